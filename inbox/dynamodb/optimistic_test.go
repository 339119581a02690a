package dynamodb_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	idyn "github.com/outboxrelay/outbox/inbox/dynamodb"
)

// TestOptimisticConflict: two updaters read the same version; the first
// write wins, the second gets a ConflictError.
func TestOptimisticConflict(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	o, err := idyn.NewOptimistic(client, idyn.OptimisticConfig{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := o.Put(ctx, idyn.Item{"pk": key("doc")["pk"], "title": &types.AttributeValueMemberS{Value: "draft"}}, 0)
	if err != nil || v != 1 {
		t.Fatalf("create: version %d, %v; want 1", v, err)
	}
	if _, err := o.Put(ctx, idyn.Item{"pk": key("doc")["pk"]}, 0); !errors.Is(err, idyn.ErrConflict) {
		t.Fatalf("second create: err = %v; want ErrConflict", err)
	}

	// Both read version 1, then race.
	itemA, va, err := o.Get(ctx, key("doc"))
	if err != nil {
		t.Fatal(err)
	}
	itemB, vb, err := o.Get(ctx, key("doc"))
	if err != nil || va != 1 || vb != 1 {
		t.Fatalf("reads: versions %d, %d (%v); want 1, 1", va, vb, err)
	}
	itemA["title"] = &types.AttributeValueMemberS{Value: "by A"}
	itemB["title"] = &types.AttributeValueMemberS{Value: "by B"}
	results := make(chan error, 2)
	var wg sync.WaitGroup
	for _, it := range []idyn.Item{itemA, itemB} {
		wg.Go(func() {
			_, err := o.Put(ctx, it, 1)
			results <- err
		})
	}
	wg.Wait()
	close(results)
	var won, conflicts int
	for err := range results {
		var ce *idyn.ConflictError
		switch {
		case err == nil:
			won++
		case errors.As(err, &ce) && ce.Expected == 1 && errors.Is(err, idyn.ErrConflict):
			conflicts++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if won != 1 || conflicts != 1 {
		t.Fatalf("%d writes won, %d conflicts; want 1 and 1", won, conflicts)
	}
	if _, v, _ := o.Get(ctx, key("doc")); v != 2 {
		t.Fatalf("version = %d; want 2", v)
	}
}

// TestOptimisticUpdateRetries: concurrent read-modify-write increments all
// land, because Update re-reads and re-applies after a conflict.
func TestOptimisticUpdateRetries(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	o, err := idyn.NewOptimistic(client, idyn.OptimisticConfig{Table: table, MaxAttempts: 200})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 6, 5
	incr := func(cur idyn.Item) (idyn.Item, error) {
		n := 0
		if cur != nil {
			var err error
			if n, err = strconv.Atoi(cur["n"].(*types.AttributeValueMemberN).Value); err != nil {
				return nil, err
			}
		}
		return idyn.Item{"n": num(n + 1)}, nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			for range each {
				if _, _, err := o.Update(context.Background(), key("counter"), incr); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := numberAttr(t, client, table, "counter", "n"); n != writers*each {
		t.Fatalf("counter = %d; want %d", n, writers*each)
	}
	if n := numberAttr(t, client, table, "counter", "version"); n != writers*each {
		t.Fatalf("version = %d; want %d", n, writers*each)
	}

	// A change function's error is returned as is, nothing written.
	boom := errors.New("boom")
	if _, _, err := o.Update(context.Background(), key("counter"), func(idyn.Item) (idyn.Item, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Update with a failing change: err = %v; want boom", err)
	}

	// With one attempt, a lost race surfaces as a ConflictError.
	once, err := idyn.NewOptimistic(client, idyn.OptimisticConfig{Table: table, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = once.Update(context.Background(), key("counter"), func(cur idyn.Item) (idyn.Item, error) {
		// Another writer slips in between this read and the write.
		if _, _, err := o.Update(context.Background(), key("counter"), incr); err != nil {
			return nil, err
		}
		return incr(cur)
	})
	if !errors.Is(err, idyn.ErrConflict) {
		t.Fatalf("lost race with MaxAttempts 1: err = %v; want ErrConflict", err)
	}
}

// TestOptimisticVersionZero: an item whose version attribute holds 0
// (created by other code, or migrated) has version 0, as an item without
// one; Update and Put with expected 0 must succeed on it, not conflict
// forever.
func TestOptimisticVersionZero(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	o, err := idyn.NewOptimistic(client, idyn.OptimisticConfig{Table: table, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, pk := range []string{"zero-update", "zero-put"} {
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: idyn.Item{"pk": key(pk)["pk"], "version": num(0), "n": num(5)}}); err != nil {
			t.Fatal(err)
		}
	}
	it, v, err := o.Update(ctx, key("zero-update"), func(cur idyn.Item) (idyn.Item, error) {
		n, _ := strconv.Atoi(cur["n"].(*types.AttributeValueMemberN).Value)
		return idyn.Item{"n": num(n + 1)}, nil
	})
	if err != nil || v != 1 {
		t.Fatalf("Update of an item at version 0: version %d, %v; want 1", v, err)
	}
	if got := it["n"].(*types.AttributeValueMemberN).Value; got != "6" {
		t.Fatalf("n = %s, want 6", got)
	}
	if got := numberAttr(t, client, table, "zero-update", "version"); got != 1 {
		t.Fatalf("stored version %d, want 1", got)
	}
	if v, err := o.Put(ctx, idyn.Item{"pk": key("zero-put")["pk"]}, 0); err != nil || v != 1 {
		t.Fatalf("Put expecting 0 on an item at version 0: %d, %v; want 1", v, err)
	}
	// Version 0 still conflicts with an item at another version.
	if _, err := o.Put(ctx, idyn.Item{"pk": key("zero-put")["pk"]}, 0); !errors.Is(err, idyn.ErrConflict) {
		t.Fatalf("Put expecting 0 on an item at version 1: %v; want ErrConflict", err)
	}
}
