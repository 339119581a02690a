package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		opts  Options
		field string
	}{
		{"prefix starts with digit", Options{TablePrefix: "1outbox"}, "TablePrefix"},
		{"prefix with dash", Options{TablePrefix: "out-box"}, "TablePrefix"},
		{"prefix with quote", Options{TablePrefix: `x"; DROP TABLE t; --`}, "TablePrefix"},
		{"prefix too long", Options{TablePrefix: strings.Repeat("a", MaxTablePrefixLen+1)}, "TablePrefix"},
		{"prefix reserved", Options{TablePrefix: "sqlite_x"}, "TablePrefix"},
		{"negative partitions", Options{Partitions: -1}, "Partitions"},
		{"too many partitions", Options{Partitions: outbox.MaxPartitions + 1}, "Partitions"},
		{"payload limit too large", Options{MaxPayload: MaxPayloadLimit + 1}, "MaxPayload"},
		{"negative retention", Options{Retention: -time.Second}, "Retention"},
		{"tiny busy timeout", Options{BusyTimeout: time.Microsecond}, "BusyTimeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(&sql.DB{}, c.opts)
			if err == nil || !strings.Contains(err.Error(), "Options."+c.field) {
				t.Fatalf("New(%+v) = %v, want an error naming Options.%s", c.opts, err, c.field)
			}
			_, err = Open(context.Background(), filepath.Join(t.TempDir(), "x.db"), c.opts)
			if err == nil || !strings.Contains(err.Error(), "Options."+c.field) {
				t.Fatalf("Open(%+v) = %v, want an error naming Options.%s", c.opts, err, c.field)
			}
		})
	}
	if _, err := New(&sql.DB{}, Options{TablePrefix: "Good_prefix_2"}); err != nil {
		t.Fatalf("valid prefix refused: %v", err)
	}
}

func TestOpenRefusesMemoryAndEmptyPath(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"", ":memory:", "file::memory:?cache=shared", "file:x.db?mode=memory"} {
		if s, err := Open(context.Background(), p, Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded, want an error", p)
		}
	}
}

func TestBuildDSN(t *testing.T) {
	t.Parallel()
	got, err := buildDSN("/tmp/a dir/x?y#z.db", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := "file:/tmp/a%20dir/x%3Fy%23z.db?_pragma=busy_timeout%285000%29&_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%28ON%29&_txlock=immediate"
	if got != want {
		t.Errorf("buildDSN(plain) =\n%s\nwant\n%s", got, want)
	}
	got, err = buildDSN("file:x.db?_pragma=busy_timeout(100)&_txlock=deferred&cache=private", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want = "file:x.db?_pragma=busy_timeout(100)&_txlock=deferred&cache=private&_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%28ON%29"
	if got != want {
		t.Errorf("buildDSN(uri) =\n%s\nwant\n%s", got, want)
	}
}

// TestOpenOddPath checks that a file name with URI metacharacters names
// that very file, in WAL mode.
func TestOpenOddPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a dir?#%", "o.db")
	if s, err := Open(ctx, path, Options{}); err == nil {
		s.Close()
		t.Fatalf("Open in a missing directory succeeded")
	} else if !strings.Contains(err.Error(), "directory exists") {
		t.Fatalf("Open in a missing directory: %v, want a hint about the directory", err)
	}
	path = filepath.Join(t.TempDir(), "x?y#%z.db")
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var file, mode string
	if err := s.DB().QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
		t.Fatal(err)
	}
	if file != path {
		t.Errorf("database file = %q, want %q", file, path)
	}
	if err := s.DB().QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
}

func TestWriteFetchSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	created := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	msgs := []outbox.Message{
		{Topic: "orders.created", Key: "c1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"Trace": "abc"}},
		{Topic: "orders.paid", Key: "c1", Payload: []byte(`{"n":2}`), CreatedAt: created},
		{ID: outbox.NewID(), Topic: "orders.created", Payload: nil},
	}
	orig := append([]outbox.Message(nil), msgs...)
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		if msgs[i].ID != orig[i].ID || !msgs[i].CreatedAt.Equal(orig[i].CreatedAt) {
			t.Fatalf("Write modified the caller's message %d", i)
		}
	}
	recs := b.all(t)
	if len(recs) != 3 {
		t.Fatalf("fetched %d records, want 3", len(recs))
	}
	byTopicKey := map[string]outbox.Record{}
	for _, r := range recs {
		byTopicKey[r.Topic+"/"+r.Key] = r
		if err := outbox.ValidateID(r.ID); err != nil {
			t.Errorf("record ID: %v", err)
		}
		if r.Key != "" && r.Partition != outbox.PartitionOf(r.Key, testPartitions) {
			t.Errorf("record %s partition %d, want PartitionOf(%q) = %d", r.ID, r.Partition, r.Key, outbox.PartitionOf(r.Key, testPartitions))
		}
		if r.Attempts != 0 || !r.NextAttemptAt.IsZero() || r.LastError != "" {
			t.Errorf("new record has retry state: %+v", r)
		}
	}
	c1, p1 := byTopicKey["orders.created/c1"], byTopicKey["orders.paid/c1"]
	if c1.Headers["Trace"] != "abc" || string(c1.Payload) != `{"n":1}` || c1.CreatedAt.IsZero() {
		t.Errorf("orders.created record = %+v", c1)
	}
	if !p1.CreatedAt.Equal(created) {
		t.Errorf("CreatedAt = %v, want %v", p1.CreatedAt, created)
	}
	if c1.Seq >= p1.Seq {
		t.Errorf("seq of the first message %d not below the second's %d", c1.Seq, p1.Seq)
	}
	noKey := byTopicKey["orders.created/"]
	if noKey.ID != orig[2].ID || len(noKey.Payload) != 0 {
		t.Errorf("keyless record = %+v, want ID %s and an empty payload", noKey, orig[2].ID)
	}

	// A cursor past a record hides it.
	got, err := b.store.Fetch(b.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: c1.Partition}, After: c1.Seq}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	// (The keyless message may share the partition: it has a random one.)
	if len(got) == 0 || got[0].ID != p1.ID || len(got) > 2 {
		t.Errorf("fetch after the first seq = %v, want %s first", got, p1.ID)
	}
	for _, r := range got {
		if r.ID == c1.ID {
			t.Errorf("fetch after the first seq returned the first record")
		}
	}

	leases := b.leaseAll(t, "n1")
	err = b.store.Settle(b.ctx, "n1", []outbox.Settlement{
		{Lease: leases[c1.Partition], Delivered: []string{c1.ID, p1.ID}},
		{Lease: leases[noKey.Partition], Delivered: []string{noKey.ID}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages left after delivery, want 0", n)
	}
}

func TestWriteNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "o.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	err = s.Write(ctx, tx, outbox.Message{Topic: "a"})
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Write before Migrate = %v, want an error saying to run Migrate", err)
	}
	if _, err := s.Fetch(ctx, []outbox.Cursor{{}}, 1); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Fetch before Migrate = %v, want an error saying to run Migrate", err)
	}
}

// TestOversizedPayload: an invalid message anywhere in a batch fails the
// whole Write before anything is written, and the transaction stays usable.
func TestOversizedPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{MaxPayload: 1024})
	if _, err := b.store.DB().ExecContext(b.ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := b.store.DB().BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(b.ctx, "INSERT INTO orders (id) VALUES ('o1')"); err != nil {
		t.Fatal(err)
	}
	err = b.store.Write(b.ctx, tx,
		outbox.Message{Topic: "orders.created", Key: "o1", Payload: make([]byte, 16)},
		outbox.Message{Topic: "orders.created", Key: "o1", Payload: make([]byte, 1025)},
	)
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Payload" {
		t.Fatalf("Write with a 1025-byte payload over a 1024-byte limit = %v, want a *ValidationError on Payload", err)
	}
	if !strings.Contains(err.Error(), "message 1 of 2") || !strings.Contains(err.Error(), "MaxPayload") {
		t.Errorf("error %q should name the message and the MaxPayload option", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after a refused Write: %v", err)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Errorf("%d messages written, want 0", n)
	}
	var orders int
	if err := b.store.DB().QueryRowContext(b.ctx, "SELECT count(*) FROM orders").Scan(&orders); err != nil || orders != 1 {
		t.Errorf("orders = %d (%v), want 1: the transaction stays usable", orders, err)
	}
}

// TestWriteManyChunks writes more messages in one call than fit one INSERT.
func TestWriteManyChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2*rowsPerInsert + 7
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "bulk", Key: fmt.Sprint("k", i%13), Payload: []byte(fmt.Sprint(i))}
	}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	if len(recs) != n {
		t.Fatalf("fetched %d records, want %d", len(recs), n)
	}
	// Within a key, seq order is the order of msgs.
	last := map[string]int{}
	for _, r := range recs {
		var i int
		fmt.Sscan(string(r.Payload), &i)
		if prev, ok := last[r.Key]; ok && i < prev {
			t.Fatalf("key %s: message %d fetched after %d", r.Key, i, prev)
		}
		last[r.Key] = i
	}
}

// TestConcurrentWriters runs many writers on the store's database and on a
// second, independent *sql.DB (as another process would): with busy_timeout
// and immediate transactions, none fails with "database is locked".
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	// Generous timeouts: the point is that writers wait rather than fail,
	// and a loaded test machine (or -race) makes each transaction slow.
	b := setup(t, Options{BusyTimeout: 30 * time.Second})
	if _, err := b.store.DB().ExecContext(b.ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT)"); err != nil {
		t.Fatal(err)
	}
	dsn, err := buildDSN(b.path, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	otherStore, err := New(other, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const writers, perWriter = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		db, s := b.store.DB(), b.store
		if w%2 == 1 {
			db, s = other, otherStore
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				id := fmt.Sprintf("o-%d-%d", w, i)
				err := func() error {
					tx, err := db.BeginTx(b.ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if _, err := tx.ExecContext(b.ctx, "INSERT INTO orders (id, customer) VALUES (?, ?)", id, fmt.Sprint("c", w)); err != nil {
						return err
					}
					if err := s.Write(b.ctx, tx,
						outbox.Message{Topic: "orders.created", Key: id},
						outbox.Message{Topic: "orders.paid", Key: id},
					); err != nil {
						return err
					}
					return tx.Commit()
				}()
				if err != nil {
					errs <- fmt.Errorf("writer %d, order %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := b.count(t, "_messages"); n != 2*writers*perWriter {
		t.Errorf("%d messages, want %d", n, 2*writers*perWriter)
	}
}

func TestRetentionCleanup(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, Options{Retention: time.Hour, Now: clk.Now})
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: "k", Payload: []byte{byte(i)}})
	}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	leases := b.leaseAll(t, "n1")
	p := recs[0].Partition
	// Publish the first two now and the other three 30 minutes later.
	if err := b.store.Settle(b.ctx, "n1", []outbox.Settlement{{Lease: leases[p], Delivered: []string{recs[0].ID, recs[1].ID}}}); err != nil {
		t.Fatal(err)
	}
	clk.Add(30 * time.Minute)
	if err := b.store.Settle(b.ctx, "n1", []outbox.Settlement{{Lease: leases[p], Delivered: []string{recs[2].ID, recs[3].ID, recs[4].ID}}}); err != nil {
		t.Fatal(err)
	}
	if got := b.all(t); len(got) != 0 {
		t.Fatalf("published records are still fetched: %d", len(got))
	}
	if n := b.count(t, "_messages"); n != 5 {
		t.Fatalf("%d rows kept, want 5 (retention)", n)
	}
	st, err := b.store.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Outstanding != 0 {
		t.Errorf("Status.Outstanding = %d with only published rows, want 0", st.Outstanding)
	}
	cleanup := func(limit int) int64 {
		t.Helper()
		n, err := b.store.Cleanup(b.ctx, limit)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := cleanup(100); n != 0 {
		t.Fatalf("Cleanup within retention deleted %d, want 0", n)
	}
	clk.Add(31 * time.Minute) // the first two are 61 minutes old, the others 31
	if n := cleanup(1); n != 1 {
		t.Fatalf("Cleanup(1) deleted %d, want 1", n)
	}
	if n := cleanup(100); n != 1 {
		t.Fatalf("Cleanup deleted %d, want the remaining expired 1", n)
	}
	clk.Add(30 * time.Minute)
	if n := cleanup(100); n != 3 {
		t.Fatalf("Cleanup deleted %d, want 3", n)
	}
	if n := b.count(t, "_messages"); n != 0 {
		t.Fatalf("%d rows left, want 0", n)
	}
}

func TestLeasesAndFencing(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, Options{Now: clk.Now})
	ctx := b.ctx
	s := b.store
	if n, err := s.Heartbeat(ctx, "a", time.Minute); err != nil || n != 1 {
		t.Fatalf("Heartbeat(a) = %d, %v; want 1", n, err)
	}
	if n, err := s.Heartbeat(ctx, "b", 10*time.Second); err != nil || n != 2 {
		t.Fatalf("Heartbeat(b) = %d, %v; want 2", n, err)
	}
	a, err := s.AcquireLeases(ctx, "a", nil, 5, 10*time.Second)
	if err != nil || len(a) != 5 {
		t.Fatalf("a acquires 5: %v, %v", a, err)
	}
	for i, l := range a {
		if l.Partition != i || l.Epoch != 1 {
			t.Fatalf("a's lease %d = %+v, want partition %d epoch 1", i, l, i)
		}
	}
	bl, err := s.AcquireLeases(ctx, "b", nil, 100, 10*time.Second)
	if err != nil || len(bl) != testPartitions-5 || bl[0].Partition != 5 {
		t.Fatalf("b acquires the rest: %v, %v", bl, err)
	}
	// Renewal keeps exactly the held leases.
	a2, err := s.AcquireLeases(ctx, "a", a, 3, 10*time.Second)
	if err != nil || len(a2) != 5 {
		t.Fatalf("a renews: %v, %v; want its 5 leases and nothing more", a2, err)
	}

	if err := b.write(t, outbox.Message{Topic: "t", Key: "x"}); err != nil {
		t.Fatal(err)
	}
	rec := b.all(t)[0]
	stale := outbox.Lease{Partition: rec.Partition, Epoch: 99}
	err = s.Settle(ctx, "a", []outbox.Settlement{{Lease: stale, Delivered: []string{rec.ID}}})
	var fe *outbox.FencedError
	if !errors.As(err, &fe) || len(fe.Leases) != 1 || fe.Leases[0] != stale {
		t.Fatalf("Settle with a wrong epoch = %v, want a FencedError for %v", err, stale)
	}
	if len(b.all(t)) != 1 {
		t.Fatal("a fenced settlement deleted the record")
	}

	// b's heartbeat and leases expire; a takes b's partitions over with a
	// new epoch, and b's settlements are fenced off.
	clk.Add(11 * time.Second)
	if n, err := s.Heartbeat(ctx, "a", time.Minute); err != nil || n != 1 {
		t.Fatalf("Heartbeat after b expired = %d, %v; want 1", n, err)
	}
	a3, err := s.AcquireLeases(ctx, "a", a2, 100, 10*time.Second)
	if err != nil || len(a3) != testPartitions {
		t.Fatalf("a takes over: %v, %v", a3, err)
	}
	for _, l := range a3 {
		if l.Partition >= 5 && l.Epoch != 2 {
			t.Errorf("taken-over lease %+v, want epoch 2", l)
		}
		if l.Partition < 5 && l.Epoch != 1 {
			t.Errorf("renewed (expired, untaken) lease %+v, want epoch 1 kept", l)
		}
	}
	var bLease, aLease outbox.Lease
	for _, l := range bl {
		if l.Partition == rec.Partition {
			bLease = l
		}
	}
	for _, l := range a3 {
		if l.Partition == rec.Partition {
			aLease = l
		}
	}
	if bLease != (outbox.Lease{}) {
		err = s.Settle(ctx, "b", []outbox.Settlement{{Lease: bLease, Delivered: []string{rec.ID}}})
		if !errors.As(err, &fe) {
			t.Fatalf("Settle by the former owner = %v, want a FencedError", err)
		}
	}
	// A mixed call applies the valid settlement and reports the other.
	other := outbox.Lease{Partition: (rec.Partition + 1) % testPartitions, Epoch: 1000}
	err = s.Settle(ctx, "a", []outbox.Settlement{
		{Lease: other, Delivered: []string{outbox.NewID()}},
		{Lease: aLease, Delivered: []string{rec.ID}},
	})
	if !errors.As(err, &fe) || len(fe.Leases) != 1 || fe.Leases[0] != other {
		t.Fatalf("mixed Settle = %v, want a FencedError for %v only", err, other)
	}
	if len(b.all(t)) != 0 {
		t.Fatal("the valid settlement of a mixed call was not applied")
	}

	// Release and Leave free leases for others at once.
	if err := s.ReleaseLeases(ctx, "a", a3[:2]); err != nil {
		t.Fatal(err)
	}
	got, err := s.AcquireLeases(ctx, "c", nil, 100, time.Minute)
	if err != nil || len(got) != 2 || got[0].Partition != 0 || got[0].Epoch != 2 {
		t.Fatalf("c after a released 2: %v, %v", got, err)
	}
	if err := s.Leave(ctx, "a", a3[2:]); err != nil {
		t.Fatal(err)
	}
	got, err = s.AcquireLeases(ctx, "c", got, 100, time.Minute)
	if err != nil || len(got) != testPartitions {
		t.Fatalf("c after a left: %v, %v", got, err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Relays) != 0 {
		t.Errorf("Status.Relays = %v after a left and c never beat, want none", st.Relays)
	}
	for _, p := range st.Partitions {
		if p.Owner != "c" {
			t.Errorf("partition %d owner %q, want c", p.Partition, p.Owner)
		}
	}
}

func TestRetryAndDeadLetters(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, Options{Now: clk.Now})
	ctx, s := b.ctx, b.store
	if err := b.write(t,
		outbox.Message{Topic: "a.b", Key: "k", Payload: []byte("1"), Headers: map[string]string{"H": "v"}},
		outbox.Message{Topic: "a.b", Key: "k", Payload: []byte("2")},
		outbox.Message{Topic: "c", Key: "k", Payload: []byte("3")},
	); err != nil {
		t.Fatal(err)
	}
	recs := b.all(t)
	leases := b.leaseAll(t, "n")
	lease := leases[recs[0].Partition]
	next := clk.Now().Add(time.Minute)
	long := strings.Repeat("é", storepolicy.MaxErrorLen) // 2 bytes each: cut in half
	if err := s.Settle(ctx, "n", []outbox.Settlement{{
		Lease: lease,
		Retry: []outbox.Failure{{ID: recs[1].ID, Partition: lease.Partition, Attempts: 1, NextAttemptAt: next, Err: long}},
		Dead:  []outbox.Failure{{ID: recs[0].ID, Partition: lease.Partition, Attempts: 3, Err: "boom"}, {ID: recs[2].ID, Partition: lease.Partition, Attempts: 1, Err: "permanent"}},
	}}); err != nil {
		t.Fatal(err)
	}
	left := b.all(t)
	if len(left) != 1 || left[0].ID != recs[1].ID {
		t.Fatalf("left after settle: %v", left)
	}
	r := left[0]
	if r.Attempts != 1 || !r.NextAttemptAt.Equal(next) || r.LastError != storepolicy.ErrorText(long) {
		t.Errorf("retried record: attempts %d next %v error len %d", r.Attempts, r.NextAttemptAt, len(r.LastError))
	}

	clk.Add(time.Second)
	dls, err := s.DeadLetters(ctx, outbox.DeadLetterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 || dls[0].ID != recs[0].ID || dls[0].Attempts != 3 || dls[0].LastError != "boom" ||
		dls[0].Headers["H"] != "v" || string(dls[0].Payload) != "1" || dls[0].FailedAt.IsZero() {
		t.Fatalf("dead letters = %+v", dls)
	}
	if dls, err := s.DeadLetters(ctx, outbox.DeadLetterFilter{Topic: "c"}); err != nil || len(dls) != 1 || dls[0].ID != recs[2].ID {
		t.Fatalf("dead letters of topic c = %v, %v", dls, err)
	}
	if dls, err := s.DeadLetters(ctx, outbox.DeadLetterFilter{Limit: 1}); err != nil || len(dls) != 1 {
		t.Fatalf("dead letters with Limit 1 = %v, %v", dls, err)
	}
	if dls, err := s.DeadLetters(ctx, outbox.DeadLetterFilter{FailedBefore: clk.Now().Add(-time.Hour)}); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters failed an hour ago = %v, %v", dls, err)
	}
	st, err := s.Status(ctx)
	if err != nil || st.DeadLetters != 2 || st.Outstanding != 1 {
		t.Fatalf("status = %+v, %v", st, err)
	}

	// Requeue puts the dead letter after the message of its key still
	// there, with attempts reset and the same ID.
	n, err := s.Requeue(ctx, outbox.DeadLetterFilter{IDs: []string{recs[0].ID}})
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	left = b.all(t)
	if len(left) != 2 || left[0].ID != recs[1].ID || left[1].ID != recs[0].ID || left[1].Attempts != 0 || left[1].Seq <= left[0].Seq {
		t.Fatalf("after requeue: %+v", left)
	}
	if !left[1].CreatedAt.Equal(recs[0].CreatedAt) || left[1].Partition != recs[0].Partition {
		t.Errorf("requeued record lost its CreatedAt or partition: %+v", left[1])
	}
	n, err = s.PurgeDeadLetters(ctx, outbox.DeadLetterFilter{})
	if err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if c := b.count(t, "_dead_letters"); c != 0 {
		t.Fatalf("%d dead letters left", c)
	}
}

func TestUnorderedClaims(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, Options{Now: clk.Now})
	ctx, s := b.ctx, b.store
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint(i % 3), Payload: []byte{byte(i)}})
	}
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
	c1, err := s.ClaimUnordered(ctx, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.ClaimUnordered(ctx, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	c3, err := s.ClaimUnordered(ctx, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range []outbox.Claim{c1, c2, c3} {
		for i, r := range c.Records() {
			if seen[r.ID] {
				t.Fatalf("record %s claimed twice", r.ID)
			}
			seen[r.ID] = true
			if i > 0 && r.Seq <= c.Records()[i-1].Seq {
				t.Fatalf("claim not in seq order")
			}
		}
	}
	if len(c1.Records()) != 4 || len(c2.Records()) != 4 || len(c3.Records()) != 2 {
		t.Fatalf("claims of %d, %d, %d records; want 4, 4, 2", len(c1.Records()), len(c2.Records()), len(c3.Records()))
	}
	// Settle c1: deliver two, retry one a minute later, dead-letter one.
	r := c1.Records()
	if err := c1.Settle(ctx, outbox.Settlement{
		Delivered: []string{r[0].ID, r[1].ID},
		Retry:     []outbox.Failure{{ID: r[2].ID, Partition: r[2].Partition, Attempts: 1, NextAttemptAt: clk.Now().Add(time.Minute), Err: "x"}},
		Dead:      []outbox.Failure{{ID: r[3].ID, Partition: r[3].Partition, Attempts: 1, Err: "y"}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := c1.Release(ctx); err != nil {
		t.Fatalf("Release after Settle: %v", err)
	}
	if err := c2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// c2's records are free again; the retried one is not due yet.
	c4, err := s.ClaimUnordered(ctx, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c4.Records()) != 4 {
		t.Fatalf("claim after release = %d records, want c2's 4", len(c4.Records()))
	}
	c4.Release(ctx)
	clk.Add(time.Minute)
	c5, err := s.ClaimUnordered(ctx, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c5.Records()) != 5 {
		t.Fatalf("claim after the retry is due = %d records, want 5", len(c5.Records()))
	}
	c5.Release(ctx)
	c3.Release(ctx)
}

// TestNotify: on a database of Open, subscribers hear of a write at its
// commit, not before, and not for a rollback.
func TestNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	subCtx, cancel := context.WithCancel(b.ctx)
	ch, err := b.store.Subscribe(subCtx)
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := b.store.Subscribe(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	pending := func(c <-chan struct{}) bool {
		select {
		case _, ok := <-c:
			return ok
		default:
			return false
		}
	}
	tx, err := b.store.DB().BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Write(b.ctx, tx, outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if pending(ch) {
		t.Fatal("notified before commit")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if pending(ch) {
		t.Fatal("notified for a rollback")
	}
	// A transaction without outbox writes does not notify.
	if _, err := b.store.DB().ExecContext(b.ctx, "CREATE TABLE x (a INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if pending(ch) {
		t.Fatal("notified for a transaction without outbox writes")
	}
	// Two commits coalesce into one value per subscriber.
	for range 2 {
		tx, err = b.store.DB().BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.store.Write(b.ctx, tx, outbox.Message{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if !pending(ch) || !pending(ch2) {
		t.Fatal("not notified after commit")
	}
	if pending(ch) {
		t.Fatal("two commits gave two values: not coalesced")
	}
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("value after the subscription ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed after its context ended")
	}
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch2; ok {
		t.Fatal("channel open after Close")
	}
	if _, err := b.store.Subscribe(b.ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}
}

func TestPackageWriteDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "o.db"), Options{Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(ctx, tx, outbox.Message{Topic: "t", Key: "abc"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("the package-level Write on a database of Open did not notify at commit")
	}
	recs, err := s.Fetch(ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: outbox.PartitionOf("abc", 4)}}}, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Fetch = %v, %v; want the message in partition PartitionOf(abc, 4)", recs, err)
	}
	if err := Write(ctx, nil, outbox.Message{Topic: "t"}); err == nil {
		t.Fatal("Write with a nil tx succeeded")
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{TablePrefix: "app_outbox", Partitions: 16})
	if err := b.store.Migrate(b.ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if n := b.count(t, "_leases"); n != 16 {
		t.Fatalf("%d lease rows, want 16", n)
	}
	if n, want := b.count(t, "_migrations"), len(mustMigrations(t)); n != want {
		t.Fatalf("%d migration rows, want %d (one per migration file)", n, want)
	}
	// Another Store on the same tables with P unset reads P; with another P
	// it fails and names the option.
	s2, err := New(b.store.DB(), Options{TablePrefix: "app_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := s2.Partitions(b.ctx); err != nil || p != 16 {
		t.Fatalf("Partitions = %d, %v; want 16", p, err)
	}
	s3, err := New(b.store.DB(), Options{TablePrefix: "app_outbox", Partitions: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Migrate(b.ctx); err == nil || !strings.Contains(err.Error(), "Options.Partitions") {
		t.Fatalf("Migrate with another P = %v, want an error naming Options.Partitions", err)
	}
	// Two prefixes live side by side in one database.
	s4, err := New(b.store.DB(), Options{TablePrefix: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s4.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := s4.Partitions(b.ctx); err != nil || p != outbox.DefaultPartitions {
		t.Fatalf("Partitions of the second prefix = %d, %v; want the default", p, err)
	}
}

// TestQueryPlans checks that the per-batch statements use their indexes.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plan := func(query string, args ...any) string {
		t.Helper()
		rows, err := b.store.DB().QueryContext(b.ctx, "EXPLAIN QUERY PLAN "+query, args...)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, detail)
		}
		return strings.Join(lines, "\n")
	}
	q := b.store.q
	for _, c := range []struct {
		name, query, want string
		args              []any
	}{
		{"fetch", q.fetch, "USING INDEX \"outbox_messages_pending_idx\" (partition=? AND seq>?)", []any{1, 2, 3}},
		{"unsettled", q.unsettled, "USING INDEX \"outbox_messages_pending_idx\" (partition=? AND seq<?)", []any{1, 2}},
		{"delete", q.deleteInPart + "?, ?)", "USING INDEX sqlite_autoindex_outbox_messages_1 (id=?)", []any{1, "a", "b"}},
		{"retry", q.retry, "USING INDEX sqlite_autoindex_outbox_messages_1 (id=?)", []any{1, 2, "e", "a", 3}},
		{"cleanup", q.cleanup, "USING COVERING INDEX outbox_messages_published_idx (published_at>? AND published_at<?)", []any{1, 2}},
	} {
		got := plan(c.query, c.args...)
		t.Logf("%s:\n%s", c.name, got)
		if !strings.Contains(strings.ReplaceAll(got, `"`, ""), strings.ReplaceAll(c.want, `"`, "")) {
			t.Errorf("plan of %s:\n%s\nwant it to contain %s", c.name, got, c.want)
		}
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.store.Fetch(b.ctx, []outbox.Cursor{{}}, 1); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Fetch after Close = %v, want ErrClosed", err)
	}
	if _, err := b.store.Heartbeat(b.ctx, "n", time.Second); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Heartbeat after Close = %v, want ErrClosed", err)
	}
}

// TestStatus covers the backlog counts.
func TestStatus(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setup(t, Options{Now: clk.Now})
	if err := b.write(t,
		outbox.Message{Topic: "a", Key: "1"},
		outbox.Message{Topic: "a", Key: "2"},
		outbox.Message{Topic: "b", Key: "1"},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Heartbeat(b.ctx, "n", time.Minute); err != nil {
		t.Fatal(err)
	}
	b.leaseAll(t, "n")
	st, err := b.store.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Outstanding != 3 || !st.OldestCreatedAt.Equal(clk.Now()) || len(st.Topics) != 2 ||
		st.Topics[0] != (outbox.TopicCount{Topic: "a", Count: 2, OldestCreatedAt: clk.Now()}) ||
		st.Topics[1] != (outbox.TopicCount{Topic: "b", Count: 1, OldestCreatedAt: clk.Now()}) {
		t.Fatalf("status = %+v", st)
	}
	if len(st.Partitions) != testPartitions || len(st.Relays) != 1 || st.Relays[0].Partitions != testPartitions {
		t.Fatalf("status partitions/relays = %+v / %+v", st.Partitions, st.Relays)
	}
	var sum int64
	for _, p := range st.Partitions {
		sum += p.Outstanding
		if p.Owner != "n" || p.Epoch != 1 || !p.LeaseExpiresAt.Equal(clk.Now().Add(time.Minute)) {
			t.Errorf("partition status %+v", p)
		}
	}
	if sum != 3 || st.Partitions[outbox.PartitionOf("1", testPartitions)].Outstanding < 2 {
		t.Errorf("per-partition counts %+v", st.Partitions)
	}
	clk.Add(2 * time.Minute)
	st, err = b.store.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Relays) != 0 || st.Partitions[0].Owner != "" {
		t.Errorf("expired relay or lease still shown: %+v %+v", st.Relays, st.Partitions[0])
	}
}

func mustMigrations(t *testing.T) []migration {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}
