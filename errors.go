package outbox

import (
	"errors"
	"fmt"
)

// Publish failures come in three kinds, and publishers classify each:
//
//   - The message itself can never be published (too large, invalid):
//     [Permanent]. The relay dead-letters it at once (or holds its key,
//     with Config.OnPermanent = PermanentHoldKey).
//   - The destination is not usable (no stream or topic for it, not
//     authorised, unroutable, full, or the broker unreachable, including a
//     publish whose outcome is unknown): [Blocked]. The relay pauses that
//     destination, spends no attempt and dead-letters nothing, probes it
//     with backoff and keeps publishing to the others.
//   - Anything else: retryable, with backoff, holding back only its key.
//
// A publisher that learns the broker stored the message already (a
// duplicate acknowledgement) returns an error wrapping [ErrDuplicate]: it
// counts as delivered.

// PermanentError marks a publish failure that retrying cannot fix: the
// message itself can never be published (too large for the broker,
// invalid). The relay dead-letters such a message at once.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a [PermanentError]. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is or wraps a [PermanentError].
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// ErrClosed is returned by calls on a closed publisher or store.
var ErrClosed = errors.New("outbox: closed")

// FencedError reports settlements a store refused because the relay no
// longer holds the lease (partition and epoch) they were made under:
// another relay took the partition over. The messages stay in the outbox
// for the new owner.
type FencedError struct {
	Leases []Lease
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("outbox: lease lost for %d partition(s) %v: settlement fenced off", len(e.Leases), e.Leases)
}

// ErrUnsupported is returned when a store lacks an ability a configuration
// asks for (for example Ordering "none" on a store without row locks).
var ErrUnsupported = errors.New("outbox: not supported by this store")

// ErrShutdownTimeout is returned by [Relay.Stop] when Config.ShutdownTimeout
// passed before the publishes in hand were settled: they were abandoned and
// stay in the outbox, to be published again (duplicates are possible).
var ErrShutdownTimeout = errors.New("outbox: shutdown timed out; work in hand abandoned")

// BlockedError marks a publish failure of the destination, not of the
// message: no stream or topic for it, not authorised, unroutable, full, the
// broker unreachable, or an outcome the publisher cannot know (a timeout
// after which the broker may have stored the message). The relay spends no
// attempt on it: it pauses the destination, probes it with backoff, and
// publishes the message again when the destination works.
type BlockedError struct {
	// Destination is what is blocked: the message's topic.
	Destination string
	Err         error
}

func (e *BlockedError) Error() string {
	return "destination " + e.Destination + " blocked: " + e.Err.Error()
}
func (e *BlockedError) Unwrap() error { return e.Err }

// Blocked wraps err as a [BlockedError] of destination. Blocked(_, nil) is
// nil.
func Blocked(destination string, err error) error {
	if err == nil {
		return nil
	}
	return &BlockedError{Destination: destination, Err: err}
}

// IsBlocked reports whether err is or wraps a [BlockedError], and which
// destination it names.
func IsBlocked(err error) (destination string, ok bool) {
	if err == nil {
		return "", false // (errors.As would allocate b for every delivery)
	}
	var b *BlockedError
	if errors.As(err, &b) {
		return b.Destination, true
	}
	return "", false
}

// ErrDuplicate is wrapped by a publish result when the broker acknowledged
// the message as a duplicate of one it had stored already (same message ID
// within its de-duplication window). The relay counts the message as
// delivered, and reports the duplicate in its logs, Stats and hook events:
// a duplicate that was not a retry means two messages share an ID.
var ErrDuplicate = errors.New("outbox: the broker acknowledged a duplicate of a message it had stored")
