package dynamodb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	idyn "github.com/outboxrelay/outbox/inbox/dynamodb"
)

var increment = idyn.Update{
	Add:    []string{"#n :one"},
	Names:  map[string]string{"#n": "n"},
	Values: idyn.Item{":one": num(1)},
}

func apply(t *testing.T, w *idyn.Window, pk, idemKey string) bool {
	t.Helper()
	res, err := w.Apply(context.Background(), key(pk), idemKey, increment)
	if err != nil {
		t.Fatalf("Apply(%s, %s): %v", pk, idemKey, err)
	}
	return res.Applied
}

// TestWindowEvictsOldest: the window keeps the last Size keys, in order,
// refuses their duplicates, and forgets the oldest when a new key arrives.
func TestWindowEvictsOldest(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	const size = 5
	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hashes := func(keys ...string) []string {
		var h []string
		for _, k := range keys {
			h = append(h, w.HashKey(k))
		}
		return h
	}
	window := func() []string {
		t.Helper()
		keys, err := w.Keys(ctx, key("acct"))
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != size {
			t.Fatalf("window holds %d keys; want %d: %v", len(keys), size, keys)
		}
		return keys
	}

	// The first update creates the item with placeholders.
	if !apply(t, w, "acct", "k1") {
		t.Fatal("k1 not applied on a missing item")
	}
	want := append(slices.Repeat([]string{w.Placeholder()}, size-1), w.HashKey("k1"))
	if got := window(); !slices.Equal(got, want) {
		t.Fatalf("window after k1 = %v; want %v", got, want)
	}
	for _, k := range []string{"k2", "k3", "k4", "k5"} {
		if !apply(t, w, "acct", k) {
			t.Fatalf("%s not applied", k)
		}
	}
	if got := window(); !slices.Equal(got, hashes("k1", "k2", "k3", "k4", "k5")) {
		t.Fatalf("window = %v; want k1..k5", got)
	}
	for _, k := range []string{"k1", "k3", "k5"} {
		if apply(t, w, "acct", k) {
			t.Fatalf("duplicate %s applied", k)
		}
	}
	if !apply(t, w, "acct", "k6") {
		t.Fatal("k6 not applied")
	}
	if got := window(); !slices.Equal(got, hashes("k2", "k3", "k4", "k5", "k6")) {
		t.Fatalf("window after k6 = %v; want k2..k6 (k1 evicted)", got)
	}
	// k1 left the window, so it is accepted again; k2 is still a duplicate.
	if apply(t, w, "acct", "k2") || !apply(t, w, "acct", "k1") {
		t.Fatal("after eviction: want k2 refused and k1 accepted")
	}
	if got := window(); !slices.Equal(got, hashes("k3", "k4", "k5", "k6", "k1")) {
		t.Fatalf("window = %v; want k3..k6, k1", got)
	}
	if n := numberAttr(t, client, table, "acct", "n"); n != 7 {
		t.Fatalf("counter = %d; want 7 (k1..k6, then k1 again after its eviction)", n)
	}
}

// TestWindowConcurrentDuplicates: many writers apply the same keys to one
// item, which does not exist at first: each key's update lands once.
func TestWindowConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: 100, MaxAttempts: 20})
	if err != nil {
		t.Fatal(err)
	}
	const writers, keys = 8, 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for i := range keys {
				k := fmt.Sprintf("msg-%d", (i+g*7)%keys)
				res, err := w.Apply(context.Background(), key("hot"), k, increment)
				if err != nil {
					errs <- err
					return
				}
				if res.Applied {
					mu.Lock()
					applied++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if applied != keys {
		t.Errorf("applied %d updates; want %d", applied, keys)
	}
	if n := numberAttr(t, client, table, "hot", "n"); n != keys {
		t.Fatalf("counter = %d; want %d", n, keys)
	}
}

// TestWindowInitialAndCondition: a missing item is created with Initial; the
// update's own condition is told apart from a duplicate, and a key whose
// update was refused by the condition can be used again.
func TestWindowInitialAndCondition(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	withdraw := func(amount int) idyn.Update {
		return idyn.Update{
			Set:          []string{"#b = #b - :amt"},
			Condition:    "#b >= :amt",
			Names:        map[string]string{"#b": "balance"},
			Values:       idyn.Item{":amt": num(amount)},
			Initial:      idyn.Item{"balance": num(100)},
			ReturnValues: types.ReturnValueUpdatedNew,
		}
	}
	res, err := w.Apply(ctx, key("alice"), "w1", withdraw(30))
	if err != nil || !res.Applied {
		t.Fatalf("first withdrawal: %+v, %v", res, err)
	}
	if b, ok := res.Attributes["balance"].(*types.AttributeValueMemberN); !ok || b.Value != "70" {
		t.Fatalf("returned balance = %v; want 70", res.Attributes["balance"])
	}
	if res, err := w.Apply(ctx, key("alice"), "w1", withdraw(30)); err != nil || res.Applied {
		t.Fatalf("repeated withdrawal: %+v, %v; want a duplicate", res, err)
	}
	if _, err := w.Apply(ctx, key("alice"), "w2", withdraw(500)); !errors.Is(err, idyn.ErrConditionFailed) {
		t.Fatalf("overdraft: err = %v; want ErrConditionFailed", err)
	}
	if res, err := w.Apply(ctx, key("alice"), "w2", withdraw(70)); err != nil || !res.Applied {
		t.Fatalf("w2 after its refused attempt: %+v, %v; want applied", res, err)
	}
	if b := numberAttr(t, client, table, "alice", "balance"); b != 0 {
		t.Fatalf("balance = %d; want 0", b)
	}
}

// TestWindowExistingItemWithoutWindow: an item written without the window
// gets one on its first idempotent update.
func TestWindowExistingItemWithoutWindow(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	ctx := context.Background()
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: idyn.Item{"pk": key("legacy")["pk"], "n": num(41)}}); err != nil {
		t.Fatal(err)
	}
	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !apply(t, w, "legacy", "a") || apply(t, w, "legacy", "a") {
		t.Fatal("want the first update applied and its duplicate refused")
	}
	if n := numberAttr(t, client, table, "legacy", "n"); n != 42 {
		t.Fatalf("counter = %d; want 42", n)
	}
}

// TestArticleExpressionIsInvalid records why the Window does not use the
// article's list_append form: DynamoDB (and dynalite) reject the overlapping
// paths #h and #h[0] in one update.
func TestArticleExpressionIsInvalid(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	ctx := context.Background()
	_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: idyn.Item{
		"pk": key("x")["pk"],
		"h":  &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberS{Value: "a"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       key("x"),
		UpdateExpression:          aws.String("SET #h = list_append(#h, :k) REMOVE #h[0]"),
		ConditionExpression:       aws.String("NOT contains(#h, :key)"),
		ExpressionAttributeNames:  map[string]string{"#h": "h"},
		ExpressionAttributeValues: idyn.Item{":k": &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberS{Value: "b"}}}, ":key": &types.AttributeValueMemberS{Value: "b"}},
	})
	if err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("the article's expression: err = %v; want a path overlap error", err)
	}
}

func TestWindowConfigAndUpdateErrors(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	for _, tc := range []struct {
		cfg   idyn.WindowConfig
		field string
	}{
		{idyn.WindowConfig{Size: 10}, "Table"},
		{idyn.WindowConfig{Table: table}, "Size"},
		{idyn.WindowConfig{Table: table, Size: 10, KeySize: 9}, "KeySize"},
		{idyn.WindowConfig{Table: table, Size: 30000, KeySize: 32}, "Size"},
	} {
		_, err := idyn.NewWindow(client, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "WindowConfig."+tc.field) {
			t.Errorf("%+v: err = %v; want an error naming WindowConfig.%s", tc.cfg, err, tc.field)
		}
	}
	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Apply(ctx, key("a"), "k", idyn.Update{}); err == nil || !strings.Contains(err.Error(), "no action") {
		t.Errorf("empty update: err = %v", err)
	}
	bad := increment
	bad.Names = map[string]string{"#inbox_x": "x"}
	if _, err := w.Apply(ctx, key("a"), "k", bad); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("reserved name: err = %v", err)
	}
	if _, err := w.Apply(ctx, key("a"), "", increment); err == nil {
		t.Error("empty idempotency key accepted")
	}
	if h := w.HashKey("0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d"); len(h) != idyn.KeySizeDefault || strings.ContainsAny(h, "+/=.") {
		t.Errorf("HashKey = %q; want %d base64url characters", h, idyn.KeySizeDefault)
	}
}

// TestWindowResize: after a change of Size, an item's window is grown with
// placeholders or shrunk by its oldest keys on the next update.
func TestWindowResize(t *testing.T) {
	t.Parallel()
	client, table := setup(t)
	ctx := context.Background()
	newWindow := func(size int) *idyn.Window {
		w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: size})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w5 := newWindow(5)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		apply(t, w5, "r", k)
	}
	w3 := newWindow(3)
	if apply(t, w3, "r", "e") {
		t.Fatal("duplicate e applied through the smaller window")
	}
	if !apply(t, w3, "r", "f") {
		t.Fatal("f not applied")
	}
	keys, err := w3.Keys(ctx, key("r"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{w3.HashKey("d"), w3.HashKey("e"), w3.HashKey("f")}; !slices.Equal(keys, want) {
		t.Fatalf("shrunk window = %v; want d, e, f", keys)
	}
	w6 := newWindow(6)
	if !apply(t, w6, "r", "g") || apply(t, w6, "r", "d") {
		t.Fatal("after growing: want g applied and d refused")
	}
	keys, err = w6.Keys(ctx, key("r"))
	if err != nil {
		t.Fatal(err)
	}
	p := w6.Placeholder()
	if want := []string{p, p, w6.HashKey("d"), w6.HashKey("e"), w6.HashKey("f"), w6.HashKey("g")}; !slices.Equal(keys, want) {
		t.Fatalf("grown window = %v; want 2 placeholders, d, e, f, g", keys)
	}
	if n := numberAttr(t, client, table, "r", "n"); n != 7 {
		t.Fatalf("counter = %d; want 7", n)
	}

	// An attribute of the same name that is not a list is reported.
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: idyn.Item{
		"pk": key("odd")["pk"], idyn.KeysAttributeDefault: &types.AttributeValueMemberS{Value: "oops"},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w6.Apply(ctx, key("odd"), "k", increment); err == nil || !strings.Contains(err.Error(), "KeysAttribute") {
		t.Fatalf("non-list keys attribute: err = %v; want an error naming KeysAttribute", err)
	}
}
