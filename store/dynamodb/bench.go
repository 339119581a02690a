package dynamodb

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// The ADR's benchmark case: finding the outstanding messages of all topics.
// The older layout could only Query its sharded Outstanding index once per
// topic and shard (5 topics × 20 shards = 100 requests, even when the
// outbox is empty); the OutstandingAllTopics index is read with one
// parallel Scan of ScanConcurrency requests.

// CompareOutstandingQueries finds the outstanding messages of all topics
// twice and returns what each way cost: older, the older layout's loop (a
// Query of the Outstanding index per topic and shard, up to PageSize
// entries each, as Brighter v9 did), and ours, Outstanding with no topic
// (a parallel Scan of OutstandingAllTopics). shards is the shard count the
// older loop iterates over; 0 means the store's. Requests made
// concurrently by other users of s are not counted.
func CompareOutstandingQueries(ctx context.Context, s *Store, topics []string, shards int) (older, ours RequestCount, err error) {
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

// FillBacklog writes n small messages spread over topics (keys k0, k1, …,
// so over every shard) with BatchWriteItem, 25 a request: a fast way to
// make a backlog for a benchmark. It is not the transactional Write.
func FillBacklog(ctx context.Context, s *Store, topics []string, n int) error {
	if len(topics) == 0 {
		return fmt.Errorf("dynamodb: FillBacklog needs at least one topic")
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
		for attempt := 0; ; attempt++ {
			if attempt > 0 {
				if err := s.backoff(ctx, attempt); err != nil {
					return err
				}
			}
			out, err := s.client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
				RequestItems:           map[string][]types.WriteRequest{s.opts.Table: reqs},
				ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
			}, s.callOpts...)
			if err != nil {
				return fmt.Errorf("dynamodb: fill backlog: %w", err)
			}
			if reqs = out.UnprocessedItems[s.opts.Table]; len(reqs) == 0 {
				return nil
			}
			if attempt+1 >= s.opts.UnprocessedAttempts {
				return fmt.Errorf("dynamodb: fill backlog: %d put(s) still unprocessed", len(reqs))
			}
		}
	})
}

// BenchOutstanding runs the ADR's case on s, which must hold an empty,
// migrated table: CompareOutstandingQueries on the empty outbox, then after
// FillBacklog(backlog), and prints both to w as a table. It leaves the
// backlog in the table.
func BenchOutstanding(ctx context.Context, w io.Writer, s *Store, topics []string, backlog int) error {
	type row struct {
		name        string
		older, ours RequestCount
	}
	var rows []row
	older, ours, err := CompareOutstandingQueries(ctx, s, topics, 0)
	if err != nil {
		return err
	}
	rows = append(rows, row{"empty outbox", older, ours})
	if backlog > 0 {
		if err := FillBacklog(ctx, s, topics, backlog); err != nil {
			return err
		}
		older, ours, err = CompareOutstandingQueries(ctx, s, topics, 0)
		if err != nil {
			return err
		}
		rows = append(rows, row{fmt.Sprintf("%d outstanding", backlog), older, ours})
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "find outstanding (%d topics × %d shards)\tolder: Query per topic×shard\tcapacity\tours: parallel Scan (%d segments)\tcapacity\t\n",
		len(topics), s.opts.Shards, s.opts.ScanConcurrency)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d requests\t%.1f\t%d requests\t%.1f\t\n", r.name, r.older.Requests, r.older.ConsumedCapacity, r.ours.Requests, r.ours.ConsumedCapacity)
	}
	return tw.Flush()
}
