package dynamodb

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

var (
	_ outbox.BacklogReader = (*Store)(nil)
	_ outbox.LeaseReader   = (*Store)(nil)
)

// Backlog measures the backlog for gauges with a bounded number of
// requests (see [outbox.BacklogReader]): a parallel Scan of the
// Outstanding index (keys only, ScanConcurrency segments) that stops after
// limit entries; when it stops early, one Query (Limit 1) of the Shard
// index per partition and one BatchGetItem of those heads, so that the
// oldest message is exact; a Scan of DeadLettered with Select=COUNT that
// stops at limit; the lease items and the heartbeat item. An outbox with
// fewer than limit outstanding messages costs the Scan pages of its index
// entries (about 100 bytes each) and no Query.
func (s *Store) Backlog(ctx context.Context, limit int) (*outbox.Backlog, error) {
	if limit < 1 || limit > outbox.BacklogScanLimitMax {
		return nil, fmt.Errorf("dynamodb: backlog: limit must be between 1 and %d, got %d", outbox.BacklogScanLimitMax, limit)
	}
	p, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	topics, complete, err := s.sampleOutstanding(ctx, limit)
	if err != nil {
		return nil, err
	}
	b := &outbox.Backlog{}
	for _, t := range topics {
		b.Outstanding += t.Outstanding
	}
	b.Topics = topics
	b.Exact = complete && len(topics) <= outbox.BacklogTopicsMax
	if len(b.Topics) > outbox.BacklogTopicsMax {
		b.Topics = b.Topics[:outbox.BacklogTopicsMax]
	}
	var heads []outbox.TopicBacklog
	if !complete {
		if heads, err = s.heads(ctx, p); err != nil {
			return nil, err
		}
	}
	b.AddHeads(heads)
	if !complete {
		b.Exact = false
	}
	if b.DeadLetters, err = s.countIndexUpTo(ctx, s.opts.Indexes.DeadLettered, int64(limit)); err != nil {
		return nil, err
	}
	if b.Leases, err = s.leaseCounts(ctx, p); err != nil {
		return nil, err
	}
	return b, nil
}

// Leases reads, per live relay node, the unexpired partition leases it
// holds, a live node holding none with zero (see [outbox.LeaseReader]): the
// figures Backlog reports in its Leases, from the lease items and the
// heartbeat item alone (one BatchGetItem per 100 partitions and one
// GetItem).
func (s *Store) Leases(ctx context.Context) (map[string]int, error) {
	p, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	return s.leaseCounts(ctx, p)
}

// leaseCounts returns the leases each node holds, for the p partitions:
// every live node, and every node holding an unexpired lease.
func (s *Store) leaseCounts(ctx context.Context, p int) (map[string]int, error) {
	held, live, _, err := s.leaseOwners(ctx, p)
	if err != nil {
		return nil, err
	}
	leases := make(map[string]int, len(live)+len(held))
	for node := range live {
		leases[node] = held[node]
	}
	for node, n := range held {
		leases[node] = n
	}
	return leases, nil
}

// sampleOutstanding scans the Outstanding index until it has read limit
// entries, and returns the count and oldest entry per topic, in topic
// order, and whether it read the whole index.
func (s *Store) sampleOutstanding(ctx context.Context, limit int) ([]outbox.TopicBacklog, bool, error) {
	var (
		mu       sync.Mutex
		read     int
		complete = true
		byTopic  = map[string]*outbox.TopicBacklog{}
	)
	in := dynamodb.ScanInput{IndexName: aws.String(s.opts.Indexes.Outstanding), Limit: aws.Int32(int32(min(limit, math.MaxInt32)))}
	err := s.scanSegments(ctx, in, func(_ int, out *dynamodb.ScanOutput, next *dynamodb.ScanInput) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, item := range out.Items {
			e := entryOf(item, attrOutstandingCreatedTime)
			t := byTopic[e.Topic]
			if t == nil {
				t = &outbox.TopicBacklog{Topic: e.Topic, OldestCreatedAt: e.Time}
				byTopic[e.Topic] = t
			}
			t.Outstanding++
			if e.Time.Before(t.OldestCreatedAt) {
				t.OldestCreatedAt = e.Time
			}
		}
		read += len(out.Items)
		left := limit - read
		if left <= 0 {
			if len(out.LastEvaluatedKey) > 0 {
				complete = false // this segment has more
			}
			return false
		}
		next.Limit = aws.Int32(int32(min(left, math.MaxInt32)))
		return true
	})
	if err != nil {
		return nil, false, err
	}
	topics := make([]outbox.TopicBacklog, 0, len(byTopic))
	for _, t := range byTopic {
		topics = append(topics, *t)
	}
	slices.SortFunc(topics, func(a, b outbox.TopicBacklog) int { return cmp.Compare(a.Topic, b.Topic) })
	return topics, complete, nil
}

// heads returns the first outstanding message (lowest Seq) of each
// partition that has one: a Query of the Shard index per partition, then
// one consistent BatchGetItem for their topics and creation times.
func (s *Store) heads(ctx context.Context, p int) ([]outbox.TopicBacklog, error) {
	first := make([]string, p)
	err := parallel(ctx, p, s.opts.Concurrency, func(ctx context.Context, i int) error {
		refs, err := s.queryShard(ctx, i, math.MaxInt64, false, 1)
		if len(refs) > 0 {
			first[i] = refs[0].id
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	ids := slices.DeleteFunc(first, func(id string) bool { return id == "" })
	if len(ids) == 0 {
		return nil, nil
	}
	items, err := s.batchGet(ctx, ids, true, nil)
	if err != nil {
		return nil, err
	}
	heads := make([]outbox.TopicBacklog, 0, len(items))
	for _, item := range items {
		r, err := recordOf(item)
		if err != nil {
			return nil, err
		}
		heads = append(heads, outbox.TopicBacklog{Topic: r.Topic, Outstanding: 1, OldestCreatedAt: r.CreatedAt})
	}
	return heads, nil
}

// countIndexUpTo counts the entries of an index with Scans of
// Select=COUNT, stopping once it has counted max.
func (s *Store) countIndexUpTo(ctx context.Context, index string, max int64) (int64, error) {
	var total int64
	in := &dynamodb.ScanInput{
		TableName:              s.table,
		IndexName:              aws.String(index),
		Select:                 types.SelectCount,
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}
	for total < max {
		if max-total < math.MaxInt32 {
			in.Limit = aws.Int32(int32(max - total))
		}
		out, err := s.client.Scan(ctx, in, s.callOpts...)
		if err != nil {
			return 0, fmt.Errorf("dynamodb: count %s: %w", index, err)
		}
		total += int64(out.Count)
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	return min(total, max), nil
}
