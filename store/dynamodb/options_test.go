package dynamodb

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestParseURL(t *testing.T) {
	o, err := ParseURL("dynamodb://my_outbox-1.prod?endpoint=http://127.0.0.1:8000&region=eu-west-1&shards=16&scan_concurrency=8&page_size=50&max_outstanding=1000&retention=24h&shard_index=Relay")
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Table: "my_outbox-1.prod", Endpoint: "http://127.0.0.1:8000", Region: "eu-west-1", Shards: 16,
		ScanConcurrency: 8, PageSize: 50, MaxOutstanding: 1000, Retention: 24 * time.Hour, Indexes: IndexNames{Shard: "Relay"}}
	if o.Table != want.Table || o.Endpoint != want.Endpoint || o.Region != want.Region || o.Shards != want.Shards ||
		o.ScanConcurrency != want.ScanConcurrency || o.PageSize != want.PageSize || o.MaxOutstanding != want.MaxOutstanding ||
		o.Retention != want.Retention || o.Indexes != want.Indexes {
		t.Fatalf("ParseURL = %+v, want %+v", o, want)
	}
	for raw, want := range map[string]time.Duration{"dynamodb://t?fetch_delay=250ms": 250 * time.Millisecond, "dynamodb://t?fetch_delay=0": FetchDelayNone} {
		if o, err := ParseURL(raw); err != nil || o.FetchDelay != want {
			t.Errorf("ParseURL(%q).FetchDelay = %v, %v; want %v", raw, o.FetchDelay, err, want)
		}
	}
	for _, tc := range []struct{ url, want string }{
		{"postgres://x", "must start with dynamodb://"},
		{"dynamodb://", "names no table"},
		{"dynamodb://t/extra", "must be dynamodb://TABLE"},
		{"dynamodb://user@tbl", "must be dynamodb://TABLE"},
		{"dynamodb://tbl?shard=3", `"shard" is unknown`},
		{"dynamodb://tbl?shards=x", "shards: want an integer"},
		{"dynamodb://tbl?retention=1", "retention: want a duration"},
		{"dynamodb://tbl?shards=1&shards=2", "given 2 times"},
	} {
		if _, err := ParseURL(tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q): got %v, want an error containing %q", tc.url, err, tc.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	base := Options{Table: "outbox"}
	for _, tc := range []struct {
		mod  func(*Options)
		want string
	}{
		{func(o *Options) { o.Table = "" }, "Options.Table must be 3 to 255"},
		{func(o *Options) { o.Table = "out box" }, "Options.Table \"out box\" has ' '"},
		{func(o *Options) { o.Shards = ShardsMax + 1 }, "Options.Shards must be between 1 and 4096"},
		{func(o *Options) { o.ScanConcurrency = -1 }, "Options.ScanConcurrency"},
		{func(o *Options) { o.PageSize = PageSizeMax + 1 }, "Options.PageSize"},
		{func(o *Options) { o.MaxOutstanding = -1 }, "Options.MaxOutstanding"},
		{func(o *Options) { o.Retention = -time.Second }, "Options.Retention"},
		{func(o *Options) { o.Indexes.Delivered = "Outstanding" }, "used twice"},
		{func(o *Options) { o.Indexes.Shard = "x" }, "Options.Indexes.Shard"},
		{func(o *Options) { o.MaxPayload = MaxItemSize + 1 }, "Options.MaxPayload"},
		{func(o *Options) { o.Endpoint = "localhost:8000" }, "Options.Endpoint must be an http or https URL"},
	} {
		o := base
		tc.mod(&o)
		err := o.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v): got %v, want an error containing %q", o, err, tc.want)
		}
	}
	if err := base.WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if _, err := New(context.Background(), Options{}); err == nil || !strings.Contains(err.Error(), "Options.Table") {
		t.Fatalf("New without a table: got %v", err)
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"dynamodb://outbox?endpoint=http://127.0.0.1:8000&region=us-east-1&shards=20",
		"dynamodb://t?retention=1h&page_size=10",
		"dynamodb://",
		"dynamodb://a/b?c=%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		o, err := ParseURL(raw)
		if err != nil {
			return
		}
		if o.Table == "" {
			t.Fatalf("ParseURL(%q) accepted a URL without a table", raw)
		}
		// Whatever parses either validates or fails naming an Options field.
		if err := o.WithDefaults().Validate(); err != nil && !strings.Contains(err.Error(), "Options.") {
			t.Fatalf("Validate error without the field name: %v", err)
		}
	})
}

func TestMigrateIsIdempotentAndChecksLayout(t *testing.T) {
	t.Parallel()
	s := newStore(t, Options{Shards: 6})
	ctx := ctxT(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if p, err := s.Partitions(ctx); err != nil || p != 6 {
		t.Fatalf("Partitions = %d, %v; want 6", p, err)
	}

	// Another store on the same table with another shard count is refused.
	other, err := New(ctx, Options{Table: s.opts.Table, Endpoint: s.opts.Endpoint, Region: s.opts.Region, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Partitions(ctx); err == nil || !strings.Contains(err.Error(), "migrated with 6 shards") {
		t.Fatalf("Partitions with Shards=8 on a 6-shard table: got %v", err)
	}
	if err := other.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "Shards") {
		t.Fatalf("Migrate with Shards=8 on a 6-shard table: got %v", err)
	}

	// A table of the older layout (no all-topics indexes) is reported with
	// what to add.
	older := newOlderLayoutTable(t)
	err = older.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "OutstandingAllTopics") || !strings.Contains(err.Error(), "Migrating") {
		t.Fatalf("Migrate on an older-layout table: got %v, want the missing indexes named", err)
	}
}

// newOlderLayoutTable creates a table with only the older layout's
// Outstanding index and returns a store configured for it.
func newOlderLayoutTable(t *testing.T) *Store {
	t.Helper()
	ctx := ctxT(t)
	s, err := New(ctx, Options{Table: testenv.Name(t), Endpoint: testenv.Dynalite(t), Region: testenv.DynaliteRegion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	in := s.CreateTableInput()
	in.GlobalSecondaryIndexes = in.GlobalSecondaryIndexes[:1] // Outstanding
	in.AttributeDefinitions = nil
	for _, a := range s.CreateTableInput().AttributeDefinitions {
		if n := aws.ToString(a.AttributeName); n == attrID || n == attrTopicShard || n == attrOutstandingCreatedTime {
			in.AttributeDefinitions = append(in.AttributeDefinitions, a)
		}
	}
	if _, err := s.client.CreateTable(ctx, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = s.client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(s.opts.Table)})
	})
	return s
}

// TestRequestStats checks the request accounting: per-operation counts in
// Stats and DetailedStatus, OnRequest events, and errors counted.
func TestRequestStats(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	events := map[string]int{}
	s := newStore(t, Options{OnRequest: func(e RequestEvent) {
		mu.Lock()
		events[e.Operation]++
		mu.Unlock()
	}})
	ctx := ctxT(t)
	before := s.Stats()
	m := &outbox.Message{Topic: "t.stats"}
	mustWrite(t, s, m)
	if err := s.Write(ctx, &outbox.Message{ID: m.ID, Topic: "t.stats"}); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("duplicate Write: %v", err)
	}
	if _, err := s.GetMany(ctx, []string{m.ID}); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	put := after["PutItem"]
	if d := put.Requests - before["PutItem"].Requests; d != 2 {
		t.Fatalf("PutItem requests grew by %d, want 2", d)
	}
	if d := put.Errors - before["PutItem"].Errors; d != 1 {
		t.Fatalf("PutItem errors grew by %d, want 1 (the duplicate)", d)
	}
	if after["BatchGetItem"].Requests-before["BatchGetItem"].Requests != 1 {
		t.Fatalf("BatchGetItem requests: %+v then %+v", before["BatchGetItem"], after["BatchGetItem"])
	}
	if put.ConsumedCapacity <= 0 {
		t.Fatalf("PutItem consumed capacity %v, want > 0 (ReturnConsumedCapacity is requested)", put.ConsumedCapacity)
	}
	mu.Lock()
	gotPut := events["PutItem"]
	mu.Unlock()
	if int64(gotPut) != put.Requests {
		t.Fatalf("OnRequest saw %d PutItem events, Stats %d", gotPut, put.Requests)
	}
	st, err := s.DetailedStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Outstanding != 1 || st.Requests["PutItem"].Requests < 2 || len(st.Partitions) != ShardsDefault {
		t.Fatalf("DetailedStatus = %+v", st)
	}
	// The portable status carries the same counts, for `outbox status`.
	plain, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Requests["PutItem"]; got.Requests < 2 || got.ConsumedCapacity <= 0 {
		t.Fatalf("Status().Requests[PutItem] = %+v", got)
	}
}
