package outbox

import "time"

// EventKind names what a relay [Event] reports.
type EventKind int

const (
	// EventPublished: Count messages of Topic were acknowledged by the broker
	// in a Publish call that took Duration.
	EventPublished EventKind = iota + 1
	// EventFailed: Count messages of Topic failed and will be retried; Err is one of the errors.
	EventFailed
	// EventDeadLettered: Count messages of Topic moved to the dead letters.
	EventDeadLettered
	// EventFetched: Count records were read from the store in Duration.
	EventFetched
	// EventSettled: Count records were settled in the store in Duration.
	EventSettled
	// EventLeases: the relay now holds Count partition leases.
	EventLeases
	// EventFenced: Count partitions were lost to another relay.
	EventFenced
	// EventStoreError: a store call failed (Err); the relay retries it.
	EventStoreError
	// EventLag: Duration is the age (now - CreatedAt) of the oldest message
	// of the last published batch.
	EventLag
	// EventBlocked: the destination Topic was refused as a whole by the
	// broker (Err): its messages wait, spending no attempts.
	EventBlocked
	// EventUnblocked: the destination Topic works again after Duration.
	EventUnblocked
	// EventDuplicate: the broker acknowledged Count messages of Topic as
	// duplicates of messages it had stored (counted as delivered).
	EventDuplicate
	// EventHeld: Count messages of Topic failed permanently and, with
	// Config.OnPermanent = PermanentHoldKey, hold their keys (Err).
	EventHeld
)

func (k EventKind) String() string {
	switch k {
	case EventPublished:
		return "published"
	case EventFailed:
		return "failed"
	case EventDeadLettered:
		return "dead_lettered"
	case EventFetched:
		return "fetched"
	case EventSettled:
		return "settled"
	case EventLeases:
		return "leases"
	case EventFenced:
		return "fenced"
	case EventStoreError:
		return "store_error"
	case EventLag:
		return "lag"
	case EventBlocked:
		return "blocked"
	case EventUnblocked:
		return "unblocked"
	case EventDuplicate:
		return "duplicate"
	case EventHeld:
		return "held"
	}
	return "unknown"
}

// Event is what a relay reports to its [Hook].
type Event struct {
	Kind     EventKind
	Topic    string
	Count    int
	Duration time.Duration
	Err      error
}

// Hook receives relay events for metrics and tracing. It is called from the
// relay's goroutines, concurrently, and must not block.
type Hook func(Event)
