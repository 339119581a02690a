package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/broker/sns"
	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/redact"
)

func init() {
	brokerSetups["sqs"] = openSQSBench
	brokerSetups["sns"] = openSNSBench
	brokerSetups["kinesis"] = openKinesisBench
}

// kinesisBenchShards is the shard count of the bench's Kinesis streams.
const kinesisBenchShards = 4

// awsAdmin opens the publisher of url with prefix through backends, as the
// relay does, for its SDK client and its naming of the bench's topic.
func awsAdmin[P any](ctx context.Context, url, prefix string) (P, error) {
	var zero P
	p, err := backends.OpenPublisher(ctx, url, backends.BrokerOptions{SubjectPrefix: prefix})
	if err != nil {
		return zero, err
	}
	ap, ok := p.(P)
	if !ok {
		_ = p.Close()
		return zero, fmt.Errorf("bench: %s opened a %T", redact.URL(url), p)
	}
	return ap, nil
}

// openSQSBench opens SQS: a queue of the bench's own per run (FIFO with
// fifo=true), counted with ApproximateNumberOfMessages (exact on a queue
// nobody reads) and deleted after it. A queue= parameter is dropped: the
// bench's queue is its own.
func openSQSBench(ctx context.Context, rawURL string, _ Options) (*Broker, error) {
	rawURL = withoutParams(rawURL, "prefix", "queue")
	uo, err := sqs.ParseURL(withoutParams(rawURL, "ack_timeout", "max_in_flight"))
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "%v", err)
	}
	admin, err := awsAdmin[*sqs.Publisher](ctx, rawURL, "")
	if err != nil {
		return nil, err
	}
	c := admin.Client()
	queueURL := func(ctx context.Context, prefix string) (string, error) {
		out, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(sqsQueue(prefix, uo.FIFO))})
		if err != nil {
			return "", fmt.Errorf("bench: queue %s: %w", sqsQueue(prefix, uo.FIFO), err)
		}
		return aws.ToString(out.QueueUrl), nil
	}
	d := &perRunDest{
		create: func(ctx context.Context, prefix string) error {
			return createSQSQueue(ctx, c, sqsQueue(prefix, uo.FIFO))
		},
		drop: func(ctx context.Context, prefix string) error {
			u, err := queueURL(ctx, prefix)
			if err == nil {
				_, err = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(u)})
			}
			return err
		},
		count: func(ctx context.Context, prefix string) (int64, error) {
			u, err := queueURL(ctx, prefix)
			if err != nil {
				return 0, err
			}
			return sqsCount(ctx, c, u)
		},
	}
	kind := "standard queue"
	if uo.FIFO {
		kind = "FIFO queue, MessageGroupId = key"
	}
	return d.broker(ctx, "sqs ("+redact.URL(rawURL)+", "+kind+")", rawURL, func() { _ = admin.Close() })
}

// sqsQueue is the queue of the bench's topic under prefix, as the sqs://
// backend names it.
func sqsQueue(prefix string, fifo bool) string {
	name := strings.ReplaceAll(prefix+Topic, ".", "-")
	if fifo {
		name += ".fifo"
	}
	return name
}

func createSQSQueue(ctx context.Context, c *awssqs.Client, name string) error {
	in := &awssqs.CreateQueueInput{QueueName: aws.String(name)}
	if strings.HasSuffix(name, ".fifo") {
		in.Attributes = map[string]string{"FifoQueue": "true"}
	}
	if _, err := c.CreateQueue(ctx, in); err != nil {
		return fmt.Errorf("bench: create queue %s: %w", name, err)
	}
	return nil
}

func sqsCount(ctx context.Context, c *awssqs.Client, queueURL string) (int64, error) {
	out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		return 0, fmt.Errorf("bench: attributes of %s: %w", queueURL, err)
	}
	n, err := strconv.ParseInt(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: ApproximateNumberOfMessages of %s: %w", queueURL, err)
	}
	return n, nil
}

// openSNSBench opens SNS: a topic of the bench's own per run with an SQS
// queue of the same name subscribed to it (raw delivery), counted on the
// queue, both deleted after it. The queue's client is SNS's endpoint,
// region and credentials (one server such as goaws serves both; on AWS the
// queue needs a policy letting the topic send, which the bench does not
// write: use an SQS endpoint where that holds). A topic= parameter is
// dropped.
func openSNSBench(ctx context.Context, rawURL string, _ Options) (*Broker, error) {
	rawURL = withoutParams(rawURL, "prefix", "topic")
	uo, err := sns.ParseURL(withoutParams(rawURL, "ack_timeout", "max_in_flight"))
	if err != nil {
		return nil, backends.Invalid(backends.BrokerFlag, "%v", err)
	}
	admin, err := awsAdmin[*sns.Publisher](ctx, rawURL, "")
	if err != nil {
		return nil, err
	}
	c := admin.Client()
	q := awssqs.New(awssqs.Options{Region: c.Options().Region, Credentials: c.Options().Credentials, HTTPClient: c.Options().HTTPClient},
		func(o *awssqs.Options) {
			if uo.Endpoint != "" {
				o.BaseEndpoint = aws.String(uo.Endpoint)
				sqs.QueryProtocol(o)
			}
		})
	queueURL := func(ctx context.Context, prefix string) (string, error) {
		out, err := q.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(sqsQueue(prefix, uo.FIFO))})
		if err != nil {
			return "", fmt.Errorf("bench: queue %s: %w", sqsQueue(prefix, uo.FIFO), err)
		}
		return aws.ToString(out.QueueUrl), nil
	}
	topicARN := func(ctx context.Context, prefix string) (string, error) {
		p, err := awsAdmin[*sns.Publisher](ctx, rawURL, prefix)
		if err != nil {
			return "", err
		}
		defer p.Close()
		return p.TopicARN(Topic), nil
	}
	d := &perRunDest{
		create: func(ctx context.Context, prefix string) error {
			name := sqsQueue(prefix, uo.FIFO) // an SNS topic name is an SQS queue name
			in := &awssns.CreateTopicInput{Name: aws.String(name)}
			if uo.FIFO {
				in.Attributes = map[string]string{"FifoTopic": "true"}
			}
			if _, err := c.CreateTopic(ctx, in); err != nil {
				return fmt.Errorf("bench: create SNS topic %s: %w", name, err)
			}
			if err := createSQSQueue(ctx, q, name); err != nil {
				return err
			}
			u, err := queueURL(ctx, prefix)
			if err != nil {
				return err
			}
			attrs, err := q.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(u),
				AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
			if err != nil {
				return fmt.Errorf("bench: ARN of queue %s: %w", name, err)
			}
			arn, err := topicARN(ctx, prefix)
			if err != nil {
				return err
			}
			_, err = c.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: aws.String(arn), Protocol: aws.String("sqs"),
				Endpoint: aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
			if err != nil {
				return fmt.Errorf("bench: subscribe queue %s to topic %s: %w", name, arn, err)
			}
			return nil
		},
		drop: func(ctx context.Context, prefix string) error {
			arn, err := topicARN(ctx, prefix)
			if err != nil {
				return err
			}
			if _, err := c.DeleteTopic(ctx, &awssns.DeleteTopicInput{TopicArn: aws.String(arn)}); err != nil {
				return fmt.Errorf("bench: delete SNS topic %s: %w", arn, err)
			}
			u, err := queueURL(ctx, prefix)
			if err == nil {
				_, err = q.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(u)})
			}
			return err
		},
		count: func(ctx context.Context, prefix string) (int64, error) {
			u, err := queueURL(ctx, prefix)
			if err != nil {
				return 0, err
			}
			return sqsCount(ctx, q, u)
		},
	}
	return d.broker(ctx, "sns ("+redact.URL(rawURL)+", counted on a subscribed SQS queue)", rawURL, func() { _ = admin.Close() })
}

// openKinesisBench opens Kinesis: a stream of the bench's own per run
// (kinesisBenchShards shards), counted by reading every shard from its
// start, deleted after it. A stream= parameter is dropped.
func openKinesisBench(ctx context.Context, rawURL string, _ Options) (*Broker, error) {
	rawURL = withoutParams(rawURL, "prefix", "stream")
	admin, err := awsAdmin[*kinesis.Publisher](ctx, rawURL, "")
	if err != nil {
		return nil, err
	}
	c := admin.Client()
	d := &perRunDest{
		create: func(ctx context.Context, prefix string) error {
			name := prefix + Topic
			if _, err := c.CreateStream(ctx, &awskinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(kinesisBenchShards)}); err != nil {
				return fmt.Errorf("bench: create stream %s: %w", name, err)
			}
			w := awskinesis.NewStreamExistsWaiter(c, func(o *awskinesis.StreamExistsWaiterOptions) {
				o.MinDelay, o.MaxDelay = 50*time.Millisecond, time.Second
			})
			if err := w.Wait(ctx, &awskinesis.DescribeStreamInput{StreamName: aws.String(name)}, 5*time.Minute); err != nil {
				return fmt.Errorf("bench: stream %s not ACTIVE: %w", name, err)
			}
			return nil
		},
		drop: func(ctx context.Context, prefix string) error {
			_, err := c.DeleteStream(ctx, &awskinesis.DeleteStreamInput{StreamName: aws.String(prefix + Topic), EnforceConsumerDeletion: aws.Bool(true)})
			if err != nil {
				return fmt.Errorf("bench: delete stream %s: %w", prefix+Topic, err)
			}
			return nil
		},
		count: func(ctx context.Context, prefix string) (int64, error) { return kinesisCount(ctx, c, prefix+Topic) },
	}
	return d.broker(ctx, fmt.Sprintf("kinesis (%s, %d shards, PutRecords)", redact.URL(rawURL), kinesisBenchShards), rawURL, func() { _ = admin.Close() })
}

// kinesisCount reads every shard of stream from its start to its end and
// returns how many records it holds.
func kinesisCount(ctx context.Context, c *awskinesis.Client, stream string) (int64, error) {
	shards, err := c.ListShards(ctx, &awskinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		return 0, fmt.Errorf("bench: shards of %s: %w", stream, err)
	}
	var n int64
	for _, s := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &awskinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: s.ShardId,
			ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return 0, fmt.Errorf("bench: iterator of %s: %w", stream, err)
		}
		for iter := it.ShardIterator; iter != nil; {
			out, err := c.GetRecords(ctx, &awskinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
			if err != nil {
				return 0, fmt.Errorf("bench: records of %s: %w", stream, err)
			}
			n += int64(len(out.Records))
			if len(out.Records) == 0 || aws.ToInt64(out.MillisBehindLatest) == 0 && len(out.Records) < 10000 {
				break
			}
			iter = out.NextShardIterator
		}
	}
	return n, nil
}
