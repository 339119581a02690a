package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

// ClaimUnordered is the seeds' claim for Ordering "none": it begins a
// transaction on a pool connection, locks up to limit due, unpublished
// records with SELECT … FOR UPDATE SKIP LOCKED (oldest IDs first; none of
// a topic in skip: the index scan passes over them), and keeps
// the transaction, and the connection, until the claim is settled or
// released. The records are returned in Seq order. A claim of no records
// holds nothing.
//
// A claim first looks at the recent IDs only (UUIDv7: created within
// claimRecent of now), where the records of a steady load are, so that it
// does not pass over every row deleted since the last vacuum, which a
// queue table holds at its oldest IDs. It also looks at the older IDs
// when the recent ones gave nothing, and at most every claimOlderEvery
// otherwise: records of long transactions, retries coming due, a backlog,
// IDs from a skewed clock or not UUIDv7 are claimed too, at most
// claimOlderEvery later while recent records keep coming. So a claim
// comes back empty only when no record at all is claimable.
func (s *Store) ClaimUnordered(ctx context.Context, limit int, skip []string) (outbox.Claim, error) {
	if err := s.check("claim"); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("postgres: claim: limit must be positive, got %d", limit)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, s.wrap("claim", err)
	}
	if skip == nil {
		skip = []string{} // <> ALL(NULL) would match no row
	}
	now := time.Now()
	bound := uuidAt(now.Add(-claimRecent))
	rq, _ := s.recordQueries()
	recs, err := s.claimRange(ctx, tx, rq.claimNew, limit, skip, bound, true)
	if err == nil && len(recs) < limit && s.claims.olderDue(now, len(recs) == 0) {
		var older []outbox.Record
		older, err = s.claimRange(ctx, tx, rq.claimOld, limit-len(recs), skip, bound, false)
		if len(older) == limit-len(recs) {
			s.claims.olderFull() // a backlog: look there again next time
		}
		recs = append(recs, older...)
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, s.wrap("claim", err)
	}
	if len(recs) == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return nil, s.wrap("claim", err)
		}
		return &claim{s: s}, nil
	}
	slices.SortFunc(recs, func(a, b outbox.Record) int { return cmp.Compare(a.Seq, b.Seq) })
	return &claim{s: s, tx: tx, recs: recs}, nil
}

// claimRecent is how old (by their UUIDv7 time) the IDs a claim looks at
// first may be, and claimOlderEvery how often at most a claim that found
// recent records also looks at the older ones.
const (
	claimRecent     = 2 * time.Second
	claimOlderEvery = time.Second
)

// claimPlan turns off, for the claim's transaction, the plans that would
// visit every deleted row of the table (see the claim query), and makes
// the claim run its generic plan: left to choose, PostgreSQL kept planning
// it again on every call (a custom plan), which at 5,000 msgs/s cost more
// than running it (pg_stat_statements: 11,315 plans in 11,313 calls,
// 7.0 s of planning against 16.4 s of execution in 20 s). The generic plan
// is the same index scan (TestClaimRunsItsGenericPlan).
const claimPlan = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// uuidAt is the least UUIDv7 of time t: its 48-bit Unix millisecond time
// and zeros.
func uuidAt(t time.Time) pgtype.UUID {
	var u pgtype.UUID
	ms := uint64(max(0, t.UnixMilli()))
	for i := range 6 {
		u.Bytes[i] = byte(ms >> (8 * (5 - i)))
	}
	u.Valid = true
	return u
}

// claimRange locks up to limit claimable records with query (claimNew
// or claimOld, split at bound) in tx; plan first sets the claim's plan
// for the transaction (the first call in it).
func (s *Store) claimRange(ctx context.Context, tx pgx.Tx, query string, limit int, skip []string, bound pgtype.UUID, plan bool) ([]outbox.Record, error) {
	ring := query == s.q.ring.claimNew || query == s.q.ring.claimOld // the ring column follows
	if s.ringLayout.Load() {
		// The ring's statements run unnamed (planArgs), which a batch
		// cannot say per query: two round trips.
		if plan {
			if _, err := tx.Exec(ctx, claimPlan); err != nil {
				return nil, err
			}
		}
		rows, err := tx.Query(ctx, query, s.planArgs(limit, skip, bound)...)
		if err != nil {
			return nil, err
		}
		return s.scanRecords(rows, ring)
	}
	b := &pgx.Batch{}
	if plan {
		b.Queue(claimPlan)
	}
	b.Queue(query, limit, skip, bound)
	br := tx.SendBatch(ctx, b)
	if plan {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	rows, err := br.Query()
	var recs []outbox.Record
	if err == nil {
		recs, err = s.scanRecords(rows, ring)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return recs, err
}

// claimState is when a claim last looked at the older IDs (see
// ClaimUnordered).
type claimState struct {
	olderAt atomic.Int64 // Unix nanoseconds; 0: look at once
}

// olderDue reports whether a claim looks at the older IDs now: always
// when the recent ones gave nothing, else once per claimOlderEvery.
func (c *claimState) olderDue(now time.Time, empty bool) bool {
	last := c.olderAt.Load()
	if !empty && last != 0 && now.UnixNano()-last < int64(claimOlderEvery) {
		return false
	}
	return c.olderAt.CompareAndSwap(last, now.UnixNano()) || empty
}

// olderFull says a claim found the older IDs full: the next claim looks
// there too.
func (c *claimState) olderFull() { c.olderAt.Store(0) }

// claim is a batch locked by ClaimUnordered. Its methods are safe for
// concurrent use; the first Settle or Release ends it.
type claim struct {
	s    *Store
	mu   sync.Mutex
	tx   pgx.Tx // nil once ended
	recs []outbox.Record
}

func (c *claim) Records() []outbox.Record { return c.recs }

// Settle applies s (its Lease is ignored) in the claim's transaction, in one
// statement, and commits. On error the transaction is rolled back, leaving
// the records untouched. Settle after the claim ended returns an error
// unless s is empty.
func (c *claim) Settle(ctx context.Context, st outbox.Settlement) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.Empty() {
		return c.end(ctx)
	}
	if c.tx == nil {
		return errors.New("postgres: claim settle: the claim was already settled or released")
	}
	var b settleBatch
	if err := b.add(0, &st); err != nil {
		_ = c.end(ctx)
		return err
	}
	if err := c.s.fillRings(ctx, c.tx, &b); err != nil {
		_ = c.end(context.WithoutCancel(ctx))
		return c.s.wrap("claim settle: find the ring of the messages", err)
	}
	if !b.empty() {
		sql, args := settleSQL(c.s.n, c.s.opts.Retention > 0, "", nil, nil, &b)
		if _, err := c.tx.Exec(ctx, sql, c.s.planArgs(args...)...); err != nil {
			_ = c.end(context.WithoutCancel(ctx))
			return c.s.wrap("claim settle", err)
		}
	}
	tx := c.tx
	c.tx = nil
	if err := tx.Commit(ctx); err != nil {
		return c.s.wrap("claim settle: commit", err)
	}
	c.s.settled(&b)
	return nil
}

// Release rolls the claim's transaction back; a no-op after Settle or
// Release.
func (c *claim) Release(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end(ctx)
}

// end rolls back the transaction if still open. c.mu is held.
func (c *claim) end(ctx context.Context) error {
	if c.tx == nil {
		return nil
	}
	tx := c.tx
	c.tx = nil
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return c.s.wrap("claim release", err)
	}
	return nil
}
