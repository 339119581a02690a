package dynamodb

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// shardRef is an entry of the Shard index.
type shardRef struct {
	id  string
	seq int64
}

// queryShard queries the Shard index (hash Shard, range OutstandingSeq) of
// partition p for entries with OutstandingSeq > after (above; and written
// at least FetchDelay ago) or ≤ after, in Seq order, up to limit entries
// (0: all).
func (s *Store) queryShard(ctx context.Context, p int, after int64, above bool, limit int) ([]shardRef, error) {
	cond := "#shard = :p AND #seq <= :after"
	values := map[string]types.AttributeValue{":p": num(int64(p)), ":after": num(after)}
	if above {
		cond = "#shard = :p AND #seq > :after"
		if s.opts.FetchDelay > 0 {
			upper := maxSeqAt(s.opts.Now().Add(-s.opts.FetchDelay))
			if upper <= after {
				return nil, nil // nothing old enough above the cursor
			}
			cond = "#shard = :p AND #seq BETWEEN :lo AND :hi"
			values = map[string]types.AttributeValue{":p": num(int64(p)), ":lo": num(after + 1), ":hi": num(upper)}
		}
	}
	in := &dynamodb.QueryInput{
		TableName:                 s.table,
		IndexName:                 aws.String(s.opts.Indexes.Shard),
		KeyConditionExpression:    aws.String(cond),
		ExpressionAttributeNames:  map[string]string{"#shard": attrShard, "#seq": attrOutstandingSeq},
		ExpressionAttributeValues: values,
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}
	var refs []shardRef
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(limit - len(refs)))
		}
		out, err := s.client.Query(ctx, in, s.callOpts...)
		if err != nil {
			return nil, fmt.Errorf("dynamodb: query %s for partition %d: %w", s.opts.Indexes.Shard, p, err)
		}
		for _, item := range out.Items {
			seq, _ := getN(item, attrOutstandingSeq)
			refs = append(refs, shardRef{id: getS(item, attrID), seq: seq})
		}
		if len(out.LastEvaluatedKey) == 0 || (limit > 0 && len(refs) >= limit) {
			return refs, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// Fetch queries the Shard index of each cursor's partition (concurrently)
// for up to limit entries with OutstandingSeq > After, then reads the items
// with consistent BatchGetItems and returns those still outstanding, in Seq
// order per cursor. The second step matters: global secondary indexes are
// eventually consistent, so the index may still list a message this relay
// has just settled (deleted, dispatched or dead-lettered); the consistent
// read drops it, so a relay never publishes twice what it has settled.
// (The price is one read unit per 4 KB of each fetched item, which the
// relay needs anyway for the payload: the index holds keys only.) A
// message the index does not show yet is fetched later, by Fetch or, if
// the cursor has moved past its Seq meanwhile, through Unsettled.
//
// Messages written less than Options.FetchDelay ago are held back (see
// there): index entries do not appear in write order, and the delay makes
// every message written before a fetched one visible to the same fetch.
//
// Fewer than limit records may come back when index entries were stale;
// the relay fetches again.
func (s *Store) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if limit < 1 {
		return nil, fmt.Errorf("dynamodb: Fetch: limit must be positive, got %d", limit)
	}
	refs := make([][]shardRef, len(cursors))
	err := parallel(ctx, len(cursors), s.opts.Concurrency, func(ctx context.Context, i int) error {
		r, err := s.queryShard(ctx, cursors[i].Partition, cursors[i].After, true, limit)
		refs[i] = r
		return err
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, rs := range refs {
		for _, r := range rs {
			ids = append(ids, r.id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	items, err := s.batchGet(ctx, ids, true, nil)
	if err != nil {
		return nil, err
	}
	var recs []outbox.Record
	for i, c := range cursors {
		start := len(recs)
		for _, r := range refs[i] {
			item, ok := items[r.id]
			if !ok {
				continue // deleted
			}
			seq, ok := getN(item, attrOutstandingSeq)
			if !ok || seq <= c.After {
				continue // settled, or requeued below the cursor
			}
			rec, err := recordOf(item)
			if err != nil {
				return nil, err
			}
			if rec.Partition != c.Partition {
				continue
			}
			rec.Seq = seq
			recs = append(recs, rec)
		}
		slices.SortFunc(recs[start:], func(a, b outbox.Record) int {
			return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.ID, b.ID))
		})
	}
	return recs, nil
}

// Unsettled queries the Shard index of each cursor's partition for every
// entry with OutstandingSeq ≤ After. It reads the index only (keys): the
// relay asks for this every sweep, and entries below its cursors are mostly
// records it holds, so confirming each with a consistent read cost about
// five read units per message relayed. An entry the (eventually
// consistent) index still shows for a record settled a moment ago may be
// reported; the relay fetches what it does not know with Fetch, which
// confirms with a consistent read before returning anything.
func (s *Store) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	refs := make([][]shardRef, len(cursors))
	err := parallel(ctx, len(cursors), s.opts.Concurrency, func(ctx context.Context, i int) error {
		r, err := s.queryShard(ctx, cursors[i].Partition, cursors[i].After, false, 0)
		refs[i] = r
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []outbox.RecordRef
	for i, c := range cursors {
		start := len(out)
		for _, r := range refs[i] {
			if r.seq > c.After {
				continue
			}
			out = append(out, outbox.RecordRef{ID: r.id, Partition: c.Partition, Seq: r.seq})
		}
		slices.SortFunc(out[start:], func(a, b outbox.RecordRef) int {
			return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.ID, b.ID))
		})
	}
	return out, nil
}

// Settle fences, then applies, each settlement.
//
// Fencing: dynalite has no TransactWriteItems, and a condition expression
// can only look at the item it writes, so the lease cannot be checked in
// the same request as the message updates. Settle reads every lease
// involved with one consistent BatchGetItem and applies only the
// settlements whose lease node holds with their epoch. The window between
// that read and the writes is a few milliseconds, and matters only if the
// lease expires and another relay takes it in that window; the relay stops
// publishing well before its lease can expire, and the writes are
// harmless even then: deleting or marking dispatched a message the broker
// acknowledged is right whoever does it, and a stale retry or
// dead-letter update at worst delays or parks a message the new owner
// would have published again.
//
// Applying: delivered messages are deleted with BatchWriteItem (or, with
// Retention, marked dispatched with an UpdateItem each); failures get an
// UpdateItem each (SET Attempts, NextAttemptTime, LastError), dead letters
// too (SET DeadLetteredTime REMOVE OutstandingCreatedTime,
// OutstandingSeq), both conditional on the message still being
// outstanding. Every write is idempotent, so a settlement is not atomic
// but can be applied again: if Settle fails midway, the relay's retry of
// the same settlement completes it.
func (s *Store) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	var parts []int
	for _, st := range settlements {
		if !st.Empty() && !slices.Contains(parts, st.Partition) {
			parts = append(parts, st.Partition)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	leases, err := s.readLeases(ctx, parts)
	if err != nil {
		return err
	}
	var fenced []outbox.Lease
	var delivered []string
	var ops []func(context.Context) error
	now := s.opts.Now()
	for _, st := range settlements {
		if st.Empty() {
			continue
		}
		if l := leases[st.Partition]; l.owner != node || l.epoch != st.Epoch {
			fenced = append(fenced, st.Lease)
			continue
		}
		delivered = append(delivered, st.Delivered...)
		for _, f := range st.Retry {
			ops = append(ops, func(ctx context.Context) error { return s.recordFailure(ctx, f) })
		}
		for _, f := range st.Dead {
			ops = append(ops, func(ctx context.Context) error { return s.deadLetter(ctx, f, now) })
		}
	}
	if len(delivered) > 0 {
		if s.opts.Retention == 0 {
			ops = append(ops, func(ctx context.Context) error { return s.batchDelete(ctx, delivered) })
		} else {
			for _, id := range delivered {
				ops = append(ops, func(ctx context.Context) error {
					if err := s.markDispatched(ctx, id, now); err != nil && !isConditionFailed(err) {
						return err
					}
					return nil
				})
			}
		}
	}
	err = parallel(ctx, len(ops), s.opts.Concurrency, func(ctx context.Context, i int) error { return ops[i](ctx) })
	if err != nil {
		return err
	}
	if len(fenced) > 0 {
		return &outbox.FencedError{Leases: fenced}
	}
	return nil
}

// recordFailure records a failed attempt of an outstanding message.
func (s *Store) recordFailure(ctx context.Context, f outbox.Failure) error {
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           s.table,
		Key:                 keyOf(f.ID),
		UpdateExpression:    aws.String("SET #att = :att, #next = :next, #err = :err"),
		ConditionExpression: aws.String("attribute_exists(#oseq)"),
		ExpressionAttributeNames: map[string]string{
			"#att": attrAttempts, "#next": attrNextAttemptTime, "#err": attrLastError, "#oseq": attrOutstandingSeq,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":att": num(int64(f.Attempts)), ":next": micros(f.NextAttemptAt), ":err": errorValue(f.Err),
		},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: record failure of %s: %w", f.ID, err)
	}
	return nil
}

// deadLetter moves an outstanding message to the dead letters: it leaves
// the outstanding indexes and enters DeadLettered.
func (s *Store) deadLetter(ctx context.Context, f outbox.Failure, now time.Time) error {
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           s.table,
		Key:                 keyOf(f.ID),
		UpdateExpression:    aws.String("SET #dlt = :now, #att = :att, #err = :err REMOVE #oct, #oseq, #next"),
		ConditionExpression: aws.String("attribute_exists(#oseq)"),
		ExpressionAttributeNames: map[string]string{
			"#dlt": attrDeadLetteredTime, "#att": attrAttempts, "#err": attrLastError,
			"#oct": attrOutstandingCreatedTime, "#oseq": attrOutstandingSeq, "#next": attrNextAttemptTime,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":now": micros(now), ":att": num(int64(f.Attempts)), ":err": errorValue(f.Err),
		},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: dead-letter %s: %w", f.ID, err)
	}
	return nil
}

// errorValue is the LastError attribute for an error text (never empty:
// older DynamoDB-compatible servers refuse empty strings).
func errorValue(e string) types.AttributeValue {
	if e == "" {
		e = "(no error text)"
	}
	return str(storepolicy.ErrorText(e))
}
