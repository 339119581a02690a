package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/storetest"
)

// ringOptions is the ring layout with a fast keeper: rotations and
// truncations happen while the tests run.
func ringOptions() Options {
	return Options{Layout: LayoutRing, RingChildren: 3, RingRotate: 20 * time.Millisecond}
}

// The conformance suite on the ring layout, with the keeper rotating and
// truncating every 10 ms once a test heartbeats.
func TestRingConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		b := setup(t, ringOptions())
		return storetest.Harness{
			Store: b.store,
			Write: func(ctx context.Context, msgs ...outbox.Message) error {
				return pgx.BeginFunc(ctx, b.store.Pool(), func(tx pgx.Tx) error {
					return b.store.Writer().Write(ctx, tx, msgs...)
				})
			},
			Partitions: testPartitions,
		}
	})
}

// ringChildSize returns the heap size of child k (0 once truncated).
func (b *bundle) ringChildSize(t *testing.T, k int) int64 {
	t.Helper()
	var n int64
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT pg_relation_size($1::regclass)`, b.store.ringChild(k)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ringOf returns the ring value of the row of message id.
func (b *bundle) ringOf(t *testing.T, id string) int {
	t.Helper()
	var k int
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT ring FROM `+b.store.n.messages+` WHERE id = $1`, id).Scan(&k); err != nil {
		t.Fatal(err)
	}
	return k
}

// deliverAll settles every pending record as delivered, as a relay
// holding every partition would, and returns their IDs.
func (b *bundle) deliverAll(t *testing.T) []string {
	t.Helper()
	leases, err := b.store.AcquireLeases(b.ctx, "n", nil, testPartitions, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer b.store.ReleaseLeases(b.ctx, "n", leases)
	var sts []outbox.Settlement
	var cursors []outbox.Cursor
	for _, l := range leases {
		cursors = append(cursors, outbox.Cursor{Lease: l})
	}
	recs, err := b.store.Fetch(b.ctx, cursors, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range leases {
		st := outbox.Settlement{Lease: l}
		for _, r := range recs {
			if r.Partition == l.Partition {
				st.Delivered = append(st.Delivered, r.ID)
				ids = append(ids, r.ID)
			}
		}
		sts = append(sts, st)
	}
	if err := b.store.Settle(b.ctx, "n", sts); err != nil {
		t.Fatal(err)
	}
	return ids
}

func newMsgs(n int, key string) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key, Payload: []byte("x")}
	}
	return out
}

// The keeper moves writers to the next empty child and truncates a child
// only once every message in it was delivered.
func TestRingRotatesAndTruncatesDrainedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Layout: LayoutRing, RingChildren: 3, RingRotate: time.Hour})
	s := b.store
	now := time.Now()
	first := newMsgs(10, "a")
	if err := b.write(t, first...); err != nil {
		t.Fatal(err)
	}
	if k := b.ringOf(t, first[0].ID); k != 0 {
		t.Fatalf("first messages in child %d, want 0", k)
	}
	res, err := s.ringStep(b.ctx, now)
	if err != nil || res.rotatedTo != 1 || len(res.truncated) != 0 {
		t.Fatalf("step 1 = %+v, %v; want a rotation to child 1 and no truncation", res, err)
	}
	second := newMsgs(5, "b")
	if err := b.write(t, second...); err != nil {
		t.Fatal(err)
	}
	if k := b.ringOf(t, second[0].ID); k != 1 {
		t.Fatalf("messages after the rotation in child %d, want 1", k)
	}
	// Child 0 holds undelivered messages: kept; no rotation before RingRotate.
	res, err = s.ringStep(b.ctx, now.Add(time.Minute))
	if err != nil || len(res.truncated) != 0 || !slices.Equal(res.pinned, []int{0}) || res.rotatedTo != -2 {
		t.Fatalf("step 2 = %+v, %v; want child 0 pinned, nothing truncated or rotated", res, err)
	}
	if got := len(b.deliverAll(t)); got != 15 {
		t.Fatalf("delivered %d, want 15", got)
	}
	if b.ringChildSize(t, 0) == 0 {
		t.Fatal("child 0 empty before the keeper truncated it: the test no longer tests truncation")
	}
	// Delivered: child 0 is truncated, child 1 (current) is not.
	res, err = s.ringStep(b.ctx, now.Add(2*time.Hour))
	if err != nil || !slices.Equal(res.truncated, []int{0}) || res.rotatedTo != 2 {
		t.Fatalf("step 3 = %+v, %v; want child 0 truncated and a rotation to child 2 (the next empty one)", res, err)
	}
	if n := b.ringChildSize(t, 0); n != 0 {
		t.Fatalf("child 0 has %d bytes after TRUNCATE", n)
	}
	if b.ringChildSize(t, 1) == 0 {
		t.Fatal("child 1 (current at the start of the step) was truncated")
	}
	// Next rotation wraps around to child 0, the truncated one, after child
	// 1 is truncated.
	third := newMsgs(3, "c")
	if err := b.write(t, third...); err != nil {
		t.Fatal(err)
	}
	res, err = s.ringStep(b.ctx, now.Add(4*time.Hour))
	if err != nil || !slices.Equal(res.truncated, []int{1}) || res.rotatedTo != 0 {
		t.Fatalf("step 4 = %+v, %v; want child 1 truncated, rotation to 0", res, err)
	}
	if recs := b.all(t); len(recs) != 3 || recs[0].Key != "c" {
		t.Fatalf("pending after the steps: %d records, want the 3 of child 2", len(recs))
	}
}

// A transaction that wrote into a child before the rotation and commits
// after it (a late commit): the keeper cannot truncate the child while the
// transaction is open (its lock times out), and once it commits the child
// holds its undelivered rows, which a marked fetch returns below the
// cursor; only then is the child truncated.
func TestRingLateCommitKeepsItsChild(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Layout: LayoutRing, RingChildren: 2, RingRotate: time.Hour, Partitions: 1})
	s := b.store
	now := time.Now()
	lease, err := s.AcquireLeases(b.ctx, "n", nil, 1, time.Minute)
	if err != nil || len(lease) != 1 {
		t.Fatalf("lease %v, %v", lease, err)
	}
	late, err := s.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background())
	lateMsg := newMsgs(1, "k")[0]
	if err := s.Writer().Write(b.ctx, late, lateMsg); err != nil {
		t.Fatal(err)
	}
	res, err := s.ringStep(b.ctx, now)
	if err != nil || res.rotatedTo != 1 {
		t.Fatalf("rotation = %+v, %v; want to child 1 (child 0 holds the open transaction's row)", res, err)
	}
	other := newMsgs(1, "other")[0]
	if err := b.write(t, other); err != nil {
		t.Fatal(err)
	}
	recs, mark, err := s.FetchMarked(b.ctx, []outbox.Cursor{{Lease: lease[0]}}, 100)
	if err != nil || len(recs) != 1 || recs[0].ID != other.ID {
		t.Fatalf("first fetch %v, %v; want only the committed message", recs, err)
	}
	cursor := outbox.Cursor{Lease: lease[0], After: recs[0].Seq, Mark: mark}
	if err := s.Settle(b.ctx, "n", []outbox.Settlement{{Lease: lease[0], Delivered: []string{other.ID}}}); err != nil {
		t.Fatal(err)
	}
	// Child 0 looks drained (the row is not visible) but the open
	// transaction holds it: the lock times out, nothing is truncated.
	res, err = s.ringStep(b.ctx, now.Add(time.Minute))
	if err != nil || !slices.Equal(res.busy, []int{0}) || len(res.truncated) != 0 {
		t.Fatalf("step while the writer is open = %+v, %v; want child 0 busy", res, err)
	}
	if err := late.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	res, err = s.ringStep(b.ctx, now.Add(2*time.Minute))
	if err != nil || !slices.Equal(res.pinned, []int{0}) || len(res.truncated) != 0 {
		t.Fatalf("step after the late commit = %+v, %v; want child 0 pinned by the late row", res, err)
	}
	recs, _, err = s.FetchMarked(b.ctx, []outbox.Cursor{cursor}, 100)
	if err != nil || len(recs) != 1 || recs[0].ID != lateMsg.ID || recs[0].Seq > cursor.After {
		t.Fatalf("marked fetch after the late commit = %v, %v; want the late row below the cursor", recs, err)
	}
	if err := s.Settle(b.ctx, "n", []outbox.Settlement{{Lease: lease[0], Delivered: []string{lateMsg.ID}}}); err != nil {
		t.Fatal(err)
	}
	res, err = s.ringStep(b.ctx, now.Add(3*time.Minute))
	if err != nil || !slices.Equal(res.truncated, []int{0}) {
		t.Fatalf("step after delivery = %+v, %v; want child 0 truncated", res, err)
	}
}

// With retention, a child is truncated only once its published rows are
// older than the retention.
func TestRingKeepsRetainedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Layout: LayoutRing, RingChildren: 2, RingRotate: time.Hour, Retention: time.Hour})
	s := b.store
	now := time.Now()
	if err := b.write(t, newMsgs(3, "a")...); err != nil {
		t.Fatal(err)
	}
	if res, err := s.ringStep(b.ctx, now); err != nil || res.rotatedTo != 1 {
		t.Fatalf("rotation = %+v, %v", res, err)
	}
	b.deliverAll(t)
	res, err := s.ringStep(b.ctx, now.Add(time.Minute))
	if err != nil || !slices.Equal(res.pinned, []int{0}) {
		t.Fatalf("step = %+v, %v; want child 0 kept for its retained rows", res, err)
	}
	if _, err := s.Pool().Exec(b.ctx, `UPDATE `+s.n.messages+` SET published_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	res, err = s.ringStep(b.ctx, now.Add(2*time.Minute))
	if err != nil || !slices.Equal(res.truncated, []int{0}) {
		t.Fatalf("step = %+v, %v; want child 0 truncated once retention ended", res, err)
	}
}

func TestRingOptions(t *testing.T) {
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Layout: "rings"}, "Layout"},
		{Options{RingChildren: 1}, "RingChildren"},
		{Options{RingChildren: RingChildrenMax + 1}, "RingChildren"},
		{Options{RingRotate: time.Millisecond}, "RingRotate"},
		{Options{Layout: LayoutRing, Capture: CaptureWAL}, "Layout"},
	} {
		err := c.o.Validate()
		oe, ok := err.(*OptionError)
		if !ok || oe.Field != c.field {
			t.Errorf("Validate(%+v) = %v; want an OptionError on %s", c.o, err, c.field)
		}
	}
	if err := (Options{Layout: LayoutRing, RingChildren: 2}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// A ring is not converted back, and Migrate on it again changes nothing.
func TestRingMigrateAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, ringOptions())
	s2, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rep, err := s2.MigrateWithReport(b.ctx)
	if err != nil || rep.Layout != LayoutRing || rep.ConvertedToRing {
		t.Fatalf("migrate again = %+v, %v; want the ring kept", rep, err)
	}
	s3, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema, Layout: LayoutPlain})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if _, err := s3.MigrateWithReport(b.ctx); err == nil {
		t.Fatal("Migrate with Layout plain on a ring succeeded; want an error saying it does not convert back")
	}
}

// ringBroker acknowledges everything and tells the checker.
type ringBroker struct {
	ch    *brokertest.Checker
	acked atomic.Int64
}

func (p *ringBroker) Publish(_ context.Context, msgs []*outbox.Message) []error {
	for _, m := range msgs {
		p.ch.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic})
		p.acked.Add(1)
	}
	return make([]error, len(msgs))
}

func (p *ringBroker) Close() error { return nil }

// Converting a plain outbox to the ring while writers write and a relay
// relays: nothing is lost, per-key order holds, new rows go to the ring's
// children with higher sequence numbers, and the former table, attached as
// the legacy child, is truncated once drained. One writer's transaction is
// open across the swap (the conversion waits for it).
func TestRingConvertOnline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.store
	ch := brokertest.NewChecker()
	// A backlog in the plain table, and one transaction open with a row.
	backlog := newMsgs(200, "old")
	if err := b.write(t, backlog...); err != nil {
		t.Fatal(err)
	}
	open, err := s.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.Background())
	openMsg := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "open"}
	if err := s.Writer().Write(b.ctx, open, openMsg); err != nil {
		t.Fatal(err)
	}
	for _, m := range backlog {
		ch.Written(m.Key, m.ID)
	}
	var maxOld int64
	if err := s.Pool().QueryRow(b.ctx, `SELECT max(seq) FROM `+s.n.messages).Scan(&maxOld); err != nil {
		t.Fatal(err)
	}

	relayStore, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema, RingRotate: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relayStore.Close() }) // after the relay stops
	pub := &ringBroker{ch: ch}
	relaytest.Start(t, relayStore, pub, outbox.Config{Node: "r", PollInterval: 10 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})

	var stop atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: fmt.Sprintf("w%d-%d", w, i%5)}
				err := pgx.BeginFunc(b.ctx, s.Pool(), func(tx pgx.Tx) error { return s.Writer().Write(b.ctx, tx, m) })
				if err != nil {
					t.Errorf("write during the conversion: %v", err)
					return
				}
				ch.Written(m.Key, m.ID)
				written.Add(1)
			}
		})
	}
	relaytest.WaitFor(t, "writes before the conversion", time.Minute, func() bool { return written.Load() > 50 })

	conv, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema, Layout: LayoutRing, RingChildren: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer conv.Close()
	done := make(chan error, 1)
	var rep MigrateReport
	go func() {
		var err error
		rep, err = conv.MigrateWithReport(b.ctx)
		done <- err
	}()
	// The swap waits for the open transaction (its lock times out and is
	// tried again): commit it once the conversion has tried.
	relaytest.WaitFor(t, "the conversion to wait for the open writer", time.Minute, func() bool {
		var waited bool
		err := s.Pool().QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE (query LIKE 'ALTER TABLE%' OR query LIKE 'LOCK TABLE%') AND wait_event_type = 'Lock')`).Scan(&waited)
		if err != nil {
			t.Fatal(err)
		}
		return waited
	})
	if err := open.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	ch.Written(openMsg.Key, openMsg.ID)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !rep.ConvertedToRing || rep.Layout != LayoutRing {
		t.Fatalf("report %+v; want converted", rep)
	}
	afterSwap := written.Load()
	relaytest.WaitFor(t, "writes after the conversion", time.Minute, func() bool { return written.Load() > afterSwap+100 })
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	relaytest.WaitFor(t, "everything relayed", 2*time.Minute, func() bool {
		rep := ch.Verify()
		return len(rep.Lost) == 0
	})
	rep2 := ch.Verify()
	if len(rep2.Unknown) > 0 || len(rep2.OrderViolations) > 0 || len(rep2.WrongKey) > 0 {
		t.Fatalf("after the conversion: %s", rep2)
	}
	var minNew int64
	if err := s.Pool().QueryRow(b.ctx, `SELECT coalesce(min(seq), 0) FROM `+s.n.messages+` WHERE ring >= 0`).Scan(&minNew); err != nil {
		t.Fatal(err)
	}
	if minNew != 0 && minNew <= maxOld {
		t.Fatalf("a row of the ring has seq %d, not above the former table's %d", minNew, maxOld)
	}
	// The keeper truncates the drained legacy child.
	relaytest.WaitFor(t, "the legacy child truncated", time.Minute, func() bool {
		var n int64
		if err := s.Pool().QueryRow(b.ctx, `SELECT coalesce(pg_relation_size(to_regclass($1)), 0)`, s.rn.legacy).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	var truncatedRing int
	if err := s.Pool().QueryRow(b.ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass AND pg_relation_size(c.oid) = 0 AND c.relname <> $2`,
		s.n.messages, s.rn.legacyName).Scan(&truncatedRing); err != nil {
		t.Fatal(err)
	}
	t.Logf("converted: %d messages written, %d acknowledged; %d of 3 ring children empty at the end", written.Load(), pub.acked.Load(), truncatedRing)
}
