package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/memstore"
)

// bareStore is a store with no operator interface: the in-memory store
// with Migrate and Close, as a backend would open it.
type bareStore struct{ *memstore.Store }

func (bareStore) Migrate(context.Context) error { return nil }
func (bareStore) Close() error                  { return nil }

// TestAdminOfNamesTheStore: status and dlq refuse a store without
// outbox.AdminStore with a usage error that names the store and the
// command, not a panic or a bare type-assertion failure.
func TestAdminOfNamesTheStore(t *testing.T) {
	_, err := adminOf(bareStore{memstore.New(4, time.Now)}, "memory", "dlq")
	if err == nil {
		t.Fatal("adminOf accepted a store without AdminStore")
	}
	if !isUsage(err) {
		t.Errorf("adminOf: %v is not a usage error (exit code 2)", err)
	}
	for _, want := range []string{"the memory store", "outbox.AdminStore", "which dlq needs", "postgres"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("adminOf: %q does not say %q", err, want)
		}
	}
}
