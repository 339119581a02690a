package backends

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/store/postgres"
)

// layout=plain|ring in a postgres:// store URL is the store's
// Options.Layout and leaves the URL; anything else is a usage error naming
// it; --print-sql prints the layout asked for.
func TestPostgresLayoutParam(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want postgres.Layout
		bad  bool
	}{
		{"postgres://h/db", "", false},
		{"postgres://h/db?layout=ring&sslmode=disable", postgres.LayoutRing, false},
		{"postgres://h/db?layout=plain", postgres.LayoutPlain, false},
		{"postgres://h/db?layout=rings", "", true},
		{"postgres://h/db?layout=", "", true},
		{"postgres://h/db?layout=ring&layout=plain", "", true},
	} {
		u, err := url.Parse(c.raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := postgresLayoutParam(u)
		var ce *ConfigError
		if c.bad {
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "layout=") {
				t.Errorf("%s: error %v; want a usage error naming layout=", c.raw, err)
			}
			continue
		}
		if err != nil || got != c.want || strings.Contains(u.RawQuery, "layout") {
			t.Errorf("%s: %q, %v, query left %q; want %q and no layout in the URL", c.raw, got, err, u.RawQuery, c.want)
		}
	}
	u, _ := url.Parse("postgres://?layout=ring")
	if sql, err := postgresMigrationSQL(u, StoreOptions{}); err != nil || !strings.Contains(sql, "PARTITION BY LIST (ring)") {
		t.Errorf("print-sql with layout=ring: %v; want the ring layout's SQL:\n%s", err, sql)
	}
	u, _ = url.Parse("postgres://?layout=plain")
	if sql, err := postgresMigrationSQL(u, StoreOptions{}); err != nil || strings.Contains(sql, "PARTITION BY") {
		t.Errorf("print-sql with layout=plain: %v; want the plain layout's SQL:\n%s", err, sql)
	}
}
