package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testPrefix is put before every topic by the publishers under test
// (StreamMapper), so that the mapping is exercised everywhere.
const testPrefix = "outbox:"

// readTimeout bounds each read of the harness.
const readTimeout = 30 * time.Second

func prefixed(topic string) string { return testPrefix + topic }

// dial returns a publisher, closed by t.Cleanup.
func dial(t testing.TB, opts redis.Options) *redis.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := redis.Dial(ctx, opts)
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

// client returns a go-redis client of the server's default user, closed by
// t.Cleanup.
func client(t testing.TB, s *testenv.RedisServer) *goredis.Client {
	c := s.Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// createStream creates an empty stream (with a consumer group, as
// operators do).
func createStream(t testing.TB, c *goredis.Client, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.XGroupCreateMkStream(ctx, stream, "readers", "$").Err(); err != nil {
		t.Fatalf("create stream %s: %v", stream, err)
	}
}

// reader reads one stream from its start, across read calls.
type reader struct {
	c      *goredis.Client
	stream string
	last   string
}

func newReader(c *goredis.Client, stream string) *reader {
	return &reader{c: c, stream: stream, last: "0-0"}
}

// read returns the next n entries, failing the test after readTimeout. A
// broken connection (the server restarting) is retried until then.
func (r *reader) read(t testing.TB, n int) []goredis.XMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	var got []goredis.XMessage
	for len(got) < n {
		res, err := r.c.XRead(ctx, &goredis.XReadArgs{Streams: []string{r.stream, r.last}, Count: int64(n - len(got)), Block: time.Second}).Result()
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d entries of %s within %v", len(got), n, r.stream, readTimeout)
		}
		if err != nil && err != goredis.Nil {
			t.Logf("XREAD %s: %v (retried)", r.stream, err)
			time.Sleep(50 * time.Millisecond) // the server may be restarting: polling
			continue
		}
		for _, s := range res {
			for _, m := range s.Messages {
				got = append(got, m)
				r.last = m.ID
			}
		}
	}
	return got
}

// received converts an entry to what the conformance suite compares.
func received(t testing.TB, stream string, m goredis.XMessage) brokertest.Received {
	t.Helper()
	str := func(f string) string {
		v, _ := m.Values[f].(string)
		return v
	}
	out := brokertest.Received{
		ID:      str(redis.FieldID),
		Key:     str(redis.FieldKey),
		Topic:   strings.TrimPrefix(stream, testPrefix),
		Payload: []byte(str(redis.FieldPayload)),
		Headers: map[string]string{},
	}
	for f, v := range m.Values {
		if name, ok := strings.CutPrefix(f, redis.HeaderFieldPrefix); ok {
			out.Headers[name], _ = v.(string)
		}
	}
	if s := str(redis.FieldCreatedAt); s != "" {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("entry %s: %s: %v", m.ID, redis.FieldCreatedAt, err)
		}
		out.CreatedAt = at
	}
	return out
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Harness {
		s := testenv.Redis(t, testenv.RedisOptions{})
		c := client(t, s)
		p := dial(t, redis.Options{Addr: s.Addr(), StreamMapper: prefixed})
		readers := map[string]*reader{} // Topic and Read run on the test's goroutine
		return brokertest.Harness{
			Publisher: p,
			Topic: func(t *testing.T) string {
				topic := "t." + testenv.Name(t)
				createStream(t, c, prefixed(topic))
				readers[topic] = newReader(c, prefixed(topic))
				return topic
			},
			MissingTopic: func(t *testing.T) string { return "t.missing." + testenv.Name(t) },
			Read: func(t *testing.T, topic string, n int) []brokertest.Received {
				r, ok := readers[topic]
				if !ok {
					t.Fatalf("Read of unknown topic %q", topic)
				}
				var out []brokertest.Received
				for _, m := range r.read(t, n) {
					out = append(out, received(t, r.stream, m))
				}
				return out
			},
			// appendfsync always: a restart keeps what was acknowledged.
			Restart: func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := s.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			},
			Stop: func(t *testing.T) func(t *testing.T) {
				if err := s.Pause(); err != nil {
					t.Fatal(err)
				}
				return func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if err := s.Resume(ctx); err != nil {
						t.Fatal(err)
					}
				}
			},
			MaxPayload: redis.MaxMessageBytesDefault,
		}
	})
}

func newMessage(topic, key, payload string) *outbox.Message {
	return &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: []byte(payload), CreatedAt: time.Now()}
}

func errorContains(t testing.TB, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

func isBlocked(err error, topic string) bool {
	dest, ok := outbox.IsBlocked(err)
	return ok && dest == topic && !outbox.IsPermanent(err)
}
