package dynamodb

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// staleIndex makes every Query of the Shard index also return the given
// entries, as an eventually consistent GSI does for a moment after their
// items were settled.
func staleIndex(index string, stale []shardRef, partition int) func(string, map[string]any) (map[string]any, func(map[string]any)) {
	return func(op string, req map[string]any) (map[string]any, func(map[string]any)) {
		if op != "Query" || req["IndexName"] != index {
			return nil, nil
		}
		return nil, func(resp map[string]any) {
			items, _ := resp["Items"].([]any)
			for _, r := range stale {
				items = append(items, map[string]any{
					attrID:             map[string]any{"S": r.id},
					attrShard:          map[string]any{"N": strconv.Itoa(partition)},
					attrOutstandingSeq: map[string]any{"N": strconv.FormatInt(r.seq, 10)},
				})
			}
			resp["Items"] = items
			resp["Count"] = len(items)
		}
	}
}

// TestFetchDropsStaleIndexEntries checks the guard against GSI lag: index
// entries of messages already settled (deleted, dispatched with retention,
// dead-lettered) are re-read consistently and dropped, by Fetch and by
// Unsettled, so a relay never publishes again what it settled.
func TestFetchDropsStaleIndexEntries(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		t.Run("retention="+retention.String(), func(t *testing.T) {
			t.Parallel()
			inj := newInjector(t)
			s := newStore(t, Options{HTTPClient: inj, Shards: 1, Retention: retention})
			ctx := ctxT(t)
			msgs := []*outbox.Message{{Topic: "t.stale", Key: "k"}, {Topic: "t.stale", Key: "k"}, {Topic: "t.stale", Key: "k"}}
			mustWrite(t, s, msgs...)
			leases, err := s.AcquireLeases(ctx, "n1", nil, 1, time.Minute)
			if err != nil || len(leases) != 1 {
				t.Fatalf("AcquireLeases = %v, %v", leases, err)
			}
			cur := []outbox.Cursor{{Lease: leases[0]}}
			recs, err := s.Fetch(ctx, cur, 10)
			if err != nil || len(recs) != 3 {
				t.Fatalf("Fetch = %d records, %v; want 3", len(recs), err)
			}
			var stale []shardRef
			for _, r := range recs[:2] {
				stale = append(stale, shardRef{id: r.ID, seq: r.Seq})
			}
			err = s.Settle(ctx, "n1", []outbox.Settlement{{
				Lease:     leases[0],
				Delivered: []string{recs[0].ID},
				Dead:      []outbox.Failure{{ID: recs[1].ID, Partition: 0, Attempts: 3, Err: "boom"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			inj.set(staleIndex(s.opts.Indexes.Shard, stale, 0))

			recs2, err := s.Fetch(ctx, cur, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs2) != 1 || recs2[0].ID != recs[2].ID {
				t.Fatalf("Fetch with stale index entries returned %v, want only %s", ids(recs2), recs[2].ID)
			}
			refs, err := s.Unsettled(ctx, []outbox.Cursor{{Lease: leases[0], After: recs[2].Seq}})
			if err != nil {
				t.Fatal(err)
			}
			// Unsettled reads the index only, so it may report the stale
			// entries; what the relay then fetches of them must be only
			// the live record.
			var sawLive bool
			for _, ref := range refs {
				sawLive = sawLive || ref.ID == recs[2].ID
				got, err := s.Fetch(ctx, []outbox.Cursor{{Lease: leases[0], After: ref.Seq - 1}}, 1)
				if err != nil {
					t.Fatal(err)
				}
				if ref.ID != recs[2].ID && len(got) != 0 && got[0].ID == ref.ID {
					t.Fatalf("Fetch of stale entry %s returned it", ref.ID)
				}
			}
			if !sawLive {
				t.Fatalf("Unsettled = %+v, missing the live record %s", refs, recs[2].ID)
			}
		})
	}
}

func ids(recs []outbox.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// TestRetentionMarksDispatched checks that with Retention the relay's
// delivered messages are kept, marked dispatched with an expiry for TTL,
// and listed by Dispatched (all topics and one topic).
func TestRetentionMarksDispatched(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 4, Retention: 24 * time.Hour})
	ctx := ctxT(t)
	a := &outbox.Message{Topic: "t.ret.a", Key: "1"}
	b := &outbox.Message{Topic: "t.ret.b", Key: "2"}
	mustWrite(t, s, a, b)
	leases, err := s.AcquireLeases(ctx, "n1", nil, 4, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var sts []outbox.Settlement
	for _, m := range []*outbox.Message{a, b} {
		p := outbox.PartitionOf(m.Key, 4)
		i := slices.IndexFunc(leases, func(l outbox.Lease) bool { return l.Partition == p })
		sts = append(sts, outbox.Settlement{Lease: leases[i], Delivered: []string{m.ID}})
	}
	if err := s.Settle(ctx, "n1", sts); err != nil {
		t.Fatal(err)
	}
	if n, err := s.OutstandingCount(ctx); err != nil || n != 0 {
		t.Fatalf("OutstandingCount after delivery = %d, %v; want 0", n, err)
	}
	all, err := s.Dispatched(ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("Dispatched(all topics) = %+v, want both messages", all)
	}
	one, err := s.Dispatched(ctx, Query{Topic: "t.ret.b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0].ID != b.ID || one[0].Topic != "t.ret.b" || one[0].Time.IsZero() {
		t.Fatalf("Dispatched(t.ret.b) = %+v, want %s with its delivery time", one, b.ID)
	}
	out, err := s.client.GetItem(ctx, getItemInput(s, a.ID))
	if err != nil {
		t.Fatal(err)
	}
	exp, ok := getN(out.Item, attrExpiresAt)
	if want := time.Now().Add(24 * time.Hour).Unix(); !ok || exp < want-60 || exp > want+60 {
		t.Fatalf("ExpiresAt = %d (present %v), want about %d", exp, ok, want)
	}
	if _, ok := getN(out.Item, attrOutstandingCreatedTime); ok {
		t.Fatal("a dispatched message still has OutstandingCreatedTime")
	}
}

// TestOutstandingQueries checks both ways of listing outstanding messages:
// one topic (a Query per shard, merged in time order) and all topics (a
// parallel Scan sorted in memory), with Limit, Since and Before.
func TestOutstandingQueries(t *testing.T) {
	t.Parallel()
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := newStore(t, Options{Shards: 5, ScanConcurrency: 3, Now: func() time.Time { return clock }})
	var want []string
	for i := range 12 {
		topic := "t.q.a"
		if i%3 == 0 {
			topic = "t.q.b"
		}
		m := &outbox.Message{Topic: topic, Key: "key" + strconv.Itoa(i), CreatedAt: clock.Add(time.Duration(i) * time.Second)}
		mustWrite(t, s, m)
		want = append(want, m.ID)
	}
	ctx := ctxT(t)
	all, err := s.Outstanding(ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	if got := entryIDs(all); !slices.Equal(got, want) {
		t.Fatalf("Outstanding(all) = %v, want %v (created-time order)", got, want)
	}
	b, err := s.Outstanding(ctx, Query{Topic: "t.q.b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := entryIDs(b); !slices.Equal(got, []string{want[0], want[3], want[6], want[9]}) {
		t.Fatalf("Outstanding(t.q.b) = %v, want messages 0, 3, 6, 9 in order", got)
	}
	limited, err := s.Outstanding(ctx, Query{Topic: "t.q.a", Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := entryIDs(limited); !slices.Equal(got, []string{want[1], want[2], want[4]}) {
		t.Fatalf("Outstanding(t.q.a, Limit 3) = %v, want the 3 oldest", got)
	}
	window, err := s.Outstanding(ctx, Query{Since: clock.Add(2 * time.Second), Before: clock.Add(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if got := entryIDs(window); !slices.Equal(got, want[2:5]) {
		t.Fatalf("Outstanding(all, 2s ≤ t < 5s) = %v, want messages 2..4", got)
	}
	if _, err := s.Outstanding(ctx, Query{Topic: "bad topic"}); err == nil {
		t.Fatal("Outstanding with an invalid topic: want an error")
	}
}

func entryIDs(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

// TestFetchDelay checks that Fetch holds back messages younger than
// FetchDelay (by their Seq and the store's clock), without even querying
// when nothing above the cursor can be old enough.
func TestFetchDelay(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	s := newStore(t, Options{Shards: 1, FetchDelay: time.Second, Now: now})
	ctx := ctxT(t)
	first := &outbox.Message{Topic: "t.delay", Key: "k"}
	mustWrite(t, s, first)
	advance(600 * time.Millisecond)
	second := &outbox.Message{Topic: "t.delay", Key: "k"}
	mustWrite(t, s, second)
	leases, err := s.AcquireLeases(ctx, "n1", nil, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(after int64) []string {
		t.Helper()
		recs, err := s.Fetch(ctx, []outbox.Cursor{{Lease: leases[0], After: after}}, 10)
		if err != nil {
			t.Fatal(err)
		}
		return ids(recs)
	}
	if got := fetch(0); len(got) != 0 {
		t.Fatalf("Fetch 0.6s after the first write = %v, want nothing yet", got)
	}
	advance(500 * time.Millisecond) // first is 1.1s old, second 0.5s
	if got := fetch(0); !slices.Equal(got, []string{first.ID}) {
		t.Fatalf("Fetch 1.1s after the first write = %v, want only the first", got)
	}
	recs, _ := s.GetMany(ctx, []string{first.ID})
	if got := fetch(recs[0].Seq); len(got) != 0 {
		t.Fatalf("Fetch above the first = %v, want nothing yet", got)
	}
	advance(500 * time.Millisecond) // second is 1s old
	if got := fetch(recs[0].Seq); !slices.Equal(got, []string{second.ID}) {
		t.Fatalf("Fetch once the second is old enough = %v, want it", got)
	}
	// A cursor at the newest possible Seq of a second ago cannot have
	// anything old enough above it: no request.
	queries := s.Stats()["Query"].Requests
	if got := fetch(maxSeqAt(now().Add(-time.Second))); len(got) != 0 {
		t.Fatalf("Fetch above everything = %v", got)
	}
	if got := s.Stats()["Query"].Requests - queries; got != 0 {
		t.Fatalf("%d Query requests for a fetch that cannot return anything, want 0", got)
	}
}
