package bench

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/redact"
)

func init() {
	brokerSetups["redis"] = openRedisBench
	brokerSetups["rediss"] = openRedisBench
}

// openRedisBench opens Redis Streams: a stream of the bench's own per run
// (created empty with XGROUP CREATE … MKSTREAM, since the publisher does
// not create streams), counted with XLEN and deleted after it.
func openRedisBench(ctx context.Context, rawURL string, _ Options) (*Broker, error) {
	rawURL = withoutParams(rawURL, "prefix")
	opts, err := redis.ParseURL(withoutParams(rawURL, "ack_timeout", "max_in_flight"))
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "%v", err)
	}
	admin, err := redis.Dial(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	c := admin.Client()
	d := &perRunDest{
		create: func(ctx context.Context, prefix string) error {
			if err := c.XGroupCreateMkStream(ctx, prefix+Topic, "bench", "$").Err(); err != nil {
				return fmt.Errorf("bench: create stream %s: %w", prefix+Topic, err)
			}
			return nil
		},
		drop: func(ctx context.Context, prefix string) error {
			if err := c.Del(ctx, prefix+Topic).Err(); err != nil {
				return fmt.Errorf("bench: delete stream %s: %w", prefix+Topic, err)
			}
			return nil
		},
		count: func(ctx context.Context, prefix string) (int64, error) {
			n, err := c.XLen(ctx, prefix+Topic).Result()
			if err != nil {
				return 0, fmt.Errorf("bench: XLEN %s: %w", prefix+Topic, err)
			}
			return n, nil
		},
	}
	return d.broker(ctx, "redis streams ("+redact.URL(rawURL)+", XADD per message, one pipeline per batch)", rawURL, func() { _ = admin.Close() })
}
