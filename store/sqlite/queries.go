package sqlite

import "strings"

// queries holds the store's SQL, built once from the validated, quoted
// table names. Values are always bound parameters.
//
// The per-batch statements were checked with EXPLAIN QUERY PLAN (SQLite
// as bundled with modernc.org/sqlite; TestQueryPlans keeps them honest):
//
//	fetch:      SEARCH <prefix>_messages USING INDEX <prefix>_messages_pending_idx (partition=? AND seq>?)
//	unsettled:  SEARCH <prefix>_messages USING INDEX <prefix>_messages_pending_idx (partition=? AND seq<?)
//	delivered:  SEARCH <prefix>_messages USING INDEX sqlite_autoindex_<prefix>_messages_1 (id=?)
//	retry/dead: SEARCH <prefix>_messages USING INDEX sqlite_autoindex_<prefix>_messages_1 (id=?)
//	cleanup:    SEARCH <prefix>_messages USING INTEGER PRIMARY KEY (rowid=?)
//	            LIST SUBQUERY 1
//	            SEARCH <prefix>_messages USING COVERING INDEX <prefix>_messages_published_idx (published_at>? AND published_at<?)
//	claim:      SCAN <prefix>_messages (rowid order; published rows, kept
//	            only with retention, are skipped)
//
// Fetch and Unsettled are re-run with new values many times a second, so
// their texts avoid what makes SQLite (3.54, as modernc.org/sqlite builds
// it, with SQLITE_ENABLE_STAT4) re-prepare a statement when a parameter is
// bound to a new value: a bare "col = ?" in a query with ORDER BY, whose
// plan SQLite lets depend on whether the value is 0 or 1 (so partitions 0
// and 1 moving between the slots of a UNION ALL re-parsed it; the CAST
// keeps the index and the plan), and a bound LIMIT (see
// Store.fetchQuery). Re-parsing a 16-cursor fetch cost about 0.5 ms of CPU
// against 15 µs to run it.
type queries struct {
	insertHead string // INSERT … VALUES, without the rows
	// fetchHead is the one-cursor fetch without its LIMIT clause; fetch
	// adds "LIMIT ?". Fetch uses the limit as a literal (see
	// Store.fetchQuery).
	fetchHead string
	fetch     string // one cursor
	unsettled string // one cursor
	// fetchGroups[i] and unsetGroups[i] serve cursorGroups[i] cursors:
	// the one-cursor statement repeated in one UNION ALL.
	fetchGroups [len(cursorGroups)]string
	unsetGroups [len(cursorGroups)]string
	claim       string

	// leasesOf ends with "partition IN (": the caller adds the
	// placeholders and ")".
	leasesOf string
	// The Delivered statements end with "id IN (": the caller adds the
	// placeholders and ")". The *Part forms also take a partition.
	deleteIn      string
	deleteInPart  string
	publishIn     string
	publishInPart string
	retry         string
	deadInsert    string
	deadDelete    string
	cleanup       string
	heartbeat     string
	expireNodes   string
	countNodes    string
	leases        string
	renewLease    string
	takeLease     string
	release       string
	leaveNode     string
}

// cursorGroups are the numbers of cursors one Fetch or Unsettled statement
// serves: the per-cursor query repeated in a UNION ALL, unused slots padded
// with partition -1. One statement for many cursors costs a fraction of one
// statement per cursor, and a few fixed texts are prepared once per
// connection.
var cursorGroups = [...]int{1, 4, 16}

// groupFor returns the index in cursorGroups of the statement to use for n
// remaining cursors: the smallest group that holds them, or the largest.
func groupFor(n int) int {
	for i, g := range cursorGroups {
		if n <= g {
			return i
		}
	}
	return len(cursorGroups) - 1
}

// groupOf repeats query n times in one UNION ALL.
func groupOf(query string, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = "SELECT * FROM (" + query + ")"
	}
	return strings.Join(parts, "\nUNION ALL ")
}

// recordColumns are the columns scanned by scanRecord, in order.
const recordColumns = "seq, id, partition, topic, key, payload, headers, created_at, attempts, next_attempt_at, last_error"

func newQueries(n names) queries {
	m := n.messages
	q := queries{
		insertHead: writeMarker + "INSERT INTO " + m + " (id, partition, topic, key, payload, headers, created_at) VALUES ",
		fetchHead: "SELECT " + recordColumns + " FROM " + m + " INDEXED BY " + n.pendingIdx +
			" WHERE partition = CAST(? AS INTEGER) AND seq > ? AND published_at IS NULL ORDER BY seq",
		unsettled: "SELECT id, partition, seq FROM " + m + " INDEXED BY " + n.pendingIdx +
			" WHERE partition = CAST(? AS INTEGER) AND seq <= ? AND published_at IS NULL ORDER BY seq",
		// No LIMIT: ClaimUnordered stops reading once it has enough, and
		// the rowid-order scan produces rows as they are read. A bound
		// LIMIT would make SQLite re-prepare the statement whenever it is
		// bound again (see Store.fetchQuery).
		claim: "SELECT " + recordColumns + " FROM " + m +
			" WHERE published_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= ?) ORDER BY seq",

		leasesOf:      "SELECT partition, owner, epoch FROM " + n.leases + " WHERE partition IN (",
		deleteIn:      "DELETE FROM " + m + " WHERE published_at IS NULL AND id IN (",
		deleteInPart:  "DELETE FROM " + m + " WHERE partition = ? AND published_at IS NULL AND id IN (",
		publishIn:     "UPDATE " + m + " SET published_at = ? WHERE published_at IS NULL AND id IN (",
		publishInPart: "UPDATE " + m + " SET published_at = ? WHERE partition = ? AND published_at IS NULL AND id IN (",
		retry: "UPDATE " + m + " SET attempts = ?, next_attempt_at = ?, last_error = ?" +
			" WHERE id = ? AND partition = ? AND published_at IS NULL",
		deadInsert: "INSERT OR REPLACE INTO " + n.deadLetters +
			" (id, seq, partition, topic, key, payload, headers, created_at, attempts, last_error, failed_at)" +
			" SELECT id, seq, partition, topic, key, payload, headers, created_at, ?, ?, ? FROM " + m +
			" WHERE id = ? AND partition = ? AND published_at IS NULL",
		deadDelete: "DELETE FROM " + m + " WHERE id = ? AND partition = ? AND published_at IS NULL",
		cleanup: "DELETE FROM " + m + " WHERE seq IN (SELECT seq FROM " + m + " INDEXED BY " + n.publishedIdx +
			" WHERE published_at IS NOT NULL AND published_at < ? ORDER BY published_at LIMIT ?)",

		heartbeat: "INSERT INTO " + n.relays + " (node, expires_at, started_at) VALUES (?, ?, ?)" +
			" ON CONFLICT (node) DO UPDATE SET expires_at = excluded.expires_at",
		expireNodes: "DELETE FROM " + n.relays + " WHERE expires_at < ? AND node <> ?",
		countNodes:  "SELECT count(*) FROM " + n.relays,
		leases:      "SELECT partition, owner, epoch, expires_at FROM " + n.leases + " ORDER BY partition",
		renewLease:  "UPDATE " + n.leases + " SET expires_at = ? WHERE partition = ? AND owner = ? AND epoch = ?",
		takeLease:   "UPDATE " + n.leases + " SET owner = ?, epoch = epoch + 1, expires_at = ? WHERE partition = ? AND epoch = ? RETURNING epoch",
		release:     "UPDATE " + n.leases + " SET owner = NULL, expires_at = NULL WHERE partition = ? AND owner = ? AND epoch = ?",
		leaveNode:   "DELETE FROM " + n.relays + " WHERE node = ?",
	}
	q.fetch = q.fetchHead + " LIMIT ?"
	for i, g := range cursorGroups {
		q.fetchGroups[i] = groupOf(q.fetch, g)
		q.unsetGroups[i] = groupOf(q.unsettled, g)
	}
	return q
}

// placeholders returns "?, ?, …" with n placeholders.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}
