package console_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/outboxrelay/outbox/internal/console"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// BenchmarkOverview measures the overview of a PostgreSQL outbox holding
// $OUTBOX_BENCH_OUTSTANDING unpublished messages (default 1,000,000, of
// 200 bytes, 8 topics, 100,000 keys), as the README reports it:
//
//	go test ./internal/console -run '^$' -bench Overview -benchtime 5x
//
// store-status is one read of the store's status (what a refresh costs the
// database); page-cold serves the overview with that read; page-snapshot
// serves it from the snapshot every viewer shares between refreshes.
func BenchmarkOverview(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("OUTBOX_BENCH_OUTSTANDING"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("OUTBOX_BENCH_OUTSTANDING=%q: want a positive count", v)
		}
	}
	ctx := b.Context()
	s, err := postgres.Open(ctx, testenv.PostgresDSN(b), postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	// The rows a relay would find: generate_series is the fastest way in;
	// partition is the key's, as Write computes it, so that per-partition
	// counts are realistic in spread.
	if _, err := s.Pool().Exec(ctx, `INSERT INTO outbox_messages (id, partition, topic, key, payload, created_at)
SELECT gen_random_uuid(), (g % 100000) % 64, 'orders.topic' || (g % 8), 'customer-' || (g % 100000),
       convert_to(repeat('x', 200), 'UTF8'), now() - make_interval(secs => g / 1000.0)
FROM generate_series(1, $1::int) g`, n); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `VACUUM ANALYZE outbox_messages`); err != nil {
		b.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil || st.Outstanding != int64(n) {
		b.Fatalf("status: %v, %v; want %d outstanding", st, err, n)
	}

	b.Run("store-status", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Status(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	serveOverview := func(b *testing.B, h http.Handler) {
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1/", nil)
		req.RemoteAddr = "127.0.0.1:40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("GET /: %d", rec.Code)
		}
	}
	b.Run("page-cold", func(b *testing.B) {
		for b.Loop() {
			srv, err := console.New(console.Options{Store: s, StoreKind: "postgres"})
			if err != nil {
				b.Fatal(err)
			}
			serveOverview(b, srv.Handler())
			srv.Close()
		}
	})
	b.Run("page-snapshot", func(b *testing.B) {
		srv, err := console.New(console.Options{Store: s, StoreKind: "postgres", RefreshMin: 1 << 62})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		h := srv.Handler()
		serveOverview(b, h)
		for b.Loop() {
			serveOverview(b, h)
		}
	})
}
