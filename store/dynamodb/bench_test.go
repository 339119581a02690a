package dynamodb

import (
	"testing"

	"github.com/outboxrelay/outbox/internal/dynamobench"
)

var benchTopics = []string{"orders.created", "orders.paid", "orders.shipped", "users.created", "users.deleted"}

// TestCompareOutstandingQueriesEmpty is the ADR's case: an empty outbox
// with 5 topics × 20 shards costs the older loop 100 requests and ours
// ScanConcurrency.
func TestCompareOutstandingQueriesEmpty(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 20, ScanConcurrency: 4})
	older, ours, err := compareOutstandingQueries(ctxT(t), s, benchTopics, 20)
	if err != nil {
		t.Fatal(err)
	}
	if older.Requests != 100 || ours.Requests != 4 {
		t.Fatalf("empty outbox: older %d requests, ours %d; want 100 and 4", older.Requests, ours.Requests)
	}
}

// TestBenchOutstandingBacklog runs the comparison on a backlog through the
// functions registered with internal/dynamobench, as `outbox bench` does.
func TestBenchOutstandingBacklog(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 20, ScanConcurrency: 4, PageSize: 50})
	if dynamobench.CompareOutstanding == nil || dynamobench.FillBacklog == nil {
		t.Fatal("store/dynamodb registered no helpers with internal/dynamobench")
	}
	if err := dynamobench.FillBacklog(ctxT(t), s, benchTopics, 500); err != nil {
		t.Fatal(err)
	}
	if n, err := s.OutstandingCount(ctxT(t)); err != nil || n != 500 {
		t.Fatalf("after fillBacklog(500), OutstandingCount = %d, %v", n, err)
	}
	// With a backlog each Scan segment stops after one page of PageSize.
	older, ours, err := dynamobench.CompareOutstanding(ctxT(t), s, benchTopics, 0)
	if err != nil {
		t.Fatal(err)
	}
	if older.Requests != 100 || ours.Requests != 4 {
		t.Fatalf("backlog of 500: older %d requests, ours %d; want 100 and 4", older.Requests, ours.Requests)
	}
}
