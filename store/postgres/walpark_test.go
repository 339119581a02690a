package postgres

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/sidetest"
)

// parkOptions: a small buffer that parks quickly.
func parkOptions() Options {
	return Options{WAL: WALOptions{BufferMessages: 50, ParkAfter: 100 * time.Millisecond, StatusInterval: 50 * time.Millisecond, Timeout: 2 * time.Second}}
}

// parkWrite writes n messages of topic over keys, in transactions of 10,
// and records them (per topic and key) in ch.
func parkWrite(t *testing.T, b *walBundle, ch *brokertest.Checker, topic string, keys, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i += 10 {
		var msgs []outbox.Message
		for j := i; j < min(i+10, n); j++ {
			m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: fmt.Sprint("k", j%keys), Payload: []byte("p")}
			msgs = append(msgs, m)
			ids = append(ids, m.ID)
		}
		if err := b.write(b.ctx, msgs...); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			ch.Written(m.Topic+"|"+m.Key, m.ID)
		}
	}
	return ids
}

func parkedRows(t *testing.T, b *walBundle) int {
	t.Helper()
	var n int
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT count(*) FROM `+b.store.tab.n.parked).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A destination that stays blocked fills the WAL buffer; its messages are
// parked and capture goes on: the other destination's messages, written
// after six buffers' worth of the blocked one's, are published while it is
// still blocked, the slot's position moves on, nothing is dead-lettered
// and no attempt is spent. Once the destination works, everything parked
// and everything captured since go out in key order, and the table is
// empty. (Before parking, capture stopped for every destination.)
func TestWALBlockedDestinationParksAndCaptureGoesOn(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, parkOptions())
	ch := brokertest.NewChecker()
	pub := sidetest.NewBroker(ch)
	var blocked atomic.Bool
	blocked.Store(true)
	pub.SetFail(func(m *outbox.Message) error {
		if m.Topic == "gone" && blocked.Load() {
			return outbox.Blocked("gone", errors.New("nats: no response from stream"))
		}
		return nil
	})
	cfg := sidetest.Config("a")
	cfg.BatchSize, cfg.FetchSize = 16, 32
	r := startRelay(t, b.store, pub, cfg)
	b.streaming(t)
	gone := parkWrite(t, b, ch, "gone", 30, 300)
	fine := parkWrite(t, b, ch, "fine", 30, 100)
	relaytest.WaitFor(t, "the other destination's messages published while one is blocked", time.Minute, func() bool { return sidetest.AllIn(ch, fine) })
	if st := b.store.Stats(); st.Parked == 0 || st.ParkedTotal == 0 {
		t.Fatalf("nothing parked: %+v", st)
	}
	after := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the slot's confirmed position past the other destination's messages", time.Minute, func() bool {
		return b.slotConfirmed(t) >= after
	})
	slot, err := b.store.SlotStatus(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slot.Parked == 0 {
		t.Fatalf("SlotStatus.Parked = 0 while %d are parked", b.store.Stats().Parked)
	}
	st, err := b.store.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Outstanding < slot.Parked {
		t.Fatalf("Status.Outstanding %d does not count the %d parked messages", st.Outstanding, slot.Parked)
	}
	// A parked message can be found by the operator.
	res, err := b.store.FindMessages(b.ctx, outbox.FindQuery{ID: gone[0]})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != 1 || res.Messages[0].State != outbox.StateOutstanding {
		t.Fatalf("FindMessages(first parked message) = %+v", res.Messages)
	}
	// Later messages of the blocked destination queue behind the parked ones.
	more := parkWrite(t, b, ch, "gone", 30, 60)
	if n, err := b.store.CountDeadLetters(b.ctx, outbox.DeadLetterFilter{}); err != nil || n != 0 {
		t.Fatalf("dead letters %d (%v): a blocked destination's messages must not be dead-lettered", n, err)
	}
	if s := r.Stats(); s.Failed != 0 {
		t.Fatalf("Stats %+v: a blocked destination must spend no attempt", s)
	}
	blocked.Store(false)
	all := append(gone, more...)
	relaytest.WaitFor(t, "every message of the blocked destination published", time.Minute, func() bool { return sidetest.AllIn(ch, all) })
	sidetest.Verify(t, captureSides[2], ch, true)
	relaytest.WaitFor(t, "the parked table emptied", time.Minute, func() bool { return parkedRows(t, b) == 0 && b.store.Stats().Parked == 0 })
}

// Parked messages survive the relay: a relay parks a blocked destination's
// messages and stops; another process's relay (a new store on the same
// slot) publishes them, before what it captures of the same keys, once the
// destination works.
func TestWALParkedMessagesSurviveARestart(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, parkOptions())
	ch := brokertest.NewChecker()
	pub := sidetest.NewBroker(ch)
	pub.SetFail(func(m *outbox.Message) error {
		return outbox.Blocked(m.Topic, errors.New("nats: no response from stream"))
	})
	cfg := sidetest.Config("a")
	cfg.BatchSize, cfg.FetchSize = 16, 32
	r := startRelay(t, b.store, pub, cfg)
	b.streaming(t)
	first := parkWrite(t, b, ch, "t", 20, 200)
	relaytest.WaitFor(t, "messages parked", time.Minute, func() bool { return parkedRows(t, b) >= 100 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}

	next, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	b2 := &walBundle{ctx: b.ctx, dsn: b.dsn, store: next}
	cfg.Node = "b"
	startRelay(t, next, sidetest.NewBroker(ch), cfg)
	b2.streaming(t)
	later := parkWrite(t, b2, ch, "t", 20, 100)
	relaytest.WaitFor(t, "everything published by the next relay", time.Minute, func() bool { return sidetest.AllIn(ch, append(first, later...)) })
	sidetest.Verify(t, captureSides[2], ch, true)
	relaytest.WaitFor(t, "the parked table emptied", time.Minute, func() bool { return parkedRows(t, b2) == 0 })
}

// Parked copies of messages the slot streams again are dropped when the
// slot is taken: a holder that parked messages and stopped (or crashed)
// before its confirmed position passed them leaves rows whose commit
// LSN is past the slot's confirmed position, and the slot streams those
// transactions again. Kept, each message would be read twice (from the
// table and from the WAL, with new Seqs) and, settled through its WAL
// copy, its parked row stayed forever (CI once: "waiting for the parked
// table emptied"). Here the copies are made by hand: the messages are
// written, never streamed, and parked with a commit LSN past the slot's
// position. Every message is published once, and the table empties.
func TestWALParkedCopiesOfWhatTheSlotStreamsAgainAreDropped(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, parkOptions())
	ch := brokertest.NewChecker()
	var confirmed int64
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, b.store.w.Slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	ids := parkWrite(t, b, ch, "t", 5, 30)
	p, err := b.store.Partitions(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rows []deadRow
	for i, id := range ids {
		key := fmt.Sprint("k", i%5)
		rows = append(rows, deadRow{
			rec:       outbox.Record{Message: outbox.Message{ID: id, Topic: "t", Key: key, Payload: []byte("p"), CreatedAt: time.Now()}, Partition: outbox.PartitionOf(key, p), Seq: int64(i + 1)},
			commitLSN: pglogrepl.LSN(confirmed + 1),
		})
	}
	if err := b.store.insertParked(b.ctx, rows); err != nil {
		t.Fatal(err)
	}
	pub := sidetest.NewBroker(ch)
	startRelay(t, b.store, pub, sidetest.Config("a"))
	b.streaming(t)
	relaytest.WaitFor(t, "everything published", time.Minute, func() bool { return sidetest.AllIn(ch, ids) })
	relaytest.WaitFor(t, "the parked table emptied", time.Minute, func() bool { return parkedRows(t, b) == 0 })
	sidetest.Verify(t, captureSides[2], ch, true)
}
