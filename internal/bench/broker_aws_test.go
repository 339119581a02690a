package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestStreamAndAWSBrokers runs the seeds, our relay and the broker ceiling
// on Redis Streams (redis-server), SQS standard and FIFO and SNS (goaws)
// and Kinesis (kinesalite) through backends.OpenPublisher, and checks that
// every message reached the bench's stream, queue or topic (counted with
// XLEN, on the queue, on a queue subscribed to the topic, by reading the
// stream's shards).
//
// Not parallel: the AWS credentials come from the environment, which the
// relay processes inherit.
func TestStreamAndAWSBrokers(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, b := range []struct {
		name, want string
		url        func(t *testing.T) string
	}{
		{"redis", "redis streams", func(t *testing.T) string { return testenv.Redis(t, testenv.RedisOptions{}).URL() }},
		{"sqs", "sqs", func(t *testing.T) string {
			return "sqs://" + testenv.GoAWSRegion + "?protocol=query&endpoint=" + testenv.GoAWSServer(t).Endpoint()
		}},
		{"sqs-fifo", "sqs", func(t *testing.T) string {
			return "sqs://" + testenv.GoAWSRegion + "?protocol=query&fifo=true&endpoint=" + testenv.GoAWSServer(t).Endpoint()
		}},
		{"sns", "sns", func(t *testing.T) string {
			return "sns://" + testenv.GoAWSRegion + "?account=" + testenv.GoAWSAccount + "&endpoint=" + testenv.GoAWSServer(t).Endpoint()
		}},
		{"kinesis", "kinesis", func(t *testing.T) string {
			return "kinesis://" + testenv.KinesaliteRegion + "?endpoint=" + testenv.KinesaliteServer(t).Endpoint()
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			dsn := testenv.PostgresDSN(t)
			rep, err := Run(ctx, children(Options{
				Store: dsn, Broker: b.url(t), Messages: 500, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
				Scenarios: []string{"seed-*", "relay/*", "ceiling/broker"},
			}))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !strings.HasPrefix(rep.Broker, b.want) {
				t.Errorf("broker described as %q, want it to start with %q", rep.Broker, b.want)
			}
			for _, res := range rep.Results {
				if res.Scenario == CeilingName {
					continue
				}
				if len(res.Details) != 1 {
					t.Fatalf("%s: %d runs, want 1 (error %q)", res.Scenario, len(res.Details), res.Err)
				}
				r := res.Details[0]
				if !(r.MsgsPerSec > 0) || r.Stored != int64(r.Messages) {
					t.Errorf("%s: %v msgs/s, %d of %d messages stored", res.Scenario, r.MsgsPerSec, r.Stored, r.Messages)
				}
			}
		})
	}
}
