package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// An SQS FIFO queue deleted mid-run and recreated 10 s later, on goaws:
// the messages written meanwhile wait (the queue is blocked, no attempt
// spent, nothing dead-lettered), and once the operator recreates it all
// arrive, each key's in commit order (MessageGroupId = key). (goaws has no
// IAM and no throttling: access denied and throttled are covered by the
// classification tests of broker/sqs, not here.)
//
// Not parallel: the AWS credentials come from the environment, as for a
// relay.
func TestMistakeSQSQueueDeletedAndRecreated(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	g := testenv.GoAWSServer(t)
	admin := awssqs.NewFromConfig(aws.Config{Region: testenv.GoAWSRegion, Credentials: credentials.NewStaticCredentialsProvider("t", "t", "")},
		func(o *awssqs.Options) { o.BaseEndpoint = aws.String(g.Endpoint()); sqs.QueryProtocol(o) })
	queue := "e2e-" + testenv.Name(t) + ".fifo"
	ctx := context.Background()
	create := func() {
		if _, err := admin.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(queue), Attributes: map[string]string{"FifoQueue": "true"}}); err != nil {
			t.Fatal(err)
		}
	}
	create()
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "sqs"} })
	url := "sqs://" + testenv.GoAWSRegion + "?protocol=query&queue=" + queue + "&endpoint=" + g.Endpoint()
	r := mistakeRelay(t, e, url, 1)
	before := brokertest.NewChecker()
	writeSome(t, e, before, "e2e.a", 200, 20)
	waitFor(t, "the first messages published", time.Minute, func() bool { return outstanding(t, e) == 0 })
	if _, err := admin.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(g.QueueURL(queue))}); err != nil {
		t.Fatal(err)
	}
	c := brokertest.NewChecker()
	writeSome(t, e, c, "e2e.a", 500, 20)
	waitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	time.Sleep(10 * time.Second) // the operator notices after 10 s (the scenario, not a synchronisation)
	noDeadLetters(t, e, r)
	create()
	waitFor(t, "the outbox to drain after the queue came back", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "sqs", read: func(t *testing.T, ch *brokertest.Checker) int {
		msgs, _, ok := g.Messages(queue, 0, -1)
		if !ok {
			t.Fatalf("queue %s is gone", queue)
		}
		for _, m := range msgs {
			ch.Delivered(brokertest.Received{ID: m.Attributes[sqs.AttrID], Key: m.Attributes[sqs.AttrKey], Topic: "e2e.a"})
		}
		return len(msgs)
	}}}, c)
	noDeadLetters(t, e, r)
	waitFor(t, "unblocked", time.Minute, func() bool { return len(r.Blocked()) == 0 })
}
