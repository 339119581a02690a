package inboxbench

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	idyn "github.com/outboxrelay/outbox/inbox/dynamodb"
)

// Defaults of [DynamoDBOptions].
const (
	UpdatesDefault = 2000
	WindowDefault  = 100
	WritersDefault = 4
)

// DynamoDBOptions configures [DynamoDB]. Zero fields take their defaults.
type DynamoDBOptions struct {
	// Updates is the number of distinct idempotent updates applied to the
	// one item; default [UpdatesDefault].
	Updates int
	// Duplicates is the fraction of requests that repeat an earlier key, in
	// [0, 0.9]; default 0.
	Duplicates float64
	// Window is the number of keys the item keeps; default [WindowDefault].
	// Duplicates repeat keys still in the window.
	Window int
	// KeySize is the stored key size; default idyn.KeySizeDefault.
	KeySize int
	// Writers is the number of concurrent writers; default
	// [WritersDefault].
	Writers int
}

// DynamoDBResult is the outcome of [DynamoDB].
type DynamoDBResult struct {
	Requests   int           // Apply calls, duplicates included
	Applied    int           // updates applied (= Updates)
	Duplicates int           // requests refused as duplicates
	Elapsed    time.Duration // wall time
	PerSecond  float64       // Requests / Elapsed
	// The article's bound for this item on DynamoDB: the item's size with
	// a full window, the write units one update costs, and 1,000 write
	// units per second per partition ÷ those units.
	ItemBytes      int
	WriteUnits     int
	BoundPerSecond int
}

func (r DynamoDBResult) String() string {
	return fmt.Sprintf("%d conditional updates (%d duplicates) on one item in %v: %.0f/s; DynamoDB's bound for a %d-byte item (%d write units per update): %d/s",
		r.Requests, r.Duplicates, r.Elapsed.Round(time.Millisecond), r.PerSecond, r.ItemBytes, r.WriteUnits, r.BoundPerSecond)
}

// DynamoDB applies Updates idempotent increments (plus duplicates) to one
// item through a dynamodb.Window from Writers goroutines, in a table it
// creates (hash key "pk") and deletes afterwards, and checks that the
// counter equals Updates. Against dynalite the rate is dynalite's; the
// result carries DynamoDB's bound for the same item next to it.
func DynamoDB(ctx context.Context, client *dynamodb.Client, opts DynamoDBOptions) (DynamoDBResult, error) {
	if client == nil {
		return DynamoDBResult{}, errNoClient
	}
	opts.Updates = cmp.Or(opts.Updates, UpdatesDefault)
	opts.Window = cmp.Or(opts.Window, WindowDefault)
	opts.KeySize = cmp.Or(opts.KeySize, idyn.KeySizeDefault)
	opts.Writers = cmp.Or(opts.Writers, WritersDefault)
	switch {
	case opts.Updates < 1:
		return DynamoDBResult{}, fmt.Errorf("inboxbench: DynamoDBOptions.Updates must be positive, got %d", opts.Updates)
	case opts.Writers < 1 || opts.Writers > 256:
		return DynamoDBResult{}, fmt.Errorf("inboxbench: DynamoDBOptions.Writers must be between 1 and 256, got %d", opts.Writers)
	case opts.Duplicates < 0 || opts.Duplicates > 0.9:
		return DynamoDBResult{}, fmt.Errorf("inboxbench: DynamoDBOptions.Duplicates must be between 0 and 0.9, got %v", opts.Duplicates)
	case opts.Window < 4*opts.Writers:
		return DynamoDBResult{}, fmt.Errorf("inboxbench: DynamoDBOptions.Window must be at least 4 × Writers (%d) so that duplicates stay in the window, got %d", 4*opts.Writers, opts.Window)
	}
	table := "inbox_bench_" + strconv.FormatUint(rand.Uint64()%1e12, 36)
	if err := createTable(ctx, client, table); err != nil {
		return DynamoDBResult{}, err
	}
	defer client.DeleteTable(context.WithoutCancel(ctx), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) //nolint:errcheck // best effort

	w, err := idyn.NewWindow(client, idyn.WindowConfig{Table: table, Size: opts.Window, KeySize: opts.KeySize, MaxAttempts: 20})
	if err != nil {
		return DynamoDBResult{}, err
	}
	// Keys "u-0" … in order; a duplicate repeats a key a few requests back,
	// well inside the window.
	total := int(float64(opts.Updates)/(1-opts.Duplicates) + 0.5)
	reqs := make([]string, 0, total)
	for i := range opts.Updates {
		reqs = append(reqs, "u-"+strconv.Itoa(i))
		for len(reqs) < total && float64(len(reqs)-i-1) < float64(i+1)*float64(total-opts.Updates)/float64(opts.Updates) {
			reqs = append(reqs, "u-"+strconv.Itoa(max(0, i-rand.IntN(opts.Window/4))))
		}
	}
	for len(reqs) < total {
		reqs = append(reqs, "u-"+strconv.Itoa(opts.Updates-1-rand.IntN(min(opts.Updates, opts.Window/4))))
	}

	update := idyn.Update{
		Add:    []string{"#n :one"},
		Names:  map[string]string{"#n": "n"},
		Values: idyn.Item{":one": &types.AttributeValueMemberN{Value: "1"}},
	}
	key := idyn.Item{"pk": &types.AttributeValueMemberS{Value: "hot"}}
	var applied, dups, next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range opts.Writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) || ctx.Err() != nil {
					return
				}
				res, err := w.Apply(ctx, key, reqs[i], update)
				if err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				if res.Applied {
					applied.Add(1)
				} else {
					dups.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return DynamoDBResult{}, fmt.Errorf("inboxbench: %w", firstErr)
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return DynamoDBResult{}, fmt.Errorf("inboxbench: %w", err)
	}
	n, _ := out.Item["n"].(*types.AttributeValueMemberN)
	r := DynamoDBResult{
		Requests:   len(reqs),
		Applied:    int(applied.Load()),
		Duplicates: int(dups.Load()),
		Elapsed:    elapsed,
		PerSecond:  float64(len(reqs)) / elapsed.Seconds(),
	}
	if n == nil || n.Value != strconv.Itoa(opts.Updates) || r.Applied != opts.Updates {
		return r, fmt.Errorf("inboxbench: counter %v after %d applied updates for %d distinct keys: not exactly once", n, r.Applied, opts.Updates)
	}
	// The bound, from the item's real size and DynamoDB's write units.
	r.ItemBytes = itemSize(out.Item)
	r.WriteUnits = (r.ItemBytes + idyn.WriteUnitBytes - 1) / idyn.WriteUnitBytes
	r.BoundPerSecond = idyn.PartitionWriteUnits / r.WriteUnits
	return r, nil
}

func createTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return fmt.Errorf("inboxbench: create table %s: %w", table, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err == nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("inboxbench: table %s not active after a minute: %v", table, err)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// itemSize is DynamoDB's size of an item: attribute names plus values (a
// string or binary its length, a number its digits' bytes rounded up, a
// list or map 3 bytes plus 1 per element plus the elements).
func itemSize(it idyn.Item) int {
	n := 0
	for k, v := range it {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return (len(v.Value)+1)/2 + 1
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	}
	return 0
}
