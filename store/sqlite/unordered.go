package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox"
)

// ClaimUnordered claims up to limit due, unpublished records that no other
// claim of this Store holds and whose topic is not in skip, in Seq order,
// for Ordering "none".
//
// Unlike PostgreSQL's FOR UPDATE SKIP LOCKED, a claim holds no transaction
// and no lock in the database (an open write transaction would stop every
// writer): claims are exclusive only among the claims of this *Store, in
// this process. Run at most one relay in Ordering "none" per database, with
// any number of workers. A claim that is neither settled nor released keeps
// its records from other claims until the Store is closed.
func (s *Store) ClaimUnordered(ctx context.Context, limit int, skip []string) (outbox.Claim, error) {
	if err := s.check("claim"); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("sqlite: claim: limit must be positive, got %d", limit)
	}
	// claimMu is held from the read to the registration, and the end of a
	// claim (after its settlement committed) takes it too, so a record is
	// either still claimed or already settled when a claim reads it.
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	var recs []outbox.Record
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.q.claim, nanos(s.now()))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() && len(recs) < limit {
			r, err := scanRecord(rows)
			if err != nil {
				return err
			}
			if _, taken := s.claimed[r.ID]; !taken && !slices.Contains(skip, r.Topic) {
				recs = append(recs, r)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.wrap("claim", err)
	}
	for _, r := range recs {
		s.claimed[r.ID] = struct{}{}
	}
	return &claim{s: s, recs: recs}, nil
}

// claim is a batch claimed by ClaimUnordered.
type claim struct {
	s    *Store
	recs []outbox.Record
	mu   sync.Mutex
	done bool
}

func (c *claim) Records() []outbox.Record { return c.recs }

// Settle applies st (its Lease is ignored; records of any partition) in one
// transaction and ends the claim. If it fails, the claim stays open: settle
// again or release it.
func (c *claim) Settle(ctx context.Context, st outbox.Settlement) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return fmt.Errorf("sqlite: settle claim: the claim was already settled or released")
	}
	if err := c.s.check("settle claim"); err != nil {
		return err
	}
	err := c.s.inTx(ctx, func(conn *sql.Conn) error {
		a := c.s.newApplier(conn)
		defer a.close()
		return a.apply(ctx, &st, nil)
	})
	if err != nil {
		return c.s.wrap("settle claim", err)
	}
	c.end()
	return nil
}

// Release ends the claim, leaving its records untouched. Safe after Settle.
func (c *claim) Release(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.end()
	return nil
}

func (c *claim) end() {
	if c.done {
		return
	}
	c.done = true
	c.s.claimMu.Lock()
	for _, r := range c.recs {
		delete(c.s.claimed, r.ID)
	}
	c.s.claimMu.Unlock()
}
