package outbox

import (
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
	pq := newPartQueue()
	for _, r := range []*Record{rec("a1", "a"), rec("b1", "b"), rec("a2", "a"), rec("u1", ""), rec("u2", ""), rec("b2", "b")} {
		pq.push(r, now)
	}
	got := pq.take(10, now)
	if want := []string{"a1", "b1", "u1", "u2"}; !equal(ids(got), want) {
		t.Fatalf("first take = %v, want %v (one head per key; keyless records are independent)", ids(got), want)
	}
	if more := pq.take(10, now); len(more) != 0 {
		t.Fatalf("took %v while a and b are in flight", ids(more))
	}
	pq.done(got[1], now) // b1 delivered
	if got := pq.take(10, now); !equal(ids(got), []string{"b2"}) {
		t.Fatalf("after b1: %v, want [b2]", ids(got))
	}
	// a1 failed: it goes back in front of a2 and waits for its retry.
	if head := pq.queues["a"].recs[0]; head.ID != "a2" {
		t.Fatalf("queue a holds %s, want a2 behind the a1 in flight", head.ID)
	}
	failed := rec("a1", "a")
	failed.NextAttemptAt = now.Add(time.Second)
	pq.pushFront(failed, now)
	if got := pq.take(10, now); len(got) != 0 {
		t.Fatalf("took %v before a1's retry time", ids(got))
	}
	if due := pq.nextDue(); !due.Equal(failed.NextAttemptAt) {
		t.Fatalf("nextDue = %v, want %v", due, failed.NextAttemptAt)
	}
	later := now.Add(2 * time.Second)
	if got := pq.take(10, later); !equal(ids(got), []string{"a1"}) {
		t.Fatalf("at the retry time: %v, want [a1]", ids(got))
	}
	pq.done(failed, later)
	if got := pq.take(10, later); !equal(ids(got), []string{"a2"}) {
		t.Fatalf("after a1: %v, want [a2]", ids(got))
	}
	if pq.n != 0 {
		t.Fatalf("n = %d after taking everything", pq.n)
	}
}

func TestPartQueueTakeRespectsMax(t *testing.T) {
	now := time.Now()
	pq := newPartQueue()
	for i := 0; i < 10; i++ {
		pq.push(rec(string(rune('a'+i)), string(rune('a'+i))), now)
	}
	if got := pq.take(3, now); len(got) != 3 || pq.n != 7 || len(pq.ready) != 7 {
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
