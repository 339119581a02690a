package dynamodb_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	idyn "github.com/outboxrelay/outbox/inbox/dynamodb"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup returns a client of the shared dynalite server and a new table with
// a string hash key "pk", deleted when the test ends.
func setup(t *testing.T) (*dynamodb.Client, string) {
	t.Helper()
	endpoint := testenv.Dynalite(t)
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	t.Cleanup(tr.CloseIdleConnections)
	client := dynamodb.New(dynamodb.Options{
		Region:       testenv.DynaliteRegion,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
	table := testenv.Name(t)
	ctx := context.Background()
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitActive(t, client, table)
	t.Cleanup(func() {
		if _, err := client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	return client, table
}

// waitActive polls until table is ACTIVE.
func waitActive(t *testing.T, client *dynamodb.Client, table string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := client.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err == nil && out.Table.TableStatus == types.TableStatusActive {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("table %s not active after 30s: %v", table, err)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

func key(pk string) idyn.Item { return idyn.Item{"pk": &types.AttributeValueMemberS{Value: pk}} }

func num(n int) types.AttributeValue { return &types.AttributeValueMemberN{Value: strconv.Itoa(n)} }

// numberAttr reads a number attribute of an item (strongly consistent).
func numberAttr(t *testing.T, client *dynamodb.Client, table, pk, attr string) int {
	t.Helper()
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), Key: key(pk), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := out.Item[attr].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("item %s has no number %q: %v", pk, attr, out.Item)
	}
	n, err := strconv.Atoi(v.Value)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
