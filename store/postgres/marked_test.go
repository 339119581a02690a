package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// TestFetchMarkedReturnsLateCommits: transaction A inserts first (lower
// seq) but commits after B's row (higher seq) was fetched. A plain cursor
// would skip A's row forever; the mark of the fetch that saw B must bring
// it back, ahead of the next row of A's key.
func TestFetchMarkedReturnsLateCommits(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, testenv.PostgresDSN(t), postgres.Options{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := st.AcquireLeases(ctx, "n", nil, 1, 60e9)
	if err != nil || len(lease) != 1 {
		t.Fatalf("leases %v, %v", lease, err)
	}
	txA, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	early := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := postgres.Write(ctx, txA, early); err != nil {
		t.Fatal(err)
	}
	other := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "other"}
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return postgres.Write(ctx, tx, other) }); err != nil {
		t.Fatal(err)
	}
	recs, mark, err := st.FetchMarked(ctx, []outbox.Cursor{{Lease: lease[0]}}, 100)
	if err != nil || len(recs) != 1 || recs[0].ID != other.ID || mark == "" {
		t.Fatalf("first fetch = %v, mark %q, %v; want only %s", recs, mark, err, other.ID)
	}
	cursor := outbox.Cursor{Lease: lease[0], After: recs[0].Seq, Mark: mark}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	later := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k"}
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return postgres.Write(ctx, tx, later) }); err != nil {
		t.Fatal(err)
	}
	plain, err := st.Fetch(ctx, []outbox.Cursor{cursor}, 100)
	if err != nil || len(plain) != 1 || plain[0].ID != later.ID {
		t.Fatalf("plain Fetch = %v, %v: the test no longer provokes a late commit", plain, err)
	}
	recs, mark2, err := st.FetchMarked(ctx, []outbox.Cursor{cursor}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].ID != early.ID || recs[1].ID != later.ID {
		t.Fatalf("marked fetch = %v; want %s (late) then %s", markedIDs(recs), early.ID, later.ID)
	}
	if recs[0].Seq > cursor.After || recs[0].Payload == nil || recs[0].Topic != "t" {
		t.Fatalf("late record %+v", recs[0])
	}
	// With the new mark nothing below the cursor comes back again.
	recs, _, err = st.FetchMarked(ctx, []outbox.Cursor{{Lease: lease[0], After: recs[1].Seq, Mark: mark2}}, 100)
	if err != nil || len(recs) != 0 {
		t.Fatalf("third fetch = %v, %v; want nothing", markedIDs(recs), err)
	}
}

func markedIDs(recs []outbox.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func TestOpenSizesThePoolForARelay(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Pool().Config().MaxConns; got != postgres.PoolMaxConnsDefault {
		t.Fatalf("MaxConns = %d, want %d", got, postgres.PoolMaxConnsDefault)
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	st2, err := postgres.Open(ctx, dsn+sep+"pool_max_conns=3", postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if got := st2.Pool().Config().MaxConns; got != 3 {
		t.Fatalf("MaxConns with pool_max_conns=3 = %d", got)
	}
}

// TestSubscribePartitions: a committed write reports its partitions, once
// each, to a partition subscriber.
func TestSubscribePartitions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := postgres.Open(ctx, testenv.PostgresDSN(t), postgres.Options{Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan []int, 10)
	done := make(chan error, 1)
	listening := make(chan struct{})
	go func() {
		done <- st.SubscribePartitions(ctx, func(ps []int) { got <- ps })
	}()
	// The subscription is live once a marker notification comes through.
	go func() {
		defer close(listening)
		for {
			if _, err := st.Pool().Exec(ctx, "SELECT pg_notify($1, 'marker')", st.Options().Channel()); err != nil {
				return
			}
			select {
			case ps := <-got:
				if ps == nil { // the marker is no partition list
					return
				}
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	<-listening
	msgs := []outbox.Message{{Topic: "t", Key: "x"}, {Topic: "t", Key: "y"}, {Topic: "t", Key: "x"}}
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return postgres.Write(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	want := map[int]bool{outbox.PartitionOf("x", 16): true, outbox.PartitionOf("y", 16): true}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ps := <-got:
			if ps == nil {
				continue // a late marker
			}
			if len(ps) != len(want) || !want[ps[0]] || !want[ps[len(ps)-1]] {
				t.Fatalf("partitions %v, want %v", ps, want)
			}
		case <-timeout:
			t.Fatal("no notification after the commit")
		}
		break
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("SubscribePartitions returned %v after ctx ended, want nil", err)
	}
}
