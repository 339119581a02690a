// Package leasetable is a partition lease table kept in memory, with the
// lease rules of outbox.Store: a node renews the leases it still holds,
// takes free or expired partitions with the next epoch, and releases only
// the leases it holds with those epochs. The stores that keep their leases
// in the process use it: the PostgreSQL WAL store (its one slot holder
// leases every partition) and the test store internal/memstore.
//
// A Table does not lock: its store does.
package leasetable

import (
	"time"

	"github.com/outboxrelay/outbox"
)

// Lease is one partition's lease. Owner is empty when it is released; a
// lease whose Expires has passed is free to take, whatever Owner says.
type Lease struct {
	Owner   string
	Epoch   int64
	Expires time.Time
}

// Table holds the lease of each partition, by partition number.
type Table []Lease

// New returns a table of p free partitions at epoch 0.
func New(p int) Table { return make(Table, p) }

// Acquire renews the leases of held that node still holds (same owner and
// epoch, not expired) and takes up to want free or expired partitions,
// each with its epoch plus one, all until now+ttl. It returns the leases
// node holds afterwards; a held lease out of range is dropped.
func (t Table) Acquire(node string, held []outbox.Lease, want int, ttl time.Duration, now time.Time) []outbox.Lease {
	var out []outbox.Lease
	for _, h := range held {
		if h.Partition < 0 || h.Partition >= len(t) {
			continue
		}
		l := &t[h.Partition]
		if l.Owner == node && l.Epoch == h.Epoch && l.Expires.After(now) {
			l.Expires = now.Add(ttl)
			out = append(out, h)
		}
	}
	for p := range t {
		if want <= 0 {
			break
		}
		l := &t[p]
		if l.Owner != "" && l.Expires.After(now) {
			continue
		}
		l.Owner, l.Epoch, l.Expires = node, l.Epoch+1, now.Add(ttl)
		out = append(out, outbox.Lease{Partition: p, Epoch: l.Epoch})
		want--
	}
	return out
}

// Release frees the leases node holds with those epochs.
func (t Table) Release(node string, leases []outbox.Lease) {
	for _, h := range leases {
		if t.Holds(node, h) {
			t[h.Partition].Owner, t[h.Partition].Expires = "", time.Time{}
		}
	}
}

// Holds reports whether node holds l's partition with l's epoch, which
// fences a settlement (expiry aside: a later epoch is what fences).
func (t Table) Holds(node string, l outbox.Lease) bool {
	if l.Partition < 0 || l.Partition >= len(t) {
		return false
	}
	return t[l.Partition].Owner == node && t[l.Partition].Epoch == l.Epoch
}

// Owner returns partition p's lease as of now: Owner empty and Expires
// zero when it is free or expired.
func (t Table) Owner(p int, now time.Time) Lease {
	l := t[p]
	if l.Owner == "" || !l.Expires.After(now) {
		return Lease{Epoch: l.Epoch}
	}
	return l
}

// Held counts the partitions node holds as of now; node "" counts every
// held partition.
func (t Table) Held(node string, now time.Time) int {
	n := 0
	for _, l := range t {
		if l.Owner != "" && (node == "" || l.Owner == node) && l.Expires.After(now) {
			n++
		}
	}
	return n
}

// Clear frees every partition; the epochs stay, so the next leases fence
// the last ones.
func (t Table) Clear() {
	for i := range t {
		t[i].Owner, t[i].Expires = "", time.Time{}
	}
}
