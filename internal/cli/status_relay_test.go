package cli_test

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// A relay whose destination has no stream pauses it; `outbox status
// --relay` lists it, with the relay's readiness, in text and JSON.
func TestStatusListsRelaysBlockedDestinations(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	stream(t, ns, "orders.>") // no stream covers "refunds.>"
	write(t, dsn, messages("refunds.issued", 5, 2))
	vars := map[string]string{"OUTBOX_STORE": dsn, "OUTBOX_HTTP_ADDR": "127.0.0.1:0"}
	b := start(t, vars, "relay", "--broker", ns.ClientURL(), "--log-format", "json", "--poll-interval", "50ms", "--max-attempts", "1")
	addr := httpAddrFromLog(t, b)
	var out string
	poll(t, "status --relay to list the blocked destination", func() bool {
		out = mustRun(t, nil, "status", "--store", dsn, "--relay", addr).stdout
		return regexp.MustCompile(`(?m)^refunds\.issued\s+http://` + regexp.QuoteMeta(addr) + `/readyz\s+\S+\s+\d+\s+.*stream`).MatchString(out)
	})
	t.Logf("status:\n%s", out)
	if !regexp.MustCompile(`(?m)^outstanding\s+5$`).MatchString(out) || !regexp.MustCompile(`(?m)^dead letters\s+0$`).MatchString(out) {
		t.Errorf("a blocked destination must keep its messages, none dead-lettered:\n%s", out)
	}
	r := mustRun(t, nil, "status", "--store", dsn, "--relay", "http://"+addr, "--json")
	var s struct {
		LiveRelays []struct {
			Ready   bool `json:"ready"`
			Blocked []struct {
				Destination string `json:"destination"`
			} `json:"blocked_destinations"`
		} `json:"live_relays"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.LiveRelays) != 1 || len(s.LiveRelays[0].Blocked) != 1 || s.LiveRelays[0].Blocked[0].Destination != "refunds.issued" {
		t.Fatalf("status --json live_relays: %+v", s.LiveRelays)
	}
	if r := run(t, nil, "status", "--store", dsn, "--relay", "127.0.0.1:1"); r.code != 1 {
		t.Fatalf("an unreachable --relay: %v", r)
	}
}
