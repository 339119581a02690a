package sqlite

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// keysIn returns keys of n distinct partitions of p, and their partitions.
func keysIn(n, p int) ([]string, []int) {
	var keys []string
	var parts []int
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("key-", i)
		if part := outbox.PartitionOf(k, p); !slices.Contains(parts, part) {
			keys = append(keys, k)
			parts = append(parts, part)
		}
	}
	return keys, parts
}

// subscribed starts SubscribePartitions on s and returns the channel of
// its calls, once the subscription is registered, and its result.
func subscribed(t *testing.T, ctx context.Context, s *Store) (<-chan []int, <-chan error) {
	t.Helper()
	got := make(chan []int, 100)
	res := make(chan error, 1)
	go func() {
		res <- s.SubscribePartitions(ctx, func(ps []int) { got <- ps })
	}()
	for {
		if s.bc.PartitionSubscribers() > 0 {
			return got, res
		}
		if ctx.Err() != nil {
			t.Fatal("SubscribePartitions did not subscribe")
		}
		runtime.Gosched()
	}
}

func next(t *testing.T, got <-chan []int) []int {
	t.Helper()
	select {
	case ps := <-got:
		return ps
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
		return nil
	}
}

func TestNotifyPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 16})
	ctx, cancel := context.WithCancel(b.ctx)
	got, res := subscribed(t, ctx, b.store)
	// Once subscribed: any partition (earlier writes were not announced).
	if ps := next(t, got); ps != nil {
		t.Fatalf("first call %v, want nil", ps)
	}
	keys, parts := keysIn(3, 16)
	commit := func(rollback bool, keys ...string) {
		t.Helper()
		tx, err := b.store.DB().BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := b.store.Write(b.ctx, tx, outbox.Message{Topic: "t", Key: k}, outbox.Message{Topic: "t", Key: k}); err != nil {
				t.Fatal(err)
			}
		}
		if rollback {
			err = tx.Rollback()
		} else {
			err = tx.Commit()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// A rolled-back write notifies nothing: the next call names only the
	// committed one's partitions.
	commit(true, keys[2])
	commit(false, keys[0], keys[1])
	want := slices.Sorted(slices.Values(parts[:2]))
	if ps := next(t, got); !slices.Equal(ps, want) {
		t.Fatalf("notified %v, want %v (partitions of %v)", ps, want, keys[:2])
	}
	// The package-level Write notifies its partitions too.
	tx, err := b.store.DB().BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(b.ctx, tx, outbox.Message{Topic: "t", Key: keys[2]}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ps := next(t, got); !slices.Equal(ps, parts[2:3]) {
		t.Fatalf("package-level Write notified %v, want %v", ps, parts[2:3])
	}
	// Unknown partitions (a requeue of dead letters) are nil: any.
	b.store.bc.Kick(nil)
	if ps := next(t, got); ps != nil {
		t.Fatalf("kick(nil) notified %v, want nil", ps)
	}
	cancel()
	if err := <-res; err != nil {
		t.Fatalf("SubscribePartitions after its context ended = %v, want nil", err)
	}
	// Closing the store ends a subscription with nil; afterwards
	// SubscribePartitions fails with ErrClosed.
	got, res = subscribed(t, b.ctx, b.store)
	if ps := next(t, got); ps != nil {
		t.Fatalf("first call %v, want nil", ps)
	}
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("SubscribePartitions after Close = %v, want nil", err)
	}
	select {
	case ps := <-got:
		t.Fatalf("notified %v with no write", ps)
	default:
	}
	if err := b.store.SubscribePartitions(b.ctx, func([]int) {}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("SubscribePartitions on a closed store = %v, want ErrClosed", err)
	}
}

// TestNotifyPartitionsNew: a store made by New notifies at Write, before
// the commit, with the partitions written.
func TestNotifyPartitionsNew(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 16})
	s, err := New(b.store.DB(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := subscribed(t, b.ctx, s)
	if ps := next(t, got); ps != nil {
		t.Fatalf("first call %v, want nil", ps)
	}
	keys, parts := keysIn(1, 16)
	tx, err := s.DB().BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.Write(b.ctx, tx, outbox.Message{Topic: "t", Key: keys[0]}); err != nil {
		t.Fatal(err)
	}
	if ps := next(t, got); !slices.Equal(ps, parts) {
		t.Fatalf("notified %v, want %v", ps, parts)
	}
}
