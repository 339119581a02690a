package dynamodb

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/dynamobench"
)

// The ADR's benchmark case: finding the outstanding messages of all topics.
// The older layout could only Query its sharded Outstanding index once per
// topic and shard (5 topics × 20 shards = 100 requests, even when the
// outbox is empty); the OutstandingAllTopics index is read with one
// parallel Scan of ScanConcurrency requests.

// These helpers serve `outbox bench` only: they are registered with
// internal/dynamobench, not exported.
func init() {
	dynamobench.CompareOutstanding = func(ctx context.Context, s any, topics []string, shards int) (older, ours dynamobench.Count, err error) {
		o, n, err := compareOutstandingQueries(ctx, s.(*Store), topics, shards)
		return dynamobench.Count(o), dynamobench.Count(n), err
	}
	dynamobench.FillBacklog = func(ctx context.Context, s any, topics []string, n int) error {
		return fillBacklog(ctx, s.(*Store), topics, n)
	}
}

// compareOutstandingQueries finds the outstanding messages of all topics
// twice and returns what each way cost: older, the older layout's loop (a
// Query of the Outstanding index per topic and shard, up to PageSize
// entries each, as Brighter v9 did), and ours, Outstanding with no topic
// (a parallel Scan of OutstandingAllTopics). shards is the shard count the
// older loop iterates over; 0 means the store's. Requests made
// concurrently by other users of s are not counted.
func compareOutstandingQueries(ctx context.Context, s *Store, topics []string, shards int) (older, ours RequestCount, err error) {
	if shards == 0 {
		shards = s.opts.Shards
	}
	octx, olderCount := countRequests(ctx)
	for _, topic := range topics {
		for shard := range shards {
			if _, err := s.olderQuery(octx, topic, shard); err != nil {
				return older, ours, err
			}
		}
	}
	nctx, oursCount := countRequests(ctx)
	if _, err := s.Outstanding(nctx, Query{}); err != nil {
		return older, ours, err
	}
	return olderCount(), oursCount(), nil
}

// olderQuery is one step of the older loop: the outstanding entries of one
// topic and shard, up to PageSize.
func (s *Store) olderQuery(ctx context.Context, topic string, shard int) (int, error) {
	out, err := s.client.Query(ctx, &dynamodb.QueryInput{
		TableName:                 s.table,
		IndexName:                 aws.String(s.opts.Indexes.Outstanding),
		KeyConditionExpression:    aws.String("#ts = :ts"),
		ExpressionAttributeNames:  map[string]string{"#ts": attrTopicShard},
		ExpressionAttributeValues: map[string]types.AttributeValue{":ts": str(TopicShard(topic, shard))},
		Limit:                     aws.Int32(int32(s.opts.PageSize)),
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil {
		return 0, fmt.Errorf("dynamodb: query %s: %w", TopicShard(topic, shard), err)
	}
	return len(out.Items), nil
}

// fillBacklog writes n small messages spread over topics (keys k0, k1, …,
// so over every shard) with BatchWriteItem, 25 a request: a fast way to
// make a backlog for a benchmark. It is not the transactional Write.
func fillBacklog(ctx context.Context, s *Store, topics []string, n int) error {
	if len(topics) == 0 {
		return fmt.Errorf("dynamodb: fillBacklog needs at least one topic")
	}
	items := make([]map[string]types.AttributeValue, n)
	for i := range n {
		m := &outbox.Message{Topic: topics[i%len(topics)], Key: "k" + strconv.Itoa(i), Payload: []byte("backlog")}
		item, err := s.newItem(ctx, m)
		if err != nil {
			return err
		}
		items[i] = item
	}
	batches := (n + batchWriteMax - 1) / batchWriteMax
	return parallel(ctx, batches, s.opts.Concurrency, func(ctx context.Context, b int) error {
		var reqs []types.WriteRequest
		for _, item := range items[b*batchWriteMax : min(n, (b+1)*batchWriteMax)] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
		}
		return s.batchWrite(ctx, reqs, "fill backlog", "put")
	})
}
