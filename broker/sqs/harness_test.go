package sqs_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// readTimeout bounds each read of the harness.
const readTimeout = 30 * time.Second

// awsConfig is a configuration for goaws: any credentials, its region,
// and a plain HTTP client with room for every concurrent request's
// connection (the SDK's default client took 4 times as long per request
// against goaws on loopback).
func awsConfig() *aws.Config {
	return &aws.Config{Region: testenv.GoAWSRegion, Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// dial returns a publisher on g, closed by t.Cleanup.
func dial(t testing.TB, g *testenv.GoAWS, opts sqs.Options) *sqs.Publisher {
	t.Helper()
	opts.AWS = awsConfig()
	if opts.Endpoint == "" {
		opts.Endpoint = g.Endpoint()
	}
	opts.ClientOptions = append(opts.ClientOptions, sqs.QueryProtocol)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := sqs.Dial(ctx, opts)
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

// admin returns an SDK client of g, for creating and deleting queues.
func admin(g *testenv.GoAWS) *awssqs.Client {
	return awssqs.NewFromConfig(*awsConfig(), func(o *awssqs.Options) {
		o.BaseEndpoint = aws.String(g.Endpoint())
		sqs.QueryProtocol(o)
	})
}

func createQueue(t testing.TB, g *testenv.GoAWS, name string) {
	t.Helper()
	in := &awssqs.CreateQueueInput{QueueName: aws.String(name)}
	if strings.HasSuffix(name, ".fifo") {
		in.Attributes = map[string]string{"FifoQueue": "true"}
	}
	if _, err := admin(g).CreateQueue(context.Background(), in); err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
}

func deleteQueue(t testing.TB, g *testenv.GoAWS, name string) {
	t.Helper()
	if _, err := admin(g).DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(g.QueueURL(name))}); err != nil {
		t.Fatalf("delete queue %s: %v", name, err)
	}
}

// reader reads a goaws queue from its start, across read calls.
type reader struct {
	g     *testenv.GoAWS
	queue string
	next  int
}

// read returns the next n messages, failing the test after readTimeout.
func (r *reader) read(t testing.TB, n int) []testenv.GoAWSMessage {
	t.Helper()
	deadline := time.Now().Add(readTimeout)
	for {
		if _, stored, _ := r.g.Messages(r.queue, r.next, 0); stored >= n {
			msgs, _, _ := r.g.Messages(r.queue, r.next, n)
			r.next += n
			return msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d messages in queue %s within %v", n, r.queue, readTimeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the queue
	}
}

// received decodes a stored message as a consumer would.
func received(t testing.TB, topic string, m testenv.GoAWSMessage) brokertest.Received {
	t.Helper()
	out := brokertest.Received{ID: m.Attributes[sqs.AttrID], Key: m.Attributes[sqs.AttrKey], Topic: topic, Headers: map[string]string{}}
	switch m.Attributes[sqs.AttrEncoding] {
	case "":
		out.Payload = []byte(m.Body)
	case "empty":
		out.Payload = []byte{}
	case "base64":
		b, err := base64.StdEncoding.DecodeString(m.Body)
		if err != nil {
			t.Fatalf("message %s: body: %v", out.ID, err)
		}
		out.Payload = b
	default:
		t.Fatalf("message %s: unknown %s %q", out.ID, sqs.AttrEncoding, m.Attributes[sqs.AttrEncoding])
	}
	if h, ok := m.Attributes[sqs.AttrHeaders]; ok {
		if err := json.Unmarshal([]byte(h), &out.Headers); err != nil {
			t.Fatalf("message %s: %s: %v", out.ID, sqs.AttrHeaders, err)
		}
	}
	for k, v := range m.Attributes {
		if !strings.HasPrefix(k, "Outbox-") {
			out.Headers[k] = v
		}
	}
	if s := m.Attributes[sqs.AttrCreatedAt]; s != "" {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("message %s: %v", out.ID, err)
		}
		out.CreatedAt = at
	}
	return out
}

// harness runs the conformance suite on goaws, on standard or FIFO queues,
// with SendMessageBatch (see testenv.GoAWS for how its batches keep the
// message attributes).
func harness(fifo bool) func(t *testing.T) brokertest.Harness {
	return func(t *testing.T) brokertest.Harness {
		g := testenv.GoAWSServer(t)
		p := dial(t, g, sqs.Options{FIFO: fifo})
		readers := map[string]*reader{}
		return brokertest.Harness{
			Publisher: p,
			Topic: func(t *testing.T) string {
				topic := "t." + testenv.Name(t)
				createQueue(t, g, p.Queue(topic))
				readers[topic] = &reader{g: g, queue: p.Queue(topic)}
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
					out = append(out, received(t, topic, m))
				}
				return out
			},
			// goaws's listener closes (every connection with it) and opens
			// again; what it stored stays in the process.
			Restart: func(t *testing.T) {
				if err := g.Pause(); err != nil {
					t.Fatal(err)
				}
				if err := g.Resume(); err != nil {
					t.Fatal(err)
				}
			},
			Stop: func(t *testing.T) func(t *testing.T) {
				if err := g.Pause(); err != nil {
					t.Fatal(err)
				}
				return func(t *testing.T) {
					if err := g.Resume(); err != nil {
						t.Fatal(err)
					}
				}
			},
			MaxPayload: sqs.MaxMessageBytesDefault,
		}
	}
}

func TestConformance(t *testing.T) {
	t.Run("Standard", func(t *testing.T) { brokertest.Run(t, harness(false)) })
	t.Run("FIFO", func(t *testing.T) { brokertest.Run(t, harness(true)) })
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
