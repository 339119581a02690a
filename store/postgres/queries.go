package postgres

// This file holds every SQL statement of the store. Table and index names
// are quoted, validated identifiers from Options (see names); every value is
// a bound parameter.

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// writeSQL inserts a batch from arrays in one statement and, with notify,
// queues a NOTIFY in the same statement (delivered on commit). The partition
// is computed from the key hash with P read from the meta table, so writers
// do not need to know P. It returns the number of inserted rows.
//
// With keyLocks it first takes the write's key locks (see keyLockIDs):
// $8 the advisory locks to take shared, then $9 those to take exclusive,
// each array in ascending order, all held until the transaction ends; the
// rows draw their sequence numbers only after every lock is held (each
// step waits for the previous one through a one-time filter on its
// count). The channel of the notification is the last parameter.
func writeSQL(n names, notify, keyLocks bool) string {
	// x takes the transaction's ID before the first row gets its sequence
	// number (FetchMarked relies on it: a transaction that starts after a
	// fetch cannot hold a number at or below that fetch's cursor).
	q := `WITH x AS MATERIALIZED (
    SELECT pg_current_xact_id() AS txid
)`
	next := 8
	locked := ""
	if keyLocks {
		q += `, shared AS MATERIALIZED (
    SELECT count(*) AS n FROM (SELECT pg_advisory_xact_lock_shared(l) FROM unnest($8::bigint[]) AS l) s
), locked AS MATERIALIZED (
    SELECT count(*) AS n FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($9::bigint[]) AS l WHERE (SELECT n FROM shared) >= 0) e
)`
		locked = `
    WHERE (SELECT n FROM locked) >= 0`
		next = 10
	}
	q += `, ins AS (
    INSERT INTO ` + n.messages + ` (id, partition, topic, key, payload, headers, created_at, txid)
    SELECT u.id, (u.hash % m.partitions)::integer, u.topic, u.key, u.payload, u.headers::jsonb, u.created_at, x.txid
    FROM x
    CROSS JOIN ` + n.meta + ` m
    CROSS JOIN unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[])
        AS u(id, hash, topic, key, payload, headers, created_at)` + locked + `
    RETURNING partition
)`
	if !notify {
		return q + `
SELECT count(*) FROM ins`
	}
	// The payload names the partitions written (comma-separated), so that
	// only the relay workers owning them fetch; PostgreSQL delivers it on
	// commit and folds identical notifications of one transaction. A
	// payload must be shorter than block_size - 192 bytes (8,000 with the
	// default 8 kB blocks; PostgreSQL refuses longer ones and the write,
	// and the application's transaction, would fail): a longer list, a
	// write touching some 1,600 partitions or more, sends "*" instead, any
	// partition, and every relay worker fetches.
	return q + `
SELECT a.n, pg_notify($` + strconv.Itoa(next) + `, CASE WHEN a.parts IS NULL OR octet_length(a.parts) < current_setting('block_size')::integer - 192 THEN a.parts ELSE '` + notifyAnyPartition + `' END)
FROM (SELECT count(*) AS n, string_agg(DISTINCT partition::text, ',') AS parts FROM ins) a`
}

// recordColumns are the columns scanned by scanRecord, from alias m.
const recordColumns = `m.id, m.partition, m.seq, m.topic, m.key, m.payload, m.headers::text, m.created_at, m.attempts, m.next_attempt_at, m.last_error`

// ringRecordColumns are recordColumns and the ring of the row (the ring
// layout: see ringsettle.go), scanned by Store.scanRecords.
const ringRecordColumns = recordColumns + `, m.ring`

// recordQueries are the statements that return records, with the columns
// of one layout.
type recordQueries struct {
	fetch    string
	marked   string // markedFetchSQL
	claimNew string
	claimOld string
}

// queries are the store's fixed statements, built once per Store.
type queries struct {
	partitions string
	heartbeat  string
	acquire    string
	release    string
	leave      string
	fetch      string
	marked     string // markedFetchSQL
	unsettled  string
	claimNew   string
	claimOld   string
	cleanup    string
	requeueIns string // prefix; the filter is appended

	ring recordQueries // the record statements of the ring layout
}

func newQueries(n names, opts Options) queries {
	var q queries
	q.marked = markedFetchSQL(n, recordColumns)
	q.ring.marked = markedFetchSQL(n, ringRecordColumns)
	// The third column says whether the table has the ring layout (ring.go).
	q.partitions = `SELECT partitions, pg_is_in_recovery(), coalesce((SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass(` + quoteLiteral(n.messages) + `)), false) FROM ` + n.meta

	// Upsert this node, forget expired ones, and count the live ones. The
	// main query sees the table as before the CTEs ran, hence "+ 1" for
	// this node and the exclusion of it.
	q.heartbeat = `WITH gone AS (
    DELETE FROM ` + n.relays + ` WHERE expires_at < now() AND node <> $1
), me AS (
    INSERT INTO ` + n.relays + ` AS r (node, expires_at, started_at) VALUES ($1, now() + $2::interval, now())
    ON CONFLICT (node) DO UPDATE SET expires_at = EXCLUDED.expires_at
)
SELECT 1 + count(*) FROM ` + n.relays + ` WHERE node <> $1 AND expires_at >= now()`

	// One statement, so one transaction: renew the held leases still owned
	// with the same epoch, then take up to $5 free or expired partitions
	// (skipping rows another relay is taking or a settle holds), bumping
	// their epoch. Expiry uses the database clock. Held leases are excluded
	// from "free" so that an expired lease this node still holds is renewed,
	// not re-taken.
	//
	// Lease rows are locked in partition order, here and in settles (FOR
	// SHARE), so that a renewal and a settle of the same node never
	// deadlock; free rows are skipped when locked.
	q.acquire = `WITH held AS (
    SELECT h.p, h.e FROM unnest($2::integer[], $3::bigint[]) AS h(p, e)
), mine AS MATERIALIZED (
    SELECT l.partition FROM ` + n.leases + ` l
    JOIN held ON l.partition = held.p AND l.epoch = held.e AND l.owner = $1
    ORDER BY l.partition
    FOR UPDATE OF l
), renewed AS (
    UPDATE ` + n.leases + ` l SET expires_at = now() + $4::interval
    FROM mine WHERE l.partition = mine.partition
    RETURNING l.partition, l.epoch
), free AS (
    SELECT l.partition FROM ` + n.leases + ` l
    WHERE (l.owner IS NULL OR l.expires_at IS NULL OR l.expires_at < now())
      AND NOT EXISTS (SELECT 1 FROM held WHERE held.p = l.partition AND held.e = l.epoch AND l.owner = $1)
    ORDER BY l.partition
    LIMIT $5
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE ` + n.leases + ` l SET owner = $1, epoch = l.epoch + 1, expires_at = now() + $4::interval
    FROM free WHERE l.partition = free.partition
    RETURNING l.partition, l.epoch
)
SELECT partition, epoch FROM renewed
UNION ALL
SELECT partition, epoch FROM taken
ORDER BY 1`

	q.release = `UPDATE ` + n.leases + ` l SET owner = NULL, expires_at = NULL
FROM unnest($2::integer[], $3::bigint[]) AS h(p, e)
WHERE l.partition = h.p AND l.epoch = h.e AND l.owner = $1`

	q.leave = `WITH released AS (
    UPDATE ` + n.leases + ` l SET owner = NULL, expires_at = NULL
    FROM unnest($2::integer[], $3::bigint[]) AS h(p, e)
    WHERE l.partition = h.p AND l.epoch = h.e AND l.owner = $1
)
DELETE FROM ` + n.relays + ` WHERE node = $1`

	// Per-cursor LIMIT in one round trip. Plan on a 100,000-record backlog
	// (EXPLAIN, PostgreSQL 15; checked by TestQueryPlans):
	//
	//	Nested Loop
	//	  ->  Function Scan on c
	//	  ->  Limit
	//	        ->  Index Scan using <prefix>_messages_pending_idx on <prefix>_messages x
	//	              Index Cond: ((partition = c.p) AND (seq > c.after))
	//
	// On small tables the planner may prefer a bitmap scan of the same index
	// plus a sort, which is as cheap there.
	fetch := func(cols string) string {
		return `SELECT ` + cols + `
FROM unnest($1::integer[], $2::bigint[]) AS c(p, after)
CROSS JOIN LATERAL (
    SELECT * FROM ` + n.messages + ` x
    WHERE x.partition = c.p AND x.seq > c.after AND x.published_at IS NULL
    ORDER BY x.seq
    LIMIT $3
) m`
	}
	q.fetch, q.ring.fetch = fetch(recordColumns), fetch(ringRecordColumns)

	// Per cursor, the pending index (checked by TestQueryPlans):
	//
	//	Nested Loop
	//	  ->  Function Scan on c
	//	  ->  Sort (Sort Key: x.seq)
	//	        ->  Bitmap Heap Scan on <prefix>_messages x
	//	              ->  Bitmap Index Scan on <prefix>_messages_pending_idx
	//	                    Index Cond: ((partition = c.p) AND (seq <= c.after))
	//
	// (or an Index Scan when few rows qualify). The rows below a cursor are
	// few in steady state: late commits and records waiting for a retry.
	q.unsettled = `SELECT m.id, m.partition, m.seq
FROM unnest($1::integer[], $2::bigint[]) AS c(p, after)
CROSS JOIN LATERAL (
    SELECT x.id, x.partition, x.seq FROM ` + n.messages + ` x
    WHERE x.partition = c.p AND x.seq <= c.after AND x.published_at IS NULL
    ORDER BY x.seq
) m`

	// The seeds' claim: an index scan on the primary key (UUIDv7, so
	// roughly oldest first), skipping rows other claims hold, over the IDs
	// from $3 on (claimNew) or below $3 (claimOld; see ClaimUnordered).
	// It runs with bitmap and sequential scans off (claimPlan), so the plan
	// is always
	//
	//	Limit
	//	  ->  LockRows
	//	        ->  Index Scan using <messages>_pkey on <messages> m
	//	              Index Cond: (id >= $3)     (claimOld: id < $3)
	//	              Filter: ((published_at IS NULL) AND …)
	//
	// which starts at $3 (or at the lowest ID) and stops after $1 rows,
	// marking the index entries of deleted rows dead as it passes them,
	// instead of a bitmap scan of the pending index followed by a sort,
	// which visits every row deleted since the last vacuum on every claim.
	claim := func(cols, cond string) string {
		return `SELECT ` + cols + `
FROM ` + n.messages + ` m
WHERE ` + cond + `
    AND m.published_at IS NULL AND (m.next_attempt_at IS NULL OR m.next_attempt_at <= now())
    AND m.topic <> ALL($2::text[])
ORDER BY m.id
LIMIT $1
FOR UPDATE SKIP LOCKED`
	}
	q.claimNew = claim(recordColumns, `m.id >= $3::uuid`)
	q.claimOld = claim(recordColumns, `m.id < $3::uuid`)
	q.ring.claimNew = claim(ringRecordColumns, `m.id >= $3::uuid`)
	q.ring.claimOld = claim(ringRecordColumns, `m.id < $3::uuid`)

	// Batched retention cleanup on the partial published index.
	q.cleanup = `DELETE FROM ` + n.messages + ` WHERE id IN (
    SELECT id FROM ` + n.messages + `
    WHERE published_at IS NOT NULL AND published_at < now() - $1::interval
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`
	return q
}

// sqlBuilder accumulates a statement's text and its bound parameters.
type sqlBuilder struct {
	strings.Builder
	args []any
}

// arg binds v and returns its placeholder.
func (b *sqlBuilder) arg(v any) string {
	b.args = append(b.args, v)
	return "$" + strconv.Itoa(len(b.args))
}

// settleBatch holds the arrays of a settle statement. Items carry the index
// (1-based) of their settlement, matched against the valid leases.
type settleBatch struct {
	delIdx   []int32
	delIDs   [][16]byte
	retryIdx []int32
	retryIDs [][16]byte
	retryAtt []int32
	retryAt  []pgtype.Timestamptz // invalid (NULL) for no time
	retryErr []string
	deadIdx  []int32
	deadIDs  [][16]byte
	deadAtt  []int32
	deadErr  []string
	// With the ring layout (see ringsettle.go): the ring of each item,
	// parallel to the IDs, and the child table of a ring. rings is false
	// for the plain statement.
	delRing   []int16
	retryRing []int16
	deadRing  []int16
	rings     bool
	child     func(ring int16) string
}

func (b *settleBatch) empty() bool {
	return len(b.delIDs) == 0 && len(b.retryIDs) == 0 && len(b.deadIDs) == 0
}

// settleSQL builds one statement that applies a settle batch.
//
// Fenced (the ordered relay): it locks the lease rows the node still holds
// with the settlements' epochs FOR SHARE (a concurrent takeover waits for
// this statement's transaction), applies only the items of those
// settlements, and returns the indexes of the settlements it applied.
// Unfenced (a claim, inside its transaction): it applies every item and
// returns nothing.
//
// Delivered items are deleted, or marked published when retention is on;
// retries update attempts, next_attempt_at and last_error; dead items move
// to the dead letters with their attempts and last error. Each part is
// present only when it has items, so the common case (only deliveries) is a
// single DELETE … USING unnest(…) plus the lease check.
//
// With the ring layout (b.rings) the items are grouped by ring, and each
// group's parts name that child table, with "m.ring = k" beside "m.id =
// d.id": the unique index (id, ring) of the child, one probe per item, and
// the statement is planned for that child alone (a plain table's
// planning; see ringsettle.go).
func settleSQL(n names, retention bool, node string, leases []int32, epochs []int64, b *settleBatch) (string, []any) {
	var q sqlBuilder
	fenced := leases != nil
	q.WriteString("WITH ")
	if fenced {
		q.WriteString(`s AS MATERIALIZED (
    SELECT s.i::integer AS i, s.p, s.e FROM unnest(` + q.arg(leases) + `::integer[], ` + q.arg(epochs) + `::bigint[]) WITH ORDINALITY AS s(p, e, i)
), valid AS MATERIALIZED (
    SELECT s.i, s.p FROM s JOIN ` + n.leases + ` l ON l.partition = s.p AND l.epoch = s.e
    WHERE l.owner = ` + q.arg(node) + `
    ORDER BY s.p
    FOR SHARE OF l
), `)
	}
	var dead []string // the CTEs returning dead rows
	if !b.rings {
		if settleParts(&q, n.messages, "", "", fenced, retention, b) {
			dead = append(dead, "dead")
		}
	} else {
		for g, k := range b.ringGroups() {
			sub := b.ofRing(k)
			suffix := "_" + strconv.Itoa(g)
			cond := " AND m.ring = " + q.arg(k) + "::smallint"
			if settleParts(&q, b.child(k), suffix, cond, fenced, retention, &sub) {
				dead = append(dead, "dead"+suffix)
			}
		}
	}
	if len(dead) > 0 {
		q.WriteString(`buried AS (
    INSERT INTO ` + n.deadLetters + ` (id, seq, partition, topic, key, payload, headers, created_at, attempts, last_error, failed_at)
    SELECT id, seq, partition, topic, key, payload, headers, created_at, attempts, err, now() FROM `)
		for i, d := range dead {
			if i > 0 {
				q.WriteString(`
    UNION ALL SELECT id, seq, partition, topic, key, payload, headers, created_at, attempts, err, now() FROM `)
			}
			q.WriteString(d)
		}
		q.WriteString(`
    ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, partition = EXCLUDED.partition, topic = EXCLUDED.topic, key = EXCLUDED.key,
        payload = EXCLUDED.payload, headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
        attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, failed_at = EXCLUDED.failed_at
), `)
	}
	// Drop the trailing ", " of the last CTE.
	text := strings.TrimSuffix(q.String(), ", ")
	if fenced {
		text += "\nSELECT i FROM valid"
	} else {
		text += "\nSELECT 1"
	}
	return text, q.args
}

// settleParts writes the CTEs of b's delivered, retried and dead items on
// table (CTE names ending in suffix; cond added to each WHERE), and
// reports whether it wrote the dead part (dead<suffix>, returning the
// rows for the dead letters).
func settleParts(q *sqlBuilder, table, suffix, cond string, fenced, retention bool, b *settleBatch) bool {
	join := func(alias string) (from, where string) {
		if !fenced {
			return "", cond
		}
		return " JOIN valid v ON v.i = " + alias + ".i", cond + " AND m.partition = v.p"
	}
	if len(b.delIDs) > 0 {
		from, where := join("d")
		src := `unnest(` + q.arg(b.delIdx) + `::integer[], ` + q.arg(b.delIDs) + `::uuid[]) AS d(i, id)` + from
		if retention {
			q.WriteString(`delivered` + suffix + ` AS (
    UPDATE ` + table + ` m SET published_at = now()
    FROM ` + src + `
    WHERE m.id = d.id AND m.published_at IS NULL` + where + `
), `)
		} else {
			q.WriteString(`delivered` + suffix + ` AS (
    DELETE FROM ` + table + ` m
    USING ` + src + `
    WHERE m.id = d.id AND m.published_at IS NULL` + where + `
), `)
		}
	}
	if len(b.retryIDs) > 0 {
		from, where := join("r")
		q.WriteString(`retried` + suffix + ` AS (
    UPDATE ` + table + ` m SET attempts = r.attempts, next_attempt_at = r.next_at, last_error = r.err
    FROM unnest(` + q.arg(b.retryIdx) + `::integer[], ` + q.arg(b.retryIDs) + `::uuid[], ` + q.arg(b.retryAtt) + `::integer[], ` +
			q.arg(b.retryAt) + `::timestamptz[], ` + q.arg(b.retryErr) + `::text[]) AS r(i, id, attempts, next_at, err)` + from + `
    WHERE m.id = r.id AND m.published_at IS NULL` + where + `
), `)
	}
	if len(b.deadIDs) == 0 {
		return false
	}
	from, where := join("d")
	q.WriteString(`dead` + suffix + ` AS (
    DELETE FROM ` + table + ` m
    USING unnest(` + q.arg(b.deadIdx) + `::integer[], ` + q.arg(b.deadIDs) + `::uuid[], ` + q.arg(b.deadAtt) + `::integer[], ` +
		q.arg(b.deadErr) + `::text[]) AS d(i, id, attempts, err)` + from + `
    WHERE m.id = d.id AND m.published_at IS NULL` + where + `
    RETURNING m.id, m.seq, m.partition, m.topic, m.key, m.payload, m.headers, m.created_at, d.attempts, d.err
), `)
	return true
}
