package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/redact"
)

// Topic is the topic of every message the bench publishes (the seeds' type
// column holds it too).
const Topic = "bench.events"

// duplicateWindow is the stream's deduplication window (JetStream's
// default): on, as in production, so the broker does the work it does
// there.
const duplicateWindow = 2 * time.Minute

// Broker is where the scenarios publish: a broker URL opened through
// internal/backends with a subject (routing key, topic) prefix of the
// bench's own, plus, when the broker allows it, a way to empty the
// destination before a run, to count what it stored after one and to
// receive what is published.
//
// A Broker is used by one scenario at a time.
type Broker struct {
	// Name describes the broker for the output ("nats (broker process,
	// JetStream file storage)").
	Name string

	// url is the broker URL the publishers and the relay processes use;
	// prefix returns the subject prefix of the bench's destination now
	// (Kafka's changes with every Reset).
	url    string
	prefix func() string

	reset func(ctx context.Context) error
	count func(ctx context.Context) (int64, error)
	// receive, if set, calls got with the message ID of every message
	// the destination stores from now on, as a consumer of it receives
	// them (a JetStream consumer of the kind Options.SteadyConsumer, on a
	// connection of its own), until stop is called. route, if set, does
	// the same with the messages as the broker routes them (a core
	// subscription on the stream's subjects: before the stream's
	// consumers see them).
	receive func(got func(id string)) (stop func(), err error)
	route   func(got func(id string)) (stop func(), err error)
	// Consumer describes what receive is ("durable JetStream consumer").
	Consumer string
	close    func()
	// proc is the broker process the bench started, nil for an external
	// broker; dir, if set, is its storage directory, removed after it.
	proc *child
	dir  string
}

// brokerSetup opens the bench's destination on the broker at rawURL.
type brokerSetup func(ctx context.Context, rawURL string, o Options) (*Broker, error)

// brokerSetups is the broker-specific part of the bench, by URL scheme:
// the destination it creates (a stream, a queue, a topic), how it empties
// and counts it. Publishers always come from backends.OpenPublisher. A
// broker registered in internal/backends but not here runs without resets
// or counts; adding one here is all a new broker needs.
var brokerSetups = map[string]brokerSetup{
	"nats": openNATSURL,
	"tls":  openNATSURL,
	"amqp": func(ctx context.Context, u string, o Options) (*Broker, error) {
		return openAMQP(ctx, u, o.AMQPQueueType)
	},
	"amqps": func(ctx context.Context, u string, o Options) (*Broker, error) {
		return openAMQP(ctx, u, o.AMQPQueueType)
	},
	"kafka": func(ctx context.Context, u string, _ Options) (*Broker, error) { return openKafka(ctx, u) },
}

// NewPublisher returns a new publisher on the bench's destination; the
// caller closes it.
func (b *Broker) NewPublisher(ctx context.Context) (outbox.Publisher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return backends.OpenPublisher(ctx, b.url, backends.BrokerOptions{SubjectPrefix: b.prefix()})
}

// relayArgs are the `outbox relay` flags and environment that publish to
// the bench's destination (the URL in the environment: it may hold
// credentials).
func (b *Broker) relayArgs() (args, env []string) {
	return []string{"--subject-prefix", b.prefix()}, []string{"OUTBOX_BROKER=" + b.url}
}

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
// stops a broker process the bench started.
func (b *Broker) Close() {
	if b.close != nil {
		b.close()
	}
	if b.proc != nil {
		_ = b.proc.stop()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// OpenBroker opens the broker of rawURL: "" starts a broker process (the
// bench's own binary, `outbox bench broker-process`: the embedded NATS server with
// JetStream file storage) and connects to it; nats:// and tls:// connect
// to a NATS server and create a stream of the bench's own; amqp:// and
// amqps:// declare a queue of the bench's own bound to the exchange;
// kafka:// creates a topic of the bench's own per run (brokerSetups). Close
// deletes them. Any other scheme registered in internal/backends is opened
// without resets or counts. o.AMQPQueueType is the type of the queue
// declared on RabbitMQ.
func OpenBroker(ctx context.Context, rawURL string, o Options) (*Broker, error) {
	if rawURL == "" && o.BrokerProcess == BrokerEmbedded {
		proc, clientURL, err := startBrokerProcess(ctx, o)
		if err != nil {
			return nil, err
		}
		b, err := openNATS(ctx, clientURL, "nats (a process of its own: outbox bench broker-process, embedded nats-server "+embeddedNATSVersion()+", JetStream file storage)", o)
		if err != nil {
			_ = proc.stop()
			return nil, err
		}
		b.proc = proc
		return b, nil
	}
	if rawURL == "" {
		proc, clientURL, dir, version, err := startNATSServer(ctx, o)
		if err != nil {
			return nil, err
		}
		b, err := openNATS(ctx, clientURL, "nats (a process of its own: nats-server "+version+", JetStream file storage, default sync)", o)
		if err != nil {
			_ = proc.stop()
			_ = os.RemoveAll(dir)
			return nil, err
		}
		b.proc, b.dir = proc, dir
		return b, nil
	}
	if err := backends.CheckBrokerURL(rawURL, backends.BrokerOptions{}); err != nil {
		return nil, err
	}
	scheme := scheme(rawURL)
	if setup, ok := brokerSetups[scheme]; ok {
		return setup(ctx, rawURL, o)
	}
	// Check that it opens at all before any scenario starts.
	p, err := backends.OpenPublisher(ctx, rawURL, backends.BrokerOptions{})
	if err != nil {
		return nil, err
	}
	if err := p.Close(); err != nil {
		return nil, err
	}
	return &Broker{Name: scheme + " (no stream checks)", url: rawURL, prefix: func() string { return "" }}, nil
}

// startBrokerProcess starts `outbox bench broker-process` from the bench's binary
// and reads the client URL it prints.
func startBrokerProcess(ctx context.Context, o Options) (*child, string, error) {
	c, first, err := startChild(ctx, o, "broker", BrokerCommand, nil)
	if err != nil {
		return nil, "", err
	}
	select {
	case line, ok := <-first:
		if ok && strings.HasPrefix(line, "nats://") {
			return c, line, nil
		}
		_ = c.stop()
		return nil, "", fmt.Errorf("bench: the broker process printed no nats:// URL (got %q)%s", line, c.lastWords())
	case <-ctx.Done():
		_ = c.stop()
		return nil, "", context.Cause(ctx)
	}
}

func openNATSURL(ctx context.Context, rawURL string, o Options) (*Broker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "is not a valid URL: %v", err)
	}
	return openNATS(ctx, rawURL, "nats ("+redact.URL(u.String())+", JetStream file storage)", o)
}

// openNATS connects to the NATS server at url and creates the bench's
// stream: file storage, deduplication on, subjects under a prefix of its
// own so that it disturbs nothing else on the server.
func openNATS(ctx context.Context, url, name string, o Options) (*Broker, error) {
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
		Name:   name,
		url:    url,
		prefix: func() string { return prefix },
		// A purge keeps the stream's deduplication map (every message ID of
		// the last two minutes), which would grow from run to run and slow
		// the later ones down: each run gets a new stream instead, as each
		// gets a truncated table.
		reset: func(ctx context.Context) error {
			if err := js.DeleteStream(ctx, stream); err != nil {
				return fmt.Errorf("bench: delete stream %s: %w", stream, err)
			}
			if st, err = recreateStream(ctx, js, cfg); err != nil {
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
		Consumer: consumerText(o.SteadyConsumer),
		receive: func(got func(id string)) (func(), error) {
			return consume(url, stream, o.SteadyConsumer, got)
		},
		// A core subscription on the stream's subjects gets every message
		// the stream takes, as the server routes it.
		route: func(got func(id string)) (func(), error) {
			sub, err := nc.Subscribe(prefix+">", func(m *nats.Msg) { got(m.Header.Get(outbox.HeaderID)) })
			if err != nil {
				return nil, fmt.Errorf("bench: subscribe to %s>: %w", prefix, err)
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				_ = sub.Unsubscribe()
				return nil, err
			}
			if err := nc.Flush(); err != nil {
				_ = sub.Unsubscribe()
				return nil, err
			}
			return func() { _ = sub.Unsubscribe() }, nil
		},
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Best effort: in the bench's broker process the stream goes with it.
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

// streamStoreFailed is JetStream's "error creating store for stream"
// (JSStreamStoreFailedF): nats-server 2.9 answers it to a stream created
// again at once under the name of one just deleted, while the old one's
// files are still being removed.
const streamStoreFailed = 10049

// recreateStream creates the stream cfg just deleted, trying again a few
// times, 100 ms apart, while the server's store for the old one is not gone.
func recreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for attempt := 1; ; attempt++ {
		st, err := js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if err == nil || attempt == 10 || !errors.As(err, &apiErr) || apiErr.ErrorCode != streamStoreFailed {
			return st, err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}
