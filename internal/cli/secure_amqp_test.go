package cli_test

import (
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// amqpQueue declares the exchange outbox and a queue bound to secure.#
// through a connection made with cfg, and returns a function counting the
// queue's messages.
func amqpQueue(t *testing.T, amqpsURL string, cfg amqp.Config) func() uint64 {
	t.Helper()
	conn, err := amqp.DialConfig(amqpsURL, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", amqpsURL, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("outbox", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("secure", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("secure", "secure.#", "outbox", false, nil); err != nil {
		t.Fatal(err)
	}
	return func() uint64 {
		q, err := ch.QueueDeclarePassive("secure", true, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue: %v", err)
		}
		return uint64(q.Messages)
	}
}

func TestRelayRabbitMQMutualTLS(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "rabbitmq")
	amqpsURL := testenv.RabbitMQTLS(t, pki, true)
	client := pki.Client("relay")
	count := amqpQueue(t, amqpsURL, amqp.Config{TLSClientConfig: clientTLS(pki, &client)})
	u, _ := url.Parse(amqpsURL)
	u.User = url.User("guest")
	noPassword := u.String() // amqps://guest@127.0.0.1:PORT/
	const wrong = "amqp-wrong-5e0c9d1b"

	t.Run("client certificate and password file publish", func(t *testing.T) {
		relayPublishes(t, count, []string{"guest:guest"}, "--broker", noPassword, "--amqp-password-file", secretFile(t, "pw", "guest"),
			"--broker-ca-file", pki.CAFile, "--broker-cert-file", client.CertFile, "--broker-key-file", client.KeyFile)
	})
	t.Run("wrong password refused", func(t *testing.T) {
		relayRefused(t, "RabbitMQ refused the password of --amqp-password-file for the user in --broker", []string{wrong},
			"--broker", noPassword, "--amqp-password-file", secretFile(t, "pw", wrong),
			"--broker-ca-file", pki.CAFile, "--broker-cert-file", client.CertFile, "--broker-key-file", client.KeyFile)
	})
	t.Run("no client certificate refused", func(t *testing.T) {
		relayRefused(t, "client certificate (mutual TLS)", nil,
			"--broker", amqpsURL, "--broker-ca-file", pki.CAFile)
	})
	t.Run("unknown CA refused", func(t *testing.T) {
		relayRefused(t, "the broker's TLS certificate is not signed by a CA in", nil,
			"--broker", amqpsURL, "--broker-ca-file", testenv.NewPKI(t, "other").CAFile, "--broker-cert-file", client.CertFile, "--broker-key-file", client.KeyFile)
	})
	t.Run("TLS options with amqp:// are a usage error", func(t *testing.T) {
		r := run(t, nil, "relay", "--store", "postgres://localhost/x", "--broker", strings.Replace(amqpsURL, "amqps://", "amqp://", 1), "--broker-ca-file", pki.CAFile)
		if r.code != 2 || !strings.Contains(r.stderr, "use amqps:// for TLS") {
			t.Fatalf("%v", r)
		}
	})
}
