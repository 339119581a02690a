package cli_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// promtoolInstall is how to get promtool, for the failure message.
const promtoolInstall = "apt-get install prometheus (Debian's package ships promtool), or run scripts/test.sh"

// scrape returns the families of the relay's /metrics and the raw text.
func scrape(t *testing.T, addr string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams, body
}

// gauge returns the value of the series of name whose labels include
// label=value (any series when label is ""), and whether there is one.
func gauge(fams map[string]*dto.MetricFamily, name, label, value string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		match := label == ""
		for _, l := range m.GetLabel() {
			match = match || l.GetName() == label && l.GetValue() == value
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// readyz returns /readyz's status code and decoded body.
func readyz(t *testing.T, addr string) (int, map[string]any) {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/readyz")
	var r map[string]any
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/readyz body is not JSON: %v\n%s", err, body)
	}
	return code, r
}

func status(r map[string]any, component string) string {
	c, _ := r[component].(map[string]any)
	s, _ := c["status"].(string)
	return s
}

// metricNameRe finds metric names in the dashboard and the alerts.
var metricNameRe = regexp.MustCompile(`\boutbox_[a-z0-9_]+`)

// checkDeployedNames checks that every metric the Grafana dashboard and
// the Prometheus alerts use is in fams, a scrape of a running relay. A
// histogram's _bucket, _sum and _count series count as its family.
func checkDeployedNames(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	for _, f := range []string{"../../deploy/grafana/outbox.json", "../../deploy/prometheus/alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		names := metricNameRe.FindAllString(string(b), -1)
		if len(names) < 10 {
			t.Fatalf("%s names %d metrics; the pattern finds nothing?", f, len(names))
		}
		for _, name := range names {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if h, ok := fams[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && h.GetType() == dto.MetricType_HISTOGRAM {
					base = strings.TrimSuffix(name, suffix)
				}
			}
			if _, ok := fams[base]; !ok {
				t.Errorf("%s uses %s, which the relay does not export", f, name)
			}
		}
	}
}

// promtoolCheckMetrics runs `promtool check metrics` on a scrape: it lints
// names, types, units and help texts.
func promtoolCheckMetrics(t *testing.T, text string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed: %s", promtoolInstall)
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
}

// TestRelayThroughBrokerOutage scrapes a running relay (PostgreSQL and an
// embedded NATS server) while the broker goes away and comes back:
// /readyz turns 503 naming the broker, the backlog and lag gauges rise
// during the outage, and everything recovers. The scrapes pass promtool,
// and hold every metric the Grafana dashboard and the alerts use.
func TestRelayThroughBrokerOutage(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 8)
	ns := testenv.StoppableNATS(t)
	st := streamAt(t, ns.URL(), "orders.>")

	b := start(t, map[string]string{"OUTBOX_STORE": dsn, "OUTBOX_HTTP_ADDR": "127.0.0.1:0"}, "relay", "--broker", ns.URL(),
		"--log-format", "json", "--publish-timeout", "1s", "--poll-interval", "50ms",
		"--ready-grace", "300ms", "--backlog-interval", "50ms", "--pprof")
	addr := httpAddrFromLog(t, b)

	write(t, dsn, messages("orders.created", 20, 5))
	poll(t, "the first messages to reach the stream", func() bool { return streamMsgs(t, st) == 20 })
	poll(t, "/readyz 200 and an empty backlog in /metrics", func() bool {
		code, _ := readyz(t, addr)
		fams, _ := scrape(t, addr)
		lag, ok := gauge(fams, "outbox_lag_seconds", "", "")
		return code == http.StatusOK && ok && lag == 0
	})
	if code, body := httpGet(t, "http://"+addr+"/debug/pprof/cmdline"); code != http.StatusOK || body == "" {
		t.Errorf("/debug/pprof/cmdline with --pprof: %d %q", code, body)
	}
	_, text := scrape(t, addr)
	promtoolCheckMetrics(t, text)

	// The outage.
	ns.Stop()
	write(t, dsn, messages("orders.created", 30, 5))
	var down map[string]any
	poll(t, "/readyz to answer 503", func() bool {
		var code int
		code, down = readyz(t, addr)
		return code == http.StatusServiceUnavailable
	})
	t.Logf("/readyz during the outage: %v", down)
	if status(down, "broker") != "down" || status(down, "store") != "ok" || down["ready"] != false {
		t.Errorf("/readyz during the outage: %v; want broker down, store ok", down)
	}
	// The unreachable broker blocks the destination: listed, not failing
	// readiness by itself.
	poll(t, "/readyz and /metrics to list orders.created as blocked", func() bool {
		_, r := readyz(t, addr)
		blocked, _ := r["blocked_destinations"].([]any)
		fams, _ := scrape(t, addr)
		n, _ := gauge(fams, "outbox_blocked_destinations", "", "")
		_, since := gauge(fams, "outbox_destination_blocked_since_seconds", "destination", "orders.created")
		return len(blocked) == 1 && n == 1 && since
	})
	var lag1, age1 float64
	poll(t, "the backlog gauges to show the stuck messages", func() bool {
		fams, _ := scrape(t, addr)
		n, _ := gauge(fams, "outbox_outstanding_messages", "topic", "orders.created")
		lag1, _ = gauge(fams, "outbox_lag_seconds", "", "")
		age1, _ = gauge(fams, "outbox_oldest_message_age_seconds", "topic", "orders.created")
		up, _ := gauge(fams, "outbox_broker_up", "", "")
		return n == 30 && lag1 > 0 && age1 > 0 && up == 0
	})
	poll(t, "the lag and the oldest age to rise", func() bool {
		fams, _ := scrape(t, addr)
		lag, _ := gauge(fams, "outbox_lag_seconds", "", "")
		age, _ := gauge(fams, "outbox_oldest_message_age_seconds", "topic", "orders.created")
		return lag > lag1 && age > age1
	})
	fams, text := scrape(t, addr)
	if up, _ := gauge(fams, "outbox_store_up", "", ""); up != 1 {
		t.Errorf("outbox_store_up = %v during a broker outage, want 1", up)
	}
	promtoolCheckMetrics(t, text)
	checkDeployedNames(t, fams)

	// The broker comes back.
	ns.Start()
	poll(t, "/readyz to answer 200 again", func() bool {
		code, _ := readyz(t, addr)
		return code == http.StatusOK
	})
	poll(t, "the stuck messages to reach the stream", func() bool { return streamMsgs(t, st) >= 50 })
	poll(t, "the backlog gauges to empty", func() bool {
		fams, _ := scrape(t, addr)
		lag, _ := gauge(fams, "outbox_lag_seconds", "", "")
		// An emptied topic keeps its series, at 0 (issue 23: "empty" is
		// not "not scraped").
		outstanding, listed := gauge(fams, "outbox_outstanding_messages", "topic", "orders.created")
		up, _ := gauge(fams, "outbox_broker_up", "", "")
		blocked, _ := gauge(fams, "outbox_blocked_destinations", "", "")
		return lag == 0 && listed && outstanding == 0 && up == 1 && blocked == 0
	})
	fams, _ = scrape(t, addr)
	if v, _ := gauge(fams, "outbox_published_total", "topic", "orders.created"); v < 50 {
		t.Errorf("outbox_published_total{orders.created} = %v, want at least 50", v)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
}
