package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// Status, dead letters and search: what `outbox status`, `outbox dlq`, the
// console and the metrics read from a store. None of it is on the relay's
// path from Write to settle (store.go holds that contract).

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
