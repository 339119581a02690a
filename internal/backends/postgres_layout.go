package backends

import (
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox/store/postgres"
)

// postgresLayoutParam reads and removes the store URL's layout parameter
// (postgres.Options.Layout: plain or ring; `outbox migrate` converts a
// plain table to the ring online, the relay finds the layout in the
// database and needs no parameter).
func postgresLayoutParam(u *url.URL) (postgres.Layout, error) {
	q := u.Query()
	vs, ok := q["layout"]
	if !ok {
		return "", nil
	}
	l, err := postgres.ParseLayout(vs[0])
	if err != nil || len(vs) > 1 || l == "" {
		return "", Invalid(StoreFlag, "layout=%q: give it once, %q or %q (ring: partitions truncated once drained, no dead rows left for vacuum)", strings.Join(vs, ","), postgres.LayoutPlain, postgres.LayoutRing)
	}
	q.Del("layout")
	u.RawQuery = q.Encode()
	return l, nil
}
