package kinesis_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// readTimeout bounds each read of the harness.
const readTimeout = 30 * time.Second

// awsConfig is a configuration for kinesalite: any credentials, its
// region, and a plain HTTP client with room for concurrent requests.
func awsConfig() *aws.Config {
	return &aws.Config{Region: testenv.KinesaliteRegion, Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// dial returns a publisher on k, closed by t.Cleanup.
func dial(t testing.TB, k *testenv.Kinesalite, opts kinesis.Options) *kinesis.Publisher {
	t.Helper()
	opts.AWS = awsConfig()
	if opts.Endpoint == "" {
		opts.Endpoint = k.Endpoint()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := kinesis.Dial(ctx, opts)
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

// admin returns an SDK client of k, for creating, deleting and reading
// streams; its requests are retried (kinesalite may be restarting).
func admin(k *testenv.Kinesalite) *awskinesis.Client {
	return awskinesis.NewFromConfig(*awsConfig(), func(o *awskinesis.Options) { o.BaseEndpoint = aws.String(k.Endpoint()) })
}

// createStream creates a stream of shards shards and waits until it is
// ACTIVE.
func createStream(t testing.TB, k *testenv.Kinesalite, name string, shards int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := admin(k)
	if _, err := c.CreateStream(ctx, &awskinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	w := awskinesis.NewStreamExistsWaiter(c, func(o *awskinesis.StreamExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 10*time.Millisecond, 100*time.Millisecond
	})
	if err := w.Wait(ctx, &awskinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute); err != nil {
		t.Fatalf("stream %s not ACTIVE: %v", name, err)
	}
}

// deleteStream deletes a stream and waits until it is gone.
func deleteStream(t testing.TB, k *testenv.Kinesalite, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := admin(k)
	if _, err := c.DeleteStream(ctx, &awskinesis.DeleteStreamInput{StreamName: aws.String(name)}); err != nil {
		t.Fatalf("delete stream %s: %v", name, err)
	}
	w := awskinesis.NewStreamNotExistsWaiter(c, func(o *awskinesis.StreamNotExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 10*time.Millisecond, 100*time.Millisecond
	})
	if err := w.Wait(ctx, &awskinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute); err != nil {
		t.Fatalf("stream %s not gone: %v", name, err)
	}
}

// reader reads a stream from its start, every shard, across read calls, as
// a consumer would: records of one shard in their order, shards
// interleaved as they come.
type reader struct {
	k      *testenv.Kinesalite
	stream string
	shards map[string]*shardPos
	buf    []types.Record
}

type shardPos struct {
	iter    *string // nil: ask for one
	lastSeq string
}

func newReader(k *testenv.Kinesalite, stream string) *reader {
	return &reader{k: k, stream: stream, shards: map[string]*shardPos{}}
}

// poll reads what is new in every shard into r.buf.
func (r *reader) poll(ctx context.Context) error {
	c := admin(r.k)
	out, err := c.ListShards(ctx, &awskinesis.ListShardsInput{StreamName: aws.String(r.stream)})
	if err != nil {
		return err
	}
	for _, s := range out.Shards {
		id := aws.ToString(s.ShardId)
		pos := r.shards[id]
		if pos == nil {
			pos = &shardPos{}
			r.shards[id] = pos
		}
		if pos.iter == nil {
			in := &awskinesis.GetShardIteratorInput{StreamName: aws.String(r.stream), ShardId: s.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon}
			if pos.lastSeq != "" {
				in.ShardIteratorType, in.StartingSequenceNumber = types.ShardIteratorTypeAfterSequenceNumber, aws.String(pos.lastSeq)
			}
			it, err := c.GetShardIterator(ctx, in)
			if err != nil {
				return err
			}
			pos.iter = it.ShardIterator
		}
		recs, err := c.GetRecords(ctx, &awskinesis.GetRecordsInput{ShardIterator: pos.iter, Limit: aws.Int32(10000)})
		if err != nil {
			pos.iter = nil // an iterator of a server that restarted: ask again
			return err
		}
		pos.iter = recs.NextShardIterator
		for _, rec := range recs.Records {
			pos.lastSeq = aws.ToString(rec.SequenceNumber)
			r.buf = append(r.buf, rec)
		}
	}
	return nil
}

// read returns the next n records, failing the test after readTimeout.
func (r *reader) read(t testing.TB, n int) []types.Record {
	t.Helper()
	deadline := time.Now().Add(readTimeout)
	var lastErr error
	for len(r.buf) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d records in stream %s within %v (got %d; last error: %v)", n, r.stream, readTimeout, len(r.buf), lastErr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		lastErr = r.poll(ctx)
		cancel()
		if len(r.buf) < n {
			time.Sleep(20 * time.Millisecond) // polling the stream
		}
	}
	out := r.buf[:n:n]
	r.buf = r.buf[n:]
	return out
}

// received decodes a record as a consumer would, with kinesis.Decode.
func received(t testing.TB, rec types.Record) brokertest.Received {
	t.Helper()
	m, err := kinesis.Decode(rec.Data)
	if err != nil {
		t.Fatalf("record %s: %v", aws.ToString(rec.SequenceNumber), err)
	}
	if want := kinesis.PartitionKey(m.Key, m.ID); aws.ToString(rec.PartitionKey) != want {
		t.Errorf("message %s: partition key %q, want %q", m.ID, aws.ToString(rec.PartitionKey), want)
	}
	return brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic, Payload: m.Payload, Headers: m.Headers, CreatedAt: m.CreatedAt}
}

// harness runs the conformance suite on kinesalite, with streams of 2
// shards (a key's records go to one of them).
func harness(t *testing.T) brokertest.Harness {
	k := testenv.KinesaliteServer(t)
	p := dial(t, k, kinesis.Options{})
	readers := map[string]*reader{}
	ctx := context.Background()
	return brokertest.Harness{
		Publisher: p,
		Topic: func(t *testing.T) string {
			topic := "t." + testenv.Name(t)
			createStream(t, k, p.Stream(topic), 2)
			readers[topic] = newReader(k, p.Stream(topic))
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
		// kinesalite's process stops (SIGTERM) and starts again on the same
		// port with its LevelDB data.
		Restart: func(t *testing.T) {
			if err := k.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		},
		Stop: func(t *testing.T) func(t *testing.T) {
			if err := k.Pause(); err != nil {
				t.Fatal(err)
			}
			return func(t *testing.T) {
				if err := k.Resume(ctx); err != nil {
					t.Fatal(err)
				}
			}
		},
		// The limit is the record's: envelope, payload and partition key.
		// The smallest envelope of a message with an ID and a topic, plus
		// a partition key, is over 70 bytes ({"outbox":1,"id":"<36>",
		// "topic":"…"} and a newline), so a payload of MaxPayload+1 never
		// fits; TestRecordSizeLimit checks the exact limit.
		MaxPayload: kinesis.MaxRecordBytesDefault - 70,
	}
}

func TestConformance(t *testing.T) { brokertest.Run(t, harness) }

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
