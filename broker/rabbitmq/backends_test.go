package rabbitmq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestBackendsScheme checks the amqp:// scheme of `outbox relay --broker`:
// query options reach the Publisher, the outbox's prefix becomes a
// routing-key prefix, and mistakes are configuration errors naming the
// parameter.
func TestBackendsScheme(t *testing.T) {
	u := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exchange := "ex_" + testenv.Name(t)
	p, err := backends.OpenPublisher(ctx, u+"?exchange="+exchange+"&prefix=pre.&channels=2&max_in_flight=10&heartbeat=5", backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		deleteExchange(t, exchange)
	})
	q := queueFor(t, "classic", exchange, "pre.orders", nil)
	m := newMessage("orders", "", "hi")
	publishAll(t, p, m)
	if d := read(t, q, 1)[0]; d.RoutingKey != "pre.orders" || d.MessageId != m.ID {
		t.Fatalf("read %s with routing key %q; want %s with pre.orders", d.MessageId, d.RoutingKey, m.ID)
	}

	for _, tc := range []struct{ url, want string }{
		{u + "?bogus=1", `unknown query parameter "bogus"`},
		{u + "?channels=0", `channels="0"`},
		{u + "?exchange=amq.x", "PassiveExchange"},
		{u + "?transient=perhaps", "true or false"},
	} {
		_, err := backends.OpenPublisher(ctx, tc.url, backends.BrokerOptions{})
		if !backends.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenPublisher(%q) = %v; want a configuration error containing %q", tc.url, err, tc.want)
		}
	}
	_, err = backends.OpenPublisher(ctx, strings.Replace(u, "guest:guest", "guest:wrongpass", 1), backends.BrokerOptions{})
	if err == nil || backends.IsConfigError(err) || !strings.Contains(err.Error(), "check the user and password") || strings.Contains(err.Error(), "wrongpass") {
		t.Errorf("wrong password: got %v; want a runtime error asking to check the credentials, without the password", err)
	}
}
