package bench

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// perRunDest is the bench's destination on a broker that has no stream of
// the bench's own to purge (Redis, SQS, SNS, Kinesis): every run gets a new
// one (a stream, a queue, a topic and its queue) under a new prefix, and
// the previous one is dropped, as Kafka's topics are (broker_kafka.go).
type perRunDest struct {
	base string // outbox_bench_<hex>
	// create makes the destination of prefix, drop removes it, count
	// returns how many messages it holds; all get the prefix the relay
	// uses (Broker.prefix).
	create func(ctx context.Context, prefix string) error
	drop   func(ctx context.Context, prefix string) error
	count  func(ctx context.Context, prefix string) (int64, error)

	mu  sync.Mutex
	run int
}

func (d *perRunDest) prefix() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.base + "_" + strconv.Itoa(d.run) + "."
}

// next drops the current destination (if any) and creates the next one.
func (d *perRunDest) next(ctx context.Context) error {
	d.mu.Lock()
	old := d.base + "_" + strconv.Itoa(d.run) + "."
	d.run++
	first := d.run == 1
	d.mu.Unlock()
	if !first {
		if err := d.drop(ctx, old); err != nil {
			return err
		}
	}
	return d.create(ctx, d.prefix())
}

// broker returns the Broker of the destination, its first one created;
// closeAll releases the admin clients after the last one is dropped.
func (d *perRunDest) broker(ctx context.Context, name, url string, closeAll func()) (*Broker, error) {
	d.base = "outbox_bench_" + randomHex(4)
	if err := d.next(ctx); err != nil {
		closeAll()
		return nil, err
	}
	return &Broker{
		Name:   name,
		url:    url,
		prefix: d.prefix,
		reset:  d.next,
		count:  func(ctx context.Context) (int64, error) { return d.count(ctx, d.prefix()) },
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = d.drop(ctx, d.prefix()) // best effort
			closeAll()
		},
	}, nil
}
