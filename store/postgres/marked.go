package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

var _ outbox.MarkedFetcher = (*Store)(nil)

// markedFetchSQL returns a first row holding only the statement's own
// snapshot (the next mark), then, per cursor, the rows below the cursor
// that the snapshot of the previous fetch (the cursor's mark) could not
// see, then up to $4 rows above it, in seq order. (The snapshot once, not
// in every row: rendering and sending it per row cost a quarter of the
// relay's throughput.)
//
// A row below the cursor that the mark could not see belongs to a
// transaction in progress then (in the mark's xip list) or started after
// it (txid >= xmax). Write takes the transaction ID before the sequence
// number, so the latter cannot hold a number at or below the cursor; both
// are looked up anyway, on the (partition, txid) index: a handful of index
// probes per cursor, whatever the backlog and however many deleted rows
// vacuum has not yet removed. (Scanning seq <= after instead walked every
// deleted row of the partition on every fetch.)
//
// There is no outer ORDER BY, which would sort every fetched payload: the
// nested loop keeps the cursors' order, the late rows (few) are sorted
// alone, and the rows above come in index order; FetchMarked checks the
// order anyway. Plan shape (EXPLAIN, PostgreSQL 15; checked by
// TestQueryPlans):
//
//	Append
//	  ->  Result (the snapshot row)
//	  ->  Nested Loop
//	        ->  Function Scan on c
//	        ->  Append
//	              ->  Sort (Sort Key: y.seq)
//	                    ->  ... Index Scan using <prefix>_messages_txid_idx
//	                              Index Cond: ((partition = c.p) AND (txid = ANY (xip)) / (txid >= xmax))
//	              ->  Limit
//	                    ->  Index Scan using <prefix>_messages_pending_idx on <prefix>_messages y_1
//	                          Index Cond: ((partition = c.p) AND (seq > c.after))
func markedFetchSQL(n names) string {
	// The first branch is one row holding the statement's snapshot (the
	// mark) and nothing else; the records follow with a NULL mark, so the
	// snapshot is rendered and sent once, not once per record.
	return `SELECT pg_current_snapshot()::text, NULL::uuid, NULL::integer, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::text, NULL::timestamptz, NULL::integer, NULL::timestamptz, NULL::text
UNION ALL
SELECT NULL, ` + recordColumns + `
FROM unnest($1::integer[], $2::bigint[], $3::text[]) AS c(p, after, mark)
CROSS JOIN LATERAL (
    (SELECT * FROM ` + n.messages + ` y
     WHERE c.mark <> '' AND y.partition = c.p AND y.published_at IS NULL
       AND (y.txid = ANY (ARRAY(SELECT pg_snapshot_xip(c.mark::pg_snapshot)))
            OR y.txid >= pg_snapshot_xmax(c.mark::pg_snapshot))
       AND y.seq <= c.after
       AND NOT pg_visible_in_snapshot(y.txid, c.mark::pg_snapshot)
     ORDER BY y.seq)
    UNION ALL
    (SELECT * FROM ` + n.messages + ` y
     WHERE y.partition = c.p AND y.seq > c.after AND y.published_at IS NULL
     ORDER BY y.seq
     LIMIT $4)
) m`
}

// FetchMarked implements outbox.MarkedFetcher in one query: the records of
// Fetch, preceded per cursor by the records that committed below After
// after the fetch that returned the cursor's Mark. The returned mark is
// the query's snapshot (pg_current_snapshot) as text.
func (s *Store) FetchMarked(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, string, error) {
	if len(cursors) == 0 || limit <= 0 {
		return nil, "", nil
	}
	if err := s.check("fetch"); err != nil {
		return nil, "", err
	}
	parts, afters := cursorArrays(cursors)
	marks := make([]string, len(cursors))
	for i, c := range cursors {
		marks[i] = c.Mark
	}
	rows, err := s.pool.Query(ctx, markedFetchSQL(s.n), parts, afters, marks, limit)
	if err != nil {
		return nil, "", s.wrap("fetch", err)
	}
	defer rows.Close()
	var (
		mark string
		recs []outbox.Record
	)
	for rows.Next() {
		var (
			snap    *string
			id      pgtype.UUID
			part    pgtype.Int4
			seq     pgtype.Int8
			r       outbox.Record
			topic   pgtype.Text
			key     pgtype.Text
			headers *string
			created pgtype.Timestamptz
			att     pgtype.Int4
			next    pgtype.Timestamptz
			lastErr *string
		)
		if err := rows.Scan(&snap, &id, &part, &seq, &topic, &key, &r.Payload, &headers, &created, &att, &next, &lastErr); err != nil {
			return nil, "", s.wrap("fetch", err)
		}
		if snap != nil {
			mark = *snap // the header row
			continue
		}
		r.ID = formatUUID(id.Bytes)
		r.Partition, r.Seq, r.Topic, r.Key = int(part.Int32), seq.Int64, topic.String, key.String
		r.CreatedAt, r.Attempts = created.Time, int(att.Int32)
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
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", s.wrap("fetch", err)
	}
	inSeqOrder(recs)
	return recs, mark, nil
}
