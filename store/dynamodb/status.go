package dynamodb

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// Status is the store's status: the portable snapshot plus the requests
// this Store has made so far, per DynamoDB operation.
type Status struct {
	outbox.Status
	Requests map[string]OpStats `json:"requests"`
}

// DetailedStatus returns Status with the request statistics (Stats) of
// this store, for `outbox status` and the benchmark.
func (s *Store) DetailedStatus(ctx context.Context) (*Status, error) {
	st, err := s.Status(ctx)
	if err != nil {
		return nil, err
	}
	return &Status{Status: *st, Requests: s.Stats()}, nil
}

// Status describes the backlog, leases and relays. It scans the whole
// Outstanding index (keys only, in ScanConcurrency segments) to count per
// topic and partition, so its cost grows with the backlog: about half a
// read unit per 4 KB of index entries (~100 bytes each). It counts dead
// letters with a Scan of DeadLettered (Select=COUNT), and reads the lease
// and heartbeat items.
func (s *Store) Status(ctx context.Context) (*outbox.Status, error) {
	p, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	st := &outbox.Status{Topics: []outbox.TopicCount{}, Relays: []outbox.RelayStatus{}}
	perTopic := map[string]int64{}
	topicOldest := map[string]time.Time{}
	perShard := make([]int64, p)
	var oldest time.Time
	var mu sync.Mutex
	err = s.scanSegments(ctx, dynamodb.ScanInput{IndexName: aws.String(s.opts.Indexes.Outstanding)}, func(_ int, out *dynamodb.ScanOutput, _ *dynamodb.ScanInput) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, item := range out.Items {
			e := entryOf(item, attrOutstandingCreatedTime)
			perTopic[e.Topic]++
			if t, ok := topicOldest[e.Topic]; !ok || e.Time.Before(t) {
				topicOldest[e.Topic] = e.Time
			}
			if e.Shard >= 0 && e.Shard < p {
				perShard[e.Shard]++
			}
			if oldest.IsZero() || e.Time.Before(oldest) {
				oldest = e.Time
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	for topic, n := range perTopic {
		st.Outstanding += n
		st.Topics = append(st.Topics, outbox.TopicCount{Topic: topic, Count: n, OldestCreatedAt: topicOldest[topic]})
	}
	slices.SortFunc(st.Topics, func(a, b outbox.TopicCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Topic, b.Topic))
	})
	st.OldestCreatedAt = oldest

	if st.DeadLetters, err = s.countIndex(ctx, s.opts.Indexes.DeadLettered); err != nil {
		return nil, err
	}

	held, live, leases, err := s.leaseOwners(ctx, p)
	if err != nil {
		return nil, err
	}
	now := s.opts.Now()
	for i := range p {
		ps := outbox.PartitionStatus{Partition: i, Outstanding: perShard[i]}
		if l, ok := leases[i]; ok {
			ps.Epoch = l.epoch
			if l.owner != "" && l.expiry.After(now) {
				ps.Owner, ps.LeaseExpiresAt = l.owner, l.expiry
			}
		}
		st.Partitions = append(st.Partitions, ps)
	}
	for node, exp := range live {
		st.Relays = append(st.Relays, outbox.RelayStatus{Node: node, ExpiresAt: exp, Partitions: held[node]})
	}
	slices.SortFunc(st.Relays, func(a, b outbox.RelayStatus) int { return cmp.Compare(a.Node, b.Node) })
	st.Requests = s.RequestStats()
	return st, nil
}

// countIndex counts the entries of an index with Scans of Select=COUNT.
func (s *Store) countIndex(ctx context.Context, index string) (int64, error) {
	return s.countIndexUpTo(ctx, index, math.MaxInt64)
}

// leaseOwners reads every lease item and the heartbeat item: the leases
// each node holds unexpired, the live nodes with their expiry, and the
// lease items by partition.
func (s *Store) leaseOwners(ctx context.Context, p int) (held map[string]int, live map[string]time.Time, leases map[int]leaseItem, err error) {
	leases, err = s.readLeases(ctx, allPartitions(p))
	if err != nil {
		return nil, nil, nil, err
	}
	now := s.opts.Now()
	held = map[string]int{}
	for _, l := range leases {
		if l.owner != "" && l.expiry.After(now) {
			held[l.owner]++
		}
	}
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:              s.table,
		Key:                    keyOf(nodesKey),
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dynamodb: read relay heartbeats: %w", err)
	}
	live, _ = liveNodes(out.Item, now)
	return held, live, leases, nil
}

var _ outbox.RequestCounter = (*Store)(nil)

// RequestStats implements outbox.RequestCounter: Stats in the portable form,
// for `outbox status` and the metrics adapters.
func (s *Store) RequestStats() map[string]outbox.RequestStats {
	out := map[string]outbox.RequestStats{}
	for op, o := range s.Stats() {
		out[op] = outbox.RequestStats{Requests: o.Requests, Errors: o.Errors, ConsumedCapacity: o.ConsumedCapacity}
	}
	return out
}
