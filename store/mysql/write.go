package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// writeColumns is the number of bound parameters per inserted row.
const writeColumns = 7

// rowsPerInsert bounds the rows of one INSERT statement.
const rowsPerInsert = maxParams / writeColumns

var defaultStore = sync.OnceValue(func() *Store {
	return newStore(nil, Options{}.WithDefaults())
})

// Write writes msgs in tx with the default Options (prefix "outbox"),
// reading P from the meta table in tx. See [Store.Write].
func Write(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	s := defaultStore()
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return fmt.Errorf("mysql: write: tx is nil: begin a transaction on the database holding the outbox")
	}
	p, err := readPartitions(ctx, tx, s.n)
	if err != nil {
		return s.wrap("write", err)
	}
	_, err = s.write(ctx, tx, p, msgs)
	return err
}

// Write inserts msgs in tx, the application's transaction, so that they
// exist if and only if tx commits. Any number of messages is written with
// one multi-row INSERT (one round trip) per [rowsPerInsert] messages or 4
// MiB of payload.
//
// Each message is prepared on a copy (msgs are not modified or retained):
// an empty ID gets a new UUIDv7 and a zero CreatedAt the store's current
// time; its partition is outbox.PartitionOf(Key, P). If any message is
// invalid (see outbox.Message.Validate, with Options.MaxPayload), Write
// returns an error naming its index and field (wrapping
// *outbox.ValidationError) before running anything, so nothing is written
// and tx remains usable. After a database error part of msgs may be
// written: roll tx back. Write never retries. It may be called
// concurrently, on different transactions.
//
// Seq is drawn from AUTO_INCREMENT when the row is inserted: a key's
// messages are published in insert order, which is their commit order when
// the key's writers are serialised before they call Write (see the package
// documentation, "Commit order").
//
// On a database opened by [Open], the commit of tx wakes the relays
// subscribed to this Store; with [New], Write signals them at once.
func (s *Store) Write(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if err := s.check("write"); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return fmt.Errorf("mysql: write: tx is nil: begin a transaction with Store.DB().BeginTx")
	}
	p := int(s.partitions.Load())
	if p == 0 {
		var err error
		if p, err = readPartitions(ctx, tx, s.n); err != nil {
			return s.wrap("write", err)
		}
		s.partitions.Store(int64(p))
	}
	parts, err := s.write(ctx, tx, p, msgs)
	if err != nil {
		return err
	}
	if !s.ownDB {
		// Not a database of Open: no commit signal, so signal now.
		s.bc.Kick(parts)
	}
	return nil
}

// write inserts msgs and returns the partitions written.
func (s *Store) write(ctx context.Context, tx *sql.Tx, p int, msgs []outbox.Message) ([]int, error) {
	now := s.opts.Now()
	args := make([]any, 0, writeColumns*len(msgs))
	sizes := make([]int, 0, len(msgs))
	parts := make([]int, 0, 1)
	for i := range msgs {
		m := msgs[i] // a copy: the caller's message is not modified
		if s.opts.Inject != nil {
			m.Headers = s.opts.Inject(ctx, m.Headers)
		}
		if err := m.Prepare(now, s.opts.MaxPayload); err != nil {
			return nil, fmt.Errorf("mysql: write: message %d of %d (topic %q): %w", i, len(msgs), m.Topic, err)
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		var headers *string
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("mysql: write: message %d of %d: %w", i, len(msgs), &outbox.ValidationError{Field: "Headers", Reason: err.Error()})
			}
			h := string(b)
			headers = &h
		}
		part := outbox.PartitionOf(m.Key, p)
		if n := len(parts); n == 0 || parts[n-1] != part {
			parts = append(parts, part)
		}
		size := len(payload) + len(m.Key) + len(m.Topic) + 128
		if headers != nil {
			size += len(*headers)
		}
		sizes = append(sizes, size)
		args = append(args, m.ID, part, []byte(m.Topic), []byte(m.Key), payload, headers, m.CreatedAt.UTC().Truncate(time.Microsecond))
	}
	wctx := context.WithValue(ctx, writeKey{}, parts)
	for len(sizes) > 0 {
		rows, bytes := 0, 0
		for rows < len(sizes) && rows < rowsPerInsert && (rows == 0 || bytes+sizes[rows] <= maxInsertBytes) {
			bytes += sizes[rows]
			rows++
		}
		if _, err := tx.ExecContext(wctx, s.insertSQL(rows), args[:rows*writeColumns]...); err != nil {
			return nil, s.wrap("write", err)
		}
		args, sizes = args[rows*writeColumns:], sizes[rows:]
	}
	return parts, nil
}

// insertSQL returns the INSERT statement for rows messages.
func (s *Store) insertSQL(rows int) string {
	const row = "(?, ?, ?, ?, ?, ?, ?)"
	var b strings.Builder
	b.Grow(len(s.q.insertHead) + rows*(len(row)+2))
	b.WriteString(s.q.insertHead)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}

// decodeHeaders decodes the headers column.
func decodeHeaders(h sql.NullString) (map[string]string, error) {
	if !h.Valid || h.String == "" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(h.String), &m); err != nil {
		return nil, fmt.Errorf("the headers column is not a JSON object of strings: %w", err)
	}
	return m, nil
}

// scanRecord scans the columns of recordColumns.
func scanRecord(rows *sql.Rows) (outbox.Record, error) {
	var (
		r          outbox.Record
		topic, key []byte
		headers    sql.NullString
		created    time.Time
		next       sql.NullTime
		lastErr    sql.NullString
	)
	if err := rows.Scan(&r.Seq, &r.ID, &r.Partition, &topic, &key, &r.Payload, &headers, &created, &r.Attempts, &next, &lastErr); err != nil {
		return r, err
	}
	r.Topic, r.Key = string(topic), string(key)
	h, err := decodeHeaders(headers)
	if err != nil {
		// One bad row must not stop the fetch: the relay dead-letters it.
		r.DecodeError = fmt.Sprintf("mysql: message %s: %v: %.200s", r.ID, err, headers.String)
	}
	r.Headers = h
	r.CreatedAt = created.UTC()
	r.NextAttemptAt = fromNull(next)
	r.LastError = lastErr.String
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	return r, nil
}
