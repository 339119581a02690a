package dynamodb

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// Entry is a message as an index lists it, without its payload: use
// GetMany for the messages themselves.
type Entry struct {
	ID    string
	Topic string
	Shard int
	// Time is the index's time: CreatedAt for Outstanding, the delivery
	// time for Dispatched.
	Time time.Time
}

// Query selects the entries of Outstanding and Dispatched.
type Query struct {
	// Topic, if set, selects one topic: a Query per shard of the
	// Outstanding (or Delivered) index, merged in time order. Empty: all
	// topics, with a parallel Scan of OutstandingAllTopics (or
	// DeliveredAllTopics) in Options.ScanConcurrency segments.
	Topic string
	// Limit bounds the entries returned; 0 means Options.PageSize.
	Limit int
	// Since and Before, when not zero, bound the index's time: Since ≤ t <
	// Before.
	Since, Before time.Time
}

// Outstanding lists up to Limit outstanding messages (not yet delivered
// nor dead-lettered), oldest first. For one topic the result is the oldest
// ones. For all topics the Scan stops each segment once it has Limit
// entries and sorts in memory, so, as the ADR says, the order (and the
// choice of entries) is exact only when the backlog is within Limit.
//
// Indexes are eventually consistent: a message written or dispatched a
// moment ago may be missing or still listed.
func (s *Store) Outstanding(ctx context.Context, q Query) ([]Entry, error) {
	return s.list(ctx, q, s.opts.Indexes.Outstanding, s.opts.Indexes.OutstandingAllTopics, attrOutstandingCreatedTime)
}

// Dispatched lists up to Limit messages marked dispatched (only kept with
// Options.Retention or MarkDispatched), in delivery-time order, with the
// same approach and caveats as Outstanding.
func (s *Store) Dispatched(ctx context.Context, q Query) ([]Entry, error) {
	return s.list(ctx, q, s.opts.Indexes.Delivered, s.opts.Indexes.DeliveredAllTopics, attrDeliveryTime)
}

func (s *Store) list(ctx context.Context, q Query, topicIndex, allIndex, timeAttr string) ([]Entry, error) {
	limit := cmp.Or(q.Limit, s.opts.PageSize)
	if limit < 1 || limit > PageSizeMax {
		return nil, fmt.Errorf("dynamodb: Query.Limit must be between 1 and %d, got %d", PageSizeMax, q.Limit)
	}
	var entries []Entry
	var err error
	if q.Topic != "" {
		if err := outbox.ValidateTopic(q.Topic); err != nil {
			return nil, fmt.Errorf("dynamodb: Query.Topic %w", err)
		}
		entries, err = s.queryTopic(ctx, topicIndex, timeAttr, q, limit)
	} else {
		entries, err = s.scanAll(ctx, allIndex, timeAttr, q, limit)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.ID, b.ID))
	})
	if len(entries) > limit {
		entries = entries[:limit]
	}
	return entries, nil
}

// timeRange returns the condition on timeAttr (placeholder #t) for Since
// and Before, and its values.
func timeRange(q Query) (string, map[string]types.AttributeValue) {
	values := map[string]types.AttributeValue{}
	switch {
	case !q.Since.IsZero() && !q.Before.IsZero():
		values[":since"], values[":before"] = micros(q.Since), num(q.Before.UnixMicro()-1)
		return "#t BETWEEN :since AND :before", values
	case !q.Since.IsZero():
		values[":since"] = micros(q.Since)
		return "#t >= :since", values
	case !q.Before.IsZero():
		values[":before"] = micros(q.Before)
		return "#t < :before", values
	}
	return "", nil
}

// queryTopic queries each shard of topic on index (hash TopicShard, range
// timeAttr) for up to limit entries, concurrently.
func (s *Store) queryTopic(ctx context.Context, index, timeAttr string, q Query, limit int) ([]Entry, error) {
	var mu sync.Mutex
	var entries []Entry
	err := parallel(ctx, s.opts.Shards, s.opts.Concurrency, func(ctx context.Context, shard int) error {
		cond, values := timeRange(q)
		names := map[string]string{"#ts": attrTopicShard}
		if values == nil {
			values = map[string]types.AttributeValue{}
		}
		values[":ts"] = str(TopicShard(q.Topic, shard))
		keyCond := "#ts = :ts"
		if cond != "" {
			keyCond += " AND " + cond
			names["#t"] = timeAttr
		}
		var got []Entry
		var start map[string]types.AttributeValue
		for {
			out, err := s.client.Query(ctx, &dynamodb.QueryInput{
				TableName:                 s.table,
				IndexName:                 aws.String(index),
				KeyConditionExpression:    aws.String(keyCond),
				ExpressionAttributeNames:  names,
				ExpressionAttributeValues: values,
				Limit:                     aws.Int32(int32(limit - len(got))),
				ExclusiveStartKey:         start,
				ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
			}, s.callOpts...)
			if err != nil {
				return fmt.Errorf("dynamodb: query %s for %s: %w", index, TopicShard(q.Topic, shard), err)
			}
			for _, item := range out.Items {
				got = append(got, entryOf(item, timeAttr))
			}
			if len(out.LastEvaluatedKey) == 0 || len(got) >= limit {
				break
			}
			start = out.LastEvaluatedKey
		}
		mu.Lock()
		entries = append(entries, got...)
		mu.Unlock()
		return nil
	})
	return entries, err
}

// scanAll scans index (hash timeAttr, range MessageId) in
// ScanConcurrency segments, each stopping once it has limit entries.
func (s *Store) scanAll(ctx context.Context, index, timeAttr string, q Query, limit int) ([]Entry, error) {
	in := dynamodb.ScanInput{IndexName: aws.String(index), Limit: aws.Int32(int32(limit))}
	if cond, values := timeRange(q); cond != "" {
		in.FilterExpression = aws.String(cond)
		in.ExpressionAttributeNames = map[string]string{"#t": timeAttr}
		in.ExpressionAttributeValues = values
	}
	got := make([][]Entry, s.opts.ScanConcurrency) // per segment
	err := s.scanSegments(ctx, in, func(seg int, out *dynamodb.ScanOutput, _ *dynamodb.ScanInput) bool {
		for _, item := range out.Items {
			got[seg] = append(got[seg], entryOf(item, timeAttr))
		}
		return len(got[seg]) < limit
	})
	return slices.Concat(got...), err
}

// scanSegments scans in.IndexName in ScanConcurrency parallel segments:
// each sends its own copy of in (with its Segment when there are several)
// and follows LastEvaluatedKey while page returns true. page sees each
// response, and the segment's next request to adjust (its Limit); the
// calls of different segments run concurrently.
func (s *Store) scanSegments(ctx context.Context, in dynamodb.ScanInput, page func(seg int, out *dynamodb.ScanOutput, next *dynamodb.ScanInput) bool) error {
	segments := s.opts.ScanConcurrency
	return parallel(ctx, segments, segments, func(ctx context.Context, seg int) error {
		in := in
		in.TableName = s.table
		in.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
		if segments > 1 {
			in.Segment, in.TotalSegments = aws.Int32(int32(seg)), aws.Int32(int32(segments))
		}
		for {
			out, err := s.client.Scan(ctx, &in, s.callOpts...)
			if err != nil {
				return fmt.Errorf("dynamodb: scan %s (segment %d of %d): %w", aws.ToString(in.IndexName), seg, segments, err)
			}
			if !page(seg, out, &in) || len(out.LastEvaluatedKey) == 0 {
				return nil
			}
			in.ExclusiveStartKey = out.LastEvaluatedKey
		}
	})
}

func entryOf(item map[string]types.AttributeValue, timeAttr string) Entry {
	e := Entry{ID: getS(item, attrID), Time: getTime(item, timeAttr)}
	e.Topic, e.Shard, _ = splitTopicShard(getS(item, attrTopicShard))
	return e
}
