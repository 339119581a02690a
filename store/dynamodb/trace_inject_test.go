package dynamodb

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func TestWriteInjectsHeaders(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Inject: storetest.Inject})
	traced := storetest.WithTraceparent(ctxT(t), "00-trace-span-01")
	own := map[string]string{"h": "v"}
	m := &outbox.Message{Topic: "a", Key: "k", Headers: own}
	if err := s.Write(traced, m); err != nil {
		t.Fatal(err)
	}
	plain := &outbox.Message{Topic: "a", Key: "k"}
	if err := s.Write(ctxT(t), plain); err != nil {
		t.Fatal(err)
	}
	recs, err := s.GetMany(ctxT(t), []string{m.ID, plain.ID})
	if err != nil {
		t.Fatal(err)
	}
	if h := recs[0].Headers; h["traceparent"] != "00-trace-span-01" || h["h"] != "v" {
		t.Errorf("Write stored headers %v, want the message's own and the injected traceparent", h)
	}
	if h := recs[1].Headers; len(h) != 0 {
		t.Errorf("a write without a trace stored headers %v, want none", h)
	}
	if len(own) != 1 {
		t.Errorf("Write modified the caller's header map: %v", own)
	}

	put, err := s.TransactWriteItemContext(traced, &outbox.Message{Topic: "a"})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := put.Put.Item[attrHeaders].(*types.AttributeValueMemberM)
	if h == nil || h.Value["traceparent"] == nil {
		t.Errorf("TransactWriteItemContext's item has headers %v, want the injected traceparent", put.Put.Item[attrHeaders])
	}
}
