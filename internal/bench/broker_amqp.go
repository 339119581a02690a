package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/backends"

	"github.com/outboxrelay/outbox/internal/redact"
)

// withoutParams returns raw without the query parameters names (the bench
// sets the outbox's own, such as prefix, itself). It works on the query
// string alone, so multi-host URLs (kafka://a:9092,b:9092) survive.
func withoutParams(raw string, names ...string) string {
	base, query, ok := strings.Cut(raw, "?")
	if !ok {
		return raw
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return raw // backends.CheckBrokerURL reports it
	}
	for _, n := range names {
		q.Del(n)
	}
	if len(q) == 0 {
		return base
	}
	return base + "?" + q.Encode()
}

// openAMQP opens RabbitMQ through backends.OpenPublisher (with a routing
// key prefix of the bench's own) and, with a connection of its own, a
// durable queue of queueType (AMQPClassic, the default, or AMQPQuorum)
// bound to the exchange for that prefix, so that the publisher's mandatory
// messages are routed and the bench can purge and count them. Close
// deletes the queue.
func openAMQP(ctx context.Context, rawURL, queueType string) (*Broker, error) {
	queueType = cmp.Or(queueType, AMQPClassic)
	if queueType != AMQPClassic && queueType != AMQPQuorum {
		return nil, invalid("AMQPQueueType", "amqp-queue-type", "must be %q or %q, got %q", AMQPClassic, AMQPQuorum, queueType)
	}
	queueArgs := amqp.Table{"x-queue-type": queueType}
	rawURL = withoutParams(rawURL, "prefix")
	amqpURL, opts, err := rabbitmq.ParseURL(withoutParams(rawURL, "ack_timeout"))
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "%v", err)
	}
	exchange := opts.Exchange
	if exchange == "" {
		exchange = rabbitmq.ExchangeDefault
	}
	suffix := randomHex(4)
	prefix := "outbox_bench_" + suffix + "."
	queue := "outbox_bench_" + suffix
	// The publisher declares the exchange (unless it is passive).
	p, err := backends.OpenPublisher(ctx, rawURL, backends.BrokerOptions{SubjectPrefix: prefix})
	if err != nil {
		return nil, err
	}
	if err := p.Close(); err != nil {
		return nil, err
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, queueArgs)
	}
	if err == nil {
		err = ch.QueueBind(queue, prefix+"#", exchange, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("bench: declare queue %s bound to exchange %s: %w", queue, exchange, err)
	}
	u, _ := url.Parse(amqpURL)
	return &Broker{
		Name:   fmt.Sprintf("rabbitmq (%s, exchange %s, durable %s queue, confirms)", redact.URL(u.String()), exchange, queueType),
		url:    rawURL,
		prefix: func() string { return prefix },
		reset: func(context.Context) error {
			if _, err := ch.QueuePurge(queue, false); err != nil {
				return fmt.Errorf("bench: purge queue %s: %w", queue, err)
			}
			return nil
		},
		count: func(context.Context) (int64, error) {
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, queueArgs)
			if err != nil {
				return 0, fmt.Errorf("bench: inspect queue %s: %w", queue, err)
			}
			return int64(q.Messages), nil
		},
		close: func() {
			_, _ = ch.QueueDelete(queue, false, false, false) // best effort
			conn.Close()
		},
	}, nil
}
