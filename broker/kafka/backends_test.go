package kafka_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestBackendsScheme checks the kafka:// scheme of `outbox relay --broker`:
// the comma-separated seed brokers and query options reach the Publisher,
// the outbox's prefix becomes a topic prefix, and mistakes are
// configuration errors naming the parameter.
func TestBackendsScheme(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "pre.orders", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := backends.OpenPublisher(ctx, "kafka://"+strings.Join(seeds, ",")+"?prefix=pre.&linger=1ms&client_id=test", backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m := newMessage("orders", "k", "hi")
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	if r := newReader(t, seeds, "pre.orders").read(t, 1)[0]; received(t, r).ID != m.ID {
		t.Fatalf("read %s; want %s", received(t, r).ID, m.ID)
	}
	if err := p.Publish(ctx, []*outbox.Message{newMessage("missing", "k", "x")})[0]; !isBlocked(err, "missing") || !strings.Contains(err.Error(), `"pre.missing"`) {
		t.Errorf("publish to a missing topic: got %v; want an error blocking topic \"missing\" and naming Kafka topic pre.missing", err)
	}

	for _, tc := range []struct{ url, want string }{
		{"kafka://h:1?bogus=1", `unknown query parameter "bogus"`},
		{"kafka://h:1?max_buffered_records=5&max_in_flight=6", "conflicts"},
		{"kafka://u:secret@h:1", "credentials"},
		{"kafka://h:1?delivery_timeout=1ms", "DeliveryTimeout"},
	} {
		_, err := backends.OpenPublisher(ctx, tc.url, backends.BrokerOptions{})
		if !backends.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenPublisher(%q) = %v; want a configuration error containing %q", tc.url, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("OpenPublisher(%q): the error shows the password: %v", tc.url, err)
		}
	}
	free, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	_, err = backends.OpenPublisher(ctx, "kafka://127.0.0.1:"+strconv.Itoa(free), backends.BrokerOptions{})
	if err == nil || backends.IsConfigError(err) || !strings.Contains(err.Error(), "check Brokers") {
		t.Errorf("no broker: got %v; want a runtime error asking to check the brokers", err)
	}
}
