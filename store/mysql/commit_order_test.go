package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// orderEnv runs a relay on a store and gives two-transaction scripts an
// aggregate row to lock, the application's own lock.
type orderEnv struct {
	*bundle
	rec *relaytest.Recorder
}

func newOrderEnv(t *testing.T) *orderEnv {
	t.Helper()
	b := setup(t)
	e := &orderEnv{bundle: b, rec: &relaytest.Recorder{}}
	for _, q := range []string{"CREATE TABLE aggregate (id VARCHAR(16) PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB", "INSERT INTO aggregate VALUES ('k', 0)"} {
		if _, err := b.store.DB().ExecContext(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// startRelay starts the relay publishing to e.rec.
func (e *orderEnv) startRelay(t *testing.T, sweep time.Duration) *outbox.Relay {
	t.Helper()
	return relaytest.Start(t, e.store, e.rec, outbox.Config{Node: "n", PollInterval: 10 * time.Millisecond, SweepInterval: sweep})
}

// txn is an application transaction on its own connection.
type txn struct {
	*sql.Tx
	id int64 // the connection's CONNECTION_ID()
}

func (e *orderEnv) begin(t *testing.T) *txn {
	t.Helper()
	tx, err := e.store.DB().BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	x := &txn{Tx: tx}
	if err := tx.QueryRowContext(e.ctx, "SELECT CONNECTION_ID()").Scan(&x.id); err != nil {
		t.Fatal(err)
	}
	return x
}

func (e *orderEnv) writeIn(t *testing.T, tx *txn, m outbox.Message) {
	t.Helper()
	if err := e.store.Write(e.ctx, tx.Tx, m); err != nil {
		t.Fatal(err)
	}
}

func (e *orderEnv) commit(t *testing.T, tx *txn) {
	t.Helper()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func (e *orderEnv) update(ctx context.Context, tx *txn) error {
	_, err := tx.ExecContext(ctx, "UPDATE aggregate SET n = n + 1 WHERE id = 'k'")
	return err
}

// waitLocked waits until tx's connection waits for a row lock. It reads
// SHOW ENGINE INNODB STATUS, not information_schema.innodb_trx: InnoDB
// refreshes the innodb_trx cache only when nobody read it in the last
// 100 ms, so tests polling it in parallel on one server keep reading the
// rows of their first poll forever (both tests here failed that way).
func (e *orderEnv) waitLocked(t *testing.T, tx *txn, what string) {
	t.Helper()
	relaytest.WaitFor(t, what, time.Minute, func() bool {
		var typ, name, status string
		if err := e.store.DB().QueryRowContext(e.ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
			t.Fatal(err)
		}
		return lockWaiting(status, tx.id)
	})
}

// lockWaiting reports whether the TRANSACTIONS section of an InnoDB
// status names the connection id as waiting for a lock. Each transaction
// is a block starting "---TRANSACTION"; a waiting one has a line starting
// "LOCK WAIT" and names its connection "MySQL thread id N," (MariaDB:
// "MariaDB thread id N,").
func lockWaiting(status string, id int64) bool {
	thread := fmt.Sprintf(" thread id %d,", id)
	for _, block := range strings.Split(status, "---TRANSACTION")[1:] {
		if strings.Contains(block, thread) && strings.Contains(block, "\nLOCK WAIT") {
			return true
		}
	}
	return false
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

func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// TestPlainWritePublishesInInsertOrder documents the limit of Write on
// MySQL, as on PostgreSQL: T1 writes M1, T2 writes M2, T2 updates the
// aggregate row, T1 waits for that row, T2 commits, then T1. T2 committed
// first, yet the relay publishes M1 first: a key's publish order is its
// insert order (AUTO_INCREMENT is drawn at insert), which is its commit
// order only when its writers are serialised before they write.
func TestPlainWritePublishesInInsertOrder(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t)
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
	e.startRelay(t, 0)
	if ids := e.published(t, 2); ids[0] != m1.ID || ids[1] != m2.ID {
		t.Fatalf("published %v, want M1 %s then M2 %s (insert order; the commit order was M2, M1)", ids, m1.ID, m2.ID)
	}
}

// TestSerialisedWritersPublishInCommitOrder: the application locks the
// aggregate row before Write, so the second writer of the key draws its
// seq only after the first committed; with the relay running throughout,
// publish order is commit order.
func TestSerialisedWritersPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t)
	e.startRelay(t, 0)
	m1, m2 := keyed(), keyed()
	t1, t2 := e.begin(t), e.begin(t)
	if err := e.update(e.ctx, t1); err != nil {
		t.Fatal(err)
	}
	t2Done := async(func() error {
		if err := e.update(e.ctx, t2); err != nil {
			return err
		}
		return e.store.Write(e.ctx, t2.Tx, m2)
	})
	e.waitLocked(t, t2, "T2 to wait for the row T1 updated")
	e.writeIn(t, t1, m1)
	e.commit(t, t1)
	if err := <-t2Done; err != nil {
		t.Fatal(err)
	}
	e.commit(t, t2)
	if ids := e.published(t, 2); ids[0] != m1.ID || ids[1] != m2.ID {
		t.Fatalf("published %v, want the commit order M1 %s, M2 %s", ids, m1.ID, m2.ID)
	}
}

// TestOpenTransactionHoldsBackLaterRows: two writers of a key commit out
// of insert order while the relay runs. T1 inserts M1 (the lower seq) and
// stays open; T2 inserts M2 and M3 (a key of another partition) and
// commits. The relay publishes M3, but holds M2 back while T1, which holds
// a lower seq of M2's partition, is open: it never moves its cursor past a
// row that may still commit. Once T1 commits, M1 and M2 go in seq order.
func TestOpenTransactionHoldsBackLaterRows(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t)
	e.startRelay(t, 0)
	m1, m2 := keyed(), keyed()
	p := outbox.PartitionOf("k", testPartitions)
	m3 := outbox.Message{ID: outbox.NewID(), Topic: "order", Key: "other"}
	for i := 0; outbox.PartitionOf(m3.Key, testPartitions) == p; i++ {
		m3.Key = fmt.Sprintf("other-%d", i)
	}
	t1, t2 := e.begin(t), e.begin(t)
	e.writeIn(t, t1, m1)
	e.writeIn(t, t2, m2)
	e.writeIn(t, t2, m3)
	e.commit(t, t2)
	if ids := e.published(t, 1); ids[0] != m3.ID {
		t.Fatalf("published %v, want M3 %s of the other partition", ids, m3.ID)
	}
	e.commit(t, t1)
	if ids := e.published(t, 3); ids[1] != m1.ID || ids[2] != m2.ID {
		t.Fatalf("published %v, want M3 %s, then M1 %s and M2 %s in seq order", ids, m3.ID, m1.ID, m2.ID)
	}
}

// TestRowBelowCursorIsFoundBySweep: a row that appears below the relay's
// cursor (a row whose seq was drawn but not yet in the pending index when
// a fetch read past it; here inserted with an explicit seq) is found by
// the relay's safety-net sweep (every 30 s with a MarkedFetcher) and
// published: nothing is lost.
func TestRowBelowCursorIsFoundBySweep(t *testing.T) {
	t.Parallel()
	e := newOrderEnv(t)
	r := e.startRelay(t, 50*time.Millisecond)
	first := outbox.Message{ID: outbox.NewID(), Topic: "order", Key: "k"}
	if err := e.write(e.ctx, first); err != nil {
		t.Fatal(err)
	}
	// Leave a gap of seqs below the next message.
	if _, err := e.store.DB().ExecContext(e.ctx, "ALTER TABLE "+e.store.n.messages+" AUTO_INCREMENT = 1000"); err != nil {
		t.Fatal(err)
	}
	second := keyed()
	if err := e.write(e.ctx, second); err != nil {
		t.Fatal(err)
	}
	e.published(t, 2)
	relaytest.WaitFor(t, "the outbox to drain", time.Minute, func() bool { return e.count(t, "_messages") == 0 })
	late := keyed()
	p := outbox.PartitionOf(late.Key, testPartitions)
	if _, err := e.store.DB().ExecContext(e.ctx, "INSERT INTO "+e.store.n.messages+
		" (seq, id, part, topic, msg_key, payload, created_at) VALUES (500, ?, ?, 'order', 'k', '', UTC_TIMESTAMP(6))", late.ID, p); err != nil {
		t.Fatal(err)
	}
	if ids := e.published(t, 3); ids[2] != late.ID {
		t.Fatalf("published %v, want the late row %s last", ids, late.ID)
	}
	relaytest.WaitFor(t, "the outbox to drain", time.Minute, func() bool { return e.count(t, "_messages") == 0 })
	if st := r.Stats(); st.Published != 3 {
		t.Fatalf("relay stats: %+v, want 3 published", st)
	}
}
