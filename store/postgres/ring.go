package postgres

// The ring layout of the outbox table (Options.Layout LayoutRing): a table
// whose cost does not depend on vacuum.
//
// <prefix>_messages becomes a LIST-partitioned table on a column ring, with
// children <prefix>_messages_r0 … r<N-1> (and, after an online conversion,
// <prefix>_messages_legacy: the former table, ring -1). Writers are
// unchanged: the column's default, <prefix>_ring_now(), reads the current
// child from the sequence <prefix>_ring_seq (a sequence, so moving the
// writers on leaves no dead row behind, even with the horizon held). The
// relay reads and settles through the parent as before; its statements
// are the table layout's.
//
// The relay's keeper (one goroutine per Store, started by the first
// Heartbeat) does two things every Options.RingRotate / 2:
//
//   - it TRUNCATEs every child other than the current one that holds no
//     undelivered message (nor a published one still kept by retention).
//     TRUNCATE removes the deleted rows at once, whatever holds the xmin
//     horizon: the rows that fetches, settles and the backlog's probes walk
//     over are those of the last few seconds, not of the whole hold;
//   - every Options.RingRotate it moves the writers on to the next child
//     that is empty (truncated), if the current one holds rows.
//
// Safety does not depend on which child a row lands in: the relay reads
// every child, and a child is truncated only inside a transaction that
// holds it in ACCESS EXCLUSIVE mode and, after taking that lock, finds no
// undelivered row in it. A writer inserting into a child holds ROW
// EXCLUSIVE on it until its transaction ends, so the lock is granted only
// once every transaction that inserted into the child has committed or
// rolled back, and the check (a new snapshot, read committed) sees their
// rows; a writer that comes later waits for the truncation and then
// inserts into the emptied child, which the next truncation checks again.
// So a transaction that read the current ring before a rotation and
// commits long after it (a late commit) keeps its child from being
// truncated until the relay has delivered its rows. The lock is tried with
// a lock_timeout of RingLockTimeout (writers and the relay's own
// statements queue behind it meanwhile), and the keeper tries again at its
// next round.
//
// What it costs: every statement on the parent plans and opens N+1
// children instead of one table; a message ID is unique per child (the
// unique index must hold the partition key), not across children; a child
// whose messages wait (a failing key, a blocked destination) cannot be
// truncated and keeps collecting deleted rows while writers are on it
// again; when no child is empty the writers stay where they are.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Layout is how the outbox table of capture table is stored.
type Layout string

const (
	// LayoutPlain is one table whose delivered rows are deleted and
	// removed by vacuum (the default of a new outbox).
	LayoutPlain Layout = "plain"
	// LayoutRing partitions the table into a ring of children that the
	// relay truncates once drained: its cost does not depend on vacuum.
	LayoutRing Layout = "ring"
)

// Defaults and limits of the ring layout.
const (
	// RingChildrenDefault is the default of Options.RingChildren.
	RingChildrenDefault = 4
	// RingChildrenMax bounds Options.RingChildren.
	RingChildrenMax = 64
	// RingRotateDefault is the default of Options.RingRotate.
	RingRotateDefault = 5 * time.Second
	// RingRotateMin bounds Options.RingRotate from below.
	RingRotateMin = 10 * time.Millisecond
	// RingLockTimeout is how long the keeper waits for a child's ACCESS
	// EXCLUSIVE lock (lock_timeout) before it gives up until its next
	// round; writers and the relay's statements wait behind it meanwhile.
	RingLockTimeout = 50 * time.Millisecond
	// RingConvertLockTimeout is how long Migrate waits, per try, for the
	// locks of the online conversion to the ring layout.
	RingConvertLockTimeout = 500 * time.Millisecond
	// ringDetectEvery is how often, at most, a keeper that found the
	// plain layout looks again (an online conversion while the relay
	// runs); 20 × RingRotate when shorter.
	ringDetectEvery = time.Minute
	// ringWarnEvery bounds the keeper's warnings that no child is empty.
	ringWarnEvery = time.Minute
)

// ParseLayout parses "plain" or "ring" (empty means keep what exists).
func ParseLayout(s string) (Layout, error) {
	switch Layout(s) {
	case "", LayoutPlain, LayoutRing:
		return Layout(s), nil
	}
	return "", fmt.Errorf("layout must be %q or %q, got %q", LayoutPlain, LayoutRing, s)
}

// validateRing checks the ring fields of o (after defaults).
func (o Options) validateRing() error {
	if _, err := ParseLayout(string(o.Layout)); err != nil {
		return &OptionError{"Layout", fmt.Sprintf("must be %q, %q or empty (keep the existing layout), got %q", LayoutPlain, LayoutRing, o.Layout)}
	}
	if o.RingChildren < 0 || o.RingChildren == 1 || o.RingChildren > RingChildrenMax {
		return &OptionError{"RingChildren", fmt.Sprintf("must be between 2 and %d (0 for the default %d), got %d", RingChildrenMax, RingChildrenDefault, o.RingChildren)}
	}
	if o.RingRotate < RingRotateMin {
		return &OptionError{"RingRotate", fmt.Sprintf("must be at least %v (0 for the default %v), got %v", RingRotateMin, RingRotateDefault, o.RingRotate)}
	}
	if o.Layout == LayoutRing && o.Capture == CaptureWAL {
		return &OptionError{"Layout", fmt.Sprintf("%q partitions the outbox table; with Capture %q there is no table: leave Layout empty", LayoutRing, CaptureWAL)}
	}
	return nil
}

// ringNames are the ring layout's names.
type ringNames struct {
	messages    string // unquoted, unqualified: <prefix>_messages
	temp        string // quoted, qualified: the new parent before the swap
	tempName    string
	legacy      string // quoted, qualified: the former table, once renamed
	legacyName  string
	legacyIdx   string // unquoted: unique (id, ring) built on the former table
	legacyCheck string // unquoted: CHECK (ring = -1) on the former table
	seq         string // quoted, qualified
	fn          string // quoted, qualified
	pkey        string // quoted, unqualified index names on the parent
	pending     string
	txid        string
	published   string
	childPrefix string // unquoted: <prefix>_messages_r
}

func newRingNames(o Options) ringNames {
	q := func(name string) string { return pgx.Identifier{o.Schema, o.TablePrefix + name}.Sanitize() }
	u := func(name string) string { return pgx.Identifier{o.TablePrefix + name}.Sanitize() }
	return ringNames{
		messages:    o.TablePrefix + "_messages",
		temp:        q("_messages_ring"),
		tempName:    o.TablePrefix + "_messages_ring",
		legacy:      q("_messages_legacy"),
		legacyName:  o.TablePrefix + "_messages_legacy",
		legacyIdx:   o.TablePrefix + "_legacy_id_ring_idx",
		legacyCheck: o.TablePrefix + "_legacy_ring_check",
		seq:         q("_ring_seq"),
		fn:          q("_ring_now"),
		pkey:        u("_ring_id_idx"),
		pending:     u("_ring_pending_idx"),
		txid:        u("_ring_txid_idx"),
		published:   u("_ring_published_idx"),
		childPrefix: o.TablePrefix + "_messages_r",
	}
}

// child returns the quoted, qualified name of child k (-1: the legacy one).
func (s *Store) ringChild(k int) string {
	if k < 0 {
		return s.rn.legacy
	}
	return pgx.Identifier{s.opts.Schema, s.rn.childPrefix + strconv.Itoa(k)}.Sanitize()
}

// ringValue returns the ring value of the child named relname, and whether
// it is one of the ring's children.
func (s *Store) ringValue(relname string) (int, bool) {
	if relname == s.rn.legacyName {
		return -1, true
	}
	tail, ok := strings.CutPrefix(relname, s.rn.childPrefix)
	if !ok {
		return 0, false
	}
	k, err := strconv.Atoi(tail)
	return k, err == nil && k >= 0
}

// isRing reports whether the outbox table is partitioned (the ring layout).
func (s *Store) isRing(ctx context.Context, q querier) (bool, error) {
	rows, err := q.Query(ctx, `SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass($1)`, s.n.messages)
	if err != nil {
		return false, err
	}
	ring, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return false, err
	}
	is := len(ring) == 1 && ring[0]
	s.ringLayout.Store(is)
	return is, nil
}

// ringParentSQL creates the new parent (under its temporary name) with the
// columns of the outbox table plus ring, its indexes and n children.
func (s *Store) ringParentSQL(n int) string {
	r := s.rn
	var b strings.Builder
	b.WriteString(`CREATE SEQUENCE IF NOT EXISTS ` + r.seq + ` AS integer MINVALUE 0 START 0;
GRANT SELECT ON ` + r.seq + ` TO PUBLIC;
CREATE OR REPLACE FUNCTION ` + r.fn + `() RETURNS smallint LANGUAGE sql STABLE PARALLEL SAFE
    AS $ring$ SELECT last_value::smallint FROM ` + r.seq + ` $ring$;
DROP TABLE IF EXISTS ` + r.temp + `;
CREATE TABLE ` + r.temp + ` (
    id              uuid NOT NULL,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    partition       integer NOT NULL,
    topic           text NOT NULL,
    key             text NOT NULL DEFAULT '',
    payload         bytea NOT NULL,
    headers         jsonb,
    created_at      timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    published_at    timestamptz,
    txid            xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ring            smallint NOT NULL DEFAULT ` + r.fn + `()
) PARTITION BY LIST (ring);
CREATE UNIQUE INDEX ` + r.pkey + ` ON ` + r.temp + ` (id, ring);
CREATE INDEX ` + r.pending + ` ON ` + r.temp + ` (partition, seq) WHERE published_at IS NULL;
CREATE INDEX ` + r.txid + ` ON ` + r.temp + ` (partition, txid) WHERE published_at IS NULL;
CREATE INDEX ` + r.published + ` ON ` + r.temp + ` (published_at) WHERE published_at IS NOT NULL;
`)
	for k := range n {
		fmt.Fprintf(&b, "CREATE TABLE %s PARTITION OF %s FOR VALUES IN (%d);\n", s.ringChild(k), r.temp, k)
	}
	return b.String()
}

// ringCreateSQL is the ring layout of a new, empty outbox table, for
// MigrationSQL (outbox migrate --print-sql with layout=ring): what
// convertToRing leaves when the table it converts is empty (the new parent
// under the table's name; the empty table dropped).
func (s *Store) ringCreateSQL() string {
	n := cmp.Or(s.opts.RingChildren, RingChildrenDefault)
	return fmt.Sprintf("\n-- the ring layout (Options.Layout ring): the outbox table LIST-partitioned on ring into %d children,\n", n) +
		"-- replacing the empty table made above; the relay rotates writers through them and truncates the drained ones\n" +
		s.ringParentSQL(n) +
		"DROP TABLE " + s.n.messages + ";\n" +
		"ALTER TABLE " + s.rn.temp + " RENAME TO " + pgx.Identifier{s.rn.messages}.Sanitize() + ";\n"
}

// convertToRing turns the plain outbox table into the ring layout, online:
// writers and relays keep working, waiting at most RingConvertLockTimeout
// at a time (a try that times out is repeated until ctx ends). It reports
// whether it converted (false: already the ring).
//
//  1. the new parent, its indexes and children are created under a
//     temporary name (nobody uses them yet);
//  2. the former table gets the column ring (default -1: a metadata
//     change) and CHECK (ring = -1), added NOT VALID and validated without
//     blocking writers, and a unique index on (id, ring) built
//     CONCURRENTLY, so that ATTACH needs neither a scan nor an index build;
//  3. one short transaction locks the former table, starts the new
//     parent's seq after the last one drawn, renames the former table to
//     <prefix>_messages_legacy and the parent to <prefix>_messages, and
//     attaches the former as the child of ring -1 (or drops it when
//     empty). Statements waiting for the lock look the name up again once
//     they have it, and find the parent.
//
// The relays' cursors stay valid: seq keeps growing, the rows keep their
// partition, seq and txid. The legacy child is truncated like any other
// once drained, and receives no new row.
func (s *Store) convertToRing(ctx context.Context, conn *pgx.Conn) (bool, error) {
	ring, err := s.isRing(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("ring layout: look at the outbox table: %w", err)
	}
	if ring {
		return false, nil
	}
	n := cmp.Or(s.opts.RingChildren, RingChildrenDefault)
	r := s.rn
	if _, err := conn.Exec(ctx, s.ringParentSQL(n)); err != nil {
		return false, fmt.Errorf("ring layout: create the partitioned table: %w", err)
	}
	var hasCheck bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2)`, s.n.messages, r.legacyCheck).Scan(&hasCheck); err != nil {
		return false, fmt.Errorf("ring layout: look for the check constraint: %w", err)
	}
	if !hasCheck {
		err := s.withLockTimeout(ctx, conn, RingConvertLockTimeout, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `ALTER TABLE `+s.n.messages+` ADD COLUMN IF NOT EXISTS ring smallint NOT NULL DEFAULT -1,
    ADD CONSTRAINT `+pgx.Identifier{r.legacyCheck}.Sanitize()+` CHECK (ring = -1) NOT VALID`)
			return err
		})
		if err != nil {
			return false, fmt.Errorf("ring layout: add the column ring to %s: %w", s.n.messages, err)
		}
	}
	// VALIDATE takes SHARE UPDATE EXCLUSIVE: writers go on.
	if _, err := conn.Exec(ctx, `ALTER TABLE `+s.n.messages+` VALIDATE CONSTRAINT `+pgx.Identifier{r.legacyCheck}.Sanitize()); err != nil {
		return false, fmt.Errorf("ring layout: validate the check constraint: %w", err)
	}
	idx := migration{version: 0, name: "ring_legacy_index", sql: noTransaction + "\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS " +
		pgx.Identifier{r.legacyIdx}.Sanitize() + " ON " + s.n.messages + " (id, ring)"}
	if _, err := s.buildConcurrently(ctx, conn, idx); err != nil {
		return false, fmt.Errorf("ring layout: %w", err)
	}
	err = s.withLockTimeout(ctx, conn, RingConvertLockTimeout, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+s.n.messages+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var (
			last     int64
			nonEmpty bool
		)
		// No transaction that inserted into the table is in progress (the
		// lock): the sequence's last value is the highest seq any row can
		// hold.
		if err := tx.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0), EXISTS (SELECT 1 FROM `+s.n.messages+`)`,
			s.n.messages).Scan(&last, &nonEmpty); err != nil {
			return err
		}
		stmts := []string{
			`ALTER TABLE ` + r.temp + ` ALTER COLUMN seq RESTART WITH ` + strconv.FormatInt(last+1, 10),
			`ALTER TABLE ` + s.n.messages + ` RENAME TO ` + pgx.Identifier{r.legacyName}.Sanitize(),
			`ALTER TABLE ` + r.temp + ` RENAME TO ` + pgx.Identifier{r.messages}.Sanitize(),
		}
		if nonEmpty {
			// Without its identity a direct insert into the legacy child
			// fails instead of drawing a seq the parent hands out too.
			stmts = append(stmts,
				`ALTER TABLE `+r.legacy+` ALTER COLUMN seq DROP IDENTITY`,
				`ALTER TABLE `+s.n.messages+` ATTACH PARTITION `+r.legacy+` FOR VALUES IN (-1)`)
		} else {
			stmts = append(stmts, `DROP TABLE `+r.legacy)
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("ring layout: swap the tables: %w", err)
	}
	return true, nil
}

// withLockTimeout runs fn in a transaction with lock_timeout d, again
// after each lock timeout (SQLSTATE 55P03), until ctx ends.
func (s *Store) withLockTimeout(ctx context.Context, conn *pgx.Conn, d time.Duration, fn func(tx pgx.Tx) error) error {
	for {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(d.Milliseconds(), 10)+"ms"); err != nil {
				return err
			}
			return fn(tx)
		})
		if !lockTimedOut(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waited for locks held by writers or relays: %w)", context.Cause(ctx), err)
		case <-time.After(d):
		}
	}
}

func lockTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// ringKeeper is the state of the Store's keeper goroutine.
type ringKeeper struct {
	started    bool      // under Store.subMu
	lastRotate time.Time // keeper goroutine only
	warnedAt   time.Time
}

// startRingKeeper starts the keeper once (Heartbeat calls it: only a relay
// keeps the ring). It runs until Close.
func (s *Store) startRingKeeper() {
	if s.opts.Capture == CaptureWAL {
		return
	}
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.ring.started || s.closed.Load() {
		return
	}
	s.ring.started = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.keepRing(s.closeCtx)
	}()
}

// keepRing runs ringStep every RingRotate / 2 while the table is a ring,
// and looks for a conversion every ringDetectEvery while it is not.
func (s *Store) keepRing(ctx context.Context) {
	every := max(s.opts.RingRotate/2, RingRotateMin)
	for {
		wait := every
		ring, err := s.isRing(ctx, s.pool)
		switch {
		case err != nil:
			s.ringLog(slog.LevelWarn, "postgres: ring: cannot read the outbox table's layout", "err", err)
		case !ring:
			wait = min(ringDetectEvery, 20*s.opts.RingRotate)
		default:
			stepCtx, cancel := context.WithTimeout(ctx, max(every, time.Second))
			_, err := s.ringStep(stepCtx, time.Now())
			cancel()
			if err != nil && ctx.Err() == nil {
				s.ringLog(slog.LevelWarn, "postgres: ring: keeping the outbox table's ring failed; trying again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (s *Store) ringLog(level slog.Level, msg string, args ...any) {
	s.horizon.mu.Lock()
	log := s.horizon.log
	s.horizon.mu.Unlock()
	if log != nil {
		log.Log(context.Background(), level, msg, args...)
	}
}

// ringStepResult is what one keeper round did.
type ringStepResult struct {
	current   int   // the writers' child at the start
	truncated []int // children truncated
	pinned    []int // children holding undelivered (or retained) rows
	busy      []int // children whose lock timed out
	rotatedTo int   // the writers' new child; -2 when not moved
}

// ringStep truncates the drained children other than the current one and,
// when the last rotation is RingRotate old (or never happened) and the
// current child holds rows, moves the writers on to the next empty child.
func (s *Store) ringStep(ctx context.Context, now time.Time) (ringStepResult, error) {
	res := ringStepResult{rotatedTo: -2}
	if err := s.check("ring"); err != nil {
		return res, err
	}
	rows, err := s.pool.Query(ctx, `SELECT (SELECT last_value FROM `+s.rn.seq+`)::integer, c.relname::text, pg_relation_size(c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, s.n.messages)
	if err != nil {
		return res, s.wrap("ring", err)
	}
	size := map[int]int64{}
	var ring []int // the values >= 0, in order
	err = func() error {
		defer rows.Close()
		for rows.Next() {
			var (
				name  string
				bytes int64
			)
			if err := rows.Scan(&res.current, &name, &bytes); err != nil {
				return err
			}
			if k, ok := s.ringValue(name); ok {
				size[k] = bytes
				if k >= 0 {
					ring = append(ring, k)
				}
			}
		}
		return rows.Err()
	}()
	if err != nil {
		return res, s.wrap("ring", err)
	}
	if len(ring) == 0 {
		return res, fmt.Errorf("postgres: ring: %s has no child named %s<n>", s.n.messages, s.rn.childPrefix)
	}
	slices.Sort(ring)
	for _, k := range append([]int{-1}, ring...) {
		b, ok := size[k]
		if !ok || k == res.current || b == 0 {
			continue
		}
		done, err := s.truncateDrained(ctx, k)
		switch {
		case lockTimedOut(err):
			res.busy = append(res.busy, k)
		case err != nil:
			return res, err
		case done:
			res.truncated = append(res.truncated, k)
			size[k] = 0
		default:
			res.pinned = append(res.pinned, k)
		}
	}
	if size[res.current] == 0 || (!s.ring.lastRotate.IsZero() && now.Sub(s.ring.lastRotate) < s.opts.RingRotate) {
		return res, nil
	}
	i := slices.Index(ring, res.current)
	for j := 1; j < len(ring); j++ {
		k := ring[(i+j+len(ring))%len(ring)]
		if size[k] != 0 {
			continue
		}
		if _, err := s.pool.Exec(ctx, `SELECT setval($1::regclass, $2, true)`, s.rn.seq, k); err != nil {
			return res, s.wrap("ring: rotate", err)
		}
		res.rotatedTo = k
		s.ring.lastRotate = now
		return res, nil
	}
	if now.Sub(s.ring.warnedAt) >= ringWarnEvery {
		s.ring.warnedAt = now
		s.ringLog(slog.LevelWarn, "postgres: ring: no child of the outbox table is empty, so writers stay on child "+strconv.Itoa(res.current)+
			" and its deleted rows wait for vacuum: the others hold undelivered messages (a failing key, a blocked destination, a backlog) or are locked by an open transaction that wrote into them; see `outbox status`",
			"pinned", res.pinned, "busy", res.busy)
	}
	return res, nil
}

// truncateDrained truncates child k if it holds no undelivered row and no
// published row that retention still keeps. It looks first without a lock,
// then again holding the child in ACCESS EXCLUSIVE mode (lock_timeout
// RingLockTimeout; a timeout is returned as a 55P03 error).
func (s *Store) truncateDrained(ctx context.Context, k int) (bool, error) {
	child := s.ringChild(k)
	busy := `SELECT EXISTS (SELECT 1 FROM ` + child + ` WHERE published_at IS NULL OR published_at > now() - $1::interval)`
	keep := interval(s.opts.Retention)
	var pinned bool
	if err := s.pool.QueryRow(ctx, busy, keep).Scan(&pinned); err != nil {
		return false, s.wrap("ring: look at "+child, err)
	}
	if pinned {
		return false, nil
	}
	truncated := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(RingLockTimeout.Milliseconds(), 10)+"ms"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+child+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		// A new snapshot, taken with the lock held: every transaction that
		// inserted into the child has ended, and its rows are seen.
		if err := tx.QueryRow(ctx, busy, keep).Scan(&pinned); err != nil || pinned {
			return err
		}
		_, err := tx.Exec(ctx, `TRUNCATE `+child)
		truncated = err == nil
		return err
	})
	if lockTimedOut(err) {
		return false, err
	}
	if err != nil {
		return false, s.wrap("ring: truncate "+child, err)
	}
	return truncated, nil
}

// LayoutNew is the layout Migrate gives a new outbox (one whose tables it
// creates) when Options.Layout is empty. An existing outbox keeps its
// layout: Migrate converts a table only when Options.Layout asks. It is
// plain: free, the ring costs PostgreSQL about 1.1× the plain table's CPU
// per message (every relay statement planned at each call, the keeper's
// truncations; README, "Should the ring be the default"), which is what
// every outbox would pay for a gain only some need.
const LayoutNew = LayoutPlain

// wantLayout is the layout Migrate makes: Options.Layout, or for a new
// outbox (created) LayoutNew when it is empty; with capture WAL none.
func (s *Store) wantLayout(created bool) Layout {
	if s.opts.Capture == CaptureWAL {
		return ""
	}
	if s.opts.Layout == "" && created {
		return LayoutNew
	}
	return s.opts.Layout
}

// migrateLayout applies Options.Layout after the migrations: it converts
// the table to the ring when asked, and reports the layout.
//
// created says the migrations just created the tables (a new outbox): an
// empty Options.Layout then means LayoutNew.
func (s *Store) migrateLayout(ctx context.Context, conn *pgx.Conn, created bool) (Layout, bool, error) {
	ring, err := s.isRing(ctx, conn)
	if err != nil {
		return "", false, fmt.Errorf("look at the outbox table's layout: %w", err)
	}
	want := s.wantLayout(created)
	switch {
	case ring && want == LayoutPlain:
		return LayoutRing, false, fmt.Errorf("Options.Layout is %q but the outbox table %s has the %q layout; Migrate does not convert it back: leave Layout empty (or %q)",
			LayoutPlain, s.n.messages, LayoutRing, LayoutRing)
	case ring:
		return LayoutRing, false, nil
	case want != LayoutRing:
		return LayoutPlain, false, nil
	}
	converted, err := s.convertToRing(ctx, conn)
	if err != nil {
		return LayoutPlain, false, err
	}
	return LayoutRing, converted, nil
}

// PendingLayout says what Migrate would do to the outbox table's layout
// (outbox migrate --dry-run): "" for nothing, else a line naming the
// change. It fails as Migrate would when Options.Layout asks for the plain
// layout of a ring.
func (s *Store) PendingLayout(ctx context.Context) (string, error) {
	if err := s.check("migrate"); err != nil {
		return "", err
	}
	if s.opts.Capture == CaptureWAL {
		return "", nil
	}
	var exists, ring bool
	err := s.pool.QueryRow(ctx, `SELECT c.oid IS NOT NULL, coalesce(c.relkind = 'p', false) FROM (SELECT to_regclass($1) AS oid) r LEFT JOIN pg_class c ON c.oid = r.oid`,
		s.n.messages).Scan(&exists, &ring)
	if err != nil {
		return "", fmt.Errorf("postgres: look at the outbox table's layout: %w", err)
	}
	n := cmp.Or(s.opts.RingChildren, RingChildrenDefault)
	want := s.wantLayout(!exists)
	switch {
	case ring && want == LayoutPlain:
		return "", fmt.Errorf("postgres: Options.Layout is %q but the outbox table %s has the %q layout; Migrate does not convert it back", LayoutPlain, s.n.messages, LayoutRing)
	case ring || want != LayoutRing:
		return "", nil
	case !exists:
		return fmt.Sprintf("ring layout: the outbox table created as a ring of %d children", n), nil
	}
	return fmt.Sprintf("ring layout: the outbox table %s converted online into a ring of %d children (the former table attached as the child %s)", s.n.messages, n, s.rn.legacyName), nil
}

// planArgs returns the arguments of a relay statement on the outbox table.
// With the ring layout they start with pgx.QueryExecModeCacheDescribe: the
// statement runs unnamed, so PostgreSQL plans it for the children as they
// are now (a child that was empty when a cached generic plan was made
// can hold thousands of rows a few seconds later, and a plan that scans
// it sequentially once per settled message takes seconds).
func (s *Store) planArgs(args ...any) []any {
	if !s.ringLayout.Load() {
		return args
	}
	return append([]any{pgx.QueryExecModeCacheDescribe}, args...)
}

// sendBatch runs b in tx: as one batch (one round trip, prepared
// statements), or on the ring layout statement by statement, unnamed
// (planArgs), each planned for the children as they are now. A batch
// cannot run some statements unnamed, and a prepared statement without
// parameters always runs its cached generic plan: Backlog's heads (ORDER
// BY seq LIMIT 1 per partition), planned while the writers' child was
// empty, read it in full once it held thousands of rows.
func (s *Store) sendBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	if !s.ringLayout.Load() {
		return tx.SendBatch(ctx, b).Close()
	}
	for _, qq := range b.QueuedQueries {
		r := &unnamedResult{ctx: ctx, tx: tx, sql: qq.SQL, args: s.planArgs(qq.Arguments...)}
		var err error
		if qq.Fn != nil {
			err = qq.Fn(r)
		} else {
			_, err = r.Exec()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unnamedResult is the pgx.BatchResults of one statement of sendBatch.
type unnamedResult struct {
	ctx  context.Context
	tx   pgx.Tx
	sql  string
	args []any
}

func (r *unnamedResult) Exec() (pgconn.CommandTag, error) { return r.tx.Exec(r.ctx, r.sql, r.args...) }
func (r *unnamedResult) Query() (pgx.Rows, error)         { return r.tx.Query(r.ctx, r.sql, r.args...) }
func (r *unnamedResult) QueryRow() pgx.Row                { return r.tx.QueryRow(r.ctx, r.sql, r.args...) }
func (r *unnamedResult) Close() error                     { return nil }
func (r *unnamedResult) Tx() pgx.Tx                       { return nil }
