package natsjs_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// testPrefix is the SubjectPrefix of the publishers under test, so that the
// prefix is exercised everywhere.
const testPrefix = "outbox."

// readTimeout bounds each Read of the harness.
const readTimeout = 30 * time.Second

// broker is one embedded NATS server for one test, with an admin connection
// that creates streams and reads them back.
type broker struct {
	mu  sync.Mutex
	srv *server.Server
	url string

	nc *nats.Conn
	js jetstream.JetStream

	cursors map[string]uint64 // topic → last stream sequence read
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	srv := testenv.NATS(t)
	b := &broker{srv: srv, url: srv.ClientURL(), cursors: map[string]uint64{}}
	b.nc = connect(t, b.url)
	var err error
	if b.js, err = jetstream.New(b.nc); err != nil {
		t.Fatal(err)
	}
	return b
}

// connect opens a connection that reconnects quickly and forever, closed by
// t.Cleanup.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsOpts are the client options of the publishers under test: reconnect
// fast, so that the restart test does not wait for the default 2s.
var natsOpts = []nats.Option{nats.ReconnectWait(20 * time.Millisecond)}

// dial returns a publisher for b, closed by t.Cleanup.
func (b *broker) dial(t *testing.T, opts natsjs.Options) *natsjs.Publisher {
	t.Helper()
	p, err := natsjs.Dial(b.url, opts, natsOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// stream creates a file-storage stream for a new topic and returns the
// topic; cfg, if not nil, adjusts the stream's configuration.
func (b *broker) stream(t *testing.T, cfg func(*jetstream.StreamConfig)) string {
	t.Helper()
	name := testenv.Name(t)
	topic := "t." + name
	sc := jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{testPrefix + topic},
		Storage:  jetstream.FileStorage,
	}
	if cfg != nil {
		cfg(&sc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.js.CreateStream(ctx, sc); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return topic
}

// streamOf returns the stream holding topic.
func (b *broker) streamOf(t *testing.T, topic string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, strings.TrimPrefix(topic, "t."))
	if err != nil {
		t.Fatalf("stream of %s: %v", topic, err)
	}
	return s
}

// read returns the next n messages of topic's stream, in stream order.
func (b *broker) read(t *testing.T, topic string, n int) []brokertest.Received {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	name := strings.TrimPrefix(topic, "t.")
	cons, err := b.js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       b.cursors[topic] + 1,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		t.Fatalf("create consumer on %s: %v", name, err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = b.js.DeleteConsumer(dctx, name, cons.CachedInfo().Name)
	}()
	var got []brokertest.Received
	for len(got) < n {
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d messages from %s within %v", len(got), n, topic, readTimeout)
		}
		batch, err := cons.Fetch(n-len(got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("fetch from %s: %v", name, err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatalf("metadata: %v", err)
			}
			b.cursors[topic] = md.Sequence.Stream
			got = append(got, decode(t, m))
		}
	}
	return got
}

// decode recovers the outbox fields of a delivered message.
func decode(t *testing.T, m jetstream.Msg) brokertest.Received {
	t.Helper()
	h := m.Headers()
	r := brokertest.Received{
		ID:      h.Get(jetstream.MsgIDHeader),
		Key:     h.Get(outbox.HeaderKey),
		Topic:   strings.TrimPrefix(m.Subject(), testPrefix),
		Payload: m.Data(),
		Headers: map[string]string{},
	}
	for k, v := range h {
		r.Headers[k] = v[0]
	}
	if s := h.Get(outbox.HeaderCreatedAt); s != "" {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("header %s = %q: %v", outbox.HeaderCreatedAt, s, err)
		}
		r.CreatedAt = ts
	}
	return r
}

// restart shuts the server down and starts a new one on the same port with
// the same JetStream directory.
func (b *broker) restart(t *testing.T) {
	t.Helper()
	b.stop(t)(t)
}

// stop shuts the server down and returns a function that starts a new one
// on the same port with the same JetStream directory. (testenv has no
// restart; this mirrors the options of testenv.StartNATS.)
func (b *broker) stop(t *testing.T) (start func(t *testing.T)) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.srv
	port := old.Addr().(*net.TCPAddr).Port
	storeDir := filepath.Dir(old.StoreDir()) // StoreDir() ends with "/jetstream"
	old.Shutdown()
	old.WaitForShutdown()
	return func(t *testing.T) {
		t.Helper()
		b.mu.Lock()
		defer b.mu.Unlock()
		srv, err := server.NewServer(&server.Options{
			ServerName: "testenv",
			Host:       "127.0.0.1",
			Port:       port,
			JetStream:  true,
			StoreDir:   storeDir,
			NoLog:      true,
			NoSigs:     true,
		})
		if err != nil {
			t.Fatalf("restart NATS: %v", err)
		}
		srv.Start()
		t.Cleanup(func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		})
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatalf("restarted NATS server not ready on port %d", port)
		}
		b.srv = srv
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Harness {
		b := newBroker(t)
		return brokertest.Harness{
			// A small MaxInFlight, so that the 5,000-message batch exercises
			// the bound.
			Publisher:    b.dial(t, natsjs.Options{MaxInFlight: 256, AckTimeout: 5 * time.Second, SubjectPrefix: testPrefix}),
			Topic:        func(t *testing.T) string { return b.stream(t, nil) },
			MissingTopic: func(t *testing.T) string { return fmt.Sprintf("missing.%s", testenv.Name(t)) },
			Read:         b.read,
			Restart:      b.restart,
			Stop:         b.stop,
			MaxPayload:   int(b.nc.MaxPayload()),
			Dedup:        true,
		}
	})
}
