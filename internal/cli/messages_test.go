package cli_test

import (
	"strings"
	"testing"
)

// TestUnknownFlagSuggests: a mistyped flag gets "did you mean", as a
// mistyped configuration key does; a flag far from every other gets none.
func TestUnknownFlagSuggests(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--stor", "x"}, "did you mean --store?"},
		{[]string{"status", "--stroe", "x"}, "did you mean --store?"},
		{[]string{"dlq", "list", "--olderthan", "1h"}, "did you mean --older-than?"},
		{[]string{"relay", "--log-levle=debug"}, "did you mean --log-level?"},
	} {
		r := run(t, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("outbox %s: want exit 2 and %q: %v", strings.Join(c.args, " "), c.want, r)
		}
	}
	if r := run(t, nil, "relay", "--zzzzzzzz"); r.code != 2 || strings.Contains(r.stderr, "did you mean") {
		t.Errorf("outbox relay --zzzzzzzz: %v", r)
	}
}
