package kafka_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestDialRefusedCredentials: a broker that refuses the credentials is not
// blamed on the network (TestDialErrors covers a port nobody listens on).
func TestDialRefusedCredentials(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	seeds, _ := testenv.Kafka(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "right"))
	_, err := kafka.Dial(ctx, kafka.Options{Brokers: seeds, ClientOptions: []kgo.Opt{kgo.SASL(plain.Auth{User: "relay", Pass: "wrong"}.AsMechanism())}})
	if err == nil || strings.Contains(err.Error(), "check Brokers") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("Dial with a wrong password: %v; want a refusal that neither blames the network nor shows the password", err)
	}
	p, err := kafka.Dial(ctx, kafka.Options{Brokers: seeds, ClientOptions: []kgo.Opt{kgo.SASL(plain.Auth{User: "relay", Pass: "right"}.AsMechanism())}})
	if err != nil {
		t.Fatalf("Dial with the right password: %v", err)
	}
	p.Close()
}
