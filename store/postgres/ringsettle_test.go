package postgres

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// ringTwoChildren writes first into child 0 and second into child 1 of a
// ring of 3 (the keeper is not running: the test rotates).
func ringTwoChildren(t *testing.T, b *bundle, first, second []outbox.Message) {
	t.Helper()
	if err := b.write(t, first...); err != nil {
		t.Fatal(err)
	}
	if res, err := b.store.ringStep(b.ctx, time.Now()); err != nil || res.rotatedTo != 1 {
		t.Fatalf("ringStep = %+v, %v; want a rotation to child 1", res, err)
	}
	if err := b.write(t, second...); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.store.Pool().QueryRow(b.ctx, `SELECT count(*) FROM `+b.store.ringChild(1)).Scan(&n); err != nil || n != len(second) {
		t.Fatalf("child 1 holds %d rows (%v), want the second batch's %d", n, err, len(second))
	}
}

// otherStore opens a second store on b's outbox (no ring hints of its
// own), closed at the end of the test.
func (b *bundle) otherStore(t *testing.T) *Store {
	t.Helper()
	other, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	if _, err := other.Partitions(b.ctx); err != nil {
		t.Fatal(err)
	}
	return other
}

// settleEvery settles the records of every partition with st's lists
// filled by pick (delivered, retried or dead), holding every lease.
func settleEvery(t *testing.T, b *bundle, s *Store, recs []outbox.Record, pick func(r outbox.Record, st *outbox.Settlement)) {
	t.Helper()
	leases, err := s.AcquireLeases(b.ctx, "n", nil, testPartitions, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseLeases(b.ctx, "n", leases)
	var sts []outbox.Settlement
	for _, l := range leases {
		st := outbox.Settlement{Lease: l}
		for _, r := range recs {
			if r.Partition == l.Partition {
				pick(r, &st)
			}
		}
		sts = append(sts, st)
	}
	if err := s.Settle(b.ctx, "n", sts); err != nil {
		t.Fatal(err)
	}
}

// One settle holding items of two children, delivered, retried and dead,
// both from the store that fetched them (ring hints) and from another
// store that has no hint (it looks the rings up): every item is applied
// to its row, in its child, and nothing else changes.
func TestRingSettleAcrossChildren(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"hinted", "looked up"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Options{Layout: LayoutRing, RingChildren: 3, RingRotate: time.Hour})
			first, second := newMsgs(9, "a"), newMsgs(9, "b")
			ringTwoChildren(t, b, first, second)
			recs := b.all(t)
			if len(recs) != 18 {
				t.Fatalf("fetched %d records, want 18", len(recs))
			}
			settler := b.store
			if name == "looked up" {
				settler = b.otherStore(t)
			} else if n := b.store.hints.size(); n != 18 {
				t.Fatalf("the store holds %d ring hints after fetching 18 records", n)
			}
			// Per key (a or b), by position: 0–2 delivered, 3–5 retried, 6–8 dead.
			pos := map[string]int{}
			for i, m := range first {
				pos[m.ID] = i
			}
			for i, m := range second {
				pos[m.ID] = i
			}
			retryAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)
			settleEvery(t, b, settler, recs, func(r outbox.Record, st *outbox.Settlement) {
				switch i := pos[r.ID]; {
				case i < 3:
					st.Delivered = append(st.Delivered, r.ID)
				case i < 6:
					st.Retry = append(st.Retry, outbox.Failure{ID: r.ID, Attempts: 1, NextAttemptAt: retryAt, Err: "try later"})
				default:
					st.Dead = append(st.Dead, outbox.Failure{ID: r.ID, Attempts: 7, Err: "never"})
				}
			})
			left := b.all(t)
			if len(left) != 6 {
				t.Fatalf("%d records left, want the 6 retried", len(left))
			}
			for _, r := range left {
				if i := pos[r.ID]; i < 3 || i >= 6 || r.Attempts != 1 || r.LastError != "try later" || !r.NextAttemptAt.Equal(retryAt) {
					t.Errorf("left: %s at position %d, attempts %d, error %q, next %v; want only the retried, updated", r.ID, pos[r.ID], r.Attempts, r.LastError, r.NextAttemptAt)
				}
			}
			if n := b.count(t, "_dead_letters"); n != 6 {
				t.Fatalf("%d dead letters, want 6 (3 of each child)", n)
			}
			if name == "hinted" {
				// Delivered and dead leave the table and the hints; the
				// retried stay.
				if n := b.store.hints.size(); n != 6 {
					t.Fatalf("%d ring hints after the settle, want the 6 retried", n)
				}
			}
		})
	}
}

// A message ID is unique per child only: written into two children, a
// settle by a store without hints settles both rows (as the statement by
// id alone did), and a delivered ID that no child holds any more settles
// nothing and fails nothing.
func TestRingSettleDuplicateAndGoneIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Layout: LayoutRing, RingChildren: 3, RingRotate: time.Hour})
	first := newMsgs(2, "a")
	dup := first[0]
	ringTwoChildren(t, b, first, []outbox.Message{dup})
	recs := b.all(t)
	if len(recs) != 3 {
		t.Fatalf("fetched %d records, want 3 (one ID twice)", len(recs))
	}
	other := b.otherStore(t)
	gone := outbox.NewID()
	settleEvery(t, b, other, recs, func(r outbox.Record, st *outbox.Settlement) {
		if r.ID == dup.ID && !slices.Contains(st.Delivered, r.ID) {
			st.Delivered = append(st.Delivered, r.ID, gone)
		}
	})
	left := b.all(t)
	if len(left) != 1 || left[0].ID != first[1].ID {
		t.Fatalf("left %v, want only %s", left, first[1].ID)
	}
}

// The statement of a ring settle names each child it touches, with its
// ring beside the ID (the children's unique index), and no other child.
func TestRingSettleSQLNamesItsChildren(t *testing.T) {
	t.Parallel()
	n := newNames(Options{Schema: "s", TablePrefix: "outbox"}.WithDefaults())
	child := func(k int16) string { return `"s"."outbox_messages_r` + string(rune('0'+k)) + `"` }
	b := settleBatch{rings: true, child: child,
		delIdx: []int32{1, 1}, delIDs: make([][16]byte, 2), delRing: []int16{2, 0},
		deadIdx: []int32{1}, deadIDs: make([][16]byte, 1), deadAtt: []int32{3}, deadErr: []string{"x"}, deadRing: []int16{2},
	}
	sql, args := settleSQL(n, false, "node", []int32{5}, []int64{1}, &b)
	for _, want := range []string{
		`delivered_0 AS (
    DELETE FROM "s"."outbox_messages_r0" m`,
		`delivered_1 AS (
    DELETE FROM "s"."outbox_messages_r2" m`,
		`dead_1 AS (
    DELETE FROM "s"."outbox_messages_r2" m`,
		"FROM dead_1\n",
		"m.id = d.id AND m.published_at IS NULL AND m.ring = $",
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("settle SQL lacks %q:\n%s", want, sql)
		}
	}
	if strings.Contains(sql, `"s"."outbox_messages" m`) || strings.Contains(sql, "_r1") {
		t.Errorf("settle SQL touches the parent or child 1:\n%s", sql)
	}
	if got := strings.Count(sql, "$"); got < len(args) {
		t.Errorf("%d placeholders for %d arguments", got, len(args))
	}
}

// The hints are bounded: two generations of ringHintsMax, the older
// dropped when the newer fills.
func TestRingHintsBounded(t *testing.T) {
	t.Parallel()
	var h ringHints
	ids := make([][16]byte, 2*ringHintsMax+1)
	rings := make([]int16, len(ids))
	for i := range ids {
		ids[i][0], ids[i][1], ids[i][2] = byte(i), byte(i>>8), byte(i>>16)
		rings[i] = int16(i % 3)
	}
	h.put(ids, rings)
	if n := h.size(); n > 2*ringHintsMax {
		t.Fatalf("%d hints held, want at most %d", n, 2*ringHintsMax)
	}
	if _, ok := h.get(ids[0]); ok {
		t.Error("the oldest hint survived two generations")
	}
	if k, ok := h.get(ids[len(ids)-1]); !ok || k != rings[len(ids)-1] {
		t.Errorf("newest hint = %d, %v", k, ok)
	}
	if k, ok := h.get(ids[ringHintsMax+5]); !ok || k != rings[ringHintsMax+5] {
		t.Errorf("hint of the previous generation = %d, %v", k, ok)
	}
	h.forget(ids[len(ids)-1:])
	if _, ok := h.get(ids[len(ids)-1]); ok {
		t.Error("a forgotten hint is still held")
	}
}

// Backlog and Status run their statements in a batch, prepared; on the
// ring layout they must plan them for the children as they are at each
// call, never reuse a generic plan cached while a child was empty (a
// prepared statement without parameters always runs its generic plan):
// they run unnamed, so none of them is prepared on the connection. The
// plain table keeps its batch of prepared statements, which run cached
// generic plans (the control: the check sees them).
func TestRingBacklogAndStatusRunUnnamed(t *testing.T) {
	t.Parallel()
	for _, layout := range []Layout{LayoutRing, LayoutPlain} {
		t.Run(string(layout), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Options{Layout: layout, RingChildren: 3, RingRotate: time.Hour})
			sep := "?"
			if strings.Contains(b.dsn, "?") {
				sep = "&"
			}
			// One connection: every call runs on it, and the check reads it.
			s, err := Open(b.ctx, b.dsn+sep+"pool_max_conns=1", Options{Schema: b.opts.Schema})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for i := range 8 {
				if err := b.write(t, newMsgs(3, "k")...); err != nil {
					t.Fatal(err)
				}
				bl, err := s.Backlog(b.ctx, 100)
				if err != nil || bl.Outstanding != int64(3*(i+1)) {
					t.Fatalf("Backlog %d: %+v, %v; want %d outstanding", i, bl, err, 3*(i+1))
				}
				st, err := s.Status(b.ctx)
				if err != nil || st.Outstanding != int64(3*(i+1)) {
					t.Fatalf("Status %d: %+v, %v; want %d outstanding", i, st, err, 3*(i+1))
				}
			}
			var prepared, generic int64
			err = s.Pool().QueryRow(b.ctx, `SELECT count(*), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
WHERE strpos(statement, 'FROM ' || $1) > 0`, b.store.n.messages).Scan(&prepared, &generic)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d prepared statements read the outbox table, %d generic plans run", layout, prepared, generic)
			switch {
			case layout == LayoutRing && prepared != 0:
				t.Fatalf("ring: %d prepared statements on the outbox table; want them all unnamed", prepared)
			case layout == LayoutPlain && generic == 0:
				t.Fatalf("plain: no generic plan after 8 calls: the check cannot see them")
			}
		})
	}
}

// outbox migrate --dry-run says what Migrate would do to the layout.
func TestRingPendingLayout(t *testing.T) {
	t.Parallel()
	b := setup(t) // plain
	open := func(o Options) *Store {
		o.Schema = b.opts.Schema
		s, err := Open(b.ctx, b.dsn, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	fresh := open(Options{Layout: LayoutRing, TablePrefix: "fresh"})
	if got, err := fresh.PendingLayout(b.ctx); err != nil || !strings.Contains(got, "created as a ring of 4 children") {
		t.Errorf("new outbox, layout ring: %q, %v", got, err)
	}
	if got, err := b.store.PendingLayout(b.ctx); err != nil || got != "" {
		t.Errorf("plain outbox, layout empty: %q, %v; want nothing", got, err)
	}
	conv := open(Options{Layout: LayoutRing})
	if got, err := conv.PendingLayout(b.ctx); err != nil || !strings.Contains(got, "converted online") {
		t.Errorf("plain outbox, layout ring: %q, %v", got, err)
	}
	if err := conv.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := conv.PendingLayout(b.ctx); err != nil || got != "" {
		t.Errorf("ring outbox, layout ring: %q, %v; want nothing", got, err)
	}
	if got, err := open(Options{Layout: LayoutPlain}).PendingLayout(b.ctx); err == nil || !strings.Contains(err.Error(), "does not convert it back") {
		t.Errorf("ring outbox, layout plain: %q, %v; want Migrate's refusal", got, err)
	}
}

// A new outbox gets LayoutNew when Options.Layout is empty; an existing
// one keeps its layout (no conversion nobody asked for); with capture
// WAL there is no layout to make.
func TestNewOutboxLayout(t *testing.T) {
	t.Parallel()
	other := LayoutPlain
	if LayoutNew == LayoutPlain {
		other = LayoutRing
	}
	b := setup(t, Options{Layout: other}) // an existing outbox of the other layout
	fresh, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema, TablePrefix: "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if got, err := fresh.PendingLayout(b.ctx); err != nil || (LayoutNew == LayoutRing) != strings.Contains(got, "created as a ring") {
		t.Errorf("dry run of a new outbox: %q, %v; want the %s layout", got, err, LayoutNew)
	}
	rep, err := fresh.MigrateWithReport(b.ctx)
	if err != nil || rep.Layout != LayoutNew || !rep.Created {
		t.Fatalf("new outbox: %+v, %v; want the %s layout", rep, err, LayoutNew)
	}
	again, err := Open(b.ctx, b.dsn, Options{Schema: b.opts.Schema})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	rep, err = again.MigrateWithReport(b.ctx)
	if err != nil || rep.Layout != other || rep.ConvertedToRing || rep.Created {
		t.Fatalf("existing %s outbox migrated with Layout empty: %+v, %v; want it kept", other, rep, err)
	}
	if got, err := again.PendingLayout(b.ctx); err != nil || got != "" {
		t.Errorf("dry run of the existing outbox: %q, %v; want nothing", got, err)
	}
}
