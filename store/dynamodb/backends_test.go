package dynamodb_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/dynamodb"
)

// TestOpenThroughBackends opens a dynamodb:// URL the way the outbox command
// does (internal/backends), with the common options mapped onto the store's.
func TestOpenThroughBackends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := testenv.Name(t)
	q := url.Values{"endpoint": {testenv.Dynalite(t)}, "region": {testenv.DynaliteRegion}, "partitions": {"4"}, "retention": {"1h"}}
	s, err := backends.OpenStore(ctx, "dynamodb://"+table+"?"+q.Encode(), backends.StoreOptions{TablePrefix: "pre_"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ds := s.(*dynamodb.Store)
	defer func() {
		if err := ds.DropTable(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	o := ds.Options()
	if o.Table != "pre_"+table || o.Shards != 4 || o.Retention != time.Hour {
		t.Fatalf("options %+v, want table pre_%s, 4 shards, retention 1h", o, table)
	}
	if p, err := s.Partitions(ctx); err != nil || p != 4 {
		t.Fatalf("Partitions = %d, %v", p, err)
	}

	for _, raw := range []string{
		"dynamodb://" + table + "?shards=3&partitions=4",
		"dynamodb://" + table + "?bogus=1",
		"dynamodb://x",
		"dynamodb://" + table + "?schema=public",
	} {
		if _, err := backends.OpenStore(ctx, raw, backends.StoreOptions{}); !backends.IsConfigError(err) {
			t.Errorf("OpenStore(%q): got %v, want a configuration error", raw, err)
		}
	}
}
