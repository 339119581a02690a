package postgres

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/outbox"
)

// txn adds a committed transaction of msgs (by key) ending at end.
func bufTxn(b *walBuffer, commit, end pglogrepl.LSN, keys ...string) []*walEntry {
	b.begin(commit, time.Now())
	var es []*walEntry
	for _, k := range keys {
		m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: k}
		if p := b.add(m, ""); p >= 0 {
			es = append(es, b.byID[m.ID])
		}
	}
	b.commit(end)
	return es
}

func TestWALBufferConfirmsOnlySettledPrefix(t *testing.T) {
	b := newWALBuffer(4, 100)
	t1 := bufTxn(b, 150, 160, "a", "b")
	t2 := bufTxn(b, 250, 260, "c")
	t3 := bufTxn(b, 350, 360, "a")
	if b.confirmed != 100 {
		t.Fatalf("confirmed %s with everything pending, want 0/64", b.confirmed)
	}
	// Settling a later transaction first confirms nothing.
	b.settle(t2[0])
	b.settle(t3[0])
	if b.confirmed != 100 {
		t.Fatalf("confirmed %s past the pending first transaction", b.confirmed)
	}
	// A keepalive never moves it past a pending message.
	b.keepalive(1000)
	if b.confirmed != 100 {
		t.Fatalf("keepalive confirmed %s past a pending message", b.confirmed)
	}
	b.settle(t1[0])
	if b.confirmed != 100 {
		t.Fatalf("confirmed %s with half of the first transaction pending", b.confirmed)
	}
	b.settle(t1[1])
	if b.confirmed != 360 {
		t.Fatalf("confirmed %s after everything settled, want the last commit end 0/168", b.confirmed)
	}
	// Nothing pending: the keepalive's position is taken.
	b.keepalive(1000)
	if b.confirmed != 1000 {
		t.Fatalf("idle keepalive: confirmed %s, want 0/3E8", b.confirmed)
	}
	b.keepalive(900) // never backwards
	if b.confirmed != 1000 {
		t.Fatalf("confirmed went back to %s", b.confirmed)
	}
}

func TestWALBufferOpenTransaction(t *testing.T) {
	b := newWALBuffer(2, 0)
	b.begin(500, time.Now())
	m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	b.add(m, "")
	b.settle(b.byID[m.ID]) // published before its Commit arrived
	b.keepalive(450)
	if b.confirmed != 0 {
		t.Fatalf("confirmed %s inside an open transaction", b.confirmed)
	}
	b.commit(510)
	if b.confirmed != 510 {
		t.Fatalf("confirmed %s after the commit of a settled transaction, want 510", b.confirmed)
	}
	// A transaction without outbox messages (another prefix) completes at
	// its commit.
	b.begin(600, time.Now())
	b.commit(610)
	if b.confirmed != 610 {
		t.Fatalf("empty transaction: confirmed %s, want 610", b.confirmed)
	}
}

func TestWALBufferFetchAndDuplicates(t *testing.T) {
	b := newWALBuffer(1, 0)
	es := bufTxn(b, 10, 20, "a", "b", "c", "d")
	// A message whose ID is held already is dropped, and does not hold its
	// transaction back.
	b.begin(30, time.Now())
	if p := b.add(es[0].rec.Message, ""); p != -1 {
		t.Fatalf("duplicate added to partition %d", p)
	}
	b.commit(40)
	if b.dups != 1 || b.n != 4 {
		t.Fatalf("dups %d, held %d; want 1, 4", b.dups, b.n)
	}
	b.settle(es[1])
	got := b.fetch(nil, 0, 0, 10)
	if len(got) != 3 || got[0].ID != es[0].rec.ID || got[1].ID != es[2].rec.ID {
		t.Fatalf("fetch after settling the 2nd: %v", got)
	}
	if got := b.fetch(nil, 0, es[0].rec.Seq, 1); len(got) != 1 || got[0].ID != es[2].rec.ID {
		t.Fatalf("fetch after the 1st, limit 1: %v", got)
	}
	for _, e := range es {
		b.settle(e)
	}
	if b.n != 0 || b.bytes != 0 || len(b.parts[0].entries) != 0 || b.confirmed != 40 {
		t.Fatalf("after settling all: n %d, bytes %d, entries %d, confirmed %s", b.n, b.bytes, len(b.parts[0].entries), b.confirmed)
	}
}

func TestWALBufferBounds(t *testing.T) {
	b := newWALBuffer(1, 0)
	b.begin(1, time.Now())
	b.add(outbox.Message{ID: outbox.NewID(), Topic: "t", Payload: make([]byte, 1000)}, "")
	if !b.full(10, 500) {
		t.Fatal("a message over the byte bound does not make the buffer full")
	}
	if b.full(10, 5000) || !b.full(1, 5000) {
		t.Fatal("message bound not applied")
	}
	empty := newWALBuffer(1, 0)
	if empty.full(10, 0) {
		t.Fatal("an empty buffer is full: one message larger than the bound could never pass")
	}
}
