package deploy_test

// The monitoring files: prometheus/alerts.yml (alerting rules, unit-tested
// in prometheus/alerts_test.yml by `promtool test rules`) and
// grafana/outbox.json (a Grafana dashboard). These tests need promtool
// (Debian's prometheus package; scripts/test.sh extracts it). The metric
// names both files use are checked against a running relay's /metrics by
// internal/cli's TestRelayThroughBrokerOutage.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const promtoolInstall = "apt-get install prometheus (Debian's package ships promtool), or run scripts/test.sh"

// promtool runs promtool with args in dir and returns its output; it fails
// the test if promtool is missing or exits non-zero.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed: %s", promtoolInstall)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func TestAlertRules(t *testing.T) {
	t.Logf("%s", promtool(t, "prometheus", "check", "rules", "alerts.yml"))
	t.Logf("%s", promtool(t, "prometheus", "test", "rules", "alerts_test.yml"))
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range []string{"OutboxBacklogGrowing", "OutboxOldestMessageTooOld", "OutboxDeadLettersIncreasing",
		"OutboxNoLiveRelay", "OutboxLeaseChurn", "OutboxDestinationBlocked", "OutboxXminHorizonHeld"} {
		if !bytes.Contains(b, []byte("alert: "+alert+"\n")) {
			t.Errorf("alerts.yml has no alert %s", alert)
		}
		tests, _ := os.ReadFile("prometheus/alerts_test.yml")
		if !bytes.Contains(tests, []byte("alertname: "+alert+"\n")) {
			t.Errorf("alerts_test.yml does not test %s", alert)
		}
	}
}

// dashboard is the part of a Grafana dashboard the test checks.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/outbox.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/outbox.json: %v", err)
	}
	return d
}

// TestDashboardStructure checks what Grafana needs to import the
// dashboard: unique panel IDs, a grid 24 columns wide without overlaps,
// the data source variable on every query, the panels the issue lists, and
// expressions that are valid PromQL once Grafana's variables are replaced
// (checked by promtool as recording rules).
func TestDashboardStructure(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 {
		t.Errorf("title %q, uid %q, schemaVersion %d: want a title, a uid and a recent schema", d.Title, d.UID, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["job"] != "query" {
		t.Errorf("templating %v: want a datasource variable and a job query variable", vars)
	}
	ids := map[int]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	titles := map[string]bool{}
	var exprs []string
	for _, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		titles[p.Title] = true
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps %q at (%d, %d)", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		switch p.Type {
		case "timeseries", "stat", "table", "gauge", "bargauge":
		default:
			t.Errorf("panel %q: type %q", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: refId %q missing or repeated", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			if !strings.Contains(q.Expr, `job=~"$job"`) {
				t.Errorf("panel %q: query %q ignores the job variable", p.Title, q.Expr)
			}
			exprs = append(exprs, q.Expr)
		}
	}
	for _, want := range []string{"Throughput by topic", "Publish latency", "Backlog per topic", "Oldest message age per topic",
		"Dead letters", "Failures by kind", "Leases per relay", "Blocked destinations"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}

	// Every query as a recording rule, for promtool to parse.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	vars2 := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*")
	for i, e := range exprs {
		q, err := json.Marshal(vars2.Replace(e))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "dashboard.yml")
}
