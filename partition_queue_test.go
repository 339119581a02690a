package outbox

import (
	"fmt"
	"testing"
	"time"
)

func rec(id, key string) *Record {
	return &Record{Message: Message{ID: id, Key: key}}
}

func ids(rs []*Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestPartQueueOneHeadPerKeyInOrder(t *testing.T) {
	now := time.Now()
	pq := newPartQueue(queueKeyOf(OrderScopeKey))
	for _, r := range []*Record{rec("a1", "a"), rec("b1", "b"), rec("a2", "a"), rec("u1", ""), rec("u2", ""), rec("b2", "b")} {
		pq.push(r, now)
	}
	got := pq.take(10, 1, now)
	if want := []string{"a1", "b1", "u1", "u2"}; !equal(ids(got), want) {
		t.Fatalf("first take = %v, want %v (one head per key; keyless records are independent)", ids(got), want)
	}
	if more := pq.take(10, 1, now); len(more) != 0 {
		t.Fatalf("took %v while a and b are in flight", ids(more))
	}
	pq.done(got[1], now) // b1 delivered
	if got := pq.take(10, 1, now); !equal(ids(got), []string{"b2"}) {
		t.Fatalf("after b1: %v, want [b2]", ids(got))
	}
	// a1 failed: it goes back in front of a2 and waits for its retry.
	if head := pq.queues["a"].recs[0]; head.ID != "a2" {
		t.Fatalf("queue a holds %s, want a2 behind the a1 in flight", head.ID)
	}
	failed := rec("a1", "a")
	failed.NextAttemptAt = now.Add(time.Second)
	pq.pushFront(failed, now)
	if got := pq.take(10, 1, now); len(got) != 0 {
		t.Fatalf("took %v before a1's retry time", ids(got))
	}
	if due := pq.nextDue(); !due.Equal(failed.NextAttemptAt) {
		t.Fatalf("nextDue = %v, want %v", due, failed.NextAttemptAt)
	}
	later := now.Add(2 * time.Second)
	if got := pq.take(10, 1, later); !equal(ids(got), []string{"a1"}) {
		t.Fatalf("at the retry time: %v, want [a1]", ids(got))
	}
	pq.done(failed, later)
	if got := pq.take(10, 1, later); !equal(ids(got), []string{"a2"}) {
		t.Fatalf("after a1: %v, want [a2]", ids(got))
	}
	if pq.n != 0 {
		t.Fatalf("n = %d after taking everything", pq.n)
	}
}

func TestPartQueueTakeRespectsMax(t *testing.T) {
	now := time.Now()
	pq := newPartQueue(queueKeyOf(OrderScopeKey))
	for i := 0; i < 10; i++ {
		pq.push(rec(string(rune('a'+i)), string(rune('a'+i))), now)
	}
	if got := pq.take(3, 1, now); len(got) != 3 || pq.n != 7 || len(pq.ready) != 7 {
		t.Fatalf("take(3) = %v, n %d, ready %d", ids(got), pq.n, len(pq.ready))
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A failing key keeps only its head in memory: fail returns what was
// queued behind it, the queue counts the head as blocked, and delivering
// the head ends the failing state.
func TestPartQueueFailKeepsOnlyTheHead(t *testing.T) {
	now := time.Now()
	pq := newPartQueue(queueKeyOf(OrderScopeKey))
	for i, id := range []string{"a1", "a2", "a3", "b1"} {
		r := rec(id, id[:1])
		r.Seq = int64(i + 1)
		pq.push(r, now)
	}
	got := pq.take(10, 1, now) // a1, b1
	a1 := got[0]
	a1.NextAttemptAt = now.Add(time.Second)
	dropped := pq.fail(a1, now)
	if !equal(ids(dropped), []string{"a2", "a3"}) {
		t.Fatalf("dropped %v, want [a2 a3]", ids(dropped))
	}
	if pq.n != 1 || pq.blocked != 1 || !pq.isFailing("a") {
		t.Fatalf("n=%d blocked=%d failing=%v, want 1, 1, true", pq.n, pq.blocked, pq.isFailing("a"))
	}
	pq.push(rec("a9", "a"), now) // a late record of the failing key
	if pq.blocked != 2 {
		t.Fatalf("blocked=%d after a push to a failing key, want 2", pq.blocked)
	}
	retry := pq.take(10, 1, now.Add(2*time.Second))
	if !equal(ids(retry), []string{"a1"}) || pq.blocked != 1 {
		t.Fatalf("took %v, blocked %d; want [a1], 1", ids(retry), pq.blocked)
	}
	pq.done(a1, now)
	if pq.isFailing("a") || pq.blocked != 0 {
		t.Fatalf("after delivery: failing=%v blocked=%d", pq.isFailing("a"), pq.blocked)
	}
}

// With perKey > 1, take hands out a run of each key's first records, next
// to each other, stopping at another topic, a record not yet due or an
// undecodable one; a failing key sends its head alone.
func TestPartQueueTakesKeyRuns(t *testing.T) {
	now := time.Now()
	pq := newPartQueue(queueKeyOf(OrderScopeKey))
	mk := func(id, key, topic string) *Record {
		r := rec(id, key)
		r.Topic = topic
		return r
	}
	later := mk("a4", "a", "t")
	later.NextAttemptAt = now.Add(time.Hour)
	bad := mk("c2", "c", "t")
	bad.DecodeError = "garbled"
	for _, r := range []*Record{mk("a1", "a", "t"), mk("b1", "b", "t"), mk("a2", "a", "t"), mk("b2", "b", "u"), mk("a3", "a", "t"), later, mk("c1", "c", "t"), bad, mk("d1", "d", "t"), mk("d2", "d", "t"), mk("d3", "d", "t")} {
		pq.push(r, now)
	}
	if got, want := ids(pq.take(6, 4, now)), []string{"a1", "a2", "a3", "b1", "c1", "d1"}; !equal(got, want) {
		t.Fatalf("take = %v, want %v (runs stop at another topic, a record not due, an undecodable one, and max)", got, want)
	}
	if more := pq.take(10, 4, now); len(more) != 0 {
		t.Fatalf("took %v while every key is in flight", ids(more))
	}
	// A run's records come back: the failed one in front, then the rest.
	pq.unshift([]*Record{mk("a2", "a", "t"), mk("a3", "a", "t")})
	failed := mk("a1", "a", "t")
	pq.pushFront(failed, now)
	if got := ids(pq.take(10, 4, now)); !equal(got, []string{"a1", "a2", "a3"}) {
		t.Fatalf("after a1 failed: %v, want [a1 a2 a3]", got)
	}
	// A failing key sends its head alone.
	pq.fail(mk("a1", "a", "t"), now)
	if got := ids(pq.take(10, 4, now)); !equal(got, []string{"a1"}) {
		t.Fatalf("failing key: %v, want [a1]", got)
	}
}

func TestSplitRunsKeepsRunsWhole(t *testing.T) {
	var recs []*Record
	for k := range 5 {
		for i := range 3 {
			recs = append(recs, rec(fmt.Sprintf("k%d-%d", k, i), fmt.Sprintf("k%d", k)))
		}
	}
	recs = append(recs, rec("u1", ""), rec("u2", ""))
	batches := splitRuns(recs, 3, 8)
	if len(batches) > 3 {
		t.Fatalf("%d batches, want at most 3", len(batches))
	}
	n := 0
	for _, b := range batches {
		if len(b) > 8 {
			t.Fatalf("batch of %d > BatchSize 8", len(b))
		}
		if n > 0 && sameRun(recs[n-1], recs[n]) {
			t.Fatalf("a batch starts inside the run of key %s", recs[n].Key)
		}
		n += len(b)
	}
	if n != len(recs) {
		t.Fatalf("batches hold %d records, want %d", n, len(recs))
	}
}
