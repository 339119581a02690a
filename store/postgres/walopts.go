package postgres

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Defaults and limits of [WALOptions].
const (
	// WALBufferMessagesDefault is how many captured messages a relay holds
	// in memory, waiting to be published, before it stops reading the WAL.
	WALBufferMessagesDefault = 10_000
	WALBufferMessagesMax     = 10_000_000
	// WALBufferBytesDefault bounds the payload bytes held the same way
	// (a single larger message is still taken, alone).
	WALBufferBytesDefault = 32 << 20
	// WALStatusIntervalDefault is how often the relay tells PostgreSQL the
	// position up to which everything is published (the slot's
	// confirmed_flush_lsn): what a crash may publish again is at most this
	// old, plus what is in flight.
	WALStatusIntervalDefault = time.Second
	// WALRetryIntervalDefault is how often a standby relay tries to take
	// the slot, and a relay reconnects after losing it.
	WALRetryIntervalDefault = time.Second
	// WALTimeoutDefault is how long the replication connection may stay
	// silent before either side drops it (the relay here, PostgreSQL
	// through wal_sender_timeout, which the relay sets to the same value
	// on its connection). It bounds the takeover after a network
	// partition.
	WALTimeoutDefault = 10 * time.Second
	WALTimeoutMin     = 100 * time.Millisecond
	// WALParkAfterDefault is how long the buffer stays full with nothing
	// published before the messages it holds are parked (see
	// WALOptions.ParkAfter).
	WALParkAfterDefault = 2 * time.Second
)

// slotNameRe is what PostgreSQL accepts as a replication slot name; the
// publication follows the same rule here.
var slotNameRe = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// WALOptions configures CaptureWAL. The zero value of every field means its
// default.
type WALOptions struct {
	// Slot is the logical replication slot the relay reads. Default
	// "outbox_<schema>_<prefix>" in lower case (hashed if longer than 63
	// bytes). Lower-case letters, digits and '_'.
	Slot string
	// Publication is the (table-less) publication the slot's pgoutput
	// stream is opened with. Default: the slot's name.
	Publication string
	// BufferMessages and BufferBytes bound the captured messages held in
	// memory until published (see the *Default constants). When either is
	// reached, the relay stops reading the WAL (it keeps the connection
	// alive) until publishing frees room.
	BufferMessages int
	BufferBytes    int
	// StatusInterval is how often the confirmed position is sent to
	// PostgreSQL; default [WALStatusIntervalDefault].
	StatusInterval time.Duration
	// RetryInterval is how often a standby tries to take the slot; default
	// [WALRetryIntervalDefault].
	RetryInterval time.Duration
	// Timeout is how long the replication connection may be silent before
	// it is considered lost, by the relay and by PostgreSQL
	// (wal_sender_timeout is set to it on the connection); default
	// [WALTimeoutDefault]. Takeover after a network partition takes about
	// Timeout + RetryInterval.
	Timeout time.Duration
	// ParkAfter: once the buffer has been full for this long with nothing
	// settled (a destination that stays blocked, keys waiting for their
	// retries), the messages it holds move to the <prefix>_parked table,
	// so that the slot's position moves on and the other destinations go
	// on being captured; the relay publishes them from there, in order,
	// when their destination works. Default [WALParkAfterDefault];
	// negative: never park (capture waits for room, holding the WAL).
	ParkAfter time.Duration
}

func (w WALOptions) withDefaults(schema, prefix string) WALOptions {
	w.Slot = cmp.Or(w.Slot, defaultSlotName(schema, prefix))
	w.Publication = cmp.Or(w.Publication, w.Slot)
	w.BufferMessages = cmp.Or(w.BufferMessages, WALBufferMessagesDefault)
	w.BufferBytes = cmp.Or(w.BufferBytes, WALBufferBytesDefault)
	w.StatusInterval = cmp.Or(w.StatusInterval, WALStatusIntervalDefault)
	w.RetryInterval = cmp.Or(w.RetryInterval, WALRetryIntervalDefault)
	w.Timeout = cmp.Or(w.Timeout, WALTimeoutDefault)
	w.ParkAfter = cmp.Or(w.ParkAfter, WALParkAfterDefault)
	return w
}

func (w WALOptions) validate() error {
	if !slotNameRe.MatchString(w.Slot) {
		return &OptionError{"WAL.Slot", fmt.Sprintf("%q is not a valid replication slot name: use 1 to 63 lower-case letters, digits and '_'", w.Slot)}
	}
	if !slotNameRe.MatchString(w.Publication) {
		return &OptionError{"WAL.Publication", fmt.Sprintf("%q is not a valid name: use 1 to 63 lower-case letters, digits and '_'", w.Publication)}
	}
	if w.BufferMessages < 1 || w.BufferMessages > WALBufferMessagesMax {
		return &OptionError{"WAL.BufferMessages", fmt.Sprintf("must be between 1 and %d (0 for %d), got %d", WALBufferMessagesMax, WALBufferMessagesDefault, w.BufferMessages)}
	}
	if w.BufferBytes < 1 {
		return &OptionError{"WAL.BufferBytes", fmt.Sprintf("must be positive (0 for %d), got %d", WALBufferBytesDefault, w.BufferBytes)}
	}
	if w.StatusInterval < time.Millisecond {
		return &OptionError{"WAL.StatusInterval", fmt.Sprintf("must be at least 1ms (0 for %v), got %v", WALStatusIntervalDefault, w.StatusInterval)}
	}
	if w.RetryInterval < time.Millisecond {
		return &OptionError{"WAL.RetryInterval", fmt.Sprintf("must be at least 1ms (0 for %v), got %v", WALRetryIntervalDefault, w.RetryInterval)}
	}
	if w.Timeout < WALTimeoutMin {
		return &OptionError{"WAL.Timeout", fmt.Sprintf("must be at least %v (0 for %v), got %v", WALTimeoutMin, WALTimeoutDefault, w.Timeout)}
	}
	if w.StatusInterval*2 > w.Timeout {
		return &OptionError{"WAL.StatusInterval", fmt.Sprintf("(%v) must be at most half of WAL.Timeout (%v), or PostgreSQL drops the connection of an idle relay", w.StatusInterval, w.Timeout)}
	}
	return nil
}

// defaultSlotName is "outbox_<schema>_<prefix>" in lower case, shortened
// with a hash when longer than 63 bytes, and with the letters other than
// [a-z0-9_] (none: schema and prefix are validated) mapped to '_'.
func defaultSlotName(schema, prefix string) string {
	n := strings.ToLower("outbox_" + schema + "_" + prefix)
	if n == "outbox_public_outbox" {
		n = "outbox"
	}
	if len(n) <= 63 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return n[:54] + "_" + hex.EncodeToString(sum[:4])
}

// walPrefix is the prefix of the logical messages of an outbox (its
// pg_logical_emit_message prefix): "outbox:<schema>.<prefix>".
func walPrefix(o Options) string {
	return "outbox:" + o.Schema + "." + o.TablePrefix
}
