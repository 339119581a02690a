package postgres

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// Writer writes messages into the outbox inside the application's own
// transaction, so that they exist if and only if that transaction commits.
// A Writer is immutable and safe for concurrent use.
type Writer struct {
	opts  Options
	n     names
	sql   string     // the INSERT (with pg_notify when Options.Notify)
	locks *keyLocker // nil unless Options.KeyLocks
	// wal is the prefix of the logical messages emitted with CaptureWAL,
	// empty with CaptureTable.
	wal string
}

// NewWriter returns a Writer for the tables named by opts (Schema,
// TablePrefix), with opts.MaxPayload as the payload limit and opts.Notify
// deciding whether writes wake subscribed relays. With opts.Capture
// CaptureWAL it emits the messages into the WAL instead (see
// [Writer.Write]).
func NewWriter(opts Options) (*Writer, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	n := newNames(opts)
	if opts.Capture == CaptureWAL {
		// The WAL delivers transactions in commit order: no key locks needed.
		return &Writer{opts: opts, n: n, sql: walWriteSQL, wal: walPrefix(opts)}, nil
	}
	w := &Writer{opts: opts, n: n, sql: writeSQL(n, *opts.Notify, *opts.KeyLocks)}
	if *opts.KeyLocks {
		w.locks = newKeyLocker(opts)
	}
	return w, nil
}

var defaultWriter = sync.OnceValue(func() *Writer {
	w, err := NewWriter(Options{})
	if err != nil {
		panic("postgres: default options are invalid: " + err.Error())
	}
	return w
})

// Write writes msgs with the default Options (schema "public", prefix
// "outbox") in tx. See [Writer.Write].
func Write(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) error {
	return defaultWriter().Write(ctx, tx, msgs...)
}

// WriteSQL writes msgs with the default Options in tx, a database/sql
// transaction of the pgx stdlib driver. See [Writer.WriteSQL].
func WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	return defaultWriter().WriteSQL(ctx, tx, msgs...)
}

// Write inserts msgs in tx with one statement (one round trip, whatever the
// number of messages) and, unless Options.Notify is false, queues a NOTIFY
// that PostgreSQL delivers when tx commits. With CaptureWAL it emits them
// instead, in the same single statement, as transactional logical
// decoding messages (pg_logical_emit_message), which a [WALStore] reads
// in commit order; no row is written.
//
// Order. Each message draws its sequence number (Record.Seq) from a
// PostgreSQL sequence when Write inserts it, and the relay publishes a
// key's messages in that order. Without Options.KeyLocks that is insert
// order: it equals commit order when the writers of a key are serialised
// before they call Write, for example by updating (or SELECT … FOR
// UPDATE) the key's aggregate row first, or when one writer at a time
// writes each key. An application that writes the message first and
// locks the row after (some ORMs flush inserts before updates) can commit
// two transactions of a key in the other order than they wrote: T1 writes
// M1, T2 writes M2, T2 updates the row, T1 waits for it, T2 commits, T1
// commits; M1 is published first (or, if the relay fetched between the two
// commits, M2 first and M1 as soon as it commits). With Options.KeyLocks
// Write first takes the key's lock, held until tx ends, so T2's Write
// waits for T1 to commit: publish order is commit order, whatever the
// order of the application's own locks. A transaction that locks its row
// before Write, while another locks it after its own Write of the same
// key, then deadlocks with it; PostgreSQL aborts one (SQLSTATE 40P01) and
// the application retries it, as for any deadlock. Keep one order
// (Write first, or the row first) in every transaction of a key to avoid
// it.
//
// Each message is prepared on a copy (msgs are not modified or retained):
// an empty ID gets a new UUIDv7 and a zero CreatedAt the current time. If
// any message is invalid, Write returns an error naming its index and field
// (wrapping *outbox.ValidationError) before sending anything, so nothing is
// written and tx remains usable. A database error, like any failed
// statement, aborts tx: roll it back. Write never retries.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if w.wal != "" {
		return w.writeWAL(ctx, tx, msgs)
	}
	args, err := w.args(ctx, msgs)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, w.sql, args...).Scan(w.dest(&n)...); err != nil {
		return wrapErr("write", w.opts, err)
	}
	return w.checkCount(n, len(msgs))
}

// dest returns the scan destinations of the write statement: the count,
// and pg_notify's (void) result when notifying.
func (w *Writer) dest(n *int64) []any {
	if *w.opts.Notify {
		return []any{n, nil}
	}
	return []any{n}
}

// WriteSQL is Write for a database/sql transaction, opened with any
// PostgreSQL driver (pgx's stdlib, lib/pq, …): the arrays are sent as
// PostgreSQL array literals.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if w.wal != "" {
		return w.writeWALSQL(ctx, tx, msgs)
	}
	args, err := w.args(ctx, msgs)
	if err != nil {
		return err
	}
	var n int64
	var void any
	dest := []any{&n}
	if *w.opts.Notify {
		dest = append(dest, &void)
	}
	if err := tx.QueryRowContext(ctx, w.sql, textArrays(args)...).Scan(dest...); err != nil {
		return wrapErr("write", w.opts, err)
	}
	return w.checkCount(n, len(msgs))
}

func (w *Writer) checkCount(got int64, want int) error {
	if got != int64(want) {
		// Only possible when the meta row is missing: the partition count
		// comes from it.
		return fmt.Errorf("postgres: write: inserted %d of %d messages: the meta table %s has no partition count; run `outbox migrate --store <url>` (or Store.Migrate)", got, want, w.n.meta)
	}
	return nil
}

// args prepares msgs (with Options.Inject's headers) and returns the
// statement's column arrays.
func (w *Writer) args(ctx context.Context, msgs []outbox.Message) ([]any, error) {
	now := time.Now()
	var (
		ids      = make([][16]byte, len(msgs))
		hashes   = make([]int64, len(msgs))
		topics   = make([]string, len(msgs))
		keys     = make([]string, len(msgs))
		payloads = make([][]byte, len(msgs))
		headers  = make([]*string, len(msgs))
		created  = make([]time.Time, len(msgs))
		// with key locks: the hashes and lock IDs of the keyed messages
		keyHashes []uint32
		keyLocks  []int64
	)
	for i := range msgs {
		m := msgs[i] // a copy: the caller's message is not modified
		if err := w.prepare(ctx, &m, i, len(msgs), now); err != nil {
			return nil, err
		}
		id, err := parseUUID(m.ID)
		if err != nil {
			return nil, fmt.Errorf("postgres: write: message %d of %d: %w", i, len(msgs), &outbox.ValidationError{Field: "ID", Reason: err.Error()})
		}
		ids[i] = id
		// The partition hash is the first 4 bytes of SHA-256(key) as a
		// little-endian uint32, so that hash % P equals
		// outbox.PartitionOf(key, P); an empty key gets a random one.
		if m.Key == "" {
			hashes[i] = int64(rand.Uint32())
		} else {
			sum := sha256.Sum256([]byte(m.Key))
			h := binary.LittleEndian.Uint32(sum[:4])
			hashes[i] = int64(h)
			if w.locks != nil {
				keyHashes = append(keyHashes, h)
				keyLocks = append(keyLocks, w.locks.keyLock(&sum))
			}
		}
		topics[i] = m.Topic
		keys[i] = m.Key
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("postgres: write: message %d of %d: %w", i, len(msgs), &outbox.ValidationError{Field: "Headers", Reason: err.Error()})
			}
			h := string(b)
			headers[i] = &h
		}
		created[i] = m.CreatedAt
	}
	args := []any{ids, hashes, topics, keys, payloads, headers, created}
	if w.locks != nil {
		shared, exclusive := w.locks.locks(keyHashes, keyLocks)
		args = append(args, shared, exclusive)
	}
	if *w.opts.Notify {
		args = append(args, w.n.channel)
	}
	return args, nil
}

// prepare adds the injected headers (trace context) to m, fills in its ID
// and CreatedAt and checks it (message i of n), for either capture.
func (w *Writer) prepare(ctx context.Context, m *outbox.Message, i, n int, now time.Time) error {
	if w.opts.Inject != nil {
		m.Headers = w.opts.Inject(ctx, m.Headers)
	}
	if err := m.Prepare(now, w.opts.MaxPayload); err != nil {
		return fmt.Errorf("postgres: write: message %d of %d (topic %q): %w", i, n, m.Topic, err)
	}
	if err := storable(m); err != nil {
		return fmt.Errorf("postgres: write: message %d of %d (topic %q): %w", i, n, m.Topic, err)
	}
	return nil
}

// keyHash is the 32-bit hash behind outbox.PartitionOf: the first 4 bytes of
// SHA-256(key) as a little-endian uint32, so that hash % P equals
// outbox.PartitionOf(key, P). An empty key gets a random hash.
func keyHash(key string) uint32 {
	if key == "" {
		return rand.Uint32()
	}
	sum := sha256.Sum256([]byte(key))
	return binary.LittleEndian.Uint32(sum[:4])
}

// parseUUID decodes a canonical lower-case UUID string (as
// outbox.ValidateID accepts); its errors are ValidateID's.
func parseUUID(s string) ([16]byte, error) {
	u, ok := uuid.Parse(s)
	if !ok {
		return u, outbox.ValidateID(s)
	}
	return u, nil
}

// storable checks what outbox.Message.Validate allows but PostgreSQL text
// and jsonb cannot hold exactly: NUL bytes in the key, and header values
// that are not valid UTF-8 or hold NUL bytes.
func storable(m *outbox.Message) error {
	if strings.IndexByte(m.Key, 0) >= 0 {
		return &outbox.ValidationError{Field: "Key", Reason: "contains a NUL byte, which PostgreSQL text cannot store"}
	}
	for k, v := range m.Headers {
		if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return &outbox.ValidationError{Field: "Headers", Reason: fmt.Sprintf("value of %q must be valid UTF-8 without NUL bytes to be stored in PostgreSQL", k)}
		}
	}
	return nil
}
