package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

// Store is the relay side of an outbox: partition leases, fetching and
// settling. Each store also exports its own Write function taking its own
// transaction type; Write is not part of this interface.
//
// A Store is safe for concurrent use. Its methods do one round of I/O and do
// not retry; the [Relay] owns retries.
type Store interface {
	// Partitions returns P, the partition count fixed at migration.
	Partitions(ctx context.Context) (int, error)

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

	// Fetch returns, for each cursor, up to limit unpublished records of
	// that partition with Seq > After, in Seq order, including records
	// waiting for a retry (the relay honours NextAttemptAt). Reads are not
	// fenced.
	Fetch(ctx context.Context, cursors []Cursor, limit int) ([]Record, error)

	// Unsettled returns the references of the unpublished records of each
	// cursor's partition with Seq <= After. The relay uses it to find
	// records whose transaction committed after records with a higher Seq
	// had been fetched, so that none is left behind.
	Unsettled(ctx context.Context, cursors []Cursor) ([]RecordRef, error)

	// Settle applies settlements atomically per settlement. It is fenced:
	// a settlement whose lease node no longer holds with that epoch is not
	// applied; Settle applies the others and returns a *[FencedError]
	// listing the refused leases.
	Settle(ctx context.Context, node string, settlements []Settlement) error
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

// PrefixConfirmer is implemented by stores that make settlements durable
// as a position in a log (the WAL capture: a replication slot's confirmed
// position), which covers a record only once every record before it is
// settled too. A record settled past an unsettled one is not confirmed:
// if the relay stopped there, the next reader would publish it again. So
// on a graceful stop the relay first publishes, in key order, the records
// up to StopBarrier that can go at once, and only then leaves.
type PrefixConfirmer interface {
	// StopBarrier returns the Seq up to which every record must be settled
	// for every settled record to be confirmed (the last record of the
	// last transaction with a settled message), or 0 when no settled
	// record waits behind an unsettled one.
	StopBarrier() int64
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

// TopicCount is a backlog count for one topic.
type TopicCount struct {
	Topic string `json:"topic"`
	Count int64  `json:"count"`
	// OldestCreatedAt is the CreatedAt of the topic's oldest unpublished
	// message; zero when the store does not say.
	OldestCreatedAt time.Time `json:"oldest_created_at,omitzero"`
}

// PartitionStatus describes one partition's backlog and lease.
type PartitionStatus struct {
	Partition      int       `json:"partition"`
	Outstanding    int64     `json:"outstanding"`
	Owner          string    `json:"owner,omitempty"`
	Epoch          int64     `json:"epoch"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
}

// RelayStatus describes one live relay node.
type RelayStatus struct {
	Node       string    `json:"node"`
	ExpiresAt  time.Time `json:"expires_at"`
	Partitions int       `json:"partitions"`
}

// Status is a snapshot of an outbox for `outbox status`.
type Status struct {
	Outstanding     int64             `json:"outstanding"`
	OldestCreatedAt time.Time         `json:"oldest_created_at,omitzero"`
	Topics          []TopicCount      `json:"topics"`
	Partitions      []PartitionStatus `json:"partitions"`
	DeadLetters     int64             `json:"dead_letters"`
	Relays          []RelayStatus     `json:"relays"`
	// Requests counts the store's requests per operation since it was
	// opened, for stores that bill per request (DynamoDB); nil otherwise.
	Requests map[string]RequestStats `json:"requests,omitempty"`
	// Slot describes the replication slot of a store that captures from
	// the database's log (PostgreSQL with capture wal); nil otherwise.
	// Its messages wait in the log, not in a table: Outstanding counts
	// only those a relay of this process holds in memory.
	Slot *SlotStatus `json:"slot,omitempty"`
	// XminHorizon says what holds back the database's vacuum, for stores
	// whose cost depends on it (PostgreSQL with capture table); nil
	// otherwise.
	XminHorizon *XminHorizon `json:"xmin_horizon,omitempty"`
}

// SlotStatus describes a logical replication slot that a relay captures
// messages from.
type SlotStatus struct {
	Name string `json:"name"`
	// Exists is false when the slot has not been created (run migrate).
	Exists bool `json:"exists"`
	// Active: a relay streams from the slot now (ActivePID is its
	// server process); Held: a relay of this process does.
	Active    bool `json:"active"`
	ActivePID int  `json:"active_pid,omitempty"`
	Held      bool `json:"held"`
	// WALStatus is PostgreSQL's: reserved, extended, unreserved, or lost
	// (the server removed WAL the slot needed: messages were lost).
	WALStatus string `json:"wal_status"`
	// ConfirmedLSN is the position up to which every message was
	// published (or dead-lettered) and confirmed.
	ConfirmedLSN string `json:"confirmed_lsn"`
	// LagBytes is the WAL written since ConfirmedLSN, which the server
	// keeps for the slot.
	LagBytes int64 `json:"lag_bytes"`
	// LagSeconds is how long ago the oldest transaction not yet confirmed
	// committed, when known (by the holder; otherwise the server's
	// flush_lag of the streaming connection).
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// SafeWALBytes is how much more WAL may be written before the server
	// invalidates the slot (max_slot_wal_keep_size); nil when unlimited.
	SafeWALBytes *int64 `json:"safe_wal_bytes,omitempty"`
	// Parked counts the messages moved out of the relay's full buffer into
	// the parked table (nothing was published for a while: a blocked
	// destination, keys waiting for their retries), so that capture went
	// on for the others. They are outstanding, published from there in
	// order once their destination works.
	Parked int64 `json:"parked"`
	// Error says what stops the relay from streaming, if anything (the
	// slot lost, a setting to change).
	Error string `json:"error,omitempty"`
}

// SlotReader is implemented by stores that capture from a replication
// slot; metrics adapters export its lag. SlotStatus does one round trip.
type SlotReader interface {
	SlotStatus(ctx context.Context) (*SlotStatus, error)
}

// RequestCounter is implemented by stores that count their requests per
// operation (DynamoDB, which bills per request); metrics adapters export
// the counts. RequestStats returns totals since the store was opened and is
// safe for concurrent use.
type RequestCounter interface {
	RequestStats() map[string]RequestStats
}

// RequestStats counts one operation's requests.
type RequestStats struct {
	Requests         int64   `json:"requests"`
	Errors           int64   `json:"errors"`
	ConsumedCapacity float64 `json:"consumed_capacity"`
}

// DeadLetter is a message that failed for good.
type DeadLetter struct {
	Message
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	FailedAt  time.Time `json:"failed_at"`
}

// DeadLetterFilter selects dead letters. Zero fields match everything.
type DeadLetterFilter struct {
	Topic string
	IDs   []string
	// FailedBefore selects dead letters that failed before this time.
	FailedBefore time.Time
	// Limit bounds how many are listed (0: a default of 100); ignored by
	// Requeue and Purge, which act on every match.
	Limit int

	// The fields below narrow a listing further; every [AdminStore]
	// honours them.

	// Key selects dead letters of this message key.
	Key string
	// ErrorContains selects dead letters whose last error contains this
	// text, ignoring case.
	ErrorContains string
	// FailedAfter selects dead letters that failed at or after this time.
	FailedAfter time.Time
	// After continues a listing: only dead letters that come after this
	// position in listing order (FailedAt, then ID) are listed. Ignored by
	// Requeue, Purge and CountDeadLetters.
	After *DeadLetterPosition
}

// DeadLetterPosition is a dead letter's place in listing order: pass the
// last one of a page as DeadLetterFilter.After to read the next page.
type DeadLetterPosition struct {
	FailedAt time.Time
	ID       string
}

// AdminStore is the one operator interface of a store: its status and its
// dead letters. `outbox status`, `outbox dlq` and the console use it; every
// store of this module implements it. Every query is bounded.
type AdminStore interface {
	// Status describes the backlog: outstanding messages per topic and
	// partition, the relays' leases, the dead letters.
	Status(ctx context.Context) (*Status, error)
	// DeadLetters lists the dead letters that match f, in listing order
	// (FailedAt, then ID), at most f.Limit of them (0: a default of 100).
	DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// Requeue moves matching dead letters back into the outbox with their
	// attempts reset, after every message of their key already there, and
	// returns how many it moved.
	Requeue(ctx context.Context, f DeadLetterFilter) (int64, error)
	// PurgeDeadLetters deletes matching dead letters for good and returns
	// how many it deleted.
	PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error)
	// CountDeadLetters returns how many dead letters match f (Limit and
	// After ignored): how many an action will touch.
	CountDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error)
	// FindMessages looks messages up by ID or by key among the outstanding
	// messages, the dead letters and the published messages a store keeps
	// (retention). A store that cannot search one of them by that criterion
	// says so in FindResult.Unsearched rather than failing.
	FindMessages(ctx context.Context, q FindQuery) (*FindResult, error)
}

// FindQuery asks for messages by ID or by key (exactly one of them).
type FindQuery struct {
	ID  string
	Key string
	// Limit bounds the messages returned per state (0: a default of 50).
	Limit int
}

// Bounds of FindQuery.Limit.
const (
	FindLimitDefault = 50
	FindLimitMax     = 1000
)

// FindPublishedWindow is how many of the most recently published messages
// (kept by retention) the SQL stores search by key: published messages
// have no index by key, and the write path should not pay for one.
const FindPublishedWindow = 10000

// PublishedWindowReason is the FindResult.Unsearched reason of a store that
// searched published messages by key only among the window most recent.
func PublishedWindowReason(window int) string {
	return fmt.Sprintf("published messages kept by retention were searched by key only among the %d most recently published; search by ID to find an older one", window)
}

// Check checks q for [AdminStore.FindMessages] implementations and returns
// its limit. The error names the field to change.
func (q FindQuery) Check() (limit int, err error) {
	switch {
	case q.ID == "" && q.Key == "":
		return 0, errors.New("outbox: FindQuery needs an ID or a Key")
	case q.ID != "" && q.Key != "":
		return 0, errors.New("outbox: FindQuery takes an ID or a Key, not both")
	case q.Limit < 0 || q.Limit > FindLimitMax:
		return 0, fmt.Errorf("outbox: FindQuery.Limit must be between 1 and %d (0 for %d), got %d", FindLimitMax, FindLimitDefault, q.Limit)
	}
	if q.ID != "" {
		if err := ValidateID(q.ID); err != nil {
			return 0, fmt.Errorf("outbox: FindQuery.ID: %w", err)
		}
	}
	return cmp.Or(q.Limit, FindLimitDefault), nil
}

// MessageState says where a found message is.
type MessageState string

// States of a found message.
const (
	// StateOutstanding: waiting in the outbox to be published.
	StateOutstanding MessageState = "outstanding"
	// StateDead: in the dead letters.
	StateDead MessageState = "dead"
	// StatePublished: acknowledged by the broker, kept for a while
	// (retention).
	StatePublished MessageState = "published"
)

// FoundMessage is a message found by [AdminStore.FindMessages]. Record's
// Partition, Attempts, NextAttemptAt and LastError are set for outstanding
// messages; Attempts and LastError for dead letters.
type FoundMessage struct {
	Record
	State MessageState `json:"state"`
	// FailedAt is when a dead letter failed for good.
	FailedAt time.Time `json:"failed_at,omitzero"`
	// PublishedAt is when a published message was acknowledged.
	PublishedAt time.Time `json:"published_at,omitzero"`
}

// FindResult is the answer of [AdminStore.FindMessages].
type FindResult struct {
	Messages []FoundMessage `json:"messages"`
	// Truncated is set when a state had more matches than the limit.
	Truncated bool `json:"truncated,omitempty"`
	// Unsearched names the states the store could not search by the
	// query's criterion, each with the reason (such as "published messages
	// can only be found by ID").
	Unsearched map[MessageState]string `json:"unsearched,omitempty"`
}
