package backends_test

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/backends"
)

func TestCheckBrokerSecurity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		o         backends.BrokerOptions
		want      string // "" for no error
	}{
		{"nats creds", "nats://h:4222", backends.BrokerOptions{NATS: backends.NATSAuth{CredsFile: "x.creds"}}, ""},
		{"nats user and password", "tls://h:4222", backends.BrokerOptions{NATS: backends.NATSAuth{User: "u", Password: "p"}}, ""},
		{"nats two ways", "nats://h:4222", backends.BrokerOptions{NATS: backends.NATSAuth{CredsFile: "x", Token: "t"}}, "--nats-creds-file: and --nats-token are two ways to authenticate"},
		{"nats user without password", "nats://h:4222", backends.BrokerOptions{NATS: backends.NATSAuth{User: "u"}}, "--nats-user: and --nats-password"},
		{"nats flag with kafka", "kafka://h:9092", backends.BrokerOptions{NATS: backends.NATSAuth{Token: "t"}}, "--nats-token: applies to nats:// and tls:// brokers only, but --broker is kafka://"},
		{"kafka flag with nats", "nats://h:4222", backends.BrokerOptions{Kafka: backends.KafkaSASL{User: "u"}}, "--kafka-sasl-user: applies to kafka:// brokers only"},
		{"kafka without mechanism", "kafka://h:9092", backends.BrokerOptions{Kafka: backends.KafkaSASL{User: "u", Password: "p"}}, "--kafka-sasl-mechanism: is required"},
		{"kafka bad mechanism", "kafka://h:9092", backends.BrokerOptions{Kafka: backends.KafkaSASL{Mechanism: "GSSAPI", User: "u", Password: "p"}}, "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
		{"kafka without password", "kafka://h:9092", backends.BrokerOptions{Kafka: backends.KafkaSASL{Mechanism: "PLAIN", User: "u"}}, "--kafka-sasl-password"},
		{"kafka credentials in URL", "kafka://u:secret@h:9092", backends.BrokerOptions{}, "give them with --kafka-sasl-mechanism"},
		{"amqp password with nats", "nats://h:4222", backends.BrokerOptions{AMQP: backends.AMQPAuth{Password: "p"}}, "--amqp-password-file: applies to amqp:// and amqps://"},
		{"tls with amqp://", "amqp://u@h:5672/", backends.BrokerOptions{TLS: backends.BrokerTLS{Enable: true}}, "use amqps:// for TLS"},
		{"cert without key", "nats://h:4222", backends.BrokerOptions{TLS: backends.BrokerTLS{CertFile: "c.pem"}}, "--broker-cert-file: and --broker-key-file go together"},
		{"missing CA file", "nats://h:4222", backends.BrokerOptions{TLS: backends.BrokerTLS{CAFile: "/nonexistent/ca.pem"}}, "--broker-ca-file: open /nonexistent/ca.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := backends.CheckBrokerURL(tc.url, tc.o)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !backends.IsConfigError(err)):
				t.Fatalf("got %v; want a ConfigError holding %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}
