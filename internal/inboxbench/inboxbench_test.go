package inboxbench_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxrelay/outbox/internal/inboxbench"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func dynaliteClient(t testing.TB) *dynamodb.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	t.Cleanup(tr.CloseIdleConnections)
	return dynamodb.New(dynamodb.Options{
		Region:       testenv.DynaliteRegion,
		BaseEndpoint: aws.String(testenv.Dynalite(t)),
		Credentials:  credentials.NewStaticCredentialsProvider("bench", "bench", ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	for _, dup := range []float64{0, 0.2} {
		r, err := inboxbench.Postgres(context.Background(), dsn, inboxbench.PostgresOptions{Messages: 400, Duplicates: dup, Workers: 4})
		if err != nil {
			t.Fatal(err)
		}
		wantDeliveries := int(400/(1-dup) + 0.5)
		if r.Processed != 400 || r.Deliveries != wantDeliveries || r.Duplicates != wantDeliveries-400 || r.PerSecond <= 0 {
			t.Fatalf("duplicates %v: %+v", dup, r)
		}
		t.Logf("duplicates %.0f%%: %v", dup*100, r)
	}
}

func TestDynamoDB(t *testing.T) {
	t.Parallel()
	r, err := inboxbench.DynamoDB(context.Background(), dynaliteClient(t), inboxbench.DynamoDBOptions{Updates: 200, Duplicates: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Applied != 200 || r.Requests != 250 || r.Duplicates != 50 || r.BoundPerSecond <= 0 || r.ItemBytes < 100*17 {
		t.Fatalf("%+v", r)
	}
	t.Logf("%v", r)
}

func BenchmarkPostgresInbox(b *testing.B) {
	dsn := testenv.PostgresDSN(b)
	for _, dup := range []float64{0, 0.2} {
		b.Run(fmt.Sprintf("duplicates=%.0f%%", dup*100), func(b *testing.B) {
			var last inboxbench.PostgresResult
			for b.Loop() {
				r, err := inboxbench.Postgres(context.Background(), dsn, inboxbench.PostgresOptions{Messages: 5000, Duplicates: dup})
				if err != nil {
					b.Fatal(err)
				}
				last = r
			}
			b.ReportMetric(last.PerSecond, "msg/s")
			b.Logf("%v", last)
		})
	}
}

func BenchmarkDynamoDBWindow(b *testing.B) {
	client := dynaliteClient(b)
	var last inboxbench.DynamoDBResult
	for b.Loop() {
		r, err := inboxbench.DynamoDB(context.Background(), client, inboxbench.DynamoDBOptions{Updates: 1000})
		if err != nil {
			b.Fatal(err)
		}
		last = r
	}
	b.ReportMetric(last.PerSecond, "updates/s")
	b.Logf("%v", last)
}
