package backends

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"
)

func TestOpenSQLiteStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "outbox.db")
	st, err := OpenStore(ctx, "sqlite://"+path+"?partitions=8", StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := st.Partitions(ctx); err != nil || p != 8 {
		t.Fatalf("partitions = %d, %v; want 8", p, err)
	}
	if _, ok := st.(outbox.CommitOrdered); !ok {
		t.Fatal("the SQLite store lost its abilities behind the registry")
	}
	for _, bad := range []string{"sqlite://", "sqlite:///x.db?schema=s"} {
		_, err := OpenStore(ctx, bad, StoreOptions{})
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "--store") {
			t.Errorf("OpenStore(%q) = %v; want a --store config error", bad, err)
		}
	}
}
