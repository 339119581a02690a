package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// ClaimUnordered is the seeds' claim for Ordering "none": it begins a
// transaction on a pool connection, locks up to limit due, unpublished
// records with SELECT … FOR UPDATE SKIP LOCKED (oldest IDs first; none of
// a topic in skip: the index scan passes over them), and keeps
// the transaction, and the connection, until the claim is settled or
// released. The records are returned in Seq order. A claim of no records
// holds nothing.
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
	rows, err := tx.Query(ctx, s.q.claim, s.planArgs(limit, skip)...)
	var recs []outbox.Record
	if err == nil {
		recs, err = pgx.CollectRows(rows, scanRecord)
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
	sql, args := settleSQL(c.s.n, c.s.opts.Retention > 0, "", nil, nil, &b)
	if _, err := c.tx.Exec(ctx, sql, c.s.planArgs(args...)...); err != nil {
		_ = c.end(context.WithoutCancel(ctx))
		return c.s.wrap("claim settle", err)
	}
	tx := c.tx
	c.tx = nil
	if err := tx.Commit(ctx); err != nil {
		return c.s.wrap("claim settle: commit", err)
	}
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
