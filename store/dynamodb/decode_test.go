package dynamodb

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

// An item whose headers hold a value that is not a string (written by a
// non-Go producer or by hand) is dead-lettered alone, with an error that
// names the header; the others flow. Such a header used to be dropped
// silently and the message published without it.
func TestUndecodableItemIsDeadLetteredAlone(t *testing.T) {
	s := newStore(t, Options{Shards: 8})
	h := storetest.Harness{
		Store:      s,
		Write:      func(ctx context.Context, msgs ...outbox.Message) error { return applyAsPuts(ctx, s, msgs) },
		Partitions: 8,
	}
	storetest.Undecodable(t, h, func(ctx context.Context, id string) error {
		_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 s.table,
			Key:                       map[string]types.AttributeValue{attrID: &types.AttributeValueMemberS{Value: id}},
			UpdateExpression:          aws.String("SET #h = :h"),
			ExpressionAttributeNames:  map[string]string{"#h": attrHeaders},
			ExpressionAttributeValues: map[string]types.AttributeValue{":h": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"h": &types.AttributeValueMemberN{Value: "1"}}}},
		})
		return err
	})
}
