package sns_test

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
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/sns"
	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func awsConfig() *aws.Config {
	return &aws.Config{Region: testenv.GoAWSRegion, Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func dial(t testing.TB, g *testenv.GoAWS, opts sns.Options) *sns.Publisher {
	t.Helper()
	opts.AWS = awsConfig()
	if opts.Endpoint == "" {
		opts.Endpoint = g.Endpoint()
	}
	opts.Account = testenv.GoAWSAccount
	p, err := sns.Dial(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// topicWithQueue creates topic name on goaws and a queue subscribed to it
// with raw message delivery (the message and its attributes as published).
func topicWithQueue(t testing.TB, g *testenv.GoAWS, name string) {
	t.Helper()
	ctx := context.Background()
	cfg := *awsConfig()
	snsc := awssns.NewFromConfig(cfg, func(o *awssns.Options) { o.BaseEndpoint = aws.String(g.Endpoint()) })
	sqsc := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(g.Endpoint()); sqs.QueryProtocol(o) })
	topic, err := snsc.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqsc.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name)}); err != nil {
		t.Fatal(err)
	}
	if _, err := snsc.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(g.QueueURL(name)), Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}
}

type reader struct {
	g     *testenv.GoAWS
	queue string
	next  int
}

func (r *reader) read(t testing.TB, n int) []testenv.GoAWSMessage {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, stored, _ := r.g.Messages(r.queue, r.next, 0); stored >= n {
			msgs, _, _ := r.g.Messages(r.queue, r.next, n)
			r.next += n
			return msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d messages in queue %s", n, r.queue)
		}
		time.Sleep(20 * time.Millisecond) // polling the queue
	}
}

func received(t testing.TB, topic string, m testenv.GoAWSMessage) brokertest.Received {
	t.Helper()
	out := brokertest.Received{ID: m.Attributes[awsmsg.AttrID], Key: m.Attributes[awsmsg.AttrKey], Topic: topic, Headers: map[string]string{}}
	switch m.Attributes[awsmsg.AttrEncoding] {
	case "":
		out.Payload = []byte(m.Body)
	case "empty":
		out.Payload = []byte{}
	case "base64":
		b, err := base64.StdEncoding.DecodeString(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		out.Payload = b
	}
	if h, ok := m.Attributes[awsmsg.AttrHeaders]; ok {
		if err := json.Unmarshal([]byte(h), &out.Headers); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range m.Attributes {
		if !strings.HasPrefix(k, "Outbox-") {
			out.Headers[k] = v
		}
	}
	if s := m.Attributes[awsmsg.AttrCreatedAt]; s != "" {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		out.CreatedAt = at
	}
	return out
}

// TestConformance on goaws: each topic has a queue subscribed with raw
// delivery, read back in order. goaws v0.4.5 has no PublishBatch: the
// test server answers it through goaws's Publish (see testenv.GoAWS);
// TestPublishBatchWire checks the batch requests themselves.
func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) brokertest.Harness {
		g := testenv.GoAWSServer(t)
		p := dial(t, g, sns.Options{})
		readers := map[string]*reader{}
		return brokertest.Harness{
			Publisher: p,
			Topic: func(t *testing.T) string {
				topic := "t." + testenv.Name(t)
				name := strings.ReplaceAll(topic, ".", "-")
				topicWithQueue(t, g, name)
				readers[topic] = &reader{g: g, queue: name}
				return topic
			},
			MissingTopic: func(t *testing.T) string { return "t.missing." + testenv.Name(t) },
			Read: func(t *testing.T, topic string, n int) []brokertest.Received {
				var out []brokertest.Received
				for _, m := range readers[topic].read(t, n) {
					out = append(out, received(t, topic, m))
				}
				return out
			},
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
			MaxPayload: sns.MaxMessageBytesDefault,
		}
	})
}

var _ = outbox.ErrClosed
