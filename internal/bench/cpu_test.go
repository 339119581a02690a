package bench

import (
	"strings"
	"testing"
	"time"
)

func TestParseCPUStat(t *testing.T) {
	stat := []byte(`cpu  100 5 50 800 20 3 2 10 7 0
cpu0 50 2 25 400 10 1 1 5 3 0
intr 12345
`)
	busy, total, ok := parseCPUStat(stat)
	if !ok {
		t.Fatal("parseCPUStat: not ok")
	}
	// user nice system idle iowait irq softirq steal: guest is in user.
	if wantTotal := uint64(100 + 5 + 50 + 800 + 20 + 3 + 2 + 10); total != wantTotal {
		t.Errorf("total = %d, want %d", total, wantTotal)
	}
	if wantBusy := uint64(100 + 5 + 50 + 3 + 2 + 10); busy != wantBusy {
		t.Errorf("busy = %d, want %d", busy, wantBusy)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 x 3 4 5\n"} {
		if _, _, ok := parseCPUStat([]byte(bad)); ok {
			t.Errorf("parseCPUStat(%q) ok, want not ok", bad)
		}
	}
}

func TestCPUWindow(t *testing.T) {
	var c cpuWindow
	if got := c.end(); got != -1 {
		t.Errorf("end without begin = %v, want -1", got)
	}
	_, before, ok := readCPUStat()
	c.begin()
	if !ok {
		// No /proc/stat on this system: the bench reports -1.
		if got := c.end(); got != -1 {
			t.Errorf("end without /proc/stat = %v, want -1", got)
		}
		return
	}
	// Spin until the kernel's counters move (a tick is 10 ms or less).
	for {
		if _, now, _ := readCPUStat(); now > before+1 {
			break
		}
	}
	if got := c.end(); !(got >= 0 && got <= 100) {
		t.Errorf("end = %v, want a percentage", got)
	}
}

func TestParseProcStat(t *testing.T) {
	// comm holds spaces and a parenthesis; utime stime cutime cstime are
	// fields 14 to 17.
	line := "4242 (postgres: a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 1 0 100 0 0\n"
	got, ok := parseProcStat(line)
	if !ok {
		t.Fatal("parseProcStat: not ok")
	}
	want := procTimes{ppid: 17, cpu: 3 * time.Second, children: 500 * time.Millisecond}
	if got != want {
		t.Errorf("parseProcStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S z 1 1 0 -1 0 0 0 0 0 1 1 1 1"} {
		if _, ok := parseProcStat(bad); ok {
			t.Errorf("parseProcStat(%q): ok, want not", bad)
		}
	}
}

func TestCPUPerMessage(t *testing.T) {
	u := cpuUse{Client: 4 * time.Millisecond, Server: 10 * time.Millisecond, Broker: -1, Relays: []time.Duration{time.Millisecond, 3 * time.Millisecond}}
	if got, want := u.perMessage(1000, benchWaits), (ProcessCPU{Postgres: 10, Broker: -1, Relay: 4, Producers: -1}); got != want {
		t.Errorf("relay processes: %+v, want %+v", got, want)
	}
	if got, want := u.perMessage(1000, benchProduces), (ProcessCPU{Postgres: 10, Broker: -1, Relay: 4, Producers: 4}); got != want {
		t.Errorf("producers: %+v, want %+v", got, want)
	}
	u.Relays = nil
	if got, want := u.perMessage(1000, benchRelays), (ProcessCPU{Postgres: 10, Broker: -1, Relay: 4, Producers: -1}); got != want {
		t.Errorf("the bench's process relays: %+v, want %+v", got, want)
	}
	if got := coreShare(u, 2*time.Second, benchProduces); got.Postgres != 0.5 || got.Producers != 0.2 || got.Relay != -1 {
		t.Errorf("coreShare = %+v, want PostgreSQL 0.5%%, producers 0.2%%, no relay", got)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP outbox_published_total Messages acknowledged by the broker.
# TYPE outbox_published_total counter
outbox_published_total{topic="a"} 3
outbox_published_total{topic="b {x}"} 4.5e0
outbox_published_total_extra 100
outbox_leases 64
outbox_fetch_duration_seconds_sum 0.25
outbox_fetch_duration_seconds_count 7 1700000000000
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"outbox_published_total": 7.5, "outbox_leases": 64, "outbox_fetch_duration_seconds_count": 7, "outbox_published_total_extra": 100} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
	times := relayTimes([]map[string]float64{m, m})
	if times.Published != 14 || times.Fetches != 14 || times.FetchTime != 500*time.Millisecond {
		t.Errorf("relayTimes = %+v, want 14 published (whole messages), 14 fetches taking 500ms", times)
	}
	if _, err := parseMetrics(strings.NewReader("outbox_leases{x=\"1\" 3\n")); err == nil {
		t.Error("parseMetrics of a malformed sample: no error")
	}
}

func TestPostgresSettings(t *testing.T) {
	durable, fast := postgresSettings(false), postgresSettings(true)
	for k, v := range map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on"} {
		if durable[k] != v {
			t.Errorf("durable %s = %q, want %q", k, durable[k], v)
		}
	}
	if fast["fsync"] != "off" || fast["full_page_writes"] != "off" || fast["shared_preload_libraries"] != "pg_stat_statements" {
		t.Errorf("fast settings %v: want fsync and full_page_writes off, pg_stat_statements loaded", fast)
	}
}
