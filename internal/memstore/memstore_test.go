package memstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The relay's own tests trust this store; it must behave like a real one.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		st := memstore.New(8, nil)
		return storetest.Harness{Store: st, Write: st.Write, Partitions: 8}
	})
}

// The stream stand-in is held, fenced and confirmed like a StreamStore.
func TestStreamConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		st := memstore.NewStream(8)
		return storetest.Harness{Store: st, Write: st.Write, Partitions: 8}
	})
}

// TestFetchMarkedLimitsLateRecords: late records come back at most limit
// per partition per fetch, before any later record of the partition, and
// draining returns each once.
func TestFetchMarkedLimitsLateRecords(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(1, nil)
	var bulk []outbox.Message
	for i := range 25 {
		bulk = append(bulk, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%3)})
	}
	commit, err := st.Begin(bulk...)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, outbox.Message{Topic: "t", Key: "other"}); err != nil {
		t.Fatal(err)
	}
	cur := outbox.Cursor{}
	recs, mark, err := st.FetchMarked(ctx, []outbox.Cursor{cur}, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("first fetch %v, %v; want the committed record", recs, err)
	}
	cur.After, cur.Mark = recs[0].Seq, mark
	commit()
	if err := st.Write(ctx, outbox.Message{Topic: "t", Key: "k0"}); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for range 10 {
		recs, mark, err := st.FetchMarked(ctx, []outbox.Cursor{cur}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) > 10 {
			t.Fatalf("fetch returned %d records, limit 10", len(recs))
		}
		for _, r := range recs {
			seqs = append(seqs, r.Seq)
			cur.After = max(cur.After, r.Seq)
		}
		cur.Mark = mark
	}
	if len(seqs) != 26 || !slices.IsSorted(seqs) || len(slices.Compact(slices.Clone(seqs))) != 26 {
		t.Fatalf("drained seqs %v; want the 25 late ones then the later one, once each, in order", seqs)
	}
}
