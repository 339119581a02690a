package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// scanRecord reads the columns of recordColumns.
func scanRecord(row pgx.CollectableRow) (outbox.Record, error) {
	r, _, err := scanRecordWith(row)
	return r, err
}

// scanRecordWith reads the columns of recordColumns, then those following
// into extra, and returns the record's ID as bytes too.
func scanRecordWith(row pgx.CollectableRow, extra ...any) (outbox.Record, [16]byte, error) {
	var (
		r       outbox.Record
		id      [16]byte
		headers *string
		next    pgtype.Timestamptz
		lastErr *string
	)
	err := row.Scan(append([]any{&id, &r.Partition, &r.Seq, &r.Topic, &r.Key, &r.Payload, &headers, &r.CreatedAt, &r.Attempts, &next, &lastErr}, extra...)...)
	if err != nil {
		return r, id, err
	}
	r.ID = uuid.Format(id)
	setNullable(&r, headers, next, lastErr)
	return r, id, nil
}

// setNullable sets the fields of r (its ID set) that come from nullable
// columns: Headers (or DecodeError), NextAttemptAt, LastError, and an empty
// Payload for NULL.
func setNullable(r *outbox.Record, headers *string, next pgtype.Timestamptz, lastErr *string) {
	r.Headers, r.DecodeError = decodeHeaders(r.ID, headers)
	if next.Valid {
		r.NextAttemptAt = next.Time
	}
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
}

// decodeHeaders decodes a headers column. A value that is not a JSON object
// of strings (written by hand or by another producer) does not fail the
// fetch: it comes back as the record's DecodeError, and the relay
// dead-letters that record alone.
func decodeHeaders(id string, headers *string) (map[string]string, string) {
	if headers == nil {
		return nil, ""
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(*headers), &h); err != nil {
		return nil, fmt.Sprintf("postgres: message %s: the headers column is not a JSON object of strings (%v): %.200s", id, err, *headers)
	}
	return h, ""
}

func cursorArrays(cursors []outbox.Cursor) ([]int32, []int64) {
	parts := make([]int32, len(cursors))
	afters := make([]int64, len(cursors))
	for i, c := range cursors {
		parts[i] = int32(c.Partition)
		afters[i] = c.After
	}
	return parts, afters
}

// Fetch returns, per cursor, up to limit unpublished records of its
// partition with Seq > After, in Seq order (cursor by cursor), in one query:
// an index scan on (partition, seq) per cursor. Reads are not fenced.
func (s *Store) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if len(cursors) == 0 || limit <= 0 {
		return nil, nil
	}
	if err := s.check("fetch"); err != nil {
		return nil, err
	}
	parts, afters := cursorArrays(cursors)
	rq, ring := s.recordQueries()
	rows, err := s.pool.Query(ctx, rq.fetch, s.planArgs(parts, afters, limit)...)
	if err != nil {
		return nil, s.wrap("fetch", err)
	}
	recs, err := s.scanRecords(rows, ring)
	if err != nil {
		return nil, s.wrap("fetch", err)
	}
	inSeqOrder(recs)
	return recs, nil
}

// inSeqOrder makes sure records are in Seq order within each partition. The
// nested-loop plan returns them so; the query has no ORDER BY, which would
// sort every fetched payload, so this checks in O(n) and sorts only if
// ever needed.
func inSeqOrder(recs []outbox.Record) {
	last := make(map[int]int64)
	for _, r := range recs {
		if prev, ok := last[r.Partition]; ok && r.Seq <= prev {
			slices.SortStableFunc(recs, func(a, b outbox.Record) int {
				return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
			})
			return
		}
		last[r.Partition] = r.Seq
	}
}

// Unsettled returns the references of the unpublished records of each
// cursor's partition with Seq <= After, in Seq order per cursor.
func (s *Store) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	if len(cursors) == 0 {
		return nil, nil
	}
	if err := s.check("unsettled"); err != nil {
		return nil, err
	}
	parts, afters := cursorArrays(cursors)
	rows, err := s.pool.Query(ctx, s.q.unsettled, s.planArgs(parts, afters)...)
	if err != nil {
		return nil, s.wrap("unsettled", err)
	}
	refs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.RecordRef, error) {
		var (
			ref outbox.RecordRef
			id  [16]byte
		)
		err := row.Scan(&id, &ref.Partition, &ref.Seq)
		ref.ID = uuid.Format(id)
		return ref, err
	})
	if err != nil {
		return nil, s.wrap("unsettled", err)
	}
	return refs, nil
}

// Settle applies the settlements in one statement (one round trip, one
// transaction), fenced: it locks FOR SHARE the lease rows node holds with
// the settlements' epochs, so a concurrent takeover waits for it, and
// applies only the settlements of those leases. It returns a
// *outbox.FencedError listing the others, which changed nothing.
func (s *Store) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	var (
		b      settleBatch
		parts  []int32
		epochs []int64
		index  []int // settlement index of each lease entry
	)
	for i := range settlements {
		st := &settlements[i]
		if st.Empty() {
			continue
		}
		parts = append(parts, int32(st.Partition))
		epochs = append(epochs, st.Epoch)
		index = append(index, i)
		if err := b.add(int32(len(parts)), st); err != nil {
			return err
		}
	}
	if len(parts) == 0 {
		return nil
	}
	if err := s.check("settle"); err != nil {
		return err
	}
	if err := s.fillRings(ctx, s.pool, &b); err != nil {
		return s.wrap("settle: find the ring of the messages", err)
	}
	sql, args := settleSQL(s.n, s.opts.Retention > 0, node, parts, epochs, &b)
	rows, err := s.pool.Query(ctx, sql, s.planArgs(args...)...)
	if err != nil {
		return s.wrap("settle", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return s.wrap("settle", err)
	}
	s.settled(&b)
	if len(applied) == len(parts) {
		return nil
	}
	ok := make(map[int32]bool, len(applied))
	for _, i := range applied {
		ok[i] = true
	}
	fenced := &outbox.FencedError{}
	for j := range parts {
		if !ok[int32(j+1)] {
			fenced.Leases = append(fenced.Leases, settlements[index[j]].Lease)
		}
	}
	return fenced
}

// add appends the items of st, tagged with the settlement index i.
func (b *settleBatch) add(i int32, st *outbox.Settlement) error {
	for _, id := range st.Delivered {
		u, err := parseUUID(id)
		if err != nil {
			return fmt.Errorf("postgres: settle: delivered ID: %w", err)
		}
		b.delIdx = append(b.delIdx, i)
		b.delIDs = append(b.delIDs, u)
	}
	for _, f := range st.Retry {
		u, err := parseUUID(f.ID)
		if err != nil {
			return fmt.Errorf("postgres: settle: retry ID: %w", err)
		}
		b.retryIdx = append(b.retryIdx, i)
		b.retryIDs = append(b.retryIDs, u)
		b.retryAtt = append(b.retryAtt, int32(f.Attempts))
		b.retryAt = append(b.retryAt, timestamptz(f.NextAttemptAt))
		b.retryErr = append(b.retryErr, storepolicy.ErrorText(f.Err))
	}
	for _, f := range st.Dead {
		u, err := parseUUID(f.ID)
		if err != nil {
			return fmt.Errorf("postgres: settle: dead ID: %w", err)
		}
		b.deadIdx = append(b.deadIdx, i)
		b.deadIDs = append(b.deadIDs, u)
		b.deadAtt = append(b.deadAtt, int32(f.Attempts))
		b.deadErr = append(b.deadErr, storepolicy.ErrorText(f.Err))
	}
	return nil
}

func timestamptz(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}
