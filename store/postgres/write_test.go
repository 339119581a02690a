package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestWriteRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := outbox.NewID()
	payload := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	err := b.write(t,
		outbox.Message{ID: id, Topic: "orders.created", Key: "order-1", Payload: payload, Headers: map[string]string{"trace": "abc", "X-Y": "ü"}},
		outbox.Message{Topic: "orders.nokey"},
	)
	if err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != 2 {
		t.Fatalf("got %d records, want 2", len(recs))
	}
	for _, r := range recs {
		switch r.Topic {
		case "orders.created":
			if r.ID != id || r.Key != "order-1" || !bytes.Equal(r.Payload, payload) || r.Headers["trace"] != "abc" || r.Headers["X-Y"] != "ü" {
				t.Errorf("record %+v does not match what was written", r)
			}
			if r.Partition != outbox.PartitionOf("order-1", testPartitions) {
				t.Errorf("partition %d, want %d", r.Partition, outbox.PartitionOf("order-1", testPartitions))
			}
		case "orders.nokey":
			if outbox.ValidateID(r.ID) != nil || r.Key != "" || len(r.Payload) != 0 || r.Headers != nil || r.CreatedAt.IsZero() {
				t.Errorf("record %+v: want a generated ID and CreatedAt, empty key, payload and headers", r)
			}
		default:
			t.Errorf("unexpected record %+v", r)
		}
	}
}

// TestPartitionMatchesPartitionOf checks that the partition computed in SQL
// from the key hash equals outbox.PartitionOf for many keys.
func TestPartitionMatchesPartitionOf(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 61}) // a prime, unlike the default
	var msgs []outbox.Message
	for i := range 500 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprintf("key-%d-%s", i, strings.Repeat("é", i%7))})
	}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != len(msgs) {
		t.Fatalf("got %d records, want %d", len(recs), len(msgs))
	}
	for _, r := range recs {
		if want := outbox.PartitionOf(r.Key, 61); r.Partition != want {
			t.Errorf("key %q: partition %d, want %d", r.Key, r.Partition, want)
		}
	}
}

func TestWriteInvalidWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{MaxPayload: 1000})
	cases := []struct {
		msg   outbox.Message
		field string
	}{
		{outbox.Message{Topic: "ok", Payload: make([]byte, 1001)}, "Payload"},
		{outbox.Message{Topic: "bad topic"}, "Topic"},
		{outbox.Message{Topic: "ok", ID: "not-a-uuid"}, "ID"},
		{outbox.Message{Topic: "ok", Headers: map[string]string{"Outbox-Id": "x"}}, "Headers"},
		{outbox.Message{Topic: "ok", Key: "a\x00b"}, "Key"},
		{outbox.Message{Topic: "ok", Headers: map[string]string{"h": "\xff"}}, "Headers"},
		{outbox.Message{Topic: "ok", Headers: map[string]string{"h": "a\x00"}}, "Headers"},
	}
	for _, c := range cases {
		tx, err := b.store.Pool().Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = b.store.Writer().Write(b.ctx, tx, outbox.Message{Topic: "fine"}, c.msg)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(err.Error(), "message 1 of 2") {
			t.Errorf("%s: got %v, want a ValidationError on %s naming message 1", c.field, err, c.field)
		}
		// Nothing was sent: the transaction is still usable.
		var one int
		if err := tx.QueryRow(b.ctx, "SELECT 1").Scan(&one); err != nil {
			t.Errorf("%s: transaction unusable after a validation error: %v", c.field, err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages written, want 0", n)
	}
}

func TestWriteSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := stdlib.OpenDBFromPool(b.store.Pool())
	defer db.Close()
	tx, err := db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.store.Writer().WriteSQL(b.ctx, tx,
		outbox.Message{Topic: "a", Key: "k", Payload: []byte("1"), Headers: map[string]string{"h": "v"}},
		outbox.Message{Topic: "a", Key: "k", Payload: []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages visible before commit, want 0", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != 2 || string(recs[0].Payload) != "1" || string(recs[1].Payload) != "2" || recs[0].Headers["h"] != "v" {
		t.Fatalf("got %+v, want payloads 1 and 2 in order", recs)
	}
}

func TestWriteSQLRollback(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := stdlib.OpenDBFromPool(b.store.Pool())
	defer db.Close()
	tx, err := db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Writer().WriteSQL(b.ctx, tx, outbox.Message{Topic: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages after rollback, want 0", n)
	}
}

// TestDefaultOptions uses the package-level Write and WriteSQL, which assume
// schema public and prefix outbox.
func TestDefaultOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, testenv.PostgresDSN(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Before Migrate: a write names the missing tables and the fix.
	err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { return Write(ctx, tx, outbox.Message{Topic: "x"}) })
	if err == nil || !strings.Contains(err.Error(), "outbox migrate") {
		t.Fatalf("write before migrate: got %v, want an error telling to run outbox migrate", err)
	}
	if _, err := s.Fetch(ctx, []outbox.Cursor{{}}, 1); err == nil || !strings.Contains(err.Error(), "outbox migrate") {
		t.Fatalf("fetch before migrate: got %v, want an error telling to run outbox migrate", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Partitions(ctx); err != nil || p != outbox.DefaultPartitions {
		t.Fatalf("Partitions = %d, %v; want the default %d", p, err, outbox.DefaultPartitions)
	}
	err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { return Write(ctx, tx, outbox.Message{Topic: "x", Key: "a"}) })
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(s.Pool())
	defer db.Close()
	err = func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := WriteSQL(ctx, tx, outbox.Message{Topic: "y", Key: "a"}); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM public.outbox_messages`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("public.outbox_messages holds %d rows (%v), want 2", n, err)
	}
}

func TestHostileNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	long := strings.Repeat("a", 64)
	cases := []struct {
		opts  Options
		field string
	}{
		{Options{Schema: "x; DROP TABLE"}, "Options.Schema"},
		{Options{Schema: `a"b`}, "Options.Schema"},
		{Options{Schema: long}, "Options.Schema"},
		{Options{Schema: "1abc"}, "Options.Schema"},
		{Options{TablePrefix: "x; DROP TABLE"}, "Options.TablePrefix"},
		{Options{TablePrefix: `a"b`}, "Options.TablePrefix"},
		{Options{TablePrefix: strings.Repeat("p", MaxTablePrefixLen+1)}, "Options.TablePrefix"},
		{Options{TablePrefix: "a-b"}, "Options.TablePrefix"},
		// System schemas: pg_dump leaves them out (issue 11).
		{Options{Schema: "information_schema"}, "Options.Schema \"information_schema\" is a system schema"},
		{Options{Schema: "pg_outbox"}, "Options.Schema \"pg_outbox\" is a system schema"},
		{Options{Schema: "PG_Catalog"}, "Options.Schema \"PG_Catalog\" is a system schema"},
		{Options{TablePrefix: strings.Repeat("p", 40)}, "the limit is 39"},
		{Options{Partitions: outbox.MaxPartitions + 1}, "Options.Partitions"},
		{Options{Partitions: -1}, "Options.Partitions"},
		{Options{MaxPayload: -1}, "Options.MaxPayload"},
		{Options{Retention: -1}, "Options.Retention"},
	}
	for _, c := range cases {
		if _, err := Open(ctx, dsn, c.opts); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Open(%+v): got %v, want an error naming %s", c.opts, err, c.field)
		}
		if _, err := NewWriter(c.opts); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewWriter(%+v): got %v, want an error naming %s", c.opts, err, c.field)
		}
	}
	// Nothing was created.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')`).Scan(&n)
	if err != nil || n != 0 {
		t.Errorf("%d relations exist (%v), want none", n, err)
	}
	// Valid but unusual names are quoted and work, mixed case included.
	s, err := New(mustPool(t, dsn), Options{Schema: "Mixed_Case", TablePrefix: "_T1", Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		return s.Writer().Write(ctx, tx, outbox.Message{Topic: "x"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM "Mixed_Case"."_T1_messages"`).Scan(&n); err != nil || n != 1 {
		t.Errorf(`"Mixed_Case"."_T1_messages" holds %d rows (%v), want 1`, n, err)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := Open(ctx, "postgres://u:secret@[::1", Options{}); err == nil || !strings.Contains(err.Error(), "store URL") || strings.Contains(err.Error(), "secret") {
		t.Errorf("bad URL: got %v, want an error about the store URL without the password", err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = Open(ctx, fmt.Sprintf("postgres://u:secret@127.0.0.1:%d/db?connect_timeout=5", port), Options{})
	if err == nil || !strings.Contains(err.Error(), "cannot connect") || strings.Contains(err.Error(), "secret") {
		t.Errorf("unreachable: got %v, want a cannot-connect error without the password", err)
	}
}

func mustPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestMigrateIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	opts := Options{Schema: "concurrent", Partitions: 5}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := Open(ctx, dsn, opts)
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			errs[i] = s.Migrate(ctx)
			if errs[i] == nil {
				errs[i] = s.Migrate(ctx) // again, on the same store
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(ctx, dsn, Options{Schema: "concurrent"}) // Partitions 0: whatever is stored
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var versions, leases int
	if err := s.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM concurrent.outbox_migrations), (SELECT count(*) FROM concurrent.outbox_leases)`).Scan(&versions, &leases); err != nil {
		t.Fatal(err)
	}
	ms, _ := migrations()
	if versions != len(ms) || leases != 5 {
		t.Errorf("%d migrations recorded and %d lease rows, want %d and 5", versions, leases, len(ms))
	}
	if p, err := s.Partitions(ctx); err != nil || p != 5 {
		t.Errorf("Partitions = %d, %v; want 5", p, err)
	}

	// Another partition count is refused, naming both values.
	s2, err := Open(ctx, dsn, Options{Schema: "concurrent", Partitions: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	err = s2.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "Options.Partitions is 7") || !strings.Contains(err.Error(), "created with 5") {
		t.Errorf("Migrate with another P: got %v, want an error naming 7 and 5", err)
	}
}

// TestNotifyAfterCommit checks on a raw LISTEN connection, where payloads
// are visible, that the write's notification is delivered on commit and not
// before: a marker notified (and committed) by another connection while the
// write is uncommitted arrives first.
func TestNotifyAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	channel := b.opts.Channel()
	listener, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(b.ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	tx, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := b.store.Writer().Write(b.ctx, tx, outbox.Message{Topic: "n", Key: "a"}, outbox.Message{Topic: "n", Key: "b"}, outbox.Message{Topic: "n", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "SELECT pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "marker" {
		t.Fatalf("first notification has payload %q: the write notified before commit", n.Payload)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n, err = listener.WaitForNotification(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The payload names the partitions written, once each.
	p, err := b.store.Partitions(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{strconv.Itoa(outbox.PartitionOf("a", p)): true, strconv.Itoa(outbox.PartitionOf("b", p)): true}
	got := strings.Split(n.Payload, ",")
	if len(got) != len(want) {
		t.Fatalf("second notification has payload %q, want the partitions %v once each", n.Payload, want)
	}
	for _, part := range got {
		if !want[part] {
			t.Fatalf("second notification has payload %q, want the partitions %v", n.Payload, want)
		}
	}
}

// TestNotifyOff checks that Notify false sends nothing: after a write with
// it off and a marker, only the marker arrives.
func TestNotifyOff(t *testing.T) {
	t.Parallel()
	off := false
	b := setup(t, Options{Notify: &off})
	channel := b.opts.Channel()
	listener, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(b.ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := b.write(t, outbox.Message{Topic: "n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Pool().Exec(b.ctx, "SELECT pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "marker" {
		t.Fatalf("got a notification with payload %q, want only the marker", n.Payload)
	}
}

func TestSubscribe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ch, err := b.store.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // several writes may coalesce into one signal
		if err := b.write(t, outbox.Message{Topic: "n"}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatal("subscription closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no signal within 10s of commit")
	}
	cancel()
	for range ch { // closed when ctx ends
	}

	// Close ends a subscription too.
	ch, err = b.store.Subscribe(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.store.Close()
	for range ch {
	}
	if _, err := b.store.Subscribe(b.ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Subscribe after Close: got %v, want ErrClosed", err)
	}
}
