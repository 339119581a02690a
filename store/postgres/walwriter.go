package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// walWriteSQL emits one transactional logical decoding message per element
// of $2 with prefix $1, in array order, and returns how many it emitted:
// one statement, one round trip, for any number of messages. Nothing is
// inserted: the messages exist only in the WAL, decoded by the slot of a
// WALStore when the transaction commits (and never if it aborts).
const walWriteSQL = `SELECT count(pg_logical_emit_message(true, $1, u.m)) FROM unnest($2::bytea[]) AS u(m)`

// walContents prepares msgs and encodes each for the WAL.
func (w *Writer) walContents(ctx context.Context, msgs []outbox.Message) ([][]byte, error) {
	now := time.Now()
	out := make([][]byte, len(msgs))
	for i := range msgs {
		m := msgs[i] // a copy: the caller's message is not modified
		if err := w.prepare(ctx, &m, i, len(msgs), now); err != nil {
			return nil, err
		}
		b, err := encodeWALMessage(make([]byte, 0, 64+len(m.Topic)+len(m.Key)+len(m.Payload)), &m)
		if err != nil {
			return nil, fmt.Errorf("postgres: write: message %d of %d: %w", i, len(msgs), err)
		}
		out[i] = b
	}
	return out, nil
}

func (w *Writer) writeWAL(ctx context.Context, tx pgx.Tx, msgs []outbox.Message) error {
	contents, err := w.walContents(ctx, msgs)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, w.sql, w.wal, contents).Scan(&n); err != nil {
		return walWriteErr(err)
	}
	return w.checkEmitted(n, len(msgs))
}

func (w *Writer) writeWALSQL(ctx context.Context, tx *sql.Tx, msgs []outbox.Message) error {
	contents, err := w.walContents(ctx, msgs)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRowContext(ctx, w.sql, w.wal, contents).Scan(&n); err != nil {
		return walWriteErr(err)
	}
	return w.checkEmitted(n, len(msgs))
}

func (w *Writer) checkEmitted(got int64, want int) error {
	if got != int64(want) {
		return fmt.Errorf("postgres: write: emitted %d of %d messages into the WAL", got, want)
	}
	return nil
}

func walWriteErr(err error) error {
	return fmt.Errorf("postgres: write (capture wal, pg_logical_emit_message): %w", err)
}
