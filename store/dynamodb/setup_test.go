package dynamodb

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newStore returns a store on a fresh, migrated table of the shared
// dynalite server, deleted when the test ends. opts.Table, Endpoint and
// Region are set by newStore.
func newStore(t testing.TB, opts Options) *Store {
	t.Helper()
	opts.Table = testenv.Name(t)
	opts.Endpoint = testenv.Dynalite(t)
	opts.Region = testenv.DynaliteRegion
	if opts.FetchDelay == 0 {
		// dynalite updates its indexes with the item: no lag to wait out.
		opts.FetchDelay = FetchDelayNone
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropTable(ctx); err != nil {
			t.Error(err)
		}
	})
	return s
}

// ctxT returns a context bounded by a minute and the test.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// mustWrite writes msgs one by one.
func mustWrite(t testing.TB, s *Store, msgs ...*outbox.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := s.Write(ctxT(t), m); err != nil {
			t.Fatalf("Write: %v", err)
		}
	}
}

// getItemInput reads one item consistently.
func getItemInput(s *Store, id string) *dynamodb.GetItemInput {
	return &dynamodb.GetItemInput{TableName: aws.String(s.opts.Table), Key: keyOf(id), ConsistentRead: aws.Bool(true)}
}
