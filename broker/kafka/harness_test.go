package kafka_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testPrefix is put before every topic by the publishers under test
// (TopicMapper), so that the mapping is exercised everywhere.
const testPrefix = "outbox."

// readTimeout bounds each Read of the harness.
const readTimeout = 30 * time.Second

func prefixed(topic string) string { return testPrefix + topic }

// dial returns a publisher for seeds, closed by t.Cleanup.
func dial(t testing.TB, opts kafka.Options) *kafka.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := kafka.Dial(ctx, opts)
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

// client returns a plain franz-go client for seeds, closed by t.Cleanup.
func client(t testing.TB, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopic creates a Kafka topic with the given partitions.
func createTopic(t testing.TB, seeds []string, name string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = name
	rt.NumPartitions = partitions
	rt.ReplicationFactor = 1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

// reader consumes one Kafka topic from its start, across Read calls.
type reader struct {
	cl *kgo.Client
}

func newReader(t testing.TB, seeds []string, kafkaTopic string) *reader {
	return &reader{cl: client(t, seeds, kgo.ConsumeTopics(kafkaTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}
}

// read returns the next n records, failing the test after readTimeout.
func (r *reader) read(t testing.TB, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n {
		fetches := r.cl.PollRecords(ctx, n-len(got))
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records within %v", len(got), n, readTimeout)
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			t.Logf("fetch %s/%d: %v", topic, partition, err) // retried by the client
		})
		got = append(got, fetches.Records()...)
	}
	return got
}

// received converts a record to what the conformance suite compares.
func received(t testing.TB, r *kgo.Record) brokertest.Received {
	t.Helper()
	out := brokertest.Received{
		Key:     string(r.Key),
		Topic:   strings.TrimPrefix(r.Topic, testPrefix),
		Payload: r.Value,
		Headers: map[string]string{},
	}
	for _, h := range r.Headers {
		if _, dup := out.Headers[h.Key]; dup {
			t.Fatalf("record %s/%d@%d has header %q twice", r.Topic, r.Partition, r.Offset, h.Key)
		}
		out.Headers[h.Key] = string(h.Value)
	}
	out.ID = out.Headers[outbox.HeaderID]
	if s, ok := out.Headers[outbox.HeaderCreatedAt]; ok {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("record %s: %s header: %v", out.ID, outbox.HeaderCreatedAt, err)
		}
		out.CreatedAt = at
	}
	return out
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Harness {
		seeds, _ := testenv.Kafka(t)
		p := dial(t, kafka.Options{Brokers: seeds, TopicMapper: prefixed})
		readers := map[string]*reader{} // Topic and Read run on the test's goroutine
		return brokertest.Harness{
			Publisher: p,
			Topic: func(t *testing.T) string {
				topic := "t." + testenv.Name(t)
				// One partition: the suite reads a batch back in publish
				// order, which Kafka keeps per partition only.
				createTopic(t, seeds, prefixed(topic), 1)
				readers[topic] = newReader(t, seeds, prefixed(topic))
				return topic
			},
			MissingTopic: func(t *testing.T) string { return "t.missing." + testenv.Name(t) },
			Read: func(t *testing.T, topic string, n int) []brokertest.Received {
				r, ok := readers[topic]
				if !ok {
					t.Fatalf("Read of unknown topic %q", topic)
				}
				var out []brokertest.Received
				for _, rec := range r.read(t, n) {
					out = append(out, received(t, rec))
				}
				return out
			},
			// kfake persists to a data directory, so a restart keeps what
			// it acknowledged, like a real broker.
			Restart: func(t *testing.T) { testenv.RestartKafka(t) },
			Stop: func(t *testing.T) func(t *testing.T) {
				resume := testenv.PauseKafka(t)
				return func(t *testing.T) { resume(t) }
			},
			MaxPayload: kafka.MaxMessageBytesDefault,
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
