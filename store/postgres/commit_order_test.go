package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// orderEnv runs a relay on a store and gives two-transaction scripts an
// aggregate row to lock, the application's own lock.
type orderEnv struct {
	*bundle
	rec *relaytest.Recorder
	agg string // quoted table with one row, id 'k'
}

func newOrderEnv(t *testing.T, opts Options) *orderEnv {
	t.Helper()
	b := setup(t, opts)
	e := &orderEnv{bundle: b, rec: &relaytest.Recorder{}, agg: pgx.Identifier{b.opts.Schema, "aggregate"}.Sanitize()}
	if _, err := b.store.Pool().Exec(b.ctx, "CREATE TABLE "+e.agg+" (id text PRIMARY KEY, n integer NOT NULL); INSERT INTO "+e.agg+" VALUES ('k', 0)"); err != nil {
		t.Fatal(err)
	}
	return e
}

// startRelay starts the relay publishing to e.rec.
func (e *orderEnv) startRelay(t *testing.T) {
	t.Helper()
	r, err := outbox.NewRelay(e.store, e.rec, outbox.Config{Node: "n", PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
}

// begin starts a transaction whose deadlock checks run after 100 ms
// instead of 1 s.
func (e *orderEnv) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(e.ctx, "SET LOCAL deadlock_timeout = '100ms'"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// writeIn writes m in tx, and commit commits tx, failing the test on error.
func (e *orderEnv) writeIn(t *testing.T, tx pgx.Tx, m outbox.Message) {
	t.Helper()
	if err := e.store.Writer().Write(e.ctx, tx, m); err != nil {
		t.Fatal(err)
	}
}

func (e *orderEnv) commit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
}

func (e *orderEnv) update(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "UPDATE "+e.agg+" SET n = n + 1 WHERE id = 'k'")
	return err
}

// async runs f in a goroutine and returns its result channel.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// waitLocked waits until tx's backend waits for a lock.
func (e *orderEnv) waitLocked(t *testing.T, tx pgx.Tx, what string) {
	t.Helper()
	pid := tx.Conn().PgConn().PID()
	relaytest.WaitFor(t, what, time.Minute, func() bool {
		var waiting bool
		err := e.store.Pool().QueryRow(e.ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
}

// published waits for n messages at the broker and returns their IDs in
// publish order.
func (e *orderEnv) published(t *testing.T, n int) []string {
	t.Helper()
	relaytest.WaitFor(t, "the messages published", time.Minute, func() bool { return len(e.rec.IDs()) >= n })
	ids := e.rec.IDs()
	if len(ids) != n {
		t.Fatalf("published %d messages, want %d", len(ids), n)
	}
	return ids
}

func keyed() outbox.Message { return outbox.Message{ID: outbox.NewID(), Topic: "order", Key: "k"} }

// TestPlainWritePublishesInInsertOrder documents the limit of the default
// write: T1 writes M1, T2 writes M2, T2 updates the aggregate row, T1
// waits for that row, T2 commits, then T1. T2 committed first, yet the
// relay publishes M1 first: a key's publish order is its insert order,
// which is its commit order only when its writers are serialised before
// they write (Options.KeyLocks makes them so). (The relay runs once both
// committed; one fetching between the two commits would publish M2 first,
// and M1 as a late commit after it: which one goes first is left to
// timing.)
func TestPlainWritePublishesInInsertOrder(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t, Options{KeyLocks: new(false)})
	m1, m2 := keyed(), keyed()
	t1, t2 := e.begin(t), e.begin(t)
	e.writeIn(t, t1, m1)
	e.writeIn(t, t2, m2)
	if err := e.update(e.ctx, t2); err != nil {
		t.Fatal(err)
	}
	t1Update := async(func() error { return e.update(e.ctx, t1) })
	e.waitLocked(t, t1, "T1 to wait for the row T2 updated")
	e.commit(t, t2)
	if err := <-t1Update; err != nil {
		t.Fatal(err)
	}
	e.commit(t, t1)
	e.startRelay(t)
	if ids := e.published(t, 2); ids[0] != m1.ID || ids[1] != m2.ID {
		t.Fatalf("published %v, want M1 %s then M2 %s (insert order; the commit order was M2, M1)", ids, m1.ID, m2.ID)
	}
}

// TestKeyLocksPublishInCommitOrder: the same script with Options.KeyLocks.
// T2's Write waits for T1's lock of the key until T1 commits, so T1 takes
// the aggregate row without waiting, commits first, and its M1 is
// published first: publish order is commit order.
func TestKeyLocksPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t, Options{KeyLocks: new(true)})
	e.startRelay(t) // running throughout: publish order is commit order whenever it fetches
	m1, m2 := keyed(), keyed()
	t1, t2 := e.begin(t), e.begin(t)
	e.writeIn(t, t1, m1)
	t2Write := async(func() error {
		if err := e.store.Writer().Write(e.ctx, t2, m2); err != nil {
			return err
		}
		return e.update(e.ctx, t2) // the script's next step of T2
	})
	e.waitLocked(t, t2, "T2's Write to wait for T1's lock of the key")
	if err := e.update(e.ctx, t1); err != nil { // the row is free: T2 never got to it
		t.Fatal(err)
	}
	e.commit(t, t1)
	if err := <-t2Write; err != nil {
		t.Fatal(err)
	}
	e.commit(t, t2)
	if ids := e.published(t, 2); ids[0] != m1.ID || ids[1] != m2.ID {
		t.Fatalf("published %v, want M1 %s then M2 %s (commit order)", ids, m1.ID, m2.ID)
	}
}

// TestKeyLocksDeadlockWithApplicationLocks: with Options.KeyLocks, an
// application that locks its aggregate row before Write in one transaction
// (T2) and after it in another (T1) deadlocks: T1 holds the key's lock and
// waits for the row, T2 holds the row and waits for the key. PostgreSQL
// detects it and aborts one with SQLSTATE 40P01; the other commits. The
// application retries the aborted one, and the relay publishes in commit
// order.
func TestKeyLocksDeadlockWithApplicationLocks(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t, Options{KeyLocks: new(true)})
	e.startRelay(t) // running throughout: publish order is commit order whenever it fetches
	m1, m2 := keyed(), keyed()
	t1, t2 := e.begin(t), e.begin(t)
	if err := e.update(e.ctx, t2); err != nil {
		t.Fatal(err)
	}
	e.writeIn(t, t1, m1)
	t1Update := async(func() error { return e.update(e.ctx, t1) })
	e.waitLocked(t, t1, "T1 to wait for the row T2 updated")
	t2Write := async(func() error { return e.store.Writer().Write(e.ctx, t2, m2) })
	err1, err2 := <-t1Update, <-t2Write
	deadlock := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "40P01"
	}
	var order []string // commit order, as retried
	retry := func(m outbox.Message) {
		t.Helper()
		m.ID = outbox.NewID()
		tx := e.begin(t)
		e.writeIn(t, tx, m)
		if err := e.update(e.ctx, tx); err != nil {
			t.Fatal(err)
		}
		e.commit(t, tx)
		order = append(order, m.ID)
	}
	switch {
	case deadlock(err1) && err2 == nil:
		e.commit(t, t2)
		order = append(order, m2.ID)
		retry(m1)
	case deadlock(err2) && err1 == nil:
		e.commit(t, t1)
		order = append(order, m1.ID)
		retry(m2)
	default:
		t.Fatalf("T1's update: %v; T2's Write: %v; want one deadlock (40P01) and one success", err1, err2)
	}
	if ids := e.published(t, 2); ids[0] != order[0] || ids[1] != order[1] {
		t.Fatalf("published %v, want the commit order %v", ids, order)
	}
}

// TestKeyLocksLargeWrite: a write of more keys than keyLockMaxKeys locks
// the keys' groups, not each key: it holds at most keyLockGroups advisory
// locks however many keys it writes, and still holds back a small write
// of one of its keys until it commits. The held-back write draws its
// sequence number only once it has its locks: after a write that
// committed while it waited.
func TestKeyLocksLargeWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{KeyLocks: new(true)})
	w := b.store.Writer()
	var big []outbox.Message
	groups := map[uint32]bool{}
	for i := range 300 { // more than keyLockMaxKeys, in fewer groups than keyLockGroups
		key := fmt.Sprintf("key-%d", i)
		big = append(big, outbox.Message{Topic: "big", Key: key})
		groups[groupOf(key)] = true
	}
	t1, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(context.Background())
	if err := w.Write(b.ctx, t1, big...); err != nil {
		t.Fatal(err)
	}
	var locks int
	if err := b.store.Pool().QueryRow(b.ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", t1.Conn().PgConn().PID()).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks > keyLockGroups || locks != len(groups) {
		t.Fatalf("a write of %d keys holds %d advisory locks, want one per group written (%d)", len(big), locks, len(groups))
	}

	t2, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Rollback(context.Background())
	small := outbox.Message{ID: outbox.NewID(), Topic: "small", Key: "key-7"}
	t2Write := async(func() error { return w.Write(b.ctx, t2, small) })
	(&orderEnv{bundle: b}).waitLocked(t, t2, "the small write to wait for the large one")

	// A key in a group the large write does not hold goes through.
	other := outbox.Message{ID: outbox.NewID(), Topic: "other"}
	for i := 0; other.Key == ""; i++ {
		if key := fmt.Sprintf("other-%d", i); !groups[groupOf(key)] {
			other.Key = key
		}
	}
	if err := b.write(t, other); err != nil {
		t.Fatal(err)
	}
	if err := t1.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-t2Write; err != nil {
		t.Fatal(err)
	}
	if err := t2.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	seqs := map[string]int64{}
	for _, r := range b.all(t) {
		seqs[r.ID] = r.Seq
	}
	if seqs[small.ID] <= seqs[other.ID] {
		t.Fatalf("the held-back write got seq %d, below %d of a write that committed while it waited", seqs[small.ID], seqs[other.ID])
	}
}

func groupOf(key string) uint32 {
	sum := sha256.Sum256([]byte(key))
	return binary.LittleEndian.Uint32(sum[:4]) % keyLockGroups
}
