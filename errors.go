package outbox

import (
	"errors"
	"fmt"
)

// PermanentError marks a publish failure that retrying cannot fix (no
// stream for the subject, message too large for the broker, an
// authorization failure). The relay dead-letters such a message at once.
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
