package postgres

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The plans of the store's statements, for the tests that check them
// (TestQueryPlans, TestBacklogPlans).

// explain returns the plan PostgreSQL chooses for sql with args (EXPLAIN:
// a custom plan, which knows the arguments).
func (b *bundle) explain(t *testing.T, sql string, args ...any) string {
	t.Helper()
	return queryPlan(t, b.ctx, b.store.Pool(), "EXPLAIN "+sql, args...)
}

// explainGeneric prepares sql on one of the store's connections and
// returns EXPLAIN EXECUTE of it with args under plan_cache_mode =
// force_generic_plan: the generic plan, which the relay's statements run
// once PostgreSQL has chosen it.
func (b *bundle) explainGeneric(t *testing.T, sql string, args ...any) string {
	t.Helper()
	conn, err := b.store.Pool().Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(b.ctx, "RESET plan_cache_mode") //nolint:errcheck // test cleanup
	if _, err := conn.Exec(b.ctx, "PREPARE explained AS "+sql); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(b.ctx, "DEALLOCATE explained") //nolint:errcheck // test cleanup
	// EXECUTE takes literals, not parameters.
	lits := make([]string, len(args))
	for i, a := range args {
		lits[i] = sqlLiteral(t, a)
	}
	return queryPlan(t, b.ctx, conn, "EXPLAIN EXECUTE explained("+strings.Join(lits, ", ")+")")
}

// queryPlan runs an EXPLAIN statement on q (the pool or one connection)
// and returns the plan, a line per row.
func queryPlan(t *testing.T, ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, explain string, args ...any) string {
	t.Helper()
	rows, err := q.Query(ctx, explain, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// sqlLiteral renders the test's argument types as SQL literals.
func sqlLiteral(t *testing.T, a any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	array := func(elems []string) string { return quote("{" + strings.Join(elems, ",") + "}") }
	switch v := a.(type) {
	case int:
		return strconv.Itoa(v)
	case []int32:
		e := make([]string, len(v))
		for i, x := range v {
			e[i] = strconv.Itoa(int(x))
		}
		return array(e)
	case []int64:
		e := make([]string, len(v))
		for i, x := range v {
			e[i] = strconv.FormatInt(x, 10)
		}
		return array(e)
	case []string:
		e := make([]string, len(v))
		for i, x := range v {
			e[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(x) + `"`
		}
		return array(e)
	}
	t.Fatalf("sqlLiteral: %T", a)
	return ""
}
