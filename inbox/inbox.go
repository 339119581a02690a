package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Limits of the (consumer, message ID) pair an inbox records.
const (
	// MaxConsumerLen is the longest consumer name accepted, in bytes.
	MaxConsumerLen = 200
	// MaxMessageIDLen is the longest message ID accepted, in bytes. Outbox
	// IDs are 36-byte UUIDs; other producers' IDs are accepted too.
	MaxMessageIDLen = 200
)

// ErrNoMessageID is returned (wrapped) by the broker helpers for a message
// that carries no ID: it cannot be deduplicated, so it is not handled.
var ErrNoMessageID = errors.New("inbox: message has no ID")

// Func is a handler's effect, run inside the consumer's transaction tx. It
// must do all its writes through tx and must not commit or roll it back.
type Func[Tx any] func(ctx context.Context, tx Tx) error

// Runner runs handlers exactly once per (consumer, message ID), each in a
// transaction of its own: it begins a transaction, records the pair, runs fn
// if the pair was new, and commits; on any error it rolls back. It returns
// processed = true when fn ran and the transaction committed, false with a nil
// error for a duplicate (fn was not called).
//
// A Runner never retries: a failed Run leaves no record, and the broker's
// redelivery is the retry. Implementations are safe for concurrent use.
type Runner[Tx any] interface {
	Run(ctx context.Context, consumer, messageID string, fn Func[Tx]) (processed bool, err error)
}

// Cleaner deletes old records of an inbox in batches.
type Cleaner interface {
	// Cleanup deletes up to limit records processed more than olderThan ago
	// and returns how many it deleted. Call it until it returns fewer than
	// limit to drain a backlog.
	Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// ValidateKey reports whether consumer and messageID can be recorded: both
// non-empty valid UTF-8 of at most [MaxConsumerLen] and [MaxMessageIDLen]
// bytes, without NUL. An empty messageID wraps [ErrNoMessageID].
func ValidateKey(consumer, messageID string) error {
	if consumer == "" {
		return errors.New("inbox: consumer is empty: name the consumer (for example the durable consumer, queue or group name)")
	}
	if err := checkText("consumer", consumer, MaxConsumerLen); err != nil {
		return err
	}
	if messageID == "" {
		return fmt.Errorf("%w (consumer %q)", ErrNoMessageID, consumer)
	}
	return checkText("message ID", messageID, MaxMessageIDLen)
}

func checkText(field, s string, maxLen int) error {
	if len(s) > maxLen {
		return fmt.Errorf("inbox: %s is %d bytes; the limit is %d", field, len(s), maxLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("inbox: %s %q is not valid UTF-8", field, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("inbox: %s %q contains a NUL byte", field, s)
		}
	}
	return nil
}

// ValidateCleanup checks the arguments of a Cleanup call.
func ValidateCleanup(olderThan time.Duration, limit int) error {
	if olderThan <= 0 {
		return fmt.Errorf("inbox: Cleanup olderThan must be positive (the retention window), got %v", olderThan)
	}
	if limit < 1 || limit > MaxCleanupLimit {
		return fmt.Errorf("inbox: Cleanup limit must be between 1 and %d, got %d", MaxCleanupLimit, limit)
	}
	return nil
}

// MaxCleanupLimit bounds the records one Cleanup call deletes.
const MaxCleanupLimit = 100000

// MaxBatch bounds the message IDs of one Record call.
const MaxBatch = 10000

// ValidateBatch checks the arguments of a Record call: a valid consumer and
// 1 to [MaxBatch] valid message IDs.
func ValidateBatch(consumer string, messageIDs []string) error {
	if len(messageIDs) == 0 || len(messageIDs) > MaxBatch {
		return fmt.Errorf("inbox: Record takes 1 to %d message IDs, got %d", MaxBatch, len(messageIDs))
	}
	for _, id := range messageIDs {
		if err := ValidateKey(consumer, id); err != nil {
			return err
		}
	}
	return nil
}
