package bench

import (
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox"
)

// RelayTimes sums the durations our relay reports to its hook during a
// run: how many store fetches, Publish calls and settles it made and how
// long they took in total (concurrent calls overlap, so the sums can
// exceed the run's duration).
type RelayTimes struct {
	Fetches        int64         `json:"fetches"`
	FetchedRecords int64         `json:"fetched_records"`
	FetchTime      time.Duration `json:"fetch_ns"`
	Publishes      int64         `json:"publishes"`
	Published      int64         `json:"published"`
	PublishTime    time.Duration `json:"publish_ns"`
	Settles        int64         `json:"settles"`
	SettleTime     time.Duration `json:"settle_ns"`
	StoreErrors    int64         `json:"store_errors"`
}

// relayClock is a relay hook that fills RelayTimes. It does not block.
type relayClock struct {
	fetches, fetched, fetchNs       atomic.Int64
	publishes, published, publishNs atomic.Int64
	settles, settleNs, storeErrors  atomic.Int64
}

func (c *relayClock) hook(e outbox.Event) {
	switch e.Kind {
	case outbox.EventFetched:
		c.fetches.Add(1)
		c.fetched.Add(int64(e.Count))
		c.fetchNs.Add(int64(e.Duration))
	case outbox.EventPublished:
		// One event per topic per Publish call; the bench uses one topic.
		c.publishes.Add(1)
		c.published.Add(int64(e.Count))
		c.publishNs.Add(int64(e.Duration))
	case outbox.EventSettled:
		c.settles.Add(1)
		c.settleNs.Add(int64(e.Duration))
	case outbox.EventStoreError:
		c.storeErrors.Add(1)
	}
}

func (c *relayClock) times() *RelayTimes {
	return &RelayTimes{
		Fetches: c.fetches.Load(), FetchedRecords: c.fetched.Load(), FetchTime: time.Duration(c.fetchNs.Load()),
		Publishes: c.publishes.Load(), Published: c.published.Load(), PublishTime: time.Duration(c.publishNs.Load()),
		Settles: c.settles.Load(), SettleTime: time.Duration(c.settleNs.Load()),
		StoreErrors: c.storeErrors.Load(),
	}
}
