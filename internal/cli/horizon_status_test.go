package cli_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// status --json carries the xmin horizon with the session that holds it,
// and the text has its line.
func TestStatusShowsXminHorizon(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 2)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "nightly-report"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{"BEGIN", "SELECT pg_current_xact_id()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	write(t, dsn, messages("orders.created", 3, 3))

	st := statusJSON(t, dsn)
	if st.XminHorizon == nil {
		t.Fatal("status --json has no xmin_horizon")
	}
	found := false
	for _, h := range st.XminHorizon.Holders {
		if h.Kind == outbox.HolderSession && h.PID == int(conn.PgConn().PID()) && h.Application == "nightly-report" && h.State == "idle in transaction" {
			found = true
		}
	}
	if !found || st.XminHorizon.AgeXids < 1 {
		t.Fatalf("xmin_horizon %+v does not name the idle session (pid %d)", st.XminHorizon, conn.PgConn().PID())
	}
	r := mustRun(t, nil, "status", "--store", dsn)
	if !regexp.MustCompile(`(?m)^xmin horizon\s+(free|HELD)`).MatchString(r.stdout) {
		t.Errorf("status text has no xmin horizon line:\n%s", r.stdout)
	}
}
