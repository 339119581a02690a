package bench

import (
	"slices"
	"strings"
	"testing"
)

// A mysql:// store runs seed-tuned, relay/none and relay/key; a pattern
// naming only PostgreSQL scenarios is an error that says so.
func TestSelectForMySQL(t *testing.T) {
	got, err := SelectFor("mysql://u@h:3306/db", nil)
	if err != nil || !slices.Equal(got, MySQLScenarioNames()) {
		t.Fatalf("SelectFor(mysql) = %v, %v; want %v", got, err, MySQLScenarioNames())
	}
	if got, err := SelectFor("mysql://u@h:3306/db", []string{"relay/*"}); err != nil || !slices.Equal(got, []string{RelayNoneName, RelayKeyName}) {
		t.Fatalf("SelectFor(mysql, relay/*) = %v, %v", got, err)
	}
	if _, err := SelectFor("mysql://u@h:3306/db", []string{"seed-naive"}); err == nil || !strings.Contains(err.Error(), "only on a PostgreSQL store") {
		t.Fatalf("SelectFor(mysql, seed-naive) = %v; want an error naming PostgreSQL", err)
	}
}
