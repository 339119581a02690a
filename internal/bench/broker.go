package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/servers"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Topic is the topic of every message the bench publishes (the seeds' type
// column holds it too).
const Topic = "bench.events"

// duplicateWindow is the stream's deduplication window (JetStream's
// default): on, as in production, so the broker does the work it does
// there.
const duplicateWindow = 2 * time.Minute

// Broker is where the scenarios publish: a publisher factory, plus, when
// the broker allows it, a way to empty the destination before a run and to
// count what it stored after one.
//
// A Broker is used by one scenario at a time.
type Broker struct {
	// Name describes the broker for the output ("nats (embedded, file
	// storage)").
	Name string

	open  func(ctx context.Context) (outbox.Publisher, error)
	reset func(ctx context.Context) error
	count func(ctx context.Context) (int64, error)
	close func()
}

// NewPublisher returns a new publisher; the caller closes it.
func (b *Broker) NewPublisher(ctx context.Context) (outbox.Publisher, error) { return b.open(ctx) }

// Reset empties the destination (a new stream) before a run; a no-op
// when the broker cannot.
func (b *Broker) Reset(ctx context.Context) error {
	if b.reset == nil {
		return nil
	}
	return b.reset(ctx)
}

// Stored returns how many messages the destination holds, or -1 when the
// broker cannot tell.
func (b *Broker) Stored(ctx context.Context) (int64, error) {
	if b.count == nil {
		return -1, nil
	}
	return b.count(ctx)
}

// Close releases the broker's connections, deletes the bench's stream and
// stops an embedded server.
func (b *Broker) Close() {
	if b.close != nil {
		b.close()
	}
}

// OpenBroker opens the broker of rawURL: "" starts an embedded NATS server
// with JetStream file storage; nats:// and tls:// connect to a NATS server
// and create a stream of the bench's own; amqp:// and amqps:// declare a
// queue of the bench's own bound to the exchange; kafka:// creates a topic
// of the bench's own per run. Close deletes them. Publishers always come
// from backends.OpenPublisher or the NATS publisher it would open, with a
// subject, routing-key or topic prefix of the bench's own. Any other scheme
// registered in internal/backends is opened with backends.OpenPublisher,
// without resets or counts. amqpQueueType is the type of the queue declared
// on RabbitMQ: AMQPClassic ("" means it) or AMQPQuorum.
func OpenBroker(ctx context.Context, rawURL, amqpQueueType string) (*Broker, error) {
	if rawURL == "" {
		srv, stop, err := servers.StartNATS("")
		if err != nil {
			return nil, fmt.Errorf("bench: start the embedded NATS server: %w", err)
		}
		b, err := openNATS(ctx, srv.ClientURL(), "nats (embedded, JetStream file storage)")
		if err != nil {
			stop()
			return nil, err
		}
		inner := b.close
		b.close = func() { inner(); stop() }
		return b, nil
	}
	if err := backends.CheckBrokerURL(rawURL, backends.BrokerOptions{}); err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case "nats", "tls":
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, backends.Invalid(backends.BrokerFlag, "is not a valid URL: %v", err)
		}
		return openNATS(ctx, rawURL, "nats ("+redact.URL(u.String())+", JetStream file storage)")
	case "amqp", "amqps":
		return openAMQP(ctx, rawURL, amqpQueueType)
	case "kafka":
		return openKafka(ctx, rawURL)
	}
	// Check that it opens at all before any scenario starts.
	p, err := backends.OpenPublisher(ctx, rawURL, backends.BrokerOptions{})
	if err != nil {
		return nil, err
	}
	if err := p.Close(); err != nil {
		return nil, err
	}
	return &Broker{
		Name: scheme + " (no stream checks)",
		open: func(ctx context.Context) (outbox.Publisher, error) {
			return backends.OpenPublisher(ctx, rawURL, backends.BrokerOptions{})
		},
	}, nil
}

// openNATS connects to the NATS server at url and creates the bench's
// stream: file storage, deduplication on, subjects under a prefix of its
// own so that it disturbs nothing else on the server.
func openNATS(ctx context.Context, url, name string) (*Broker, error) {
	suffix := randomHex(4)
	stream := "OUTBOX_BENCH_" + strings.ToUpper(suffix)
	prefix := "outbox_bench_" + suffix + "."
	nc, err := nats.Connect(url, nats.Name("outbox-bench"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect to NATS at %s: %w (is a server with JetStream running there?)", name, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	cfg := jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{prefix + ">"},
		Storage:    jetstream.FileStorage,
		Duplicates: duplicateWindow,
	}
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: create stream %s: %w", stream, err)
	}
	return &Broker{
		Name: name,
		open: func(ctx context.Context) (outbox.Publisher, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return backends.OpenPublisher(ctx, url, backends.BrokerOptions{SubjectPrefix: prefix})
		},
		// A purge keeps the stream's deduplication map (every message ID of
		// the last two minutes), which would grow from run to run and slow
		// the later ones down: each run gets a new stream instead, as each
		// gets a truncated table.
		reset: func(ctx context.Context) error {
			if err := js.DeleteStream(ctx, stream); err != nil {
				return fmt.Errorf("bench: delete stream %s: %w", stream, err)
			}
			if st, err = js.CreateStream(ctx, cfg); err != nil {
				return fmt.Errorf("bench: create stream %s: %w", stream, err)
			}
			return nil
		},
		count: func(ctx context.Context) (int64, error) {
			info, err := st.Info(ctx)
			if err != nil {
				return 0, fmt.Errorf("bench: stream %s info: %w", stream, err)
			}
			return int64(info.State.Msgs), nil
		},
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Best effort: on an embedded server the stream goes with it.
			_ = js.DeleteStream(ctx, stream)
			nc.Close()
		},
	}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
