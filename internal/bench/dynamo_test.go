package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/dynamodb"
)

// TestRunDynamoDB runs the DynamoDB scenarios once on a tiny workload
// against dynalite and embedded NATS: a rate and requests per message for
// the drain, every message in the stream, ADR 0034's counts on the empty
// outbox (100 Queries against ScanConcurrency Scans), and the bench's
// tables gone afterwards. No timing is asserted.
func TestRunDynamoDB(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	endpoint := testenv.Dynalite(t)
	srv := testenv.NATS(t)
	table := testenv.Name(t)
	const scanConcurrency = 3
	storeURL := "dynamodb://" + table + "?endpoint=" + endpoint + "&region=" + testenv.DynaliteRegion + "&scan_concurrency=3"
	var notices bytes.Buffer
	rep, err := Run(ctx, children(Options{
		Store: storeURL, Broker: srv.ClientURL(),
		Messages: 300, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
		OutstandingBacklog: 200,
		Notices:            &notices,
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(notices.String(), "only the DynamoDB scenarios") {
		t.Errorf("notices do not say that only the DynamoDB scenarios run:\n%s", notices.String())
	}
	if len(rep.Results) != 1 || rep.Results[0].Scenario != DynamoRelayKeyName {
		t.Fatalf("results: %+v, want only %s", rep.Results, DynamoRelayKeyName)
	}
	res := rep.Results[0]
	if res.Err != "" || len(res.Details) != 1 {
		t.Fatalf("%s: error %q, %d runs", res.Scenario, res.Err, len(res.Details))
	}
	run := res.Details[0]
	if !(res.MsgsPerSec > 0) || run.Left != 0 || run.Stored != 300 {
		t.Errorf("%s: %v msgs/s, %d left, %d of 300 in the stream", res.Scenario, res.MsgsPerSec, run.Left, run.Stored)
	}
	d := res.DynamoDB
	if d == nil || !(d.RequestsPerMessage > 0) || len(d.Requests) != 1 || d.Operations["BatchGetItem"].Requests == 0 || d.Operations["Query"].Requests == 0 {
		t.Fatalf("requests of the drain: %+v, want requests per message > 0 with BatchGetItem and Query among them", d)
	}
	out := rep.Outstanding
	if out == nil || out.Err != "" || len(out.Rows) != 2 {
		t.Fatalf("outstanding comparison: %+v", out)
	}
	if empty := out.Rows[0]; empty.Outstanding != 0 || empty.Older.Requests != 100 || empty.Ours.Requests != scanConcurrency {
		t.Errorf("empty outbox: older %d requests, ours %d; want 100 and %d", empty.Older.Requests, empty.Ours.Requests, scanConcurrency)
	}
	if full := out.Rows[1]; full.Outstanding != 200 || full.Older.Requests < 100 || full.Ours.Requests < scanConcurrency {
		t.Errorf("backlog row %+v: want 200 outstanding, at least 100 and %d requests", full, scanConcurrency)
	}
	if len(rep.Targets) != 0 {
		t.Errorf("targets %+v: the issue's targets compare PostgreSQL scenarios and should be left out", rep.Targets)
	}

	var tbl bytes.Buffer
	if err := rep.WriteTable(&tbl); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{DynamoRelayKeyName, "PER MESSAGE", "BatchGetItem", "ADR 0034", "100 requests", "3 requests", "200 outstanding", "PostgreSQL-only"} {
		if !strings.Contains(tbl.String(), s) {
			t.Errorf("the table lacks %q:\n%s", s, tbl.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("JSON: %d lines, want the drain, the comparison and the targets:\n%s", len(lines), js.String())
	}
	var drain struct {
		DynamoDB *DynamoRequests `json:"dynamodb"`
	}
	var cmp OutstandingReport
	if err := json.Unmarshal([]byte(lines[0]), &drain); err != nil || drain.DynamoDB == nil || !(drain.DynamoDB.RequestsPerMessage > 0) {
		t.Errorf("JSON drain line %s: %v", lines[0], err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &cmp); err != nil || cmp.Scenario != DynamoOutstandingName || len(cmp.Rows) != 2 || cmp.Rows[0].Older.Requests != 100 {
		t.Errorf("JSON comparison line %s: %v", lines[1], err)
	}
	t.Logf("\n%s", tbl.String())

	// The bench's tables are dropped (or being dropped).
	s, err := dynamodb.New(ctx, dynamodb.Options{Table: table, Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := s.Client().ListTables(ctx, &awsdynamodb.ListTablesInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range list.TableNames {
		if !strings.HasPrefix(name, table+"_bench_") {
			continue
		}
		desc, err := s.Client().DescribeTable(ctx, &awsdynamodb.DescribeTableInput{TableName: &name})
		if err == nil && desc.Table.TableStatus != "DELETING" {
			t.Errorf("table %s is %s after the run, want it dropped", name, desc.Table.TableStatus)
		}
	}
}

// TestDynamoScenarioSelection: with a DynamoDB store only the DynamoDB
// scenarios run, and asking for a PostgreSQL-only one is an error naming
// --scenarios (and the other way round).
func TestDynamoScenarioSelection(t *testing.T) {
	const store = "dynamodb://t1?endpoint=http://127.0.0.1:1"
	got, err := SelectFor(store, nil)
	if err != nil || strings.Join(got, ",") != DynamoRelayKeyName+","+DynamoOutstandingName {
		t.Errorf("SelectFor(dynamodb, all) = %v, %v", got, err)
	}
	if got, err := SelectFor(store, []string{"dynamodb/relay-*"}); err != nil || len(got) != 1 {
		t.Errorf("SelectFor(dynamodb, dynamodb/relay-*) = %v, %v", got, err)
	}
	for _, c := range []struct{ store, pattern, says string }{
		{store, "relay/key", "PostgreSQL"},
		{store, "seed-*", "PostgreSQL"},
		{"postgres://localhost/db", "dynamodb/*", "DynamoDB"},
		{store, "nope", "matches no scenario"},
	} {
		_, err := SelectFor(c.store, []string{c.pattern})
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Flag != "scenarios" || !strings.Contains(err.Error(), c.says) {
			t.Errorf("SelectFor(%s, %q) = %v, want an error naming --scenarios that says %q", c.store, c.pattern, err, c.says)
		}
	}
	// Validate goes through SelectFor, and defaults the DynamoDB backlog.
	o := Options{Store: store, Scenarios: []string{"ceiling/*"}}.WithDefaults()
	var oe *OptionError
	if err := o.Validate(); !errors.As(err, &oe) || oe.Flag != "scenarios" {
		t.Errorf("Validate with a PostgreSQL-only scenario on DynamoDB = %v, want an error naming --scenarios", err)
	}
	if o.Messages != DynamoMessagesDefault {
		t.Errorf("DynamoDB backlog default = %d, want %d", o.Messages, DynamoMessagesDefault)
	}
}

func TestAMQPQueueTypeOption(t *testing.T) {
	for _, c := range []Options{
		{AMQPQueueType: "stream", Broker: "amqp://localhost/"},
		{AMQPQueueType: AMQPQuorum},                          // embedded NATS
		{AMQPQueueType: AMQPQuorum, Broker: "nats://x:4222"}, // not RabbitMQ
	} {
		err := c.WithDefaults().Validate()
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Flag != "amqp-queue-type" {
			t.Errorf("Validate(%+v) = %v, want an error naming --amqp-queue-type", c, err)
		}
	}
	if err := (Options{AMQPQueueType: AMQPQuorum, Broker: "amqps://h/"}).WithDefaults().Validate(); err != nil {
		t.Errorf("quorum on amqps: %v", err)
	}
}

// TestAMQPQuorumQueue: with AMQPQueueType quorum the bench's queue on
// RabbitMQ is a quorum queue, and a small relay/key run lands every
// message in it.
func TestAMQPQuorumQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testenv.RabbitMQ(t)
	b, err := OpenBroker(ctx, url, Options{AMQPQueueType: AMQPQuorum})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.Name, "quorum queue") {
		t.Errorf("broker described as %q, want it to say quorum queue", b.Name)
	}
	queues := testenv.RabbitMQCtl(t, "list_queues", "--quiet", "name", "type")
	b.Close()
	found := false
	for _, line := range strings.Split(queues, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[0], "outbox_bench_") && f[1] == "quorum" {
			found = true
		}
	}
	if !found {
		t.Errorf("no quorum queue outbox_bench_* on the node:\n%s", queues)
	}

	rep, err := Run(ctx, children(Options{
		Store: testenv.PostgresDSN(t), Broker: url, AMQPQueueType: AMQPQuorum,
		Messages: 300, Keys: 20, Batch: 50, Workers: 2, Runs: 1,
		Scenarios: []string{RelayKeyName},
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	res := rep.Result(RelayKeyName)
	if res == nil || len(res.Details) != 1 {
		t.Fatalf("relay/key: %+v", res)
	}
	if r := res.Details[0]; !(r.MsgsPerSec > 0) || r.Stored != 300 {
		t.Errorf("relay/key on a quorum queue: %v msgs/s, %d of 300 messages stored", r.MsgsPerSec, r.Stored)
	}
	if !strings.Contains(rep.Broker, "quorum") {
		t.Errorf("report's broker %q does not say quorum", rep.Broker)
	}
}
