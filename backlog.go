package outbox

import (
	"context"
	"slices"
	"strings"
	"time"
)

// Defaults and limits of the backlog a [BacklogReader] measures.
const (
	// BacklogScanLimitDefault is how many outstanding messages (and dead
	// letters) a Backlog call reads at most: beyond it the per-topic
	// figures are a sample (Backlog.Exact is false).
	BacklogScanLimitDefault = 100_000
	// BacklogScanLimitMax is the largest limit accepted.
	BacklogScanLimitMax = 100_000_000
	// BacklogTopicsMax bounds the topics a Backlog reports; the others are
	// left out (Backlog.Exact is false).
	BacklogTopicsMax = 1000
)

// Backlog is a store's backlog measured with a bounded cost, for gauges
// refreshed on an interval ([BacklogReader]).
type Backlog struct {
	// Topics holds, per topic with outstanding messages, how many there are
	// and the creation time of the oldest, in topic order.
	Topics []TopicBacklog `json:"topics"`
	// Outstanding is the number of outstanding messages counted (all of
	// them when Exact).
	Outstanding int64 `json:"outstanding"`
	// Exact is true when every outstanding message was counted. When the
	// backlog is larger than the limit, the counts are those of a sample
	// of limit messages (lower bounds), and a topic's oldest message is the
	// oldest of the sample and of the heads of the partitions.
	Exact bool `json:"exact"`
	// OldestCreatedAt is the CreatedAt of the oldest outstanding message
	// (the oldest of the partitions' first messages in write order), exact
	// whatever the backlog; zero when there is none.
	OldestCreatedAt time.Time `json:"oldest_created_at,omitzero"`
	// DeadLetters is the number of dead letters, counted up to the limit.
	DeadLetters int64 `json:"dead_letters"`
	// Leases holds, per live relay node, the partition leases it holds
	// (unexpired); a node holding none is listed with zero.
	Leases map[string]int `json:"leases"`
}

// TopicBacklog is one topic's part of a [Backlog].
type TopicBacklog struct {
	Topic           string    `json:"topic"`
	Outstanding     int64     `json:"outstanding"`
	OldestCreatedAt time.Time `json:"oldest_created_at"`
}

// BacklogReader is implemented by stores that measure their backlog with
// a cost bounded by limit, whatever the size of the outbox: at most limit
// outstanding messages and limit dead letters are read, plus one index
// probe per partition and one row per partition lease. The metrics
// adapters call it on an interval (package metrics/backlog). limit is
// between 1 and BacklogScanLimitMax.
type BacklogReader interface {
	Backlog(ctx context.Context, limit int) (*Backlog, error)
}

// LeaseReader is implemented by stores that read the partition leases
// alone, without measuring the backlog: per live relay node, the
// unexpired leases it holds, a live node holding none listed with zero
// (the same figures as [Backlog].Leases, read the same way). Its cost is
// one row per partition lease and one per relay, whatever the size of the
// outbox; the backlog monitor (package metrics/backlog) uses it to update
// its lease gauges soon after partitions move, without a backlog read.
type LeaseReader interface {
	Leases(ctx context.Context) (map[string]int, error)
}

// AddHeads completes a Backlog whose Topics hold a sample with the first
// message (in write order) of each partition, for [BacklogReader]
// implementations (heads may be nil when the sample holds every message):
// a topic's oldest message becomes the older of its sampled one and its
// heads', a topic found only at a partition's head is listed with one
// message, and OldestCreatedAt becomes the oldest of all. Topics stay in
// topic order, at most BacklogTopicsMax of them.
func (b *Backlog) AddHeads(heads []TopicBacklog) {
	byTopic := make(map[string]int, len(b.Topics))
	for i, t := range b.Topics {
		byTopic[t.Topic] = i
		if b.OldestCreatedAt.IsZero() || t.OldestCreatedAt.Before(b.OldestCreatedAt) {
			b.OldestCreatedAt = t.OldestCreatedAt
		}
	}
	for _, h := range heads {
		if b.OldestCreatedAt.IsZero() || h.OldestCreatedAt.Before(b.OldestCreatedAt) {
			b.OldestCreatedAt = h.OldestCreatedAt
		}
		i, ok := byTopic[h.Topic]
		switch {
		case ok:
			if h.OldestCreatedAt.Before(b.Topics[i].OldestCreatedAt) {
				b.Topics[i].OldestCreatedAt = h.OldestCreatedAt
			}
		case len(b.Topics) < BacklogTopicsMax:
			byTopic[h.Topic] = len(b.Topics)
			b.Topics = append(b.Topics, TopicBacklog{Topic: h.Topic, Outstanding: 1, OldestCreatedAt: h.OldestCreatedAt})
			b.Outstanding++
			b.Exact = false // the sample missed it
		}
	}
	if b.Topics == nil {
		b.Topics = []TopicBacklog{}
	}
	slices.SortFunc(b.Topics, func(x, y TopicBacklog) int { return strings.Compare(x.Topic, y.Topic) })
}
