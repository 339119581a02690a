package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// walBroker acknowledges what fail lets through and records it for a
// checker, in publish order.
type walBroker struct {
	checker *brokertest.Checker
	mu      sync.Mutex
	fail    func(m *outbox.Message) error // nil: acknowledge everything
	onCall  func()                        // called at every Publish
	onAck   func(m *outbox.Message)       // called for every message acknowledged
	acked   atomic.Int64
}

func (b *walBroker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.mu.Lock()
	fail, onCall := b.fail, b.onCall
	b.mu.Unlock()
	if onCall != nil {
		onCall()
	}
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if fail != nil {
			if errs[i] = fail(m); errs[i] != nil {
				continue
			}
		}
		if b.onAck != nil {
			b.onAck(m)
		} else if b.checker != nil {
			b.checker.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic})
		}
		b.acked.Add(1)
	}
	return errs
}

func (b *walBroker) Close() error { return nil }

func (b *walBroker) setFail(f func(m *outbox.Message) error) {
	b.mu.Lock()
	b.fail = f
	b.mu.Unlock()
}

// walRelayConfig reacts quickly, for tests that wait on conditions.
func walRelayConfig(node string) outbox.Config {
	return outbox.Config{
		Node: node, Workers: 4, BatchSize: 100,
		PollInterval: 20 * time.Millisecond, PublishTimeout: time.Second, LeaseTTL: 3 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		MaxAttempts: 1000, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	}
}

func startRelay(t *testing.T, s outbox.Source, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	return relaytest.Start(t, s, pub, cfg)
}

func currentLSN(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := q.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// slotConfirmed returns the slot's confirmed_flush_lsn as the server has it.
func (b *walBundle) slotConfirmed(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s string
	err := b.store.Pool().QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, b.store.w.Slot).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func parseLSN(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// keyWriter writes messages of its own keys, so that its call order is the
// commit order of each key, and records them in the checker once committed.
type keyWriter struct {
	b       *walBundle
	checker *brokertest.Checker
	written atomic.Int64
}

func (w *keyWriter) run(t *testing.T, id, keys, total int, stop *atomic.Bool) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(id), 16))
	for n := 0; n < total && (stop == nil || !stop.Load()); {
		size := min(1+rng.IntN(10), total-n)
		msgs := make([]outbox.Message, size)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: fmt.Sprintf("wal.w%d", id), Key: fmt.Sprintf("w%d-k%d", id, rng.IntN(keys)), Payload: []byte("x")}
		}
		if err := w.b.write(ctx, msgs...); err != nil {
			t.Errorf("write: %v", err)
			return
		}
		for _, m := range msgs {
			w.checker.Written(m.Key, m.ID)
		}
		n += size
		w.written.Add(int64(size))
	}
}

func verifyChecker(t *testing.T, c *brokertest.Checker) brokertest.Report {
	t.Helper()
	rep := c.Verify()
	t.Logf("checker: %s", rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestWALRelayOrderAndGracefulStop: writers write while a relay publishes;
// every message arrives, per key in commit order. The relay sends its
// position only at start and at stop here (a status interval of an hour),
// so the slot's position after a graceful stop shows that the stop
// flushed it; a new relay on the slot then publishes nothing again.
func TestWALRelayOrderAndGracefulStop(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{WAL: WALOptions{StatusInterval: time.Hour, Timeout: 3 * time.Hour}})
	checker := brokertest.NewChecker()
	pub := &walBroker{checker: checker}
	r := startRelay(t, b.store, pub, walRelayConfig("a"))
	w := &keyWriter{b: b, checker: checker}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { w.run(t, i, 20, 2000, nil) })
	}
	wg.Wait()
	if err := b.store.Sync(b.ctx); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "every message published", time.Minute, func() bool { return checker.Verify().DeliveredUnique == 8000 })
	settled := parseLSN(t, b.store.Stats().Confirmed)
	if got := b.slotConfirmed(t); got >= settled {
		t.Fatalf("the slot is at %s before the stop, want below %s: the test needs the position unsent", got, settled)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	rep := verifyChecker(t, checker)
	if len(rep.Duplicates) != 0 {
		t.Errorf("%d duplicates without any failure", len(rep.Duplicates))
	}
	if got := b.slotConfirmed(t); got < settled {
		t.Fatalf("after a graceful stop the slot is confirmed up to %s, want %s (everything settled)", got, settled)
	}
	// A new relay on the same slot has nothing to publish again.
	before := pub.acked.Load()
	fast := b.store.Options()
	fast.WAL.StatusInterval, fast.WAL.Timeout = 20*time.Millisecond, WALTimeoutDefault
	b2, err := OpenWAL(b.ctx, b.dsn, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	r2 := startRelay(t, b2, pub, walRelayConfig("b"))
	after := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the new relay to confirm the latest position", time.Minute, func() bool { return b.slotConfirmed(t) >= after })
	if err := r2.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := pub.acked.Load() - before; n != 0 {
		t.Fatalf("a relay started after a graceful stop published %d messages again", n)
	}
}

// TestWALKeepaliveNoAdvancePastPending: while a message waits for its
// broker acknowledgement, neither the relay's confirmed position nor the
// slot moves past its transaction, however many keepalives and later
// transactions come (go-pq-cdc's #107); once it is acknowledged, the slot
// catches up.
func TestWALKeepaliveNoAdvancePastPending(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	pub := &walBroker{fail: func(m *outbox.Message) error {
		if m.Key == "stuck" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-gate
		}
		return nil
	}}
	startRelay(t, b.store, pub, walRelayConfig("a"))
	b.streaming(t)
	// The stuck message's transaction: its commit comes after lsn0.
	var lsn0 pglogrepl.LSN
	err := pgx.BeginFunc(b.ctx, b.store.Pool(), func(tx pgx.Tx) error {
		if err := b.store.Writer().Write(b.ctx, tx, outbox.Message{Topic: "t", Key: "stuck"}); err != nil {
			return err
		}
		lsn0 = currentLSN(t, tx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The stuck transaction's commit ends at or before lsnc. (Other tests
	// share the server: their transactions committing between lsn0 and
	// the stuck commit may rightly be confirmed, so lsn0 is no bound.)
	lsnc := currentLSN(t, b.store.Pool())
	<-entered
	// Later traffic: outbox messages of other keys (published at once) and
	// plain writes.
	if _, err := b.store.Pool().Exec(b.ctx, `CREATE TABLE other (v int)`); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := b.write(b.ctx, outbox.Message{Topic: "t", Key: fmt.Sprint("free-", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Pool().Exec(b.ctx, `INSERT INTO other SELECT generate_series(1, 100)`); err != nil {
			t.Fatal(err)
		}
	}
	lsn1 := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the later messages published", time.Minute, func() bool { return pub.acked.Load() >= 20 })
	relaytest.WaitFor(t, "the reader to receive past the traffic", time.Minute, func() bool {
		return parseLSN(t, b.store.Stats().Received) >= lsn1
	})
	k := b.store.Stats().Keepalives
	relaytest.WaitFor(t, "more keepalives", time.Minute, func() bool { return b.store.Stats().Keepalives >= k+5 })
	if got := parseLSN(t, b.store.Stats().Confirmed); got >= lsnc {
		t.Fatalf("the relay confirmed %s past the pending message's transaction (its commit is between %s and %s)", got, lsn0, lsnc)
	}
	if got := b.slotConfirmed(t); got >= lsnc {
		t.Fatalf("the slot is confirmed up to %s, past the pending message's transaction (its commit is between %s and %s)", got, lsn0, lsnc)
	}
	close(gate)
	relaytest.WaitFor(t, "the slot to catch up once acknowledged", time.Minute, func() bool { return b.slotConfirmed(t) >= lsn1 })
}

// TestWALIdleOutboxAdvancesSlot: with no outbox message at all, writes to
// other tables still move the slot on (the server's keepalive positions
// are confirmed), so the WAL is not retained.
func TestWALIdleOutboxAdvancesSlot(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	startRelay(t, b.store, &walBroker{}, walRelayConfig("a"))
	b.streaming(t)
	start := b.slotConfirmed(t)
	if _, err := b.store.Pool().Exec(b.ctx, `CREATE TABLE busy (v int); INSERT INTO busy SELECT generate_series(1, 10000)`); err != nil {
		t.Fatal(err)
	}
	end := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the slot to move past the other writes", time.Minute, func() bool { return b.slotConfirmed(t) >= end })
	if end <= start {
		t.Fatalf("the writes made no WAL: %s, %s", start, end)
	}
}

// TestWALLockAfterWrite: T1 writes M1, T2 writes M2 (same key), T2 updates
// an aggregate row that T1 then waits for, T2 commits, then T1. The
// commit order is T2, T1, and so is the publishing order, with no lock
// taken by the outbox.
func TestWALLockAfterWrite(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	var mu sync.Mutex
	var order []string
	pub := &walBroker{fail: func(m *outbox.Message) error {
		mu.Lock()
		order = append(order, string(m.Payload))
		mu.Unlock()
		return nil
	}}
	startRelay(t, b.store, pub, walRelayConfig("a"))
	pool := b.store.Pool()
	if _, err := pool.Exec(b.ctx, `CREATE TABLE agg (id int PRIMARY KEY, v int); INSERT INTO agg VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	w := b.store.Writer()
	m := func(p string) outbox.Message { return outbox.Message{Topic: "agg", Key: "order-1", Payload: []byte(p)} }
	t1, err := pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(context.Background())
	t2, err := pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Rollback(context.Background())
	if err := w.Write(b.ctx, t1, m("M1")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(b.ctx, t2, m("M2")); err != nil {
		t.Fatal(err)
	}
	if _, err := t2.Exec(b.ctx, `UPDATE agg SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	var pid1 int
	if err := t1.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid1); err != nil {
		t.Fatal(err)
	}
	t1done := make(chan error, 1)
	go func() {
		_, err := t1.Exec(b.ctx, `UPDATE agg SET v = v + 10 WHERE id = 1`)
		if err == nil {
			err = t1.Commit(b.ctx)
		}
		t1done <- err
	}()
	relaytest.WaitFor(t, "T1 to wait for T2's row lock", time.Minute, func() bool {
		var waiting bool
		err := pool.QueryRow(b.ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid1).Scan(&waiting)
		return err == nil && waiting
	})
	if err := t2.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-t1done; err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "both published", time.Minute, func() bool { return pub.acked.Load() == 2 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{"M2", "M1"}) {
		t.Fatalf("published %v, want [M2 M1]: the commit order", order)
	}
}

// TestWALBrokerOutageBoundedMemory: the broker refuses everything for
// longer than the replication timeout while a transaction of 1,500
// messages and many small ones commit; the buffer never holds more than
// its bound, the connection survives (the relay confirms on schedule while
// it does not read), and once the broker is back everything is published
// in order.
func TestWALBrokerOutageBoundedMemory(t *testing.T) {
	t.Parallel()
	const bound = 100
	// Parking off: this is about a full buffer waiting for room.
	b := setupWAL(t, Options{WAL: WALOptions{BufferMessages: bound, Timeout: 500 * time.Millisecond, StatusInterval: 50 * time.Millisecond, ParkAfter: -1}})
	checker := brokertest.NewChecker()
	var maxHeld atomic.Int64
	pub := &walBroker{checker: checker, onCall: func() {
		if n := int64(b.store.Stats().Buffered); n > maxHeld.Load() {
			maxHeld.Store(n)
		}
	}}
	down := errors.New("broker down")
	pub.setFail(func(*outbox.Message) error { return down })
	startRelay(t, b.store, pub, walRelayConfig("a"))
	b.streaming(t)
	big := make([]outbox.Message, 1500)
	for i := range big {
		big[i] = outbox.Message{ID: outbox.NewID(), Topic: "big", Key: fmt.Sprint("k", i%7)}
	}
	if err := b.write(b.ctx, big...); err != nil {
		t.Fatal(err)
	}
	for _, m := range big {
		checker.Written(m.Key, m.ID)
	}
	w := &keyWriter{b: b, checker: checker}
	w.run(t, 1, 10, 500, nil)
	relaytest.WaitFor(t, "the buffer to fill", time.Minute, func() bool { return b.store.Stats().Buffered == bound })
	// Stay full for longer than the timeout: the connection must survive.
	sent := b.store.Stats().StatusSent
	relaytest.WaitFor(t, "status updates over twice the timeout while full", time.Minute, func() bool {
		return b.store.Stats().StatusSent >= sent+20
	})
	if st := b.store.Stats(); st.Buffered != bound || st.Acquisitions != 1 {
		t.Fatalf("while full: %+v; want %d held and the first connection still up", st, bound)
	}
	pub.setFail(nil)
	relaytest.WaitFor(t, "every message published", 2*time.Minute, func() bool { return checker.Verify().DeliveredUnique == 2000 })
	verifyChecker(t, checker)
	if got := maxHeld.Load(); got > bound {
		t.Fatalf("the buffer held %d messages, bound %d", got, bound)
	}
	if st := b.store.Stats(); st.Acquisitions != 1 {
		t.Fatalf("the replication connection was lost during the outage: %+v", st)
	}
}

// TestWALDeadLetterBeforeConfirm: a message the broker refuses for good is
// written to the dead-letter table before the slot moves past it; while
// that write waits (the table locked), the position stays put.
func TestWALDeadLetterBeforeConfirm(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	pub := &walBroker{fail: func(m *outbox.Message) error {
		if m.Key == "poison" {
			return outbox.Permanent(errors.New("too large for the broker"))
		}
		return nil
	}}
	lock, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(b.ctx, `LOCK TABLE `+b.store.tab.n.deadLetters+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	startRelay(t, b.store, pub, walRelayConfig("a"))
	b.streaming(t)
	var lsn0 pglogrepl.LSN
	err = pgx.BeginFunc(b.ctx, b.store.Pool(), func(tx pgx.Tx) error {
		if err := b.store.Writer().Write(b.ctx, tx, outbox.Message{Topic: "t", Key: "poison", Payload: []byte("p")}); err != nil {
			return err
		}
		lsn0 = currentLSN(t, tx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.write(b.ctx, outbox.Message{Topic: "t", Key: "fine"}); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the dead-letter insert to wait for the lock", time.Minute, func() bool {
		var n int
		err := b.store.Pool().QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%dead_letters%'`).Scan(&n)
		return err == nil && n > 0
	})
	relaytest.WaitFor(t, "the other message published", time.Minute, func() bool { return pub.acked.Load() == 1 })
	k := b.store.Stats().Keepalives
	relaytest.WaitFor(t, "more keepalives", time.Minute, func() bool { return b.store.Stats().Keepalives >= k+5 })
	// The slot may be confirmed past lsn0 (read inside the poison's
	// transaction) while the transaction had not committed yet: nothing
	// after lsn0 is skipped but transactions committing before the
	// confirmed position. What matters is the poison's commit, known once
	// its dead letter is written (its seq is the commit LSN).
	locked := b.slotConfirmed(t)
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	end := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the slot to move on", time.Minute, func() bool { return b.slotConfirmed(t) >= end })
	dls, err := b.store.DeadLetters(b.ctx, outbox.DeadLetterFilter{})
	if err != nil || len(dls) != 1 || dls[0].Key != "poison" || string(dls[0].Payload) != "p" {
		t.Fatalf("dead letters = %+v, %v; want the poison message", dls, err)
	}
	var commit int64
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT seq FROM `+b.store.tab.n.deadLetters).Scan(&commit); err != nil {
		t.Fatal(err)
	}
	// The commit record starts at or after what was read inside its
	// transaction (at it when nothing else wrote WAL in between: CI once).
	if commit < int64(lsn0) {
		t.Fatalf("the dead letter's commit LSN %s is before %s, read inside its transaction", pglogrepl.LSN(commit), lsn0)
	}
	if locked > pglogrepl.LSN(commit) {
		t.Fatalf("slot confirmed up to %s before the dead letter was written: a restart would skip its transaction, committed at %s", locked, pglogrepl.LSN(commit))
	}
}

// TestWALUndecodableAndDuplicate: a logical message with the outbox prefix
// that is not an outbox message is dead-lettered with what was wrong; a
// message whose ID is held already is dropped; the slot moves past both.
func TestWALUndecodableAndDuplicate(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	gate := make(chan struct{})
	pub := &walBroker{fail: func(m *outbox.Message) error {
		if m.Key == "held" {
			<-gate
		}
		return nil
	}}
	startRelay(t, b.store, pub, walRelayConfig("a"))
	b.streaming(t)
	first := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "held", Payload: []byte("1")}
	if err := b.write(b.ctx, first); err != nil {
		t.Fatal(err)
	}
	again := first
	again.Payload = []byte("2")
	if err := b.write(b.ctx, again); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, b.store.prefix, []byte("\x01abc")); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Sync(b.ctx); err != nil {
		t.Fatal(err)
	}
	if d := b.store.Stats().Duplicates; d != 1 {
		t.Fatalf("%d duplicates dropped, want 1", d)
	}
	close(gate)
	end := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the slot to move past both", time.Minute, func() bool { return b.slotConfirmed(t) >= end })
	dls, err := b.store.DeadLetters(b.ctx, outbox.DeadLetterFilter{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters = %+v, %v; want the undecodable message", dls, err)
	}
	if want := "truncated ID"; !strings.Contains(dls[0].LastError, want) || string(dls[0].Payload) != "\x01abc" {
		t.Fatalf("dead letter %+v: want the raw content and an error saying %q", dls[0], want)
	}
	if n := pub.acked.Load(); n != 1 {
		t.Fatalf("%d messages published, want 1 (the duplicate dropped, the undecodable dead-lettered)", n)
	}
}

// TestWALGracefulStopRepublishesNothing: partitions progress independently,
// so a relay that lags has published later transactions while earlier
// ones wait in another worker's queue; the slot can be confirmed only up
// to the first unsettled message. A graceful stop publishes what lies
// before the last settled message first, so the confirmed position covers
// everything published and a relay started after it publishes nothing
// again. (On 443b377 the workers only waited for their publishes in
// flight: the 10 messages of the later transaction, published and
// acknowledged, were all published again by the next relay.)
func TestWALGracefulStopRepublishesNothing(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	cfg := walRelayConfig("a")
	cfg.Workers, cfg.InFlight, cfg.BatchSize = 2, 1, 1
	// The hung publish must not time out, however slow the machine.
	cfg.PublishTimeout, cfg.LeaseTTL, cfg.ShutdownTimeout = 20*time.Second, time.Minute, time.Minute
	cfg.Logger = slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	keysOf := func(worker int) []string {
		var keys []string
		for i := 0; len(keys) < 10; i++ {
			k := fmt.Sprintf("w%d-%d", worker, i)
			if outbox.PartitionOf(k, testPartitions)%cfg.Workers == worker {
				keys = append(keys, k)
			}
		}
		return keys
	}
	slowKeys, fastKeys := keysOf(0), keysOf(1)
	gate := make(chan struct{})
	var once sync.Once
	entered := make(chan struct{})
	pub := &walBroker{fail: func(m *outbox.Message) error {
		if strings.HasPrefix(m.Key, "w0-") {
			once.Do(func() { close(entered) })
			<-gate // worker 0's first publish hangs until the stop
		}
		return nil
	}}
	r := startRelay(t, b.store, pub, cfg)
	b.streaming(t)
	var first, second []outbox.Message
	for _, k := range slowKeys {
		first = append(first, outbox.Message{Topic: "t", Key: k})
	}
	for _, k := range fastKeys {
		second = append(second, outbox.Message{Topic: "t", Key: k})
	}
	if err := b.write(b.ctx, first...); err != nil {
		t.Fatal(err)
	}
	if err := b.write(b.ctx, second...); err != nil {
		t.Fatal(err)
	}
	<-entered
	// Both transactions received, then the second, published and settled,
	// waits behind the first: 10 messages held (the first transaction's;
	// without the Sync, the 10 held could be the first alone, before the
	// second arrived).
	if err := b.store.Sync(b.ctx); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the later transaction settled", time.Minute, func() bool { return b.store.Stats().Buffered == 10 })
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop() }()
	relaytest.WaitFor(t, "the stop to begin", time.Minute, func() bool { return !r.Ready() })
	close(gate)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	before := pub.acked.Load()
	if before != 20 {
		t.Fatalf("%d messages acknowledged before the stop returned, want the 20 written (relay %+v, store %+v)", before, r.Stats(), b.store.Stats())
	}
	b2, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	r2 := startRelay(t, b2, pub, walRelayConfig("b"))
	after := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the new relay to confirm the latest position", time.Minute, func() bool { return b.slotConfirmed(t) >= after })
	if err := r2.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := pub.acked.Load() - before; n != 0 {
		t.Fatalf("a relay started after a graceful stop published %d messages again", n)
	}
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) { l.t.Log(string(p)); return len(p), nil }

// TestWALGracefulStopWaitsForADueRetry: a graceful stop drains what lies
// below the stop barrier, and that includes a message waiting for a retry
// due before the shutdown deadline (retryDueBefore): the stop publishes
// it, the confirmed position covers both transactions, and the next relay
// publishes nothing again. (Leaving without waiting would leave its
// transaction unconfirmed, and the next relay would publish it and the
// later, acknowledged one again.)
func TestWALGracefulStopWaitsForADueRetry(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	cfg := walRelayConfig("a")
	cfg.Workers, cfg.BatchSize = 1, 1
	// The retry comes 3 s after the failure: after the stop begins (on a
	// machine too slow for that, the test still checks that nothing is
	// published twice), well before its deadline.
	cfg.BackoffMin, cfg.BackoffMax = 3*time.Second, 3*time.Second
	cfg.PublishTimeout, cfg.LeaseTTL, cfg.ShutdownTimeout = 5*time.Second, time.Minute, time.Minute
	var failed atomic.Bool
	pub := &walBroker{}
	pub.setFail(func(m *outbox.Message) error {
		if m.Key == "a" {
			if failed.CompareAndSwap(false, true) {
				return errors.New("broker: internal error")
			}
		}
		return nil
	})
	r := startRelay(t, b.store, pub, cfg)
	b.streaming(t)
	if err := b.write(b.ctx, outbox.Message{Topic: "t", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the first attempt to fail", time.Minute, failed.Load)
	if err := b.write(b.ctx, outbox.Message{Topic: "t", Key: "b"}); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the later transaction published and settled, the failed message waiting for its retry", time.Minute, func() bool {
		return pub.acked.Load() == 1 && b.store.Stats().Buffered == 1
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := pub.acked.Load(); n != 2 {
		t.Fatalf("%d messages acknowledged when the stop returned, want 2: the stop must publish the retry due before its deadline (relay %+v, store %+v)", n, r.Stats(), b.store.Stats())
	}
	b2, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	r2 := startRelay(t, b2, pub, walRelayConfig("b"))
	after := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the new relay to confirm the latest position", time.Minute, func() bool { return b.slotConfirmed(t) >= after })
	if err := r2.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := pub.acked.Load(); n != 2 {
		t.Fatalf("a relay started after a graceful stop published %d messages again", n-2)
	}
}

// TestWALGracefulStopInsideALargeTransaction: a transaction five times
// larger than the buffer is published while it is read; the relay stops
// in the middle of it. Its stop barrier keeps rising as the rest of the
// transaction is read (StopBarrier's complete is false until its Commit),
// so the drain publishes it to the end, the confirmed position covers it,
// and the next relay publishes nothing again. (Draining only to the first
// barrier left the transaction unconfirmed: every message of it already
// published was published again.)
func TestWALGracefulStopInsideALargeTransaction(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{WAL: WALOptions{BufferMessages: 20, ParkAfter: -1}})
	checker := brokertest.NewChecker()
	pub := &walBroker{checker: checker}
	pub.setFail(func(*outbox.Message) error {
		time.Sleep(time.Millisecond) // a broker's latency: the stop comes mid-transaction
		return nil
	})
	cfg := walRelayConfig("a")
	cfg.BatchSize = 5
	r := startRelay(t, b.store, pub, cfg)
	b.streaming(t)
	big := make([]outbox.Message, 100)
	for i := range big {
		big[i] = outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprint("k", i%10)}
		checker.Written(big[i].Key, big[i].ID)
	}
	if err := b.write(b.ctx, big...); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "part of the transaction published", time.Minute, func() bool { return pub.acked.Load() >= 30 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := pub.acked.Load()
	b2, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	pub.setFail(nil)
	startRelay(t, b2, pub, walRelayConfig("b"))
	relaytest.WaitFor(t, "the whole transaction published", time.Minute, func() bool { return checker.Verify().DeliveredUnique == len(big) })
	after := currentLSN(t, b.store.Pool())
	relaytest.WaitFor(t, "the new relay to confirm the latest position", time.Minute, func() bool { return b.slotConfirmed(t) >= after })
	rep := verifyChecker(t, checker)
	if len(rep.Duplicates) > 0 {
		t.Fatalf("%d messages published again after a graceful stop (%d acknowledged when it returned)", len(rep.Duplicates), stopped)
	}
}
