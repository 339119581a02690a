package outbox

import (
	"context"
	"time"
)

// Record is a message as the relay reads it from a store.
type Record struct {
	Message
	// Partition is PartitionOf(Key, P), computed at write time.
	Partition int
	// Seq orders records within a partition, and the relay publishes a
	// key's records in Seq order: a sequence drawn at insert in PostgreSQL
	// (commit order per key with its Options.KeyLocks, else only when the
	// key's writers are serialised before they write), the rowid in SQLite
	// (commit order), the writer's clock in DynamoDB. The package
	// documentation states when it is commit order.
	Seq int64
	// Attempts counts failed publish attempts so far.
	Attempts int
	// NextAttemptAt is when the record may be tried again after a failure;
	// zero when it has never failed.
	NextAttemptAt time.Time
	// LastError is the error of the last failed attempt, if any.
	LastError string
	// DecodeError, when not empty, says what was wrong with the stored
	// row (headers that are not a map of strings, written by hand or by
	// another producer): the store returns the record with what it could
	// read, and the relay dead-letters it with this error, without
	// publishing it, when it reaches the head of its key. A store never
	// fails a whole fetch for one bad row.
	DecodeError string
}

// Lease is a relay's ownership of one partition. Epoch increases every time
// the partition changes hands and fences off settlements of former owners.
type Lease struct {
	Partition int
	Epoch     int64
}

// Cursor asks for the records of a leased partition with Seq > After.
type Cursor struct {
	Lease
	After int64
	// Mark is the mark returned by the [MarkedFetcher] call that last
	// fetched this partition, or empty. Stores without marks ignore it.
	Mark string
}

// RecordRef names a stored record without its payload.
type RecordRef struct {
	ID        string
	Partition int
	Seq       int64
}

// Failure is a failed publish attempt to record.
type Failure struct {
	ID        string
	Partition int
	// Attempts is the new attempt count (including this failure).
	Attempts int
	// NextAttemptAt is when to try again (ignored for dead letters).
	NextAttemptAt time.Time
	// Err is the error text: the relay makes it valid UTF-8 without NUL
	// bytes and at most 4 KiB (storepolicy.ErrorText); stores apply the
	// same rule for other callers.
	Err string
}

// Settlement is the outcome of publishing records of one partition under
// one lease. In unordered mode Lease is zero and records may span
// partitions.
type Settlement struct {
	Lease
	// Delivered holds the IDs the broker acknowledged: the store deletes
	// them, or marks them published when it keeps them for a while.
	Delivered []string
	// Retry holds failures to try again later.
	Retry []Failure
	// Dead holds failures moved to the dead letters.
	Dead []Failure
}

// Empty reports whether the settlement has nothing to apply.
func (s *Settlement) Empty() bool {
	return len(s.Delivered) == 0 && len(s.Retry) == 0 && len(s.Dead) == 0
}

// Source is what every capture side offers the relay: the partition
// count, a fetch of a partition's records after a cursor, and settlements.
// How the relay comes to own partitions is the side's own protocol, and a
// source has exactly one: partition leases ([Store], the table poller) or
// a stream held by one process at a time ([StreamStore], a log such as
// PostgreSQL's WAL). [NewRelay] takes either.
//
// A Source is safe for concurrent use. Its methods do one round of I/O and
// do not retry; the [Relay] owns retries.
type Source interface {
	// Partitions returns P, the partition count fixed at migration.
	Partitions(ctx context.Context) (int, error)

	// Fetch returns, for each cursor, up to limit unpublished records of
	// that partition with Seq > After, in Seq order, including records
	// waiting for a retry (the relay honours NextAttemptAt). Reads are not
	// fenced.
	Fetch(ctx context.Context, cursors []Cursor, limit int) ([]Record, error)

	// Settle applies settlements atomically per settlement. It is fenced:
	// a settlement whose lease node no longer holds with that epoch (for a
	// stream: whose epoch is not node's current hold) is not applied;
	// Settle applies the others and returns a *[FencedError] listing the
	// refused leases.
	Settle(ctx context.Context, node string, settlements []Settlement) error
}

// Store is the table side of an outbox: relays share its partitions by
// leases, and fetch and settle what they lease. Each store also exports its
// own Write function taking its own transaction type; Write is not part of
// this interface.
//
// A Store is safe for concurrent use. Its methods do one round of I/O and do
// not retry; the [Relay] owns retries.
type Store interface {
	Source

	// Heartbeat records that the relay node is alive until now+ttl (by the
	// store's clock) and returns how many nodes are alive, this one
	// included. Expired nodes are forgotten.
	Heartbeat(ctx context.Context, node string, ttl time.Duration) (live int, err error)

	// AcquireLeases renews the leases in held that node still owns with the
	// same epoch, then takes up to want more partitions whose lease is free
	// or expired, incrementing their epoch. Every returned lease expires at
	// now+ttl by the store's clock. A lease of held missing from the result
	// was lost to another node.
	AcquireLeases(ctx context.Context, node string, held []Lease, want int, ttl time.Duration) ([]Lease, error)

	// ReleaseLeases hands back leases node holds with those epochs, so that
	// other nodes can take them at once. Leases no longer held are ignored.
	ReleaseLeases(ctx context.Context, node string, leases []Lease) error

	// Leave removes node's heartbeat and releases the leases node still
	// holds with those epochs, as ReleaseLeases does: a lease taken again
	// since with another epoch (by another process with the same node
	// name, after this one's expired) is left alone. The relay passes
	// every lease it holds.
	Leave(ctx context.Context, node string, leases []Lease) error

	// Unsettled returns the references of the unpublished records of each
	// cursor's partition with Seq <= After. The relay uses it to find
	// records whose transaction committed after records with a higher Seq
	// had been fetched, so that none is left behind.
	Unsettled(ctx context.Context, cursors []Cursor) ([]RecordRef, error)
}

// MarkedFetcher is implemented by stores whose Seq can be assigned in an
// order other than commit order (a PostgreSQL sequence: a transaction may
// take a number, then commit after a transaction that took a higher one).
// A cursor alone would skip such a record; a mark closes the gap.
//
// FetchMarked returns what Fetch returns and, for each cursor with a Mark,
// first the unpublished records with Seq <= After that were not yet
// visible to the fetch that returned Mark (they committed after it). Per
// partition the records come in Seq order, at most limit of them, late
// records included: when the late records of a partition fill the limit
// (a bulk transaction committed late), FetchMarked returns none above
// After for it, and the mark it returns remembers where the next fetch
// resumes. It also returns the mark of this fetch (in PostgreSQL, its
// snapshot and those resume points), to pass in the next cursors of the
// same partitions with After advanced past the returned records. The
// relay uses FetchMarked instead of Fetch when a store implements it.
type MarkedFetcher interface {
	FetchMarked(ctx context.Context, cursors []Cursor, limit int) (recs []Record, mark string, err error)
}

// CommitOrdered is implemented by stores whose Seq order is their commit
// order (SQLite, where write transactions are serialised): no record can
// commit below a relay's cursor, so the relay never sweeps below it.
type CommitOrdered interface {
	CommitOrdered()
}

// UnorderedStore is implemented by stores that support Ordering "none", the
// seeds' design: any worker claims any due records with row locks held
// until the claim is settled (FOR UPDATE SKIP LOCKED in PostgreSQL).
type UnorderedStore interface {
	// ClaimUnordered locks up to limit due, unpublished records that no other
	// claim holds, whose topic is not in skip, and returns them in Seq order
	// within each partition. The claim holds a transaction open until
	// Settle or Release. The relay passes in skip the destinations it has
	// paused (blocked, no probe due), so that however many of their records
	// wait, a claim takes those of other destinations.
	ClaimUnordered(ctx context.Context, limit int, skip []string) (Claim, error)
}

// Claim is a batch locked by [UnorderedStore.ClaimUnordered].
type Claim interface {
	Records() []Record
	// Settle applies the settlement (Lease is ignored) and commits.
	Settle(ctx context.Context, s Settlement) error
	// Release rolls back, leaving the records untouched. Safe after Settle.
	Release(ctx context.Context) error
}

// StreamStore is the stream side of an outbox: records captured from a log
// in commit order (PostgreSQL's WAL through a replication slot), which one
// process at a time streams. Its relay owns every partition while its
// process holds the stream, none while another does (it stands by), so
// there are no leases: the hold is the fence, and each new hold has a new
// epoch, which the relay puts in its settlements' Lease.
//
// Settlements become durable as a position in the log, which covers a
// record only once every record before it is settled too: a record
// settled past an unsettled one is not confirmed, and if the relay let go
// of the stream there, the next holder would publish it again. So on a
// graceful stop the relay first publishes, in key order, the records up
// to StopBarrier that can go at once, and only then releases the stream.
//
// Records are fetched by partition and cursor like a Store's; Seq is
// commit order, so the relay never looks below its cursors.
type StreamStore interface {
	Source

	// Hold asks for the stream for node. It returns the epoch of node's
	// hold while this process streams for node, or 0 while it does not
	// (another process streams; or another relay of this process holds
	// it), and a channel closed when that answer may have changed (the
	// stream taken, lost or given up), so that the relay asks again at
	// once. A store starts trying to take the stream at the first Hold,
	// and keeps trying until Release. An error says why it cannot stream
	// at all (a setting to change, the log position lost).
	Hold(ctx context.Context, node string) (epoch int64, changed <-chan struct{}, err error)

	// Release gives the stream up for node, making what is settled
	// durable first, so that a relay of another process can take it.
	// Releasing a stream node does not hold is a no-op.
	Release(ctx context.Context, node string) error

	// StopBarrier returns the Seq up to which every record must be settled
	// for every settled record to be confirmed (the last record so far of
	// the last transaction with a settled message), or 0 when no settled
	// record waits behind an unsettled one. complete is false while that
	// transaction has not been read whole (a large one, read while it is
	// published): its later records raise the barrier as they come, and
	// the relay drains to the new barrier until it is complete or the
	// stop's deadline comes.
	StopBarrier() (seq int64, complete bool)
}

// PartitionNotifier is implemented by stores that can signal new writes
// (LISTEN/NOTIFY in PostgreSQL), naming the partitions written when they
// can (PostgreSQL's NOTIFY payload): the relay then wakes only the workers
// owning them, and they fetch only those partitions. A store that cannot
// name them passes nil, "any partition", every time. The relay polls as
// well, so a notification is only a latency hint.
type PartitionNotifier interface {
	// SubscribePartitions calls fn, from one goroutine and in order, with
	// the partitions of each write as it commits, until ctx ends (it then
	// returns nil) or the subscription fails (it returns the error; the
	// relay polls and subscribes again). fn(nil) means "any partition".
	// It calls fn(nil) once subscribed: writes committed before were not
	// announced, and the relay then looks at every partition.
	SubscribePartitions(ctx context.Context, fn func(partitions []int)) error
}

// Cleaner is implemented by stores that keep published records for a while
// (retention). The relay calls Cleanup periodically.
type Cleaner interface {
	// Cleanup deletes up to limit published records whose retention ended
	// and returns how many it deleted.
	Cleanup(ctx context.Context, limit int) (int64, error)
}
