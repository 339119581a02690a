package backends

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// TestOpenPostgresKeyLocks: key_locks in a postgres:// store URL sets the
// writer's Options.KeyLocks and does not reach the server (which would
// refuse it as an unknown setting); a value that is not a boolean is a
// usage error naming it.
func TestOpenPostgresKeyLocks(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	for _, tc := range []struct {
		param string
		want  bool
	}{{"", postgres.KeyLocksDefault}, {"key_locks=true", true}, {"key_locks=false", false}} {
		u := dsn
		if tc.param != "" {
			u += sep + tc.param
		}
		s, err := OpenStore(ctx, u, StoreOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tc.param, err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("%s: %v", tc.param, err)
		}
		if got := *s.(postgresStore).Options().KeyLocks; got != tc.want {
			t.Errorf("%q: KeyLocks = %v, want %v", tc.param, got, tc.want)
		}
		s.Close()
	}
	_, err := OpenStore(ctx, dsn+sep+"key_locks=maybe", StoreOptions{})
	if !IsConfigError(err) || !strings.Contains(err.Error(), "key_locks") || !strings.Contains(err.Error(), "true or false") {
		t.Fatalf("key_locks=maybe: %v; want a usage error naming key_locks", err)
	}
}
