package leasetable

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

func TestTable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := 10 * time.Second
	tab := New(3)

	a := tab.Acquire("a", nil, 2, ttl, t0)
	if want := []outbox.Lease{{Partition: 0, Epoch: 1}, {Partition: 1, Epoch: 1}}; !slices.Equal(a, want) {
		t.Fatalf("a acquires %v; want %v", a, want)
	}
	b := tab.Acquire("b", nil, 3, ttl, t0)
	if want := []outbox.Lease{{Partition: 2, Epoch: 1}}; !slices.Equal(b, want) {
		t.Fatalf("b acquires %v; want only the free %v", b, want)
	}
	if n, all := tab.Held("a", t0), tab.Held("", t0); n != 2 || all != 3 {
		t.Errorf("Held: a %d, all %d; want 2, 3", n, all)
	}

	// a renews what it holds (a lease out of range or of another epoch is
	// dropped); b's lease expires and a takes it with the next epoch.
	t1 := t0.Add(ttl)
	renewed := tab.Acquire("a", append(slices.Clone(a), outbox.Lease{Partition: 7, Epoch: 1}, outbox.Lease{Partition: 2, Epoch: 9}), 1, ttl, t1.Add(-time.Second))
	if !slices.Equal(renewed, a) {
		t.Errorf("a renews %v; want %v", renewed, a)
	}
	taken := tab.Acquire("a", nil, 1, ttl, t1)
	if want := []outbox.Lease{{Partition: 2, Epoch: 2}}; !slices.Equal(taken, want) {
		t.Errorf("a takes %v after b's lease expired; want %v", taken, want)
	}
	if tab.Holds("b", b[0]) || !tab.Holds("a", taken[0]) || tab.Holds("a", outbox.Lease{Partition: -1}) {
		t.Error("Holds: b's old epoch must be fenced, a's new one held, a partition out of range not held")
	}

	// Release frees only what node holds with that epoch.
	tab.Release("b", b)
	tab.Release("a", []outbox.Lease{{Partition: 0, Epoch: 1}})
	if l := tab.Owner(0, t1); l.Owner != "" || l.Epoch != 1 || !l.Expires.IsZero() {
		t.Errorf("Owner(0) after release = %+v; want free at epoch 1", l)
	}
	if l := tab.Owner(2, t1); l.Owner != "a" || l.Epoch != 2 {
		t.Errorf("Owner(2) = %+v; want a at epoch 2 (b's release of epoch 1 must not free it)", l)
	}
	if l := tab.Owner(1, t1.Add(time.Hour)); l.Owner != "" || l.Epoch != 1 {
		t.Errorf("Owner(1) after expiry = %+v; want free at epoch 1", l)
	}

	tab.Clear()
	if n := tab.Held("", t1); n != 0 {
		t.Errorf("Held after Clear = %d; want 0", n)
	}
	if got := tab.Acquire("c", nil, 1, ttl, t1); !slices.Equal(got, []outbox.Lease{{Partition: 0, Epoch: 2}}) {
		t.Errorf("after Clear c acquires %v; want partition 0 at epoch 2 (epochs survive Clear)", got)
	}
}
