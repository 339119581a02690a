package sqlite

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/outboxrelay/outbox"
)

// TestFetchLimits checks Fetch with more distinct limits than it keeps
// literal statements for (the rest bind the limit), and with cursor counts
// that fill, pad and span the UNION ALL groups.
func TestFetchLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 20})
	// Keys spread over the partitions; count what each partition holds.
	var msgs []outbox.Message
	for i := range 400 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint("key-", i), Payload: []byte("{}")})
	}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	held := map[int]int{}
	for _, r := range b.all(t) {
		held[r.Partition]++
	}
	for limit := 1; limit <= maxLiteralLimits+4; limit++ {
		for _, n := range []int{1, 3, 16, 20} {
			cursors := make([]outbox.Cursor, n)
			for i := range cursors {
				// Partitions 0 and 1 move between the slots.
				cursors[i] = outbox.Cursor{Lease: outbox.Lease{Partition: (i + limit) % 20}}
			}
			recs, err := b.store.Fetch(b.ctx, cursors, limit)
			if err != nil {
				t.Fatalf("Fetch(%d cursors, limit %d): %v", n, limit, err)
			}
			got := map[int]int{}
			for _, r := range recs {
				got[r.Partition]++
			}
			for _, c := range cursors {
				if want := min(limit, held[c.Partition]); got[c.Partition] != want {
					t.Errorf("Fetch(%d cursors, limit %d): partition %d gave %d records, want %d", n, limit, c.Partition, got[c.Partition], want)
				}
				delete(got, c.Partition)
			}
			if len(got) > 0 {
				t.Errorf("Fetch(%d cursors, limit %d): records of partitions not asked for: %v", n, limit, got)
			}
		}
	}
}

// BenchmarkFetchRebind fetches 16 partitions again and again with new
// cursors, partitions 0 and 1 moving between the statement's slots and
// fewer cursors than slots now and then, as a relay's workers do. With a
// bound "partition = ?" and "LIMIT ?", SQLite re-prepared the statement on
// most calls: 742-903 µs per fetch, against 23-61 µs without (2 cores,
// load 16).
func BenchmarkFetchRebind(b *testing.B) {
	bu := setup(b, Options{Partitions: 64})
	ctx, s := bu.ctx, bu.store
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 640 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint("key-", i), Payload: []byte("{}")})
	}
	if err := s.Write(ctx, tx, msgs...); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	cursors := make([]outbox.Cursor, 16)
	b.ResetTimer()
	for i := range b.N {
		for j := range cursors {
			// After past the last record: the statement's own cost,
			// not the records'.
			cursors[j] = outbox.Cursor{Lease: outbox.Lease{Partition: (i + j) % 16}, After: 1_000_000 + int64(i%5)}
		}
		if _, err := s.Fetch(ctx, cursors[:16-i%3], 100); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWriteOtherHandle: Write in a transaction of another *sql.DB on the
// same file (the store's prepared INSERT belongs to the store's own) still
// writes.
func TestWriteOtherHandle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db2, err := sql.Open("sqlite", b.path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	tx, err := db2.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Write(b.ctx, tx, outbox.Message{Topic: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := len(b.all(t)); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}

// TestCachedStatements: a connection of Open runs a text starting with
// cacheMarker on its prepared statement, and unprepared while rows of that
// statement are still open.
func TestCachedStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := b.store.DB().Conn(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	query := cacheMarker + "SELECT ?"
	read := func(rows *sql.Rows) int {
		t.Helper()
		var v int
		if !rows.Next() {
			t.Fatalf("no row: %v", rows.Err())
		}
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	outer, err := c.QueryContext(b.ctx, query, 1)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.QueryContext(b.ctx, query, 2) // the statement is busy
	if err != nil {
		t.Fatal(err)
	}
	if a, b := read(outer), read(inner); a != 1 || b != 2 {
		t.Fatalf("read %d and %d, want 1 and 2", a, b)
	}
	outer.Close()
	inner.Close()
	for want := 3; want < 6; want++ {
		rows, err := c.QueryContext(b.ctx, query, want)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(rows); got != want {
			t.Fatalf("read %d, want %d", got, want)
		}
		rows.Close()
	}
	if _, err := c.ExecContext(b.ctx, cacheMarker+"UPDATE "+b.store.n.leases+" SET epoch = epoch WHERE partition = ?", 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Raw(func(dc any) error {
		if n := len(dc.(*conn).stmts); n != 2 {
			t.Errorf("%d statements kept prepared, want 2", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
