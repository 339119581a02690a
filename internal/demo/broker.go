package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/internal/servers"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Settings of the stream and the consumer.
const (
	// duplicateWindow is how long JetStream remembers message IDs to drop
	// re-published copies.
	duplicateWindow = 2 * time.Minute
	// consumeBatch bounds the messages the consumer applies in one
	// transaction.
	consumeBatch = 1000
	// ackWait is how long JetStream waits for an acknowledgement before
	// redelivering.
	ackWait = 30 * time.Second
)

// natsBroker is the NATS side: a publisher for the relay, and a connection
// for the stream and the consumer.
type natsBroker struct {
	pub    *natsjs.Publisher
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string // stream name
	prefix string // subject prefix ("" on the embedded server)
	// external: the stream lives on the user's server and is deleted at the
	// end; stopServer stops the embedded server otherwise.
	external   bool
	stopServer func()
	log        *slog.Logger
}

// openBroker starts the embedded NATS server (url "") or connects to url,
// and creates the stream.
func openBroker(ctx context.Context, url, runID string, log *slog.Logger) (*natsBroker, string, error) {
	b := &natsBroker{log: log, name: "ORDERS"}
	desc := "NATS JetStream (embedded)"
	if url == "" {
		srv, stop, err := servers.StartNATS("")
		if err != nil {
			return nil, "", fmt.Errorf("demo: start the embedded NATS server: %w", err)
		}
		b.stopServer = stop
		url = srv.ClientURL()
	} else {
		b.external = true
		b.name = "OUTBOX_DEMO_" + strings.ToUpper(runID)
		b.prefix = "outbox_demo_" + runID + "."
		desc = fmt.Sprintf("NATS JetStream (%s, stream %s)", redact.URL(url), b.name)
	}
	var err error
	b.nc, err = nats.Connect(url, nats.Name("outbox-demo-consumer"))
	if err != nil {
		b.close()
		return nil, "", fmt.Errorf("demo: connect to NATS at %s: %w (is a server with JetStream running there?)", redact.URL(url), err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		b.close()
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	b.stream, err = b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       b.name,
		Subjects:   []string{b.prefix + topicPrefix + ">"},
		Storage:    jetstream.FileStorage,
		Duplicates: duplicateWindow,
	})
	if err != nil {
		b.close()
		return nil, "", fmt.Errorf("demo: create stream %s for subjects %s>: %w", b.name, b.prefix+topicPrefix, err)
	}
	b.pub, err = natsjs.Dial(url, natsjs.Options{SubjectPrefix: b.prefix, Logger: log})
	if err != nil {
		b.close()
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	return b, desc, nil
}

func (b *natsBroker) publisher() outbox.Publisher { return b.pub }

func (b *natsBroker) close() {
	if b.pub != nil {
		if err := b.pub.Close(); err != nil {
			b.log.Warn("demo: close the publisher", "err", err)
		}
	}
	if b.external && b.js != nil && b.stream != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := b.js.DeleteStream(ctx, b.name); err != nil {
			b.log.Warn("demo: delete the stream", "stream", b.name, "err", err)
		}
		cancel()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.stopServer != nil {
		b.stopServer()
	}
}

// consumer applies the stream's messages in batches, in stream order.
type consumer struct {
	cc     jetstream.ConsumeContext
	in     chan jetstream.Msg
	ctx    context.Context // ends the consumer
	cancel context.CancelFunc
	done   chan error
	st     orderStore
	c      *counters
	log    *slog.Logger
	last   map[string]int64 // customer → last event seq seen
}

// consume starts a durable pull consumer on the stream that applies the
// messages with st.apply and updates c. Stop it with stop; wait returns
// its error.
func (b *natsBroker) consume(ctx context.Context, st orderStore, c *counters) (*consumer, error) {
	jc, err := b.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "demo-consumer",
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       ackWait,
		MaxAckPending: 4 * consumeBatch,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("demo: create the consumer: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cons := &consumer{
		in: make(chan jetstream.Msg, consumeBatch), ctx: cctx, cancel: cancel, done: make(chan error, 1),
		st: st, c: c, log: b.log, last: map[string]int64{},
	}
	cons.cc, err = jc.Consume(func(m jetstream.Msg) {
		select {
		case cons.in <- m:
		case <-cctx.Done(): // not acknowledged: redelivered to the next consumer
		}
	}, jetstream.PullMaxMessages(consumeBatch))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("demo: consume: %w", err)
	}
	go func() { cons.done <- cons.run() }()
	return cons, nil
}

// stop stops receiving and applying; a batch being applied is abandoned
// (rolled back, not acknowledged).
func (cons *consumer) stop() {
	cons.cancel()
	cons.cc.Stop()
	<-cons.cc.Closed()
}

// wait returns when the consumer has stopped, with the error that stopped
// it, if any.
func (cons *consumer) wait() error { return <-cons.done }

func (cons *consumer) run() error {
	batch := make([]jetstream.Msg, 0, consumeBatch)
	for {
		batch = batch[:0]
		select {
		case m := <-cons.in:
			batch = append(batch, m)
		case <-cons.ctx.Done():
			return nil
		}
	more:
		for len(batch) < consumeBatch {
			select {
			case m := <-cons.in:
				batch = append(batch, m)
			default:
				break more
			}
		}
		if err := cons.process(batch); err != nil {
			if cons.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("demo: consumer: %w", err)
		}
	}
}

// process applies one batch in one transaction, checks order and counts,
// then acknowledges the batch (AckAll: acknowledging the last message
// acknowledges all before it).
func (cons *consumer) process(batch []jetstream.Msg) error {
	evs := make([]event, len(batch))
	for i, m := range batch {
		e := &evs[i]
		if err := json.Unmarshal(m.Data(), e); err != nil {
			return fmt.Errorf("message on %s: payload is not an order event: %w", m.Subject(), err)
		}
		h := m.Headers()
		if e.id = h.Get(jetstream.MsgIDHeader); e.id == "" {
			return fmt.Errorf("message on %s has no %s header", m.Subject(), jetstream.MsgIDHeader)
		}
		if t, err := time.Parse(time.RFC3339Nano, h.Get(outbox.HeaderCreatedAt)); err == nil {
			e.created = t
		}
	}
	fresh, err := cons.st.apply(cons.ctx, evs)
	if err != nil {
		return err
	}
	now := time.Now()
	var unique, dups int64
	for _, e := range evs {
		if !fresh[e.id] {
			dups++
			continue
		}
		delete(fresh, e.id) // a second copy in this batch is a duplicate
		unique++
		if !e.created.IsZero() {
			cons.c.latency.add(now.Sub(e.created))
		}
		if want := cons.last[e.Customer] + 1; e.Seq != want {
			if cons.c.violations.Add(1) <= 10 {
				cons.log.Warn("demo: order violation", "customer", e.Customer, "seq", e.Seq, "want", want, "order", e.Order, "type", e.Type)
			}
		}
		cons.last[e.Customer] = max(cons.last[e.Customer], e.Seq)
	}
	if err := batch[len(batch)-1].Ack(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("acknowledge: %w", err)
	}
	cons.c.unique.Add(unique)
	cons.c.duplicates.Add(dups)
	cons.c.lastAt.Store(now.UnixNano())
	select {
	case cons.c.progress <- struct{}{}:
	default:
	}
	return nil
}
