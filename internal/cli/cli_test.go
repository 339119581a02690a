package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/cli"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// childEnv makes the test binary run the outbox command instead of the
// tests (see TestRelayExitsZeroOnSIGTERM).
const childEnv = "OUTBOX_CLI_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	testenv.Main(m)
}

// waitFor bounds every poll of the tests.
const waitFor = 30 * time.Second

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is a finished command run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// lookup returns a LookupEnv reading only vars, so that the developer's own
// OUTBOX_* variables never reach the tests.
func lookup(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

// run runs the outbox command in-process.
func run(t *testing.T, vars map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr syncBuffer
	code := cli.Run(t.Context(), args, cli.Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: lookup(vars)})
	return result{code, stdout.String(), stderr.String()}
}

// mustRun runs the command and fails unless it exits 0.
func mustRun(t *testing.T, vars map[string]string, args ...string) result {
	t.Helper()
	r := run(t, vars, args...)
	if r.code != 0 {
		t.Fatalf("outbox %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// background is a command running in a goroutine until its context is
// cancelled.
type background struct {
	cancel         context.CancelFunc
	stdout, stderr *syncBuffer
	done           chan int
}

func start(t *testing.T, vars map[string]string, args ...string) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{cancel: cancel, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan int, 1)}
	go func() {
		b.done <- cli.Run(ctx, args, cli.Env{Stdout: b.stdout, Stderr: b.stderr, LookupEnv: lookup(vars)})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-b.done:
		case <-time.After(waitFor):
			t.Errorf("outbox %s did not stop within %v", args[0], waitFor)
		}
	})
	return b
}

// stop cancels the command's context and returns its exit code.
func (b *background) stop(t *testing.T) int {
	t.Helper()
	b.cancel()
	select {
	case code := <-b.done:
		b.done <- code // for the cleanup
		return code
	case <-time.After(waitFor):
		t.Fatalf("command did not stop within %v; stderr:\n%s", waitFor, b.stderr)
		return -1
	}
}

// exited reports a command that ended before the test stopped it.
func (b *background) exited() (int, bool) {
	select {
	case code := <-b.done:
		b.done <- code
		return code, true
	default:
		return 0, false
	}
}

// poll calls cond until it returns true, failing after waitFor.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitFor, what)
		}
		<-tick.C
	}
}

// httpAddrFromLog returns the address of the "http listening" JSON log line.
func httpAddrFromLog(t *testing.T, b *background) string {
	t.Helper()
	var addr string
	poll(t, "the relay to log its HTTP address", func() bool {
		if code, ok := b.exited(); ok {
			t.Fatalf("relay exited with %d before listening:\n%s", code, b.stderr)
		}
		addr = findHTTPAddr(b.stderr.String())
		return addr != ""
	})
	return addr
}

func findHTTPAddr(log string) string {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "http listening" {
			return rec.Addr
		}
	}
	return ""
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// migrated returns the DSN of a new database with the outbox tables.
func migrated(t *testing.T, partitions int) string {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	mustRun(t, nil, "migrate", "--store", dsn, "--partitions", fmt.Sprint(partitions))
	return dsn
}

// write commits msgs into the outbox of dsn (default schema and prefix).
func write(t *testing.T, dsn string, msgs []outbox.Message) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// messages returns n messages of topic spread over keys.
func messages(topic string, n, keys int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{
			Topic:   topic,
			Key:     fmt.Sprintf("order-%d", i%keys),
			Payload: fmt.Appendf(nil, `{"n":%d}`, i),
		}
	}
	return msgs
}

// stream creates a JetStream stream for subjects on s and returns it.
func stream(t *testing.T, s *server.Server, subjects ...string) jetstream.Stream {
	t.Helper()
	return streamAt(t, s.ClientURL(), subjects...)
}

// streamAt creates a stream for subjects on the NATS server at url, over
// a connection that reconnects for as long as the test runs.
func streamAt(t *testing.T, url string, subjects ...string) jetstream.Stream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: strings.ToUpper(testenv.Name(t)), Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// setMaxMsgSize sets the largest message st accepts (-1: no limit).
func setMaxMsgSize(t *testing.T, s *server.Server, st jetstream.Stream, size int32) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = size
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

func streamMsgs(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// statusJSON runs `outbox status --json`.
func statusJSON(t *testing.T, dsn string) *outbox.Status {
	t.Helper()
	r := mustRun(t, nil, "status", "--store", dsn, "--json")
	var st outbox.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	return &st
}

func TestMigrateTwiceIsIdempotent(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)

	// The flag beats the variable: OUTBOX_STORE is wrong, --store is right.
	r := mustRun(t, map[string]string{"OUTBOX_STORE": "mysql://nope"}, "migrate", "--store", dsn, "--schema", "app_outbox", "--partitions", "8")
	if !strings.Contains(r.stdout, "(8 partitions)") {
		t.Fatalf("first migrate: %v", r)
	}
	// The variable beats the default: no --store, no --schema.
	r = mustRun(t, map[string]string{"OUTBOX_STORE": dsn, "OUTBOX_SCHEMA": "app_outbox"}, "migrate")
	if !strings.Contains(r.stdout, "(8 partitions)") {
		t.Fatalf("second migrate: %v", r)
	}

	// Both runs left one set of tables in the schema.
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'app_outbox' AND table_name = 'outbox_messages'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 1 {
		t.Fatalf("found %d outbox_messages tables in schema app_outbox, want 1", tables)
	}

	// P is fixed once the tables exist.
	if r := run(t, nil, "migrate", "--store", dsn, "--schema", "app_outbox", "--partitions", "16"); r.code == 0 {
		t.Fatalf("migrate with another partition count succeeded: %v", r)
	}
}

func TestRelayDrainsBacklogAndServesHTTP(t *testing.T) {
	t.Parallel()
	const partitions, n = 8, 300
	dsn := migrated(t, partitions)
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	write(t, dsn, messages("orders.created", n-50, 20))
	write(t, dsn, messages("orders.paid", 50, 5))

	node := "relay-" + testenv.Name(t)
	vars := map[string]string{"OUTBOX_STORE": dsn, "OUTBOX_HTTP_ADDR": "127.0.0.1:0", "OUTBOX_WORKERS": "3"}
	b := start(t, vars, "relay", "--broker", ns.ClientURL(), "--node", node, "--log-format", "json",
		"--batch", "50", "--publish-timeout", "2s", "--poll-interval", "50ms")
	addr := httpAddrFromLog(t, b)

	poll(t, "the backlog to reach the stream", func() bool { return streamMsgs(t, st) >= n })
	if got := streamMsgs(t, st); got != n {
		t.Fatalf("stream holds %d messages, want %d", got, n)
	}

	if code, body := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	poll(t, "/readyz to answer 200", func() bool {
		code, _ := httpGet(t, "http://"+addr+"/readyz")
		return code == http.StatusOK
	})
	// The counters are updated after settling: wait for all of them.
	poll(t, "/metrics to count every published message", func() bool {
		_, body := httpGet(t, "http://"+addr+"/metrics")
		return strings.Contains(body, `outbox_published_total{topic="orders.created"} 250`) &&
			strings.Contains(body, `outbox_published_total{topic="orders.paid"} 50`)
	})
	_, metrics := httpGet(t, "http://"+addr+"/metrics")
	for _, want := range []string{"outbox_publish_duration_seconds_bucket", "outbox_leases " + fmt.Sprint(partitions), "go_goroutines", "outbox_build_info{goversion=\"go"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// While the relay runs, status shows it with its leases and no backlog
	// (the settle of the last batch may trail the stream by a moment).
	var s *outbox.Status
	poll(t, "status to show an empty outbox", func() bool {
		s = statusJSON(t, dsn)
		return s.Outstanding == 0
	})
	if len(s.Relays) != 1 || s.Relays[0].Node != node || s.Relays[0].Partitions != partitions {
		t.Fatalf("status relays = %+v, want %s holding %d partitions", s.Relays, node, partitions)
	}
	r := mustRun(t, nil, "status", "--store", dsn)
	if !regexp.MustCompile(`(?m)^outstanding\s+0$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^`+node+`\s+8\s+\S+`).MatchString(r.stdout) {
		t.Fatalf("status text:\n%s", r.stdout)
	}

	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d after its context was cancelled:\n%s", code, b.stderr)
	}
	if log := b.stderr.String(); !strings.Contains(log, `"msg":"relay stopped"`) || !strings.Contains(log, `"published":300`) {
		t.Fatalf("relay log lacks the final stats:\n%s", log)
	}
	// Stop handed the leases back: no live relay.
	if s := statusJSON(t, dsn); len(s.Relays) != 0 {
		t.Fatalf("relays after stop = %+v, want none", s.Relays)
	}
}

func TestStatusShowsBacklog(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	write(t, dsn, messages("orders.created", 7, 3))
	write(t, dsn, messages("orders.paid", 2, 2))

	r := mustRun(t, nil, "status", "--store", dsn)
	t.Logf("status:\n%s", r.stdout)
	for _, re := range []string{
		`(?m)^outstanding\s+9$`,
		`(?m)^oldest\s+\S+ \(written \d{4}-\d\d-\d\dT`,
		`(?m)^dead letters\s+0$`,
		`(?m)^live relays\s+0$`,
		`(?m)^TOPIC\s+OUTSTANDING$`,
		`(?m)^orders\.created\s+7$`,
		`(?m)^orders\.paid\s+2$`,
		`(?m)^PARTITION\s+OUTSTANDING\s+OWNER\s+EPOCH\s+LEASE EXPIRES IN$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("status text does not match %s:\n%s", re, r.stdout)
		}
	}

	s := statusJSON(t, dsn)
	if s.Outstanding != 9 || s.DeadLetters != 0 || len(s.Partitions) != 4 || s.OldestCreatedAt.IsZero() {
		t.Fatalf("status --json = %+v", s)
	}
	var sum int64
	for _, p := range s.Partitions {
		sum += p.Outstanding
	}
	if sum != 9 {
		t.Fatalf("partition backlog adds up to %d, want 9", sum)
	}
	topics := map[string]int64{}
	for _, tc := range s.Topics {
		topics[tc.Topic] = tc.Count
	}
	if topics["orders.created"] != 7 || topics["orders.paid"] != 2 {
		t.Fatalf("topics = %v", topics)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, nil, "status", "--store", dsn, "--json").stdout), &raw); err != nil {
		t.Fatal(err)
	}
	if age, ok := raw["oldest_age_seconds"].(float64); !ok || age < 0 {
		t.Fatalf("oldest_age_seconds = %v", raw["oldest_age_seconds"])
	}
}

func TestDLQListRequeuePurge(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	// The stream on "nostream.>" takes no message as large as these (with
	// their headers): publishing fails for good (a missing stream would only
	// block the topic) and the relay dead-letters at once.
	st := stream(t, ns, "nostream.>")
	setMaxMsgSize(t, ns, st, 64)
	write(t, dsn, messages("nostream.created", 3, 3))
	write(t, dsn, messages("nostream.paid", 2, 2))

	b := start(t, nil, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", "", "--poll-interval", "50ms")
	poll(t, "five dead letters", func() bool {
		if code, ok := b.exited(); ok {
			t.Fatalf("relay exited with %d:\n%s", code, b.stderr)
		}
		return statusJSON(t, dsn).DeadLetters == 5
	})
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}

	// list, text.
	r := mustRun(t, nil, "dlq", "list", "--store", dsn)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 || !regexp.MustCompile(`^ID\s+TOPIC\s+KEY\s+ATTEMPTS\s+FAILED\s+LAST ERROR$`).MatchString(lines[0]) {
		t.Fatalf("dlq list:\n%s", r.stdout)
	}
	// list, JSON, with a filter.
	var dls []struct {
		ID        string          `json:"id"`
		Topic     string          `json:"topic"`
		Key       string          `json:"key"`
		LastError string          `json:"last_error"`
		Payload   json.RawMessage `json:"payload"`
	}
	t.Logf("dlq list:\n%s", r.stdout)
	r = mustRun(t, nil, "dlq", "list", "--store", dsn, "--topic", "nostream.created", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &dls); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(dls) != 3 {
		t.Fatalf("dlq list --topic nostream.created gave %d dead letters, want 3:\n%s", len(dls), r.stdout)
	}
	for _, d := range dls {
		if d.Topic != "nostream.created" || d.LastError == "" || !json.Valid(d.Payload) || outbox.ValidateID(d.ID) != nil {
			t.Fatalf("dead letter %+v", d)
		}
	}
	if r := mustRun(t, nil, "dlq", "list", "--store", dsn, "--limit", "2", "--json"); strings.Count(r.stdout, `"id"`) != 2 {
		t.Fatalf("dlq list --limit 2:\n%s", r.stdout)
	}

	// show, by ID (users type show, issue 23): the whole record; JSON as
	// list's; an unknown ID fails naming it; no ID is a usage error.
	r = mustRun(t, nil, "dlq", "show", "--store", dsn, dls[1].ID)
	var payload bytes.Buffer
	if err := json.Compact(&payload, dls[1].Payload); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{dls[1].ID, "nostream.created", "Last error", strings.Join(strings.Fields(dls[1].LastError), " "), "Attempts", payload.String()} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("dlq show lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := mustRun(t, nil, "dlq", "show", "--store", dsn, "--json", dls[1].ID, dls[2].ID); strings.Count(r.stdout, `"id"`) != 2 {
		t.Fatalf("dlq show --json of two IDs:\n%s", r.stdout)
	}
	if r := run(t, nil, "dlq", "show", "--store", dsn, "0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d"); r.code != 1 || !strings.Contains(r.stderr, "no dead letter with ID 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d") {
		t.Fatalf("dlq show of an unknown ID: %v", r)
	}
	if r := run(t, nil, "dlq", "show", "--store", dsn); r.code != 2 || !strings.Contains(r.stderr, "give the ID") {
		t.Fatalf("dlq show without an ID: %v", r)
	}

	// requeue one, by ID: it is back in the outbox.
	r = mustRun(t, nil, "dlq", "requeue", "--store", dsn, "--id", dls[0].ID)
	if strings.TrimSpace(r.stdout) != "requeued 1 dead letter" {
		t.Fatalf("dlq requeue: %v", r)
	}
	if s := statusJSON(t, dsn); s.Outstanding != 1 || s.DeadLetters != 4 {
		t.Fatalf("after requeue: outstanding %d, dead letters %d; want 1 and 4", s.Outstanding, s.DeadLetters)
	}

	// purge: without a filter it wants --yes.
	if r := run(t, nil, "dlq", "purge", "--store", dsn); r.code != 2 || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("dlq purge without filters or --yes: %v", r)
	}
	if s := statusJSON(t, dsn); s.DeadLetters != 4 {
		t.Fatalf("a refused purge deleted dead letters: %d left", s.DeadLetters)
	}
	// A filter that matches nothing yet (they failed seconds ago).
	r = mustRun(t, nil, "dlq", "purge", "--store", dsn, "--older-than", "1h", "--json")
	if strings.TrimSpace(r.stdout) != `{"purged":0}` {
		t.Fatalf("dlq purge --older-than 1h: %v", r)
	}
	r = mustRun(t, nil, "dlq", "purge", "--store", dsn, "--topic", "nostream.paid")
	if strings.TrimSpace(r.stdout) != "purged 2 dead letters" {
		t.Fatalf("dlq purge --topic: %v", r)
	}
	r = mustRun(t, nil, "dlq", "purge", "--store", dsn, "--yes")
	if strings.TrimSpace(r.stdout) != "purged 2 dead letters" {
		t.Fatalf("dlq purge --yes: %v", r)
	}
	if r := mustRun(t, nil, "dlq", "list", "--store", dsn); strings.TrimSpace(r.stdout) != "no dead letters" {
		t.Fatalf("dlq list after purge: %v", r)
	}
	if r := mustRun(t, nil, "dlq", "list", "--store", dsn, "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("dlq list --json after purge: %v", r)
	}

	// The requeued message goes out once the stream takes it.
	setMaxMsgSize(t, ns, st, -1)
	b2 := start(t, nil, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", "", "--poll-interval", "50ms")
	poll(t, "the requeued message to be published", func() bool { return streamMsgs(t, st) == 1 })
	if code := b2.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b2.stderr)
	}
}

// TestUsageErrors checks that mistakes exit 2 with one line that names the
// flag. None of these reaches a server.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	const (
		pg   = "postgres://outbox@127.0.0.1:1/app"
		nats = "nats://127.0.0.1:1"
	)
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want []string
	}{
		{"unknown scheme", nil, []string{"migrate", "--store", "oracle://u:pw@localhost/app"}, []string{"--store", `unknown scheme "oracle"`, "postgres"}},
		{"malformed URL", nil, []string{"status", "--store", "postgres://u:hunter22@db:port/app"}, []string{"--store", "not a valid URL"}},
		{"missing store", nil, []string{"migrate"}, []string{"--store is required", "OUTBOX_STORE"}},
		{"hostile schema", nil, []string{"migrate", "--store", pg, "--schema", `x"; DROP TABLE users; --`}, []string{"--schema", "use only letters"}},
		{"hostile schema in URL", nil, []string{"dlq", "list", "--store", pg + "?schema=a%3Bb"}, []string{"--schema", "use only letters"}},
		// PostgreSQL's own limits name the flag and the URL parameter too.
		{"prefix too long for PostgreSQL", nil, []string{"migrate", "--store", pg + "?prefix=" + strings.Repeat("p", 40)}, []string{"?prefix= in --store", "--table-prefix", "is 40 bytes; the limit is 39"}},
		{"system schema in URL", nil, []string{"migrate", "--store", pg + "?schema=information_schema"}, []string{"?schema= in --store", `"information_schema" is a system schema`}},
		{"system schema flag", nil, []string{"status", "--store", pg, "--schema", "pg_outbox"}, []string{"--schema", `"pg_outbox" is a system schema`}},
		{"workers 0", nil, []string{"relay", "--store", pg, "--broker", nats, "--workers", "0"}, []string{"--workers", "between 1 and 256, got 0"}},
		{"in-flight 0", nil, []string{"relay", "--store", pg, "--broker", nats, "--in-flight", "0"}, []string{"--in-flight", "between 1 and 64, got 0"}},
		{"ordering bogus", nil, []string{"relay", "--store", pg, "--broker", nats, "--ordering", "bogus"}, []string{"--ordering", `"key" or "none"`}},
		{"on-permanent bogus", nil, []string{"relay", "--store", pg, "--broker", nats, "--on-permanent", "bogus"}, []string{"--on-permanent", `"dead-letter" or "hold"`}},
		{"order-scope bogus", nil, []string{"relay", "--store", pg, "--broker", nats, "--order-scope", "partition"}, []string{"--order-scope", `"topic" or "key"`}},
		{"bad http addr", nil, []string{"relay", "--store", pg, "--broker", nats, "--http-addr", "nonsense"}, []string{"--http-addr", "host:port"}},
		{"bad http port", nil, []string{"relay", "--store", pg, "--broker", nats, "--http-addr", "127.0.0.1:99999"}, []string{"--http-addr", "0 to 65535"}},
		{"lease below publish timeout", nil, []string{"relay", "--store", pg, "--broker", nats, "--publish-timeout", "20s", "--lease-ttl", "30s"}, []string{"--lease-ttl", "LeaseTTL must exceed 2 × PublishTimeout"}},
		{"negative duration", nil, []string{"relay", "--store", pg, "--broker", nats, "--shutdown-timeout", "-1s"}, []string{"--shutdown-timeout", "positive"}},
		{"missing broker", nil, []string{"relay", "--store", pg}, []string{"--broker is required"}},
		{"zero ready grace", nil, []string{"relay", "--store", pg, "--broker", nats, "--ready-grace", "0s"}, []string{"--ready-grace", "positive"}},
		{"tiny backlog interval", nil, []string{"relay", "--store", pg, "--broker", nats, "--backlog-interval", "1ms"}, []string{"--backlog-interval", "at least 10ms"}},
		{"zero backlog limit", nil, []string{"relay", "--store", pg, "--broker", nats, "--backlog-limit", "0"}, []string{"--backlog-limit", "between 1 and 100000000"}},
		{"broker scheme", nil, []string{"relay", "--store", pg, "--broker", "amqp0://x"}, []string{"--broker", `unknown scheme "amqp0"`}},
		{"unknown flag", nil, []string{"relay", "--wokers", "3"}, []string{"unknown flag: --wokers"}},
		{"not a number", nil, []string{"relay", "--workers", "many"}, []string{"--workers"}},
		{"unknown command", nil, []string{"relais"}, []string{`unknown command "relais"`}},
		{"dlq without subcommand", nil, []string{"dlq"}, []string{"list, show, requeue or purge"}},
		{"purge everything without --yes", nil, []string{"dlq", "purge", "--store", pg}, []string{"--yes"}},
		{"bad id", nil, []string{"dlq", "requeue", "--store", pg, "--id", "42"}, []string{"--id", "not a UUID"}},
		{"bad topic", nil, []string{"dlq", "list", "--store", pg, "--topic", "a..b"}, []string{"--topic", "empty token"}},
		{"zero limit", nil, []string{"dlq", "list", "--store", pg, "--limit", "0"}, []string{"--limit", "between 1 and 10000"}},
		{"log format", nil, []string{"status", "--store", pg, "--log-format", "xml"}, []string{"--log-format", "text or json"}},
		{"env not a number", map[string]string{"OUTBOX_WORKERS": "abc"}, []string{"relay"}, []string{"OUTBOX_WORKERS", "--workers"}},
		{"env out of range", map[string]string{"OUTBOX_WORKERS": "0"}, []string{"relay", "--store", pg, "--broker", nats}, []string{"--workers (from OUTBOX_WORKERS)", "got 0"}},
		// The flag beats the variable: --workers 2 passes, so the next
		// check (--batch from the environment) is the one that fails.
		{"flag beats env", map[string]string{"OUTBOX_WORKERS": "0", "OUTBOX_BATCH": "0"}, []string{"relay", "--store", pg, "--broker", nats, "--workers", "2"}, []string{"--batch (from OUTBOX_BATCH)"}},
		{"env store scheme", map[string]string{"OUTBOX_STORE": "sqlite3://x"}, []string{"status"}, []string{"--store", `unknown scheme "sqlite3"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, tc.vars, tc.args...)
			if r.code != 2 {
				t.Fatalf("want exit 2: %v", r)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
				t.Fatalf("want one line on stderr: %v", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if strings.Contains(r.stderr, "Options.") {
				t.Errorf("stderr %q names a Go field; it must name the flag or URL parameter", r.stderr)
			}
			if strings.Contains(r.stderr, "hunter22") {
				t.Errorf("stderr shows the password: %q", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout is not empty: %q", r.stdout)
			}
		})
	}
}

func TestRuntimeFailureExitsOne(t *testing.T) {
	t.Parallel()
	// A well-formed URL of a server that is not there (a closed port on
	// this machine).
	r := run(t, nil, "status", "--store", "postgres://outbox:hunter22@127.0.0.1:1/app?connect_timeout=5")
	if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "cannot connect") {
		t.Fatalf("want exit 1 and one line: %v", r)
	}
	if strings.Contains(r.stderr, "hunter22") {
		t.Fatalf("stderr shows the password: %q", r.stderr)
	}
}

func TestHelpListsCommands(t *testing.T) {
	t.Parallel()
	r := mustRun(t, nil, "--help")
	for _, c := range []string{"migrate", "relay", "status", "dlq"} {
		if !regexp.MustCompile(`(?m)^  ` + c + `\s+\S`).MatchString(r.stdout) {
			t.Errorf("--help does not list %s:\n%s", c, r.stdout)
		}
	}
	r = mustRun(t, nil, "relay", "--help")
	if !strings.Contains(r.stdout, "[$OUTBOX_HTTP_ADDR]") || !strings.Contains(r.stdout, "[$OUTBOX_STORE]") {
		t.Errorf("relay --help does not name the environment variables:\n%s", r.stdout)
	}
	if r := mustRun(t, nil, "dlq", "purge", "--help"); strings.Contains(r.stdout, "OUTBOX_YES") {
		t.Errorf("--yes must not be read from the environment:\n%s", r.stdout)
	}
}

// TestRelayExitsZeroOnSIGTERM runs the real signal path: the test binary
// re-executes itself as `outbox relay` and gets SIGTERM once ready.
func TestRelayExitsZeroOnSIGTERM(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	write(t, dsn, messages("orders.created", 20, 4))

	ctx, cancel := context.WithTimeout(t.Context(), 2*waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "relay", "--broker", ns.ClientURL(), "--log-format", "json", "--poll-interval", "50ms")
	cmd.Env = []string{childEnv + "=1", "OUTBOX_STORE=" + dsn, "OUTBOX_HTTP_ADDR=127.0.0.1:0", "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	addrc := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.Write(append(sc.Bytes(), '\n'))
			if a := findHTTPAddr(sc.Text()); a != "" {
				addrc <- a
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-copied:
		_ = cmd.Wait()
		t.Fatalf("child exited before listening:\n%s", log.String())
	case <-ctx.Done():
		t.Fatalf("child did not log its address:\n%s", log.String())
	}
	poll(t, "the child's /readyz", func() bool {
		code, _ := httpGet(t, "http://"+addr+"/readyz")
		return code == http.StatusOK
	})
	poll(t, "the child to publish the backlog", func() bool { return streamMsgs(t, st) == 20 })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-copied // stderr closes when the child exits
	err = cmd.Wait()
	if err != nil || cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("child after SIGTERM: %v (exit %d)\n%s", err, cmd.ProcessState.ExitCode(), log.String())
	}
	if out := log.String(); !strings.Contains(out, `"msg":"stopping relay"`) || !strings.Contains(out, `"msg":"relay stopped"`) {
		t.Fatalf("child did not stop gracefully:\n%s", out)
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	// The embedded default: SQLite and an embedded NATS server. The keys
	// and producers come from the environment.
	r := mustRun(t, map[string]string{"OUTBOX_KEYS": "10", "OUTBOX_PRODUCERS": "2"},
		"demo", "--duration", "1s", "--rate", "300", "--workers", "2", "--json")
	var sum struct {
		Orders          int64 `json:"orders"`
		Written         int64 `json:"written"`
		ConsumedUnique  int64 `json:"consumed_unique"`
		OrderViolations int64 `json:"order_violations"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("demo --json: %v\n%v", err, r)
	}
	if sum.Orders == 0 || sum.Written != 3*sum.Orders || sum.ConsumedUnique != sum.Written || sum.OrderViolations != 0 {
		t.Fatalf("demo summary %+v", sum)
	}
	// The progress and the text summary went to stderr, without the
	// terminal's redrawing.
	if !strings.Contains(r.stderr, "order violations: 0") || !strings.Contains(r.stderr, "10 customers") || strings.Contains(r.stderr, "\x1b[K") {
		t.Fatalf("demo stderr:\n%s", r.stderr)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"demo", "--keys", "0"}, "--keys must be between 1"},
		{[]string{"demo", "--rate", "-5"}, "--rate must be 0"},
		{[]string{"demo", "--store", "dynamodb://t"}, "--store: the demo runs on postgres://"},
		{[]string{"demo", "--broker", "nats//x"}, "--broker"},
	} {
		if r := run(t, nil, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("outbox %s: want exit 2 and %q: %v", strings.Join(tc.args, " "), tc.want, r)
		}
	}
}

func TestRelayOrderingNone(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	write(t, dsn, messages("orders.created", 40, 40))

	// --http-addr "" serves nothing; the relay claims with SKIP LOCKED.
	b := start(t, map[string]string{"OUTBOX_ORDERING": "none"}, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", "", "--poll-interval", "50ms")
	poll(t, "the backlog to reach the stream", func() bool {
		if code, ok := b.exited(); ok {
			t.Fatalf("relay exited with %d:\n%s", code, b.stderr)
		}
		return streamMsgs(t, st) == 40
	})
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	log := b.stderr.String()
	if !strings.Contains(log, "ordering=none") || !strings.Contains(log, "http disabled") {
		t.Fatalf("relay log:\n%s", log)
	}
}
