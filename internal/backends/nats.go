package backends

import (
	"context"
	"net/url"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"

	"github.com/outboxrelay/outbox/internal/redact"
)

// NATS JetStream broker: nats://[user:password@]host:4222 (tls:// for TLS).
// Query parameters: prefix (subject prefix, such as "outbox."),
// max_in_flight, ack_timeout.
func init() {
	RegisterBroker("nats", openNATS)
	RegisterBroker("tls", openNATS)
}

func openNATS(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	if u.Host == "" {
		return nil, Invalid(BrokerFlag, "%q has no host; give a URL such as nats://localhost:4222", redact.URL(u.String()))
	}
	if u.RawQuery != "" {
		return nil, Invalid(BrokerFlag, "%q has query parameters NATS does not know (%s); accepted: prefix, max_in_flight, ack_timeout", redact.URL(u.String()), u.RawQuery)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return natsjs.Dial(u.String(), natsjs.Options{
		MaxInFlight:   o.MaxInFlight,
		AckTimeout:    o.AckTimeout,
		SubjectPrefix: o.SubjectPrefix,
		Logger:        o.Logger,
	})
}
