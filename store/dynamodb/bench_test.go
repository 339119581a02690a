package dynamodb

import (
	"bytes"
	"strings"
	"testing"
)

var benchTopics = []string{"orders.created", "orders.paid", "orders.shipped", "users.created", "users.deleted"}

// TestCompareOutstandingQueriesEmpty is the ADR's case: an empty outbox
// with 5 topics × 20 shards costs the older loop 100 requests and ours
// ScanConcurrency.
func TestCompareOutstandingQueriesEmpty(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 20, ScanConcurrency: 4})
	older, ours, err := CompareOutstandingQueries(ctxT(t), s, benchTopics, 20)
	if err != nil {
		t.Fatal(err)
	}
	if older.Requests != 100 || ours.Requests != 4 {
		t.Fatalf("empty outbox: older %d requests, ours %d; want 100 and 4", older.Requests, ours.Requests)
	}
}

func TestBenchOutstandingBacklog(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 20, ScanConcurrency: 4, PageSize: 50})
	var buf bytes.Buffer
	if err := BenchOutstanding(ctxT(t), &buf, s, benchTopics, 500); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	if n, err := s.OutstandingCount(ctxT(t)); err != nil || n != 500 {
		t.Fatalf("after FillBacklog(500), OutstandingCount = %d, %v", n, err)
	}
	// With a backlog each Scan segment stops after one page of PageSize.
	older, ours, err := CompareOutstandingQueries(ctxT(t), s, benchTopics, 0)
	if err != nil {
		t.Fatal(err)
	}
	if older.Requests != 100 || ours.Requests != 4 {
		t.Fatalf("backlog of 500: older %d requests, ours %d; want 100 and 4", older.Requests, ours.Requests)
	}
	if !strings.Contains(buf.String(), "500 outstanding") || !strings.Contains(buf.String(), "empty outbox") {
		t.Fatalf("table lacks its rows:\n%s", buf.String())
	}
}
