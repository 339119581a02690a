package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// kinesisEnv gives the relay (this process and the relay processes it
// starts) kinesalite's credentials through the AWS configuration chain.
func kinesisEnv(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// kinesisAdmin is an SDK client of k, for creating, deleting and reading
// streams.
func kinesisAdmin(k *testenv.Kinesalite) *awskinesis.Client {
	return awskinesis.NewFromConfig(aws.Config{Region: testenv.KinesaliteRegion, Credentials: credentials.NewStaticCredentialsProvider("t", "t", "")},
		func(o *awskinesis.Options) { o.BaseEndpoint = aws.String(k.Endpoint()) })
}

// createKinesisStream creates a stream of 2 shards and waits until it is
// ACTIVE.
func createKinesisStream(t *testing.T, c *awskinesis.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.CreateStream(ctx, &awskinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(2)}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	w := awskinesis.NewStreamExistsWaiter(c, func(o *awskinesis.StreamExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 10*time.Millisecond, 100*time.Millisecond
	})
	if err := w.Wait(ctx, &awskinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute); err != nil {
		t.Fatalf("stream %s not ACTIVE: %v", name, err)
	}
}

// kinesisTarget: a stream of 2 shards per writer topic on the shared
// kinesalite server, named with a prefix of the test's own, read back
// shard by shard (a key's records are in one shard, in their order).
func kinesisTarget(t *testing.T) *target {
	kinesisEnv(t)
	k := testenv.KinesaliteServer(t)
	c := kinesisAdmin(k)
	prefix := strings.ReplaceAll(testenv.Name(t), "/", "-") + "."
	var streams []string
	for _, topic := range writerTopics() {
		streams = append(streams, prefix+topic)
		createKinesisStream(t, c, prefix+topic)
	}
	return &target{name: "kinesis", url: "kinesis://" + testenv.KinesaliteRegion + "?endpoint=" + k.Endpoint() + "&prefix=" + prefix,
		read: kinesisReader(c, streams)}
}

// kinesisReader reads streams from their start, every shard to its end,
// and feeds every record (decoded with kinesis.Decode) to the checker; it
// returns how many it read.
func kinesisReader(c *awskinesis.Client, streams []string) func(t *testing.T, ch *brokertest.Checker) int {
	return func(t *testing.T, ch *brokertest.Checker) int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		got := 0
		for _, stream := range streams {
			shards, err := c.ListShards(ctx, &awskinesis.ListShardsInput{StreamName: aws.String(stream)})
			if err != nil {
				t.Fatalf("ListShards %s: %v", stream, err)
			}
			for _, s := range shards.Shards {
				it, err := c.GetShardIterator(ctx, &awskinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: s.ShardId,
					ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
				if err != nil {
					t.Fatalf("GetShardIterator %s: %v", stream, err)
				}
				for iter := it.ShardIterator; iter != nil; {
					out, err := c.GetRecords(ctx, &awskinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
					if err != nil {
						t.Fatalf("GetRecords %s: %v", stream, err)
					}
					for _, rec := range out.Records {
						m, err := kinesis.Decode(rec.Data)
						if err != nil {
							t.Fatalf("stream %s: %v", stream, err)
						}
						ch.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic})
						got++
					}
					iter = out.NextShardIterator
					if len(out.Records) == 0 {
						break // the shard's end, as the relay has drained the outbox
					}
				}
			}
		}
		return got
	}
}

// A Kinesis stream deleted mid-run and recreated 10 s later, on
// kinesalite: the messages written meanwhile wait (the stream is blocked,
// no attempt spent, nothing dead-lettered), and once the operator
// recreates it all arrive, each key's in commit order (partition key =
// key, one shard per key). (kinesalite has no IAM and never throttles:
// access denied and throttled, per request and per record, are covered by
// broker/kinesis's tests on a scripted endpoint, not here.)
//
// Not parallel: the AWS credentials come from the environment, as for a
// relay.
func TestMistakeKinesisStreamDeletedAndRecreated(t *testing.T) {
	kinesisEnv(t)
	k := testenv.KinesaliteServer(t)
	c := kinesisAdmin(k)
	stream := strings.ReplaceAll(testenv.Name(t), "/", "-")
	createKinesisStream(t, c, stream)
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "kinesis"} })
	r := mistakeRelay(t, e, "kinesis://"+testenv.KinesaliteRegion+"?stream="+stream+"&endpoint="+k.Endpoint(), 1)
	before := brokertest.NewChecker()
	writeSome(t, e, before, "e2e.a", 200, 20)
	waitFor(t, "the first messages published", time.Minute, func() bool { return outstanding(t, e) == 0 })
	ctx := context.Background()
	if _, err := c.DeleteStream(ctx, &awskinesis.DeleteStreamInput{StreamName: aws.String(stream)}); err != nil {
		t.Fatal(err)
	}
	ch := brokertest.NewChecker()
	writeSome(t, e, ch, "e2e.a", 500, 20)
	waitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	time.Sleep(10 * time.Second) // the operator notices after 10 s (the scenario, not a synchronisation)
	noDeadLetters(t, e, r)
	if outstanding(t, e) != 500 {
		t.Fatalf("%d messages outstanding while the stream is gone; want the 500 written since", outstanding(t, e))
	}
	createKinesisStream(t, c, stream)
	waitFor(t, "the outbox to drain after the stream came back", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "kinesis", read: kinesisReader(c, []string{stream})}}, ch)
	noDeadLetters(t, e, r)
	waitFor(t, "unblocked", time.Minute, func() bool { return len(r.Blocked()) == 0 })
}
