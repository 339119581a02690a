package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

var _ outbox.MarkedFetcher = (*Store)(nil)

// markedFetchSQL returns a first row holding only the statement's own
// snapshot (the next mark), then, per cursor, up to $4 rows in seq order:
// first the rows below the cursor that the snapshot of the previous fetch
// (the cursor's mark) could not see (late rows), then rows above the
// cursor. (The snapshot once, not in every row: rendering and sending it
// per row cost a quarter of the relay's throughput.)
//
// Parameters, one array element per cursor: $1 partition, $2 after, $3 the
// mark's snapshot (” for none), $5 resume and $6 seen (0 and ” unless a
// previous fetch of that mark was cut short, see [markState]); $4 is the
// limit.
//
// A row below the cursor that the mark could not see belongs to a
// transaction in progress then (in the mark's xip list) or started after
// it (txid >= xmax). Write takes the transaction ID before the sequence
// number, so the latter cannot hold a number at or below the cursor (a
// plain INSERT can: it draws seq before its transaction ID); both are
// looked up on the (partition, txid) index: one index lookup per
// transaction of the xip list (a lateral join, kept apart by OFFSET 0 so
// that the planner cannot turn it inside out) and one range scan from
// xmax, instead of walking every row below the cursor (deleted rows vacuum
// has not yet removed included) on every fetch. The statement runs with
// sequential and bitmap scans off (indexedPlan): the planner cannot tell
// the probes are selective (the snapshot is a parameter), and a generic
// plan made while the table was small scanned it whole for every cursor.
// Given "seq <= cursor" as an index condition it walked the pending index
// instead; hence "seq + 0", a filter, and OFFSET 0, which keeps the ORDER
// BY from asking for the pending index's order. The late rows found are
// few, and sorted alone.
//
// The limit holds for the late rows too: a bulk transaction that commits
// late comes back $4 rows at a time, and rows above the cursor come only
// after every late row of the partition was returned (they would
// otherwise be queued ahead of the late rows still unread, and a key's
// late row must go out before its later rows). When a fetch returns $4
// late rows of a partition, the next one resumes: the late rows still
// unread are those the mark could not see minus those already returned,
// which are exactly the ones at or below the last late row returned
// (resume) that the cut-short fetch could see (seen). So a resumed fetch
// looks up the rows at or below resume by the transactions seen could not
// see (the same txid probes), then scans the pending index upwards from
// resume, keeping the rows up to the cursor the mark could not see and
// the rows above the cursor: each resumed fetch continues where the
// previous one stopped, and the scan stops after $4 rows.
//
// Per cursor the branches are merged in seq order (Merge Append of sorted
// inputs, no sort of the payloads); FetchMarked checks the order anyway.
// Plan shape (EXPLAIN, PostgreSQL 15; checked by TestQueryPlans and
// TestFetchMarkedProbesLateRowsByTxid):
//
//	Append
//	  ->  Result (the snapshot row)
//	  ->  Nested Loop
//	        ->  Function Scan on c
//	        ->  Limit
//	              ->  Merge Append (Sort Key: y.seq)
//	                    ->  Limit ->  Sort (Sort Key: y.seq)
//	                          ->  Append
//	                                ->  Nested Loop
//	                                      ->  Function Scan on pg_snapshot_xip x
//	                                      ->  Index Scan using <prefix>_messages_txid_idx on <prefix>_messages y
//	                                            Index Cond: ((partition = c.p) AND (txid = x.txid))
//	                                ->  Index Scan using <prefix>_messages_txid_idx (or _pending_idx) on <prefix>_messages y
//	                                      Index Cond: ((partition = c.p) AND (txid >= pg_snapshot_xmax(s.probe)))
//	                    ->  Limit ->  Index Scan using <prefix>_messages_pending_idx on <prefix>_messages y_1
//	                          Index Cond: ((partition = c.p) AND (seq > c.resume))  (resumed)
//	                    ->  Limit ->  Index Scan using <prefix>_messages_pending_idx on <prefix>_messages y_2
//	                          Index Cond: ((partition = c.p) AND (seq > c.after))
func markedFetchSQL(n names, cols string) string {
	// The first branch is one row holding the statement's snapshot (the
	// mark) and nothing else; the records follow with a NULL mark, so the
	// snapshot is rendered and sent once, not once per record.
	header := `NULL::uuid, NULL::integer, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::text, NULL::timestamptz, NULL::integer, NULL::timestamptz, NULL::text`
	if cols == ringRecordColumns {
		header += `, NULL::smallint`
	}
	return `SELECT pg_current_snapshot()::text, ` + header + `
UNION ALL
SELECT NULL, ` + cols + `
FROM unnest($1::integer[], $2::bigint[], $3::text[], $5::bigint[], $6::text[]) AS c(p, after, mark, resume, seen)
CROSS JOIN LATERAL (
    SELECT NULLIF(c.mark, '')::pg_snapshot AS mark,
        NULLIF(CASE WHEN c.resume > 0 THEN c.seen ELSE c.mark END, '')::pg_snapshot AS probe,
        CASE WHEN c.resume > 0 THEN c.resume ELSE c.after END AS probe_to
) s
CROSS JOIN LATERAL (
    SELECT * FROM (
        (SELECT * FROM (
            SELECT y.* FROM pg_snapshot_xip(s.probe) AS x(txid)
            CROSS JOIN LATERAL (
                SELECT * FROM ` + n.messages + ` y
                WHERE y.partition = c.p AND y.txid = x.txid
                  AND y.published_at IS NULL AND y.seq + 0 <= s.probe_to
                OFFSET 0
            ) y
            WHERE s.probe IS NOT NULL
            UNION ALL
            SELECT * FROM ` + n.messages + ` y
            WHERE s.probe IS NOT NULL AND y.partition = c.p AND y.txid >= pg_snapshot_xmax(s.probe)
              AND y.published_at IS NULL AND y.seq + 0 <= s.probe_to
            OFFSET 0) y
         ORDER BY y.seq
         LIMIT $4)
        UNION ALL
        (SELECT * FROM ` + n.messages + ` y
         WHERE c.resume > 0 AND y.partition = c.p AND y.seq > c.resume AND y.published_at IS NULL
           AND (y.seq > c.after OR NOT pg_visible_in_snapshot(y.txid, s.mark))
         ORDER BY y.seq
         LIMIT $4)
        UNION ALL
        (SELECT * FROM ` + n.messages + ` y
         WHERE c.resume <= 0 AND y.partition = c.p AND y.seq > c.after AND y.published_at IS NULL
         ORDER BY y.seq
         LIMIT $4)
    ) y
    ORDER BY y.seq
    LIMIT $4
) m`
}

// indexedPlan turns off, for the fetch's transaction, the plans that
// visit rows of other partitions: sequential and bitmap scans. Measured
// at a steady 1,000 msgs/s (durable PostgreSQL, auto_explain): the
// generic plan a connection cached while the outbox table was small read
// the late rows with a sequential scan of the whole table for every
// cursor, and kept it as the table grew between two autovacuums: fetches
// of 64 cursors read 72,683 buffers for no row (1.26 s), the mean fetch
// took 23.5 ms, and the backlog, and with it every next fetch, grew; half
// of the other fetches walked a partition's whole index. With only index
// scans to choose from, each late-row probe is an index lookup
// (TestFetchMarkedPlanIsIndexedWhateverTheStatistics). That plan is also
// safe to cache whatever the table holds, so the fetch runs its generic
// plan: left to choose, PostgreSQL planned it again on 28% of the calls
// in a 180 s run at 2,000 msgs/s (9,929 plans in 35,500 calls, 14.8 s of
// planning against 14.4 s of execution).
const indexedPlan = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// queryIndexed runs query with indexedPlan in effect and returns its rows;
// finish must be called once the rows are closed. Both go in one batch:
// one round trip, in the implicit transaction of a pipeline, whose end
// resets the settings. On the ring layout too, the query then runs from
// a prepared statement (a batch cannot run one unnamed): its cached plan
// cannot scan a child sequentially, whatever the child held when it was
// made, since indexedPlan leaves it index scans alone.
func (s *Store) queryIndexed(ctx context.Context, query string, args ...any) (pgx.Rows, func() error, error) {
	b := &pgx.Batch{}
	b.Queue(indexedPlan)
	b.Queue(query, args...)
	br := s.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, nil, err
	}
	return rows, br.Close, nil
}

// markState is what a cursor's Mark says about its partition. A mark is
// the text of a fetch's snapshot, followed, for each partition whose late
// rows that fetch cut short at the limit, by " <partition>/<resume>/<base>":
// base is the snapshot the late rows are still measured against (the mark
// the cut-short fetch was given), resume the seq of the last late row it
// returned, and the leading snapshot is then "seen", what it could see.
// Marks live in the relay's memory only, so their format can change.
type markState struct {
	base   string // snapshot text; '' for none
	resume int64  // 0 unless cut short
	seen   string // with resume: the cut-short fetch's snapshot
}

// parseMark returns the state of partition p in mark.
func parseMark(mark string, p int) (markState, error) {
	snap, rest, _ := strings.Cut(mark, " ")
	prefix := strconv.Itoa(p) + "/"
	for rest != "" {
		var field string
		field, rest, _ = strings.Cut(rest, " ")
		tail, ok := strings.CutPrefix(field, prefix)
		if !ok {
			continue
		}
		resume, base, ok := strings.Cut(tail, "/")
		n, err := strconv.ParseInt(resume, 10, 64)
		if !ok || err != nil || n <= 0 || base == "" {
			return markState{}, fmt.Errorf("postgres: fetch: the mark of partition %d is not one FetchMarked returned: %q", p, field)
		}
		return markState{base: base, resume: n, seen: snap}, nil
	}
	return markState{base: snap}, nil
}

// FetchMarked implements outbox.MarkedFetcher in one query: the records of
// Fetch, preceded per cursor by the records that committed below After
// after the fetch that returned the cursor's Mark. The returned mark is
// the query's snapshot (pg_current_snapshot) as text.
func (s *Store) FetchMarked(ctx context.Context, cursors []outbox.Cursor, limit int) (recs []outbox.Record, mark string, err error) {
	if len(cursors) == 0 || limit <= 0 {
		return nil, "", nil
	}
	if err := s.check("fetch"); err != nil {
		return nil, "", err
	}
	parts, afters := cursorArrays(cursors)
	states := make([]markState, len(cursors))
	bases := make([]string, len(cursors))
	resumes := make([]int64, len(cursors))
	seens := make([]string, len(cursors))
	for i, c := range cursors {
		st, err := parseMark(c.Mark, c.Partition)
		if err != nil {
			return nil, "", err
		}
		states[i], bases[i], resumes[i], seens[i] = st, st.base, st.resume, st.seen
	}
	rq, ring := s.recordQueries()
	rows, finish, err := s.queryIndexed(ctx, rq.marked, parts, afters, bases, limit, resumes, seens)
	if err != nil {
		return nil, "", s.wrap("fetch", err)
	}
	defer func() {
		rows.Close()
		if ferr := finish(); ferr != nil && err == nil {
			recs, mark, err = nil, "", s.wrap("fetch", ferr)
		}
	}()
	var (
		ids   [][16]byte // with ring: the hints (see ringsettle.go)
		rings []int16
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
			k       pgtype.Int2
		)
		dest := []any{&snap, &id, &part, &seq, &topic, &key, &r.Payload, &headers, &created, &att, &next, &lastErr}
		if ring {
			dest = append(dest, &k)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, "", s.wrap("fetch", err)
		}
		if snap != nil {
			mark = *snap // the header row
			continue
		}
		if ring {
			ids, rings = append(ids, id.Bytes), append(rings, k.Int16)
		}
		r.ID = uuid.Format(id.Bytes)
		r.Partition, r.Seq, r.Topic, r.Key = int(part.Int32), seq.Int64, topic.String, key.String
		r.CreatedAt, r.Attempts = created.Time, int(att.Int32)
		setNullable(&r, headers, next, lastErr)
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", s.wrap("fetch", err)
	}
	if ring {
		s.hints.put(ids, rings)
	}
	inSeqOrder(recs)
	return recs, nextMark(mark, cursors, states, recs, limit), nil
}

// nextMark returns the mark of a fetch whose snapshot is snap: snap alone,
// or followed by the state of each partition whose late rows the fetch
// cut short (it returned limit of them; see markState).
func nextMark(snap string, cursors []outbox.Cursor, states []markState, recs []outbox.Record, limit int) string {
	type late struct {
		n    int
		last int64
	}
	after := make(map[int]int64, len(cursors))
	for _, c := range cursors {
		after[c.Partition] = c.After
	}
	var lates map[int]*late
	for i := range recs {
		r := &recs[i]
		if a, ok := after[r.Partition]; ok && r.Seq <= a {
			if lates == nil {
				lates = map[int]*late{}
			}
			l := lates[r.Partition]
			if l == nil {
				l = &late{}
				lates[r.Partition] = l
			}
			l.n++
			l.last = max(l.last, r.Seq)
		}
	}
	if lates == nil {
		return snap
	}
	var b strings.Builder
	b.WriteString(snap)
	for i, c := range cursors {
		if l := lates[c.Partition]; l != nil && l.n >= limit {
			fmt.Fprintf(&b, " %d/%d/%s", c.Partition, l.last, states[i].base)
		}
	}
	return b.String()
}
