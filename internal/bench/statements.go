package bench

import (
	"context"
	"strings"
)

// Statement is one statement's share of a timed span, from
// pg_stat_statements (reset when the span began).
type Statement struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"` // executing
	Rows    int64   `json:"rows"`
	// Plans and PlanMs are the statement's planning (the bench's server
	// tracks it: pg_stat_statements.track_planning): a prepared statement
	// that PostgreSQL plans again on every execution (a custom plan) pays
	// it on every call, and it is not in TotalMs.
	Plans  int64   `json:"plans"`
	PlanMs float64 `json:"plan_ms"`
	// MicrosPerMsg is TotalMs per message of the run, in µs.
	MicrosPerMsg float64 `json:"us_per_msg"`
}

// statementsTop is how many statements a run keeps, by total time.
const statementsTop = 8

// statementQueryMax bounds the query text kept per statement.
const statementQueryMax = 160

// statementStats is what pg_stat_statements recorded in a span.
type statementStats struct {
	top []Statement
	// calls is every statement's calls together.
	calls int64
}

// enableStatements creates pg_stat_statements in the bench's database when
// the server loaded it (shared_preload_libraries), and reports whether it
// can be read.
func (e *Env) enableStatements(ctx context.Context) bool {
	var loaded bool
	err := e.Pool.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))`).Scan(&loaded)
	if err != nil || !loaded {
		return false
	}
	if _, err := e.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		e.Log.Warn("bench: pg_stat_statements is loaded but cannot be created: no statements per scenario", "err", err)
		return false
	}
	return e.resetStatements(ctx) == nil
}

func (e *Env) resetStatements(ctx context.Context) error {
	_, err := e.Pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err
}

// readStatements returns the top statements by total time since the last
// reset, leaving out the bench's reset itself.
func (e *Env) readStatements(ctx context.Context) (*statementStats, error) {
	rows, err := e.Pool.Query(ctx, `
SELECT query, calls, total_exec_time, rows, plans, total_plan_time, sum(calls) OVER ()
FROM pg_stat_statements
WHERE query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time + total_plan_time DESC`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	st := &statementStats{}
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.Rows, &s.Plans, &s.PlanMs, &st.calls); err != nil {
			return nil, err
		}
		if len(st.top) < statementsTop {
			s.Query = shortQuery(s.Query)
			st.top = append(st.top, s)
		}
	}
	return st, rows.Err()
}

// shortQuery folds a query's whitespace and cuts it to statementQueryMax
// characters.
func shortQuery(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	if r := []rune(q); len(r) > statementQueryMax {
		q = string(r[:statementQueryMax-1]) + "…"
	}
	return q
}
