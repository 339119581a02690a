package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// applyAsPuts builds each message's TransactWriteItem and applies its Put
// with a PutItem carrying the same item and condition: dynalite has no
// TransactWriteItems, so this is how the tests exercise the builder. (On
// DynamoDB the caller sends the items in one TransactWriteItems request.)
//
// As with a transaction, every item is built (and so every message
// validated) before anything is written.
func applyAsPuts(ctx context.Context, s *Store, msgs []outbox.Message) error {
	items := make([]types.TransactWriteItem, len(msgs))
	for i := range msgs {
		twi, err := s.TransactWriteItem(&msgs[i])
		if err != nil {
			return err
		}
		items[i] = twi
	}
	for _, twi := range items {
		if err := applyPut(ctx, s, twi); err != nil {
			return err
		}
	}
	return nil
}

func applyPut(ctx context.Context, s *Store, twi types.TransactWriteItem) error {
	p := twi.Put
	if p == nil || twi.Update != nil || twi.Delete != nil || twi.ConditionCheck != nil {
		return fmt.Errorf("TransactWriteItem must be a Put only, got %+v", twi)
	}
	_, err := s.Client().PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 p.TableName,
		Item:                      p.Item,
		ConditionExpression:       p.ConditionExpression,
		ExpressionAttributeNames:  p.ExpressionAttributeNames,
		ExpressionAttributeValues: p.ExpressionAttributeValues,
	}, s.CallOptions()...)
	return err
}

// TestTransactWriteItem checks the builder's Put by applying it as the
// equivalent PutItem (dynalite has no TransactWriteItems): the message is
// stored like Write stores it, and the condition refuses a duplicate ID.
func TestTransactWriteItem(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 4})
	ctx := ctxT(t)
	msg := outbox.Message{Topic: "orders.created", Key: "order-1", Payload: []byte(`{"id":1}`), Headers: map[string]string{"a": "b"}}
	twi, err := s.TransactWriteItem(&msg)
	if err != nil {
		t.Fatal(err)
	}
	if msg.ID == "" || msg.CreatedAt.IsZero() {
		t.Fatalf("TransactWriteItem did not fill in ID and CreatedAt: %+v", msg)
	}
	if got := *twi.Put.TableName; got != s.Options().Table {
		t.Fatalf("Put.TableName = %q, want %q", got, s.Options().Table)
	}
	if err := applyPut(ctx, s, twi); err != nil {
		t.Fatal(err)
	}
	recs, err := s.GetMany(ctx, []string{msg.ID})
	if err != nil {
		t.Fatal(err)
	}
	r := recs[0]
	if r.Topic != msg.Topic || r.Key != msg.Key || string(r.Payload) != string(msg.Payload) || r.Headers["a"] != "b" ||
		r.Partition != outbox.PartitionOf(msg.Key, 4) || r.Seq <= 0 || !r.CreatedAt.Equal(msg.CreatedAt.Truncate(1000)) {
		t.Fatalf("stored %+v, want %+v in partition %d", r, msg, outbox.PartitionOf(msg.Key, 4))
	}
	// The same item again violates the condition, as it would cancel the
	// transaction.
	err = applyPut(ctx, s, twi)
	if !isConditionFailed(err) {
		t.Fatalf("second put of the same ID: got %v, want a conditional check failure", err)
	}
	// Write reports the duplicate as ErrDuplicateID.
	dup := outbox.Message{ID: msg.ID, Topic: "orders.created"}
	if err := s.Write(ctx, &dup); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("Write of an existing ID: got %v, want ErrDuplicateID", err)
	}
	// Invalid messages are refused before any request.
	bad := outbox.Message{Topic: "bad topic"}
	_, err = s.TransactWriteItem(&bad)
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Topic" {
		t.Fatalf("TransactWriteItem of a bad topic: got %v, want a ValidationError on Topic", err)
	}
}
