// Package storetest is the conformance suite of outbox stores. Every store of
// this module runs it against a real server, and so can a user's own store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			s := openFreshMigratedStore(t) // isolated: its own database, schema or table
//			return storetest.Harness{
//				Store:      s,
//				Write:      func(ctx context.Context, msgs ...outbox.Message) error { /* one transaction */ },
//				Partitions: 8,
//			}
//		})
//	}
//
// # What it checks
//
// The outbox.Store contract: messages round-trip every field (created_at to
// the microsecond); Seq increases in write order within a partition;
// Partition is outbox.PartitionOf(Key, P); Fetch honours After and its
// per-cursor limit; leases are acquired, renewed, released, taken over
// after expiry with a higher epoch, and split between nodes; Settle
// delivers, retries and dead-letters, and is fenced by lease and epoch;
// Unsettled; Heartbeat counts live nodes. For an outbox.StreamStore the
// same without the lease checks, and instead: one node at a time holds
// the stream, the next takes it over on Release with a higher epoch, and
// settlements of a former hold are fenced. The optional abilities are checked
// when the store implements them: outbox.UnorderedStore (concurrent claims
// never overlap; released records come back), outbox.BacklogReader (exact
// figures under the limit, a sample that says so above it),
// outbox.LeaseReader (the leases of each live node, as Backlog reports
// them; not on a stream),
// outbox.AdminStore (status counts; dead letters listed, filtered by
// topic, ID, key, error text and time, paged, counted, requeued and purged;
// messages found by ID and key), outbox.PartitionNotifier (fn(nil)
// once subscribed; a write signals its partition or nil; it returns nil
// when ctx ends), outbox.MarkedFetcher (without a mark it is Fetch; a mark
// does not bring back what its fetch saw; late commits below a cursor need
// interleaved transactions, which a Harness cannot express: test them in
// the store's own package). outbox.Cleaner is not checked: retention needs
// store-specific configuration, so each store tests it itself.
//
// # What it assumes
//
// Seq is positive, so a cursor with After 0 reads a partition from its
// start. The store's payload limit is the default, outbox.MaxPayloadDefault
// (a larger payload must be refused). The store's clock is close to the test's (within a second) for
// CreatedAt set by Write. The store can hold three open claims and a few
// other calls at once. Subtests run in parallel, each with its own harness.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// Harness is one fresh store under test.
type Harness struct {
	// Store is a fresh, isolated, migrated store with no messages: an
	// outbox.Store or an outbox.StreamStore.
	Store outbox.Source
	// Write commits msgs in one transaction of the store's own kind, with
	// the store's Write function. It must return the store's validation
	// errors as they are (wrapping *outbox.ValidationError).
	Write func(ctx context.Context, msgs ...outbox.Message) error
	// Partitions is P, as configured at migration.
	Partitions int
	// Sync, if not nil, waits until every write committed before the call
	// can be fetched, for stores that capture asynchronously (the WAL
	// capture of store/postgres). The suite calls it after each write and
	// requeue.
	Sync func(ctx context.Context) error
}

// Timeouts of the suite.
const (
	// testTimeout bounds each subtest.
	testTimeout = 2 * time.Minute
	// waitTimeout bounds each wait for a condition (an expiry, a signal).
	waitTimeout = 20 * time.Second
	// longTTL is a lease and heartbeat time to live that never expires
	// during a test; shortTTL one that expires quickly.
	longTTL  = 10 * time.Minute
	shortTTL = 300 * time.Millisecond
	// fetchAll is the per-cursor limit used to read whole partitions.
	fetchAll = 10000
)

// Run runs the suite. newHarness is called once per subtest, from the
// subtest's goroutine, and must return a fresh, isolated, migrated store
// (cleaned up with t.Cleanup).
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(*suite)
	}{
		{"Partitions", testPartitions},
		{"RoundTrip", testRoundTrip},
		{"SeqOrderAndPartition", testSeqOrder},
		{"FetchAfterAndLimit", testFetchAfterLimit},
		{"WriteValidation", testWriteValidation},
		{"Leases", testLeases},
		{"LeaseExpiryTakeover", testLeaseExpiry},
		{"LeasesSplitBetweenNodes", testLeaseSplit},
		{"LeasesConcurrentAcquire", testLeaseConcurrent},
		{"LeaveReleasesOnlyItsEpochs", testLeaveOwnEpochs},
		{"Settle", testSettle},
		{"SettleFenced", testSettleFenced},
		{"Unsettled", testUnsettled},
		{"Heartbeat", testHeartbeat},
		{"Unordered", testUnordered},
		{"Status", testStatus},
		{"Backlog", testBacklog},
		{"LeaseReader", testLeaseReader},
		{"DeadLetters", testDeadLetters},
		{"RequeueInSeqOrder", testRequeueSeqOrder},
		{"Admin", testAdmin},
		{"Subscribe", testSubscribe},
		{"FetchMarked", testFetchMarked},
		{"StreamHold", testStreamHold},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Write == nil || h.Partitions < 1 {
				t.Fatalf("storetest: the harness needs Store, Write and Partitions >= 1, got %+v", h)
			}
			ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
			defer cancel()
			ls, _ := h.Store.(outbox.Store)
			st, _ := h.Store.(outbox.StreamStore)
			if (ls == nil) == (st == nil) {
				t.Fatalf("storetest: the harness's Store %T must be an outbox.Store or an outbox.StreamStore (and not both)", h.Store)
			}
			tc.fn(&suite{T: t, h: h, src: h.Store, s: ls, st: st, p: h.Partitions, ctx: ctx})
		})
	}
}
