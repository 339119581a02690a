package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// Settle applies settlements in one transaction. It is fenced: in that
// transaction it checks that node holds each settlement's lease with its
// epoch, applies those that pass, and returns a *outbox.FencedError listing
// the leases of the others, which it leaves untouched. Delivered records are
// deleted, or marked published when Options.Retention is set; Retry
// records get their attempt count, next attempt time and error; Dead
// records move to the dead letters. Only records of the settlement's
// partition are touched.
func (s *Store) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	if err := s.check("settle"); err != nil {
		return err
	}
	var fenced []outbox.Lease
	err := s.inTx(ctx, func(c *sql.Conn) error {
		fenced = fenced[:0]
		a := s.newApplier(c)
		defer a.close()
		for i := range settlements {
			st := &settlements[i]
			if st.Empty() {
				continue
			}
			var owner sql.NullString
			var epoch int64
			err := c.QueryRowContext(ctx, s.q.leaseOf, st.Partition).Scan(&owner, &epoch)
			if err != nil && err != sql.ErrNoRows {
				return err
			}
			if err == sql.ErrNoRows || owner.String != node || epoch != st.Epoch {
				fenced = append(fenced, st.Lease)
				continue
			}
			part := st.Partition
			if err := a.apply(ctx, st, &part); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.wrap("settle", err)
	}
	if len(fenced) > 0 {
		return &outbox.FencedError{Leases: fenced}
	}
	return nil
}

// applier applies settlements inside one write transaction, preparing each
// statement at most once.
type applier struct {
	s     *Store
	c     *sql.Conn
	now   time.Time
	stmts map[string]*sql.Stmt
}

func (s *Store) newApplier(c *sql.Conn) *applier {
	return &applier{s: s, c: c, now: s.now(), stmts: make(map[string]*sql.Stmt)}
}

func (a *applier) close() {
	for _, st := range a.stmts {
		st.Close()
	}
}

func (a *applier) exec(ctx context.Context, query string, args ...any) error {
	st, ok := a.stmts[query]
	if !ok {
		var err error
		if st, err = a.c.PrepareContext(ctx, query); err != nil {
			return err
		}
		a.stmts[query] = st
	}
	_, err := st.ExecContext(ctx, args...)
	return err
}

// apply applies st. With part set, only records of that partition are
// touched (ordered mode); otherwise records of any partition (a claim).
func (a *applier) apply(ctx context.Context, st *outbox.Settlement, part *int) error {
	q := &a.s.q
	ids := st.Delivered
	for len(ids) > 0 {
		n := min(len(ids), maxVariables-2)
		var head string
		args := make([]any, 0, n+2)
		retain := a.s.opts.Retention > 0
		if retain {
			args = append(args, nanos(a.now))
		}
		switch {
		case retain && part != nil:
			head = q.publishInPart
		case retain:
			head = q.publishIn
		case part != nil:
			head = q.deleteInPart
		default:
			head = q.deleteIn
		}
		if part != nil {
			args = append(args, *part)
		}
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		if err := a.exec(ctx, head+placeholders(n)+")", args...); err != nil {
			return fmt.Errorf("delivered: %w", err)
		}
		ids = ids[n:]
	}
	for _, f := range st.Retry {
		if part != nil && f.Partition != *part {
			continue
		}
		var next any
		if !f.NextAttemptAt.IsZero() {
			next = nanos(f.NextAttemptAt)
		}
		if err := a.exec(ctx, q.retry, f.Attempts, next, storepolicy.ErrorText(f.Err), f.ID, f.Partition); err != nil {
			return fmt.Errorf("retry: %w", err)
		}
	}
	for _, f := range st.Dead {
		if part != nil && f.Partition != *part {
			continue
		}
		if err := a.exec(ctx, q.deadInsert, f.Attempts, storepolicy.ErrorText(f.Err), nanos(a.now), f.ID, f.Partition); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
		if err := a.exec(ctx, q.deadDelete, f.ID, f.Partition); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
	}
	return nil
}

// Cleanup deletes up to limit records that were published more than
// Options.Retention ago, oldest first, and returns how many it deleted.
// Without retention there are none.
func (s *Store) Cleanup(ctx context.Context, limit int) (int64, error) {
	if err := s.check("cleanup"); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("sqlite: cleanup: limit must be positive, got %d", limit)
	}
	var n int64
	err := s.inTx(ctx, func(c *sql.Conn) error {
		res, err := c.ExecContext(ctx, s.q.cleanup, nanos(s.now().Add(-s.opts.Retention)), limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.wrap("cleanup", err)
	}
	return n, nil
}
