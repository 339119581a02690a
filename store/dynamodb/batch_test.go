package dynamodb

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outboxrelay/outbox"
)

// writeN writes n messages of topic and returns their IDs.
func writeN(t testing.TB, s *Store, n int, topic string) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		m := &outbox.Message{Topic: topic, Key: fmt.Sprintf("k%d", i), Payload: fmt.Appendf(nil, "p%d", i)}
		mustWrite(t, s, m)
		ids[i] = m.ID
	}
	return ids
}

// moveToUnprocessedKeys rewrites BatchGetItem responses: it moves up to n
// returned items of the table into UnprocessedKeys, for the first `times`
// responses.
func moveToUnprocessedKeys(table string, n int, times int64) func(string, map[string]any) (map[string]any, func(map[string]any)) {
	var done atomic.Int64
	return func(op string, req map[string]any) (map[string]any, func(map[string]any)) {
		if op != "BatchGetItem" || done.Add(1) > times {
			return nil, nil
		}
		return nil, func(resp map[string]any) {
			items, _ := resp["Responses"].(map[string]any)[table].([]any)
			k := min(n, len(items))
			var keys []any
			for _, it := range items[:k] {
				keys = append(keys, map[string]any{attrID: it.(map[string]any)[attrID]})
			}
			resp["Responses"].(map[string]any)[table] = items[k:]
			resp["UnprocessedKeys"] = map[string]any{table: map[string]any{"Keys": keys, "ConsistentRead": true}}
		}
	}
}

func TestGetManyRetriesUnprocessedKeys(t *testing.T) {
	t.Parallel()
	inj := newInjector(t)
	s := newStore(t, Options{HTTPClient: inj, UnprocessedBackoff: 1})
	ids := writeN(t, s, 150, "t.get") // two BatchGetItem calls: 100 + 50 keys
	inj.set(moveToUnprocessedKeys(s.opts.Table, 10, 2))
	before := s.Stats()["BatchGetItem"].Requests
	recs, err := s.GetMany(ctxT(t), ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(ids) {
		t.Fatalf("GetMany returned %d records, want %d", len(recs), len(ids))
	}
	for i, r := range recs {
		if r.ID != ids[i] {
			t.Fatalf("record %d is %s, want %s (the requested order)", i, r.ID, ids[i])
		}
	}
	if got := s.Stats()["BatchGetItem"].Requests - before; got != 4 {
		t.Fatalf("BatchGetItem requests = %d, want 4 (2 chunks + 2 resends of unprocessed keys)", got)
	}
}

func TestGetManyUnprocessedForever(t *testing.T) {
	t.Parallel()
	inj := newInjector(t)
	s := newStore(t, Options{HTTPClient: inj, UnprocessedBackoff: 1, UnprocessedAttempts: 3})
	ids := writeN(t, s, 5, "t.get")
	inj.set(moveToUnprocessedKeys(s.opts.Table, 1, 1<<30))
	before := s.Stats()["BatchGetItem"].Requests
	_, err := s.GetMany(ctxT(t), ids)
	if err == nil || !strings.Contains(err.Error(), "unprocessed after 3 requests") {
		t.Fatalf("GetMany with keys unprocessed forever: got %v, want an error after 3 requests", err)
	}
	if got := s.Stats()["BatchGetItem"].Requests - before; got != 3 {
		t.Fatalf("BatchGetItem requests = %d, want 3", got)
	}
}

func TestGetManySubsetIsAnError(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{})
	ids := writeN(t, s, 3, "t.get")
	absent := outbox.NewID()
	want := []string{ids[0], absent, ids[1], ids[2]}
	recs, err := s.GetMany(ctxT(t), want)
	var me *MissingError
	if !errors.As(err, &me) || !slices.Equal(me.IDs, []string{absent}) {
		t.Fatalf("GetMany with one absent ID: got %v, want a *MissingError naming %s", err, absent)
	}
	if len(recs) != 3 {
		t.Fatalf("GetMany returned %d records with the error, want the 3 found", len(recs))
	}
	if _, err := s.GetMany(ctxT(t), []string{"outbox:meta"}); err == nil {
		t.Fatal("GetMany of a coordination key: want an error, the ID is not a UUID")
	}
}

// dropWrites rewrites BatchWriteItem requests: the first `times` requests
// send all but their last n write requests, and the response reports
// those as UnprocessedItems, as DynamoDB does when throttled.
func dropWrites(table string, n int, times int64) func(string, map[string]any) (map[string]any, func(map[string]any)) {
	var done atomic.Int64
	return func(op string, req map[string]any) (map[string]any, func(map[string]any)) {
		if op != "BatchWriteItem" || done.Add(1) > times {
			return nil, nil
		}
		reqs := req["RequestItems"].(map[string]any)[table].([]any)
		k := min(n, len(reqs))
		dropped := reqs[len(reqs)-k:]
		sent := reqs[:len(reqs)-k]
		if len(sent) == 0 {
			// dynalite refuses an empty batch: send one delete and still
			// report it unprocessed (deleting twice is harmless).
			sent = reqs[:1]
		}
		req["RequestItems"].(map[string]any)[table] = sent
		return req, func(resp map[string]any) {
			resp["UnprocessedItems"] = map[string]any{table: dropped}
		}
	}
}

func TestDeleteRetriesUnprocessedItems(t *testing.T) {
	t.Parallel()
	inj := newInjector(t)
	s := newStore(t, Options{HTTPClient: inj, UnprocessedBackoff: 1})
	ids := writeN(t, s, 30, "t.del") // two BatchWriteItem calls: 25 + 5
	inj.set(dropWrites(s.opts.Table, 3, 2))
	before := s.Stats()["BatchWriteItem"].Requests
	if err := s.Delete(ctxT(t), ids); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats()["BatchWriteItem"].Requests - before; got != 4 {
		t.Fatalf("BatchWriteItem requests = %d, want 4 (2 chunks + 2 resends of unprocessed items)", got)
	}
	_, err := s.GetMany(ctxT(t), ids)
	var me *MissingError
	if !errors.As(err, &me) || len(me.IDs) != len(ids) {
		t.Fatalf("after Delete, GetMany: got %v, want all %d missing", err, len(ids))
	}
}

func TestDeleteUnprocessedForever(t *testing.T) {
	t.Parallel()
	inj := newInjector(t)
	s := newStore(t, Options{HTTPClient: inj, UnprocessedBackoff: 1, UnprocessedAttempts: 4})
	ids := writeN(t, s, 5, "t.del")
	inj.set(dropWrites(s.opts.Table, 2, 1<<30))
	err := s.Delete(ctxT(t), ids)
	if err == nil || !strings.Contains(err.Error(), "still unprocessed after 4 requests") {
		t.Fatalf("Delete with items unprocessed forever: got %v, want an error after 4 requests", err)
	}
}

// TestOutstandingCountPageSize checks the ADR's count: a Scan with
// Select=COUNT and a page size of MaxOutstanding+1 that stops once the
// count exceeds MaxOutstanding.
func TestOutstandingCountPageSize(t *testing.T) {
	t.Parallel()
	inj := newInjector(t)
	s := newStore(t, Options{HTTPClient: inj, MaxOutstanding: 5})
	writeN(t, s, 12, "t.count")

	var limits []float64
	var selects []string
	inj.set(func(op string, req map[string]any) (map[string]any, func(map[string]any)) {
		if op == "Scan" {
			limits = append(limits, req["Limit"].(float64))
			selects = append(selects, req["Select"].(string))
		}
		return nil, nil
	})
	n, err := s.OutstandingCount(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Fatalf("OutstandingCount with MaxOutstanding 5 and 12 outstanding = %d, want 6 (one page of MaxOutstanding+1)", n)
	}
	if !slices.Equal(limits, []float64{6}) || !slices.Equal(selects, []string{"COUNT"}) {
		t.Fatalf("Scan requests had Limit %v and Select %v, want one request with Limit 6 and Select COUNT", limits, selects)
	}

	// Without a maximum, everything is counted (pages of the default size).
	s2 := newStore(t, Options{})
	writeN(t, s2, 12, "t.count")
	if n, err := s2.OutstandingCount(ctxT(t)); err != nil || n != 12 {
		t.Fatalf("OutstandingCount without MaxOutstanding = %d, %v; want 12", n, err)
	}
	// Delivered and dead-lettered messages are not outstanding.
	ids := writeN(t, s2, 2, "t.count")
	if err := s2.MarkDispatched(ctxT(t), ids[0], s2.opts.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s2.Delete(ctxT(t), ids[1:]); err != nil {
		t.Fatal(err)
	}
	if n, err := s2.OutstandingCount(ctxT(t)); err != nil || n != 12 {
		t.Fatalf("OutstandingCount after dispatching and deleting = %d, %v; want 12", n, err)
	}
}

func TestShardFormulaVectors(t *testing.T) {
	// SHA-256(key), first 4 bytes as a little-endian uint32 (C#'s
	// BitConverter.ToUInt32 in the ADR), modulo the shard count; computed
	// independently of Go.
	for _, v := range []struct {
		key          string
		shards, want int
	}{
		{"order-1", 20, 15}, {"order-1", 64, 11}, {"order-1", 7, 6},
		{"customer-42", 20, 0}, {"customer-42", 64, 32},
		{"a", 20, 10}, {"a", 7, 4},
		{"Ω-unicode", 20, 9}, {"Ω-unicode", 64, 1},
	} {
		if got := outbox.PartitionOf(v.key, v.shards); got != v.want {
			t.Errorf("shard of %q among %d = %d, want %d", v.key, v.shards, got, v.want)
		}
	}
	if got := TopicShard("orders_eu.created", 7); got != "orders_eu.created_7" {
		t.Errorf("TopicShard = %q", got)
	}
	if topic, shard, ok := splitTopicShard("orders_eu.created_17"); !ok || topic != "orders_eu.created" || shard != 17 {
		t.Errorf("splitTopicShard = %q %d %v", topic, shard, ok)
	}
}

// TestWriteAssignsShard checks that the item written carries the shard of
// its key (and a random one without a key, within range).
func TestWriteAssignsShard(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 20})
	keyed := &outbox.Message{Topic: "t.shard", Key: "order-1"}
	unkeyed := &outbox.Message{Topic: "t.shard"}
	mustWrite(t, s, keyed, unkeyed)
	recs, err := s.GetMany(ctxT(t), []string{keyed.ID, unkeyed.ID})
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Partition != 15 {
		t.Errorf("shard of key order-1 = %d, want 15", recs[0].Partition)
	}
	if p := recs[1].Partition; p < 0 || p >= 20 {
		t.Errorf("shard of a message without key = %d, want 0..19", p)
	}
	es, err := s.Outstanding(ctxT(t), Query{Topic: "t.shard"})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].ID != keyed.ID || es[0].Shard != 15 || es[0].Topic != "t.shard" {
		t.Fatalf("Outstanding(t.shard) = %+v, want the keyed message first, in shard 15", es)
	}
}
