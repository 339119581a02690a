package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// Parking (capture wal).
//
// The slot's confirmed position cannot move past a message that is not
// settled, and the buffer holds at most WALOptions.BufferMessages. A
// destination that stays blocked (its messages spend no attempt and are
// never dead-lettered), or keys that keep failing, would fill the buffer
// and stop capture for every destination. So, while the buffer is full,
// the messages held longer than WALOptions.ParkAfter are parked: written
// to the <prefix>_parked table, then settled in the buffer, which lets the
// position move on and capture go on.
//
// A parked message keeps its Seq: Fetch merges the table's rows of a
// partition with the buffer's, in Seq order, so the relay reads them like
// any other and a key's order holds across the two. Settle deletes a
// parked message once delivered (or moves it to the dead letters), and
// records its failed attempts on its row. A relay that takes the slot
// later goes on from the highest parked Seq, so what it captures comes
// after what is parked, in commit order: the table is the head of the
// outbox, the WAL past the confirmed position its tail.
//
// Memory stays bounded: the store keeps, per partition, only the number of
// parked rows and their highest Seq; a fetch reads the table only below
// that Seq.

// parkChunk is how many messages one park statement writes.
const parkChunk = 1000

// walParked is what a WALStore knows of its parked table (under s.mu).
type walParked struct {
	n     []int   // rows per partition
	max   []int64 // highest Seq per partition
	total int
}

func newWALParked(p int) walParked {
	return walParked{n: make([]int, p), max: make([]int64, p)}
}

func (w *walParked) add(p int, seq int64) {
	w.n[p]++
	w.total++
	w.max[p] = max(w.max[p], seq)
}

func (w *walParked) remove(p int) {
	if p >= 0 && p < len(w.n) && w.n[p] > 0 {
		w.n[p]--
		w.total--
	}
}

// loadParked reads what the table holds when the slot is taken: the rows
// per partition and the highest Seq, which the buffer's Seqs then follow.
func (s *WALStore) loadParked(ctx context.Context, p int) (walParked, int64, error) {
	park := newWALParked(p)
	rows, err := s.tab.pool.Query(ctx, `SELECT partition, count(*), max(seq) FROM `+s.tab.n.parked+` GROUP BY partition`)
	if err != nil {
		return park, 0, wrapErr("read the parked messages", s.opts, err)
	}
	var top int64
	var part, n int
	var hi int64
	_, err = pgx.ForEachRow(rows, []any{&part, &n, &hi}, func() error {
		if part >= 0 && part < p {
			park.n[part], park.max[part] = n, hi
			park.total += n
		}
		top = max(top, hi)
		return nil
	})
	if err != nil {
		return park, 0, wrapErr("read the parked messages", s.opts, err)
	}
	return park, top, nil
}

// dropRestreamed deletes the parked rows of transactions the slot, taken
// at confirmed, streams again: a holder that parked messages (rows
// written, then settled in its buffer) and stopped or crashed before its
// confirmed position passed them. PostgreSQL decodes again every
// transaction whose commit record starts past the confirmed position
// (the rows' commit_lsn is that start: BEGIN's FinalLSN), so the stream
// brings these messages back; kept, each would be read twice (from the
// table and from the WAL, with a new Seq), and once settled through its
// WAL copy its row would stay parked for good. Rows at or below the
// position were confirmed and stay. (Strictly past it: a confirmed
// position is the end of a transaction or a record boundary, never the
// start of a commit record still to be streamed.)
func (s *WALStore) dropRestreamed(ctx context.Context, confirmed pglogrepl.LSN) error {
	tag, err := s.tab.pool.Exec(ctx, `DELETE FROM `+s.tab.n.parked+` WHERE commit_lsn > $1`, int64(confirmed))
	if err != nil {
		return wrapErr("drop the parked copies of what the slot streams again", s.opts, err)
	}
	if n := tag.RowsAffected(); n > 0 {
		s.logger().Info("dropped parked messages the replication slot streams again (their holder stopped before confirming past them)",
			"slot", s.w.Slot, "dropped", n, "confirmed", confirmed, "table", s.tab.n.parked)
	}
	return nil
}

// parkStale parks every message held, once the buffer has been full with
// nothing settled for ParkAfter (since fullSince, or the last settlement
// if later): the relay is stuck on what the buffer holds. It returns how
// many it parked, and when parking becomes due (zero: now, or never).
func (s *WALStore) parkStale(ctx context.Context, fullSince time.Time) (int, time.Time, error) {
	if s.w.ParkAfter < 0 {
		return 0, time.Time{}, nil
	}
	s.settleMu.Lock() // no Settle between reading the entries and settling them
	defer s.settleMu.Unlock()
	s.mu.Lock()
	if s.buf == nil || !s.active {
		s.mu.Unlock()
		return 0, time.Time{}, nil
	}
	idle := fullSince
	if s.lastSettle.After(idle) {
		idle = s.lastSettle
	}
	if due := idle.Add(s.w.ParkAfter); time.Now().Before(due) {
		s.mu.Unlock()
		return 0, due, nil
	}
	entries := s.buf.stale(time.Now(), s.w.BufferMessages)
	rows := make([]deadRow, len(entries))
	for i, e := range entries {
		rows[i] = deadRow{rec: e.rec, commitLSN: e.txn.commitLSN}
	}
	epoch := s.epochs
	s.mu.Unlock()
	if len(entries) == 0 {
		return 0, time.Time{}, nil
	}
	for chunk := range slices.Chunk(rows, parkChunk) {
		if err := s.insertParked(ctx, chunk); err != nil {
			return 0, time.Time{}, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epochs != epoch || !s.active {
		return 0, time.Time{}, nil // the slot was lost meanwhile: the rows are parked, the buffer gone
	}
	n := 0
	for _, e := range entries {
		if e.done {
			continue
		}
		s.park.add(e.rec.Partition, e.rec.Seq)
		s.buf.settle(e)
		n++
	}
	s.parkedTotal.Add(int64(n))
	return n, time.Time{}, nil
}

// parkLogEvery rate-limits the log lines of parking.
const parkLogEvery = 30 * time.Second

// logParked logs, at most every parkLogEvery, how many messages were
// parked since the last line, and how many the table holds.
func (s *WALStore) logParked(n int) {
	s.mu.Lock()
	s.parkUnlogged += n
	if time.Since(s.parkLogged) < parkLogEvery {
		s.mu.Unlock()
		return
	}
	s.parkLogged = time.Now()
	n, s.parkUnlogged = s.parkUnlogged, 0
	held, log := s.park.total, s.log
	s.mu.Unlock()
	log.Warn("the WAL buffer was full and nothing was published for a while (a blocked destination, keys waiting for their retries): moved the messages it held to the parked table, so that capture goes on for every other destination; they are published from there, in order, once their destination works",
		"slot", s.w.Slot, "parked", n, "parked_now", held, "table", s.tab.n.parked, "park_after", s.w.ParkAfter)
}

// insertParked writes rows to the parked table in one statement. A row
// whose ID is parked already (captured again after a crash) keeps the
// first.
func (s *WALStore) insertParked(ctx context.Context, rows []deadRow) error {
	n := len(rows)
	var (
		ids      = make([][16]byte, n)
		seqs     = make([]int64, n)
		lsns     = make([]int64, n)
		parts    = make([]int32, n)
		topics   = make([]string, n)
		keys     = make([]string, n)
		payloads = make([][]byte, n)
		headers  = make([]*string, n)
		created  = make([]time.Time, n)
		attempts = make([]int32, n)
		next     = make([]*time.Time, n)
		errs     = make([]*string, n)
	)
	for i, r := range rows {
		id, err := parseUUID(r.rec.ID)
		if err != nil {
			return fmt.Errorf("postgres: park %q: %w", r.rec.ID, err)
		}
		ids[i], seqs[i], lsns[i], parts[i] = id, r.rec.Seq, int64(r.commitLSN), int32(r.rec.Partition)
		topics[i], keys[i], payloads[i] = r.rec.Topic, r.rec.Key, r.rec.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		headers[i] = headersJSON(r.rec.Headers)
		created[i], attempts[i] = r.rec.CreatedAt, int32(r.rec.Attempts)
		if !r.rec.NextAttemptAt.IsZero() {
			next[i] = &r.rec.NextAttemptAt
		}
		if r.rec.LastError != "" {
			errs[i] = &r.rec.LastError
		}
	}
	_, err := s.tab.pool.Exec(ctx, `INSERT INTO `+s.tab.n.parked+` (id, seq, commit_lsn, partition, topic, key, payload, headers, created_at, attempts, next_attempt_at, last_error)
SELECT u.id, u.seq, u.lsn, u.partition, u.topic, u.key, u.payload, u.headers::jsonb, u.created_at, u.attempts, u.next, u.err
FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::integer[], $5::text[], $6::text[], $7::bytea[], $8::text[], $9::timestamptz[], $10::integer[], $11::timestamptz[], $12::text[])
    AS u(id, seq, lsn, partition, topic, key, payload, headers, created_at, attempts, next, err)
ON CONFLICT (id) DO NOTHING`,
		ids, seqs, lsns, parts, topics, keys, payloads, headers, created, attempts, next, errs)
	if err != nil {
		return wrapErr("park messages held too long", s.opts, err)
	}
	return nil
}

// parkedBelow reports, for each cursor, whether the table may hold a
// record of its partition past it. s.mu held.
func (s *WALStore) parkedBelowLocked(c outbox.Cursor) bool {
	return c.Partition >= 0 && c.Partition < len(s.park.n) && s.park.n[c.Partition] > 0 && c.After < s.park.max[c.Partition]
}

// fetchParked reads up to limit parked records of each cursor's partition
// with Seq > After, in Seq order.
func (s *WALStore) fetchParked(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	parts := make([]int32, len(cursors))
	afters := make([]int64, len(cursors))
	for i, c := range cursors {
		parts[i], afters[i] = int32(c.Partition), c.After
	}
	rows, err := s.tab.pool.Query(ctx, `SELECT r.id, r.seq, r.partition, r.topic, r.key, r.payload, r.headers::text, r.created_at, r.attempts, r.next_attempt_at, coalesce(r.last_error, '') AS last_error
FROM unnest($1::integer[], $2::bigint[]) AS c(partition, after)
CROSS JOIN LATERAL (
    SELECT * FROM `+s.tab.n.parked+` p
    WHERE p.partition = c.partition AND p.seq > c.after
    ORDER BY p.seq LIMIT $3
) r`, parts, afters, limit)
	if err != nil {
		return nil, wrapErr("fetch parked messages", s.opts, err)
	}
	recs, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, wrapErr("fetch parked messages", s.opts, err)
	}
	return recs, nil
}

// mergeRecords merges parked records into the buffer's (both in Seq order
// per partition), dropping a parked copy of a record the buffer returned
// too (parked between the two reads), and keeps up to limit per partition.
func mergeRecords(buffered, parked []outbox.Record, limit int) []outbox.Record {
	if len(parked) == 0 {
		return buffered
	}
	seen := make(map[string]bool, len(buffered))
	for _, r := range buffered {
		seen[r.ID] = true
	}
	out := buffered
	for _, r := range parked {
		if !seen[r.ID] {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b outbox.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	// Keep limit per partition.
	kept := out[:0]
	n, part := 0, -1
	for _, r := range out {
		if r.Partition != part {
			part, n = r.Partition, 0
		}
		if n < limit {
			kept = append(kept, r)
			n++
		}
	}
	return kept
}

// settleParked applies to the parked table the settlements of records the
// buffer no longer holds: delivered ones are deleted, dead ones moved to
// the dead letters, retries recorded. Records neither held nor parked
// (settled already) are ignored.
func (s *WALStore) settleParked(ctx context.Context, delivered []string, retry, dead []outbox.Failure) error {
	var gone []int // the partitions of the rows deleted, counted once committed
	removed := func(rows pgx.Rows) error {
		var part int
		_, err := pgx.ForEachRow(rows, []any{&part}, func() error {
			gone = append(gone, part)
			return nil
		})
		return err
	}
	b := &pgx.Batch{}
	if ids, fs := parkedFailures(dead); len(ids) > 0 {
		attempts := make([]int32, len(fs))
		errs := make([]string, len(fs))
		for i, f := range fs {
			attempts[i], errs[i] = int32(f.Attempts), storepolicy.ErrorText(f.Err)
		}
		b.Queue(`WITH f AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::text[]) AS f(id, attempts, err)
), moved AS (
    DELETE FROM `+s.tab.n.parked+` p USING f WHERE p.id = f.id
    RETURNING p.id, p.commit_lsn, p.partition, p.topic, p.key, p.payload, p.headers, p.created_at, f.attempts, f.err
), ins AS (
    INSERT INTO `+s.tab.n.deadLetters+` AS d (id, seq, partition, topic, key, payload, headers, created_at, attempts, last_error, failed_at)
    SELECT id, commit_lsn, partition, topic, key, payload, headers, created_at, attempts, err, now() FROM moved
    ON CONFLICT (id) DO UPDATE SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, failed_at = EXCLUDED.failed_at
)
SELECT partition FROM moved`, ids, attempts, errs).Query(removed)
	}
	if len(delivered) > 0 {
		var ids [][16]byte
		for _, id := range delivered {
			if u, err := parseUUID(id); err == nil {
				ids = append(ids, u)
			}
		}
		b.Queue(`DELETE FROM `+s.tab.n.parked+` WHERE id = ANY($1::uuid[]) RETURNING partition`, ids).Query(removed)
	}
	if ids, fs := parkedFailures(retry); len(ids) > 0 {
		attempts := make([]int32, len(fs))
		next := make([]time.Time, len(fs))
		errs := make([]string, len(fs))
		for i, f := range fs {
			attempts[i], next[i], errs[i] = int32(f.Attempts), f.NextAttemptAt, storepolicy.ErrorText(f.Err)
		}
		b.Queue(`UPDATE `+s.tab.n.parked+` p SET attempts = f.attempts, next_attempt_at = f.next, last_error = f.err
FROM unnest($1::uuid[], $2::integer[], $3::timestamptz[], $4::text[]) AS f(id, attempts, next, err)
WHERE p.id = f.id`, ids, attempts, next, errs)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := s.tab.pool.SendBatch(ctx, b).Close(); err != nil {
		return wrapErr("settle parked messages", s.opts, err)
	}
	s.mu.Lock()
	for _, p := range gone {
		s.park.remove(p)
	}
	s.mu.Unlock()
	return nil
}

// parkedFailures returns the failures whose ID is a UUID (any other is
// not one of ours, so not parked) with their IDs parsed.
func parkedFailures(fs []outbox.Failure) ([][16]byte, []outbox.Failure) {
	var ids [][16]byte
	var out []outbox.Failure
	for _, f := range fs {
		if u, err := parseUUID(f.ID); err == nil {
			ids = append(ids, u)
			out = append(out, f)
		}
	}
	return ids, out
}

// unsettledParked returns the parked records of c's partition with
// Seq <= After.
func (s *WALStore) unsettledParked(ctx context.Context, c outbox.Cursor) ([]outbox.RecordRef, error) {
	rows, err := s.tab.pool.Query(ctx, `SELECT id, partition, seq FROM `+s.tab.n.parked+` WHERE partition = $1 AND seq <= $2 ORDER BY seq`, c.Partition, c.After)
	if err != nil {
		return nil, wrapErr("unsettled parked messages", s.opts, err)
	}
	refs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.RecordRef, error) {
		var (
			r  outbox.RecordRef
			id [16]byte
		)
		err := row.Scan(&id, &r.Partition, &r.Seq)
		r.ID = uuid.Format(id)
		return r, err
	})
	if err != nil {
		return nil, wrapErr("unsettled parked messages", s.opts, err)
	}
	return refs, nil
}

// findParked returns the parked messages with q's ID, or up to limit of
// q's key in Seq order.
func (s *WALStore) findParked(ctx context.Context, q outbox.FindQuery, limit int) ([]outbox.Record, error) {
	const cols = `id, seq, partition, topic, key, payload, headers::text, created_at, attempts, next_attempt_at, coalesce(last_error, '')`
	var (
		rows pgx.Rows
		err  error
	)
	if q.ID != "" {
		u, perr := parseUUID(q.ID)
		if perr != nil {
			return nil, fmt.Errorf("postgres: FindQuery.ID: %w", perr)
		}
		rows, err = s.tab.pool.Query(ctx, `SELECT `+cols+` FROM `+s.tab.n.parked+` WHERE id = $1`, u)
	} else {
		p, perr := s.Partitions(ctx)
		if perr != nil {
			return nil, perr
		}
		rows, err = s.tab.pool.Query(ctx, `SELECT `+cols+` FROM `+s.tab.n.parked+` WHERE partition = $1 AND key = $2 ORDER BY seq LIMIT $3`,
			outbox.PartitionOf(q.Key, p), q.Key, limit)
	}
	if err != nil {
		return nil, wrapErr("find parked messages", s.opts, err)
	}
	recs, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, wrapErr("find parked messages", s.opts, err)
	}
	return recs, nil
}

// scanParked reads a parked row (the columns of fetchParked and findParked).
func scanParked(row pgx.CollectableRow) (outbox.Record, error) {
	var (
		r       outbox.Record
		id      [16]byte
		headers *string
		next    *time.Time
	)
	if err := row.Scan(&id, &r.Seq, &r.Partition, &r.Topic, &r.Key, &r.Payload, &headers, &r.CreatedAt, &r.Attempts, &next, &r.LastError); err != nil {
		return r, err
	}
	r.ID = uuid.Format(id)
	r.Headers, r.DecodeError = decodeHeaders(r.ID, headers)
	if next != nil {
		r.NextAttemptAt = *next
	}
	return r, nil
}
