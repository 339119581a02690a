package dynamodb

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Dead letters stay in the outbox table: a dead-lettered message has
// DeadLetteredTime, Attempts and LastError set and no Outstanding*
// attributes, so it has left the outstanding indexes (the relay no longer
// sees it) and is listed by the sparse DeadLettered index.

// deadEntries returns the dead letters matching f (Limit ignored), oldest
// failure first: by a consistent BatchGetItem when f.IDs is set, else by a
// parallel Scan of the whole DeadLettered index (sparse, keys and
// TopicShard only).
func (s *Store) deadEntries(ctx context.Context, f outbox.DeadLetterFilter) ([]Entry, error) {
	if f.Topic != "" {
		if err := outbox.ValidateTopic(f.Topic); err != nil {
			return nil, fmt.Errorf("dynamodb: DeadLetterFilter.Topic %w", err)
		}
	}
	var entries []Entry
	if len(f.IDs) > 0 {
		for _, id := range f.IDs {
			if err := outbox.ValidateID(id); err != nil {
				return nil, fmt.Errorf("dynamodb: DeadLetterFilter.IDs: %w", err)
			}
		}
		items, err := s.batchGet(ctx, f.IDs, true, &projection{
			expr:  "#id, #ts, #dlt",
			names: map[string]string{"#id": attrID, "#ts": attrTopicShard, "#dlt": attrDeadLetteredTime},
		})
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			if _, dead := getN(item, attrDeadLetteredTime); dead {
				entries = append(entries, entryOf(item, attrDeadLetteredTime))
			}
		}
	} else {
		var mu sync.Mutex
		err := s.scanSegments(ctx, dynamodb.ScanInput{IndexName: aws.String(s.opts.Indexes.DeadLettered)}, func(_ int, out *dynamodb.ScanOutput, _ *dynamodb.ScanInput) bool {
			mu.Lock()
			defer mu.Unlock()
			for _, item := range out.Items {
				entries = append(entries, entryOf(item, attrDeadLetteredTime))
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	entries = slices.DeleteFunc(entries, func(e Entry) bool {
		return (f.Topic != "" && e.Topic != f.Topic) || (!f.FailedBefore.IsZero() && !e.Time.Before(f.FailedBefore)) ||
			(!f.FailedAfter.IsZero() && e.Time.Before(f.FailedAfter))
	})
	if f.Key != "" || f.ErrorContains != "" {
		var err error
		if entries, err = s.matchDeadItems(ctx, entries, f); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.ID, b.ID))
	})
	return entries, nil
}

// deadItems reads the full items of entries, keeping those still dead.
func (s *Store) deadItems(ctx context.Context, entries []Entry) ([]map[string]types.AttributeValue, error) {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	items, err := s.batchGet(ctx, ids, true, nil)
	if err != nil {
		return nil, err
	}
	var out []map[string]types.AttributeValue
	for _, id := range ids {
		if item, ok := items[id]; ok {
			if _, dead := getN(item, attrDeadLetteredTime); dead {
				out = append(out, item)
			}
		}
	}
	return out, nil
}

// DeadLetters lists up to f.Limit (default 100) matching dead letters,
// oldest failure first.
func (s *Store) DeadLetters(ctx context.Context, f outbox.DeadLetterFilter) ([]outbox.DeadLetter, error) {
	entries, err := s.deadEntries(ctx, f)
	if err != nil {
		return nil, err
	}
	if f.After != nil {
		after := *f.After
		entries = slices.DeleteFunc(entries, func(e Entry) bool {
			return cmp.Or(e.Time.Compare(after.FailedAt), cmp.Compare(e.ID, after.ID)) <= 0
		})
	}
	limit := cmp.Or(f.Limit, storepolicy.DeadLetterLimitDefault)
	if len(entries) > limit {
		entries = entries[:limit]
	}
	items, err := s.deadItems(ctx, entries)
	if err != nil {
		return nil, err
	}
	dls := make([]outbox.DeadLetter, 0, len(items))
	for _, item := range items {
		r, err := recordOf(item)
		if err != nil {
			return nil, err
		}
		dls = append(dls, outbox.DeadLetter{
			Message:   r.Message,
			Attempts:  r.Attempts,
			LastError: r.LastError,
			FailedAt:  getTime(item, attrDeadLetteredTime),
		})
	}
	return dls, nil
}

// Requeue moves every matching dead letter back into the outbox with
// attempts reset and a new Seq (taken now, in the order of their old
// Seqs, so after every message already there and in their own order), one
// conditional UpdateItem each; it returns how many it moved.
func (s *Store) Requeue(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	entries, err := s.deadEntries(ctx, f)
	if err != nil {
		return 0, err
	}
	items, err := s.deadItems(ctx, entries)
	if err != nil {
		return 0, err
	}
	slices.SortFunc(items, func(a, b map[string]types.AttributeValue) int {
		sa, _ := getN(a, attrSeq)
		sb, _ := getN(b, attrSeq)
		return cmp.Compare(sa, sb)
	})
	seqs := make([]int64, len(items))
	for i := range items {
		seqs[i] = s.seq.next(s.opts.Now())
	}
	var moved atomic.Int64
	err = parallel(ctx, len(items), s.opts.Concurrency, func(ctx context.Context, i int) error {
		id := getS(items[i], attrID)
		_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:           s.table,
			Key:                 keyOf(id),
			UpdateExpression:    aws.String("SET #oct = #ct, #oseq = :seq, #seq = :seq, #att = :zero REMOVE #dlt, #next, #err"),
			ConditionExpression: aws.String("attribute_exists(#dlt)"),
			ExpressionAttributeNames: map[string]string{
				"#oct": attrOutstandingCreatedTime, "#ct": attrCreatedTime, "#oseq": attrOutstandingSeq,
				"#seq": attrSeq, "#att": attrAttempts, "#dlt": attrDeadLetteredTime,
				"#next": attrNextAttemptTime, "#err": attrLastError,
			},
			ExpressionAttributeValues: map[string]types.AttributeValue{":seq": num(seqs[i]), ":zero": num(0)},
			ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if isConditionFailed(err) {
			return nil // requeued or purged meanwhile
		}
		if err != nil {
			return fmt.Errorf("dynamodb: requeue %s: %w", id, err)
		}
		moved.Add(1)
		return nil
	})
	return moved.Load(), err
}

// PurgeDeadLetters deletes every matching dead letter for good, one
// DeleteItem each, conditional on the message still being dead (so a
// message requeued meanwhile survives); it returns how many it deleted.
func (s *Store) PurgeDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	entries, err := s.deadEntries(ctx, f)
	if err != nil {
		return 0, err
	}
	var deleted atomic.Int64
	err = parallel(ctx, len(entries), s.opts.Concurrency, func(ctx context.Context, i int) error {
		_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName:                s.table,
			Key:                      keyOf(entries[i].ID),
			ConditionExpression:      aws.String("attribute_exists(#dlt)"),
			ExpressionAttributeNames: map[string]string{"#dlt": attrDeadLetteredTime},
			ReturnConsumedCapacity:   types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if isConditionFailed(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dynamodb: purge %s: %w", entries[i].ID, err)
		}
		deleted.Add(1)
		return nil
	})
	return deleted.Load(), err
}
