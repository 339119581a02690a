// Package mysql is the outbox store for MySQL 8.0+ and MariaDB 10.6+, with
// github.com/go-sql-driver/mysql. It is tested against Debian's MariaDB
// 10.11 started by the tests themselves (internal/testenv), and its SQL is
// kept to what MySQL 8 accepts too (see "MySQL and MariaDB" below).
//
//	s, err := mysql.Open(ctx, "mysql://app:secret@db:3306/app", mysql.Options{})
//	err = s.Migrate(ctx) // or: outbox migrate --store mysql://…
//	tx, _ := s.DB().BeginTx(ctx, nil)
//	// … the application's own writes in tx …
//	err = s.Write(ctx, tx, outbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//	err = tx.Commit()
//	relay, _ := outbox.NewRelay(s, publisher, outbox.Config{})
//
// # Guarantees
//
// Atomic with the business write: [Store.Write] inserts the messages in the
// caller's *sql.Tx, with one multi-row INSERT (one round trip with the
// default interpolateParams=true) per 1,428 messages or 4 MiB of payload;
// they exist if and only if it commits.
//
// At least once, per-key order, no poison pill, bounded everything: the
// relay's (package outbox), over partition leases with epochs in
// <prefix>_leases. Leases are taken with SELECT … FOR UPDATE SKIP LOCKED and
// expire by the server's clock (UTC_TIMESTAMP); Settle reads the lease rows
// of its settlements LOCK IN SHARE MODE in the transaction that applies
// them, so a takeover (which updates the row) waits for a settle in flight,
// and a settle of a former owner, whose epoch is gone, changes nothing
// (*outbox.FencedError). Undecodable rows (headers that are not a JSON
// object of strings) are returned with Record.DecodeError and dead-lettered
// alone.
//
// # Commit order
//
// Seq is the row's AUTO_INCREMENT, drawn when the INSERT runs; the row
// becomes visible when its transaction commits. Store order is therefore
// insert order, and a key's messages are published in commit order when the
// key's writers are serialised before they call Write (they update or lock
// the key's aggregate row first, or one writer at a time writes the key),
// as with PostgreSQL's default write.
//
// A row with a lower seq can commit after rows with higher seqs of its
// partition were committed. Fetch does not let the relay's cursor pass such
// a row: after reading a partition it reads the same seq range again at
// READ UNCOMMITTED (a dirty read of the pending index: part and seq only)
// and drops the fetched rows at and above the lowest seq it sees there that
// the fetch did not, a row of a transaction still open. Those rows come at a
// later fetch, once that transaction has committed (the lower row first) or
// rolled back. The price: a transaction that has written a message to a
// partition holds back that partition's later messages (not the other
// partitions') until it ends, so keep transactions that call Write short.
// The cost: one index range read per fetched partition with gaps in its seq
// range, in one statement per 64 partitions.
//
// What the dirty read cannot see is a row whose seq has been drawn but
// whose index entry is not written yet: the instant inside the INSERT
// statement between the two (longer when a multi-row INSERT spans
// partitions, or when the server thread is descheduled). If a fetch reads
// past such a row, the row is "late": the relay's safety-net sweep
// (Unsettled: the pending index below the cursors, never the table) finds
// it and publishes it, within 30 s (or outbox.Config.SweepInterval if
// longer) plus two round trips of its commit. The Store implements
// outbox.MarkedFetcher (with an empty mark: the hold-back needs none) so
// that the relay sweeps that rarely: a sweep reads every row the relay
// holds in flight, and every second it cost more than the fetches during a
// drain (measured: 76 sweeps took 48 s of store time in a 23 s drain of
// 20,000 messages; 11.9 s without them). Nothing is lost; the
// one reordering left is that such a row is published after the later
// messages of its key that were fetched before the sweep (TestRelayChaos
// checks that every reordering is such a late row; measured with 4 writers
// of 1 to 5 messages per transaction on a loaded 2-core machine: 0 to 2
// late rows per 1,200 messages). innodb_trx gives no mark to do better
// without a lock: it does not say which seqs an open transaction drew.
//
// # MySQL and MariaDB
//
// The SQL in runtime paths is the intersection of MySQL 8.0 and MariaDB
// 10.6: FOR UPDATE SKIP LOCKED (MySQL 8.0.1, MariaDB 10.6), LOCK IN SHARE
// MODE (MariaDB has no FOR SHARE), no RETURNING (MariaDB only), no VALUES()
// in ON DUPLICATE KEY UPDATE (deprecated in MySQL 8.0.20; the values are
// bound twice instead), no row alias (MySQL only), row constructors in IN
// lists, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), FORCE INDEX.
// Migrations use CREATE TABLE IF NOT EXISTS and CHECK constraints (enforced
// by MySQL 8.0.16+ and MariaDB). Where the two differ, the store asks the
// server (SELECT VERSION()): the session variable of the isolation level of
// the dirty reads is tx_isolation on MariaDB and transaction_isolation on
// MySQL 8. The store's own transactions run at READ COMMITTED, so that
// their locking reads take no gap locks and never hold back writers'
// inserts.
//
// # Notifications
//
// MySQL has no LISTEN/NOTIFY. A Store made by [Open] wraps the driver's
// connections: the commit of a transaction of [Store.DB] in which
// [Store.Write] ran wakes the relays of that Store (outbox.PartitionNotifier),
// naming the partitions written, once the rows are visible. Writes by other
// processes are found by the relay's poll (outbox.Config.PollInterval,
// 500 ms by default). README.md gives the measured cost of polling.
//
// # Ordering none
//
// [Store.ClaimUnordered] is the seeds' claim: SELECT … ORDER BY seq LIMIT ?
// FOR UPDATE SKIP LOCKED in a READ COMMITTED transaction held open until the
// claim is settled or released.
//
// # Tables
//
// <prefix>_messages (seq BIGINT AUTO_INCREMENT primary key; indexes on id,
// on (part, published_at, seq) for the fetch, and on published_at for
// retention; no payload in any index), <prefix>_dead_letters,
// <prefix>_leases, <prefix>_relays, <prefix>_meta (P) and
// <prefix>_migrations, in the database of the connection. `outbox migrate
// --print-sql --store mysql://` prints them. The id index is not unique: a
// unique index is filled before the others, and its duplicate check can
// wait for a settle's lock, leaving a drawn seq out of the pending index
// that Fetch reads; writing one ID twice makes two rows (PostgreSQL refuses
// the second).
package mysql
