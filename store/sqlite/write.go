package sqlite

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

// rowsPerInsert bounds the rows of one INSERT statement, to stay within
// SQLite's bound-parameter limit.
const rowsPerInsert = maxVariables / writeColumns

var defaultStore = sync.OnceValue(func() *Store {
	return newStore(nil, Options{}.WithDefaults())
})

// Write writes msgs in tx with the default Options (prefix "outbox"),
// reading P from the meta table in tx. See [Store.Write].
//
// On a database opened by [Open], the commit of tx wakes the relays
// subscribed to that Store.
func Write(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	s := defaultStore()
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return fmt.Errorf("sqlite: write: tx is nil: begin a transaction on the database holding the outbox")
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
// one multi-row INSERT per [rowsPerInsert] messages.
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
// SQLite serialises write transactions, so seq order is commit order: the
// relay publishes a key's messages in the order their transactions
// committed.
func (s *Store) Write(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if err := s.check("write"); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return fmt.Errorf("sqlite: write: tx is nil: begin a transaction with Store.DB().BeginTx")
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
	if s.gate == nil {
		// Not a database of Open: no commit signal, so signal now.
		s.bc.Kick(parts)
	}
	return nil
}

// write inserts msgs and returns the partitions written, in message order
// (repeats removed when adjacent).
func (s *Store) write(ctx context.Context, tx *sql.Tx, p int, msgs []outbox.Message) ([]int, error) {
	now := s.now()
	args := make([]any, 0, writeColumns*len(msgs))
	parts := make([]int, 0, 1)
	for i := range msgs {
		m := msgs[i] // a copy: the caller's message is not modified
		if s.opts.Inject != nil {
			m.Headers = s.opts.Inject(ctx, m.Headers)
		}
		if err := m.Prepare(now, s.opts.MaxPayload); err != nil {
			return nil, fmt.Errorf("sqlite: write: message %d of %d (topic %q): %w", i, len(msgs), m.Topic, err)
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		var headers *string
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("sqlite: write: message %d of %d: %w", i, len(msgs), &outbox.ValidationError{Field: "Headers", Reason: err.Error()})
			}
			h := string(b)
			headers = &h
		}
		part := outbox.PartitionOf(m.Key, p)
		if n := len(parts); n == 0 || parts[n-1] != part {
			parts = append(parts, part)
		}
		args = append(args, m.ID, part, m.Topic, m.Key, payload, headers, nanos(m.CreatedAt))
	}
	for len(args) > 0 {
		n := min(len(args), rowsPerInsert*writeColumns)
		if err := s.insert(ctx, tx, n/writeColumns, args[:n]); err != nil {
			return nil, s.wrap("write", err)
		}
		args = args[n:]
	}
	return parts, nil
}

// maxPreparedRows bounds the rows of the INSERT statements Write keeps
// prepared, one per row count; larger writes are parsed each time.
const maxPreparedRows = 16

// insert runs the INSERT of rows messages with args in tx: prepared once
// (on each connection) for up to maxPreparedRows rows, since parsing the
// statement took a third of a small Write's time. The package-level Write,
// which has no *sql.DB, and a tx of another *sql.DB than the store's parse
// it each time.
func (s *Store) insert(ctx context.Context, tx *sql.Tx, rows int, args []any) error {
	query := s.insertSQL(rows)
	if s.db != nil && rows <= maxPreparedRows {
		st, err := s.prepared(ctx, query)
		if err != nil {
			return err
		}
		_, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		if err == nil || !strings.Contains(err.Error(), "statement from different database") {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, query, args...)
	return err
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
		r       outbox.Record
		headers sql.NullString
		created int64
		next    sql.NullInt64
		lastErr sql.NullString
	)
	if err := rows.Scan(&r.Seq, &r.ID, &r.Partition, &r.Topic, &r.Key, &r.Payload, &headers, &created, &r.Attempts, &next, &lastErr); err != nil {
		return r, err
	}
	h, err := decodeHeaders(headers)
	if err != nil {
		// One bad row must not stop the fetch: the relay dead-letters it.
		r.DecodeError = fmt.Sprintf("sqlite: message %s: %v: %.200s", r.ID, err, headers.String)
	}
	r.Headers = h
	r.CreatedAt = time.Unix(0, created).UTC()
	r.NextAttemptAt = fromNanos(next)
	r.LastError = lastErr.String
	return r, nil
}
