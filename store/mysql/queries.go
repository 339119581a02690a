package mysql

// queries holds the store's SQL, built once from the validated, quoted
// table names. Values are always bound parameters. Every statement is valid
// on MySQL 8.0 and MariaDB 10.6+ alike (see doc.go, "MySQL and MariaDB").
//
// Plans of the per-batch statements (EXPLAIN on MariaDB 10.11 with 2,000
// rows, checked by TestQueryPlans):
//
//	fetch:      range on pending_idx (part, published_at, seq) per cursor
//	dirty read: range on pending_idx
//	unsettled:  range on pending_idx
//	settle:     range on id_idx (DELETE/UPDATE … WHERE id IN (…)); the
//	            leases by PRIMARY
//	cleanup:    range on published_idx
//
// The claim (ordering none) reads PRIMARY in seq order, skipping locked
// rows and, with retention, published ones.
type queries struct {
	insertHead string // INSERT … VALUES, without the rows
	fetchOne   string // one cursor, in parentheses, for a UNION ALL
	unsetOne   string // one cursor, in parentheses, for a UNION ALL
	dirtyOne   string // one fetched range, read at READ UNCOMMITTED
	claim      string

	leasesOf  string // ends with "part IN (": the caller adds the placeholders and ")"
	deleteIn  string // ends with "id IN ("
	publishIn string // ends with "id IN ("
	// deleteAnyIn and publishAnyIn are deleteIn and publishIn of any
	// partition (a claim).
	deleteAnyIn  string
	publishAnyIn string
	retry        string
	deadIns      string
	deadDel      string
	cleanup      string

	heartbeat   string
	expireNodes string
	countNodes  string
	renewOf     string // ends with "(part, epoch) IN ("
	heldOf      string // ends with "(part, epoch) IN ("
	free        string // ends with "FOR UPDATE SKIP LOCKED"
	takeOf      string // ends with "part IN ("
	releaseOne  string
	leaveNode   string
	leases      string
}

// recordColumns are the columns scanned by scanRecord, in order.
const recordColumns = "seq, id, part, topic, msg_key, payload, headers, created_at, attempts, next_attempt_at, last_error"

func newQueries(n names) queries {
	m := n.messages
	// expiry is the server's clock plus a bound number of microseconds.
	const expiry = "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)"
	return queries{
		insertHead: "INSERT INTO " + m + " (id, part, topic, msg_key, payload, headers, created_at) VALUES ",
		fetchOne: "(SELECT " + recordColumns + " FROM " + m + " FORCE INDEX (pending_idx)" +
			" WHERE part = ? AND published_at IS NULL AND seq > ? ORDER BY seq LIMIT ?)",
		dirtyOne: "(SELECT part, seq FROM " + m + " FORCE INDEX (pending_idx)" +
			" WHERE part = ? AND published_at IS NULL AND seq > ? AND seq <= ?)",
		unsetOne: "(SELECT id, part, seq FROM " + m + " FORCE INDEX (pending_idx)" +
			" WHERE part = ? AND published_at IS NULL AND seq <= ? ORDER BY seq)",
		// The seeds' claim: the clustered index in seq order, skipping rows
		// other claims hold (MySQL 8.0.1+, MariaDB 10.6+).
		claim: "SELECT " + recordColumns + " FROM " + m +
			" WHERE published_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= UTC_TIMESTAMP(6))" +
			" ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED",

		// LOCK IN SHARE MODE, not FOR SHARE: MariaDB has only the former,
		// MySQL 8 both.
		leasesOf: "SELECT part, owner, epoch FROM " + n.leases + " WHERE part IN (",
		// FORCE INDEX (id_idx): on a small table the optimizer prefers a
		// scan, or the pending index of the partition, and the statement
		// would then wait for rows it does not touch: rows of open claims,
		// and rows inserted by writers that have not committed.
		deleteIn:     "DELETE m FROM " + m + " m FORCE INDEX (id_idx) WHERE m.part = ? AND m.published_at IS NULL AND m.id IN (",
		publishIn:    "UPDATE " + m + " m FORCE INDEX (id_idx) SET m.published_at = UTC_TIMESTAMP(6) WHERE m.part = ? AND m.published_at IS NULL AND m.id IN (",
		deleteAnyIn:  "DELETE m FROM " + m + " m FORCE INDEX (id_idx) WHERE m.published_at IS NULL AND m.id IN (",
		publishAnyIn: "UPDATE " + m + " m FORCE INDEX (id_idx) SET m.published_at = UTC_TIMESTAMP(6) WHERE m.published_at IS NULL AND m.id IN (",
		retry: "UPDATE " + m + " SET attempts = ?, next_attempt_at = ?, last_error = ?" +
			" WHERE id = ? AND part = ? AND published_at IS NULL",
		// Not VALUES() in ON DUPLICATE KEY UPDATE (deprecated in MySQL
		// 8.0.20) nor an alias (MySQL only): the values are bound twice.
		deadIns: "INSERT INTO " + n.deadLetters +
			" (id, seq, part, topic, msg_key, payload, headers, created_at, attempts, last_error, failed_at)" +
			" SELECT id, seq, part, topic, msg_key, payload, headers, created_at, ?, ?, ? FROM " + m +
			" WHERE id = ? AND part = ? AND published_at IS NULL" +
			" ON DUPLICATE KEY UPDATE attempts = ?, last_error = ?, failed_at = ?",
		deadDel: "DELETE FROM " + m + " WHERE id = ? AND part = ? AND published_at IS NULL",
		cleanup: "DELETE FROM " + m + " WHERE published_at IS NOT NULL AND published_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)" +
			" ORDER BY published_at LIMIT ?",

		heartbeat: "INSERT INTO " + n.relays + " (node, expires_at, started_at) VALUES (?, " + expiry + ", UTC_TIMESTAMP(6))" +
			" ON DUPLICATE KEY UPDATE expires_at = " + expiry,
		expireNodes: "DELETE FROM " + n.relays + " WHERE expires_at < UTC_TIMESTAMP(6) AND node <> ?",
		countNodes:  "SELECT count(*) FROM " + n.relays + " WHERE expires_at >= UTC_TIMESTAMP(6) OR node = ?",
		renewOf:     "UPDATE " + n.leases + " SET expires_at = " + expiry + " WHERE owner = ? AND (part, epoch) IN (",
		heldOf:      "SELECT part, epoch FROM " + n.leases + " WHERE owner = ? AND (part, epoch) IN (",
		free: "SELECT part FROM " + n.leases +
			" WHERE (owner IS NULL OR expires_at IS NULL OR expires_at < UTC_TIMESTAMP(6))" +
			" ORDER BY part LIMIT ? FOR UPDATE SKIP LOCKED",
		takeOf:     "UPDATE " + n.leases + " SET owner = ?, epoch = epoch + 1, expires_at = " + expiry + " WHERE part IN (",
		releaseOne: "UPDATE " + n.leases + " SET owner = NULL, expires_at = NULL WHERE part = ? AND owner = ? AND epoch = ?",
		leaveNode:  "DELETE FROM " + n.relays + " WHERE node = ?",
		leases:     "SELECT part, owner, epoch, expires_at FROM " + n.leases + " ORDER BY part",
	}
}
