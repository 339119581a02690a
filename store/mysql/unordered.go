package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"

	"github.com/outboxrelay/outbox"
)

// ClaimUnordered claims up to limit due, unpublished records that no other
// claim holds, in Seq order, for Ordering "none" (the seeds' design): it
// opens a transaction and locks them with SELECT … FOR UPDATE SKIP LOCKED
// (MySQL 8.0.1+, MariaDB 10.6+), held until Settle or Release. The
// transaction is READ COMMITTED, so the claim locks only the rows it
// returns, not the gaps between them: writers insert meanwhile. Records of
// a topic in skip (destinations the relay paused) are not claimed.
func (s *Store) ClaimUnordered(ctx context.Context, limit int, skip []string) (outbox.Claim, error) {
	if err := s.check("claim"); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("mysql: claim: limit must be positive, got %d", limit)
	}
	// database/sql rolls a transaction back when its context ends: the
	// claim outlives ctx, the call's.
	tx, err := s.db.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, s.wrap("claim", err)
	}
	q, args := s.q.claim, []any{limit}
	if len(skip) > 0 {
		// The skipped topics as bound values: AND topic NOT IN (?, …).
		q = strings.Replace(q, " ORDER BY seq", " AND topic NOT IN (?"+strings.Repeat(", ?", len(skip)-1)+") ORDER BY seq", 1)
		args = args[:0]
		for _, t := range skip {
			args = append(args, t)
		}
		args = append(args, limit)
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		tx.Rollback()
		return nil, s.wrap("claim", err)
	}
	var recs []outbox.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			rows.Close()
			tx.Rollback()
			return nil, s.wrap("claim", err)
		}
		recs = append(recs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		tx.Rollback()
		return nil, s.wrap("claim", err)
	}
	return &claim{s: s, tx: tx, recs: recs}, nil
}

// claim is a batch claimed by ClaimUnordered.
type claim struct {
	s    *Store
	tx   *sql.Tx
	recs []outbox.Record
	mu   sync.Mutex
	done bool
}

func (c *claim) Records() []outbox.Record { return c.recs }

// Settle applies st (its Lease is ignored; records of any partition) in
// the claim's transaction and commits it. If it fails, the transaction is
// rolled back and the records are claimable again.
func (c *claim) Settle(ctx context.Context, st outbox.Settlement) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return fmt.Errorf("mysql: settle claim: the claim was already settled or released")
	}
	c.done = true
	if err := c.s.apply(ctx, c.tx, &st, nil); err != nil {
		c.tx.Rollback()
		return c.s.wrap("settle claim", err)
	}
	if err := c.tx.Commit(); err != nil {
		return c.s.wrap("settle claim", err)
	}
	return nil
}

// Release rolls the claim's transaction back, leaving its records
// untouched. Safe after Settle.
func (c *claim) Release(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	c.done = true
	if err := c.tx.Rollback(); err != nil && err != sql.ErrTxDone {
		return c.s.wrap("release claim", err)
	}
	return nil
}
