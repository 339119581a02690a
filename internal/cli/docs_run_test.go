package cli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestDocumentedCommandsRun runs every shell command of README.md and
// docs/*.md, as written, in sh, against servers this test starts: the
// `outbox` on PATH is the one the README's own `go install ./cmd/outbox`
// built, and each command ends with the exit code it should (0), or, for
// the commands that run until stopped (outbox relay, outbox console), is
// ready (/readyz or the console's page answers 200) and then exits 0 on
// SIGTERM. A documented command that no longer runs fails here.
//
// What the test changes, and only that, is said in one place per group of
// commands (docSetup): the documented hosts and URLs become the test
// servers' addresses, the documented file paths (/etc/outbox/…,
// /run/secrets/…, ca.pem) files of a temporary directory holding what they
// name, $DB, $BROKER and $DATABASE_URL variables of the environment, and a
// few OUTBOX_* variables make long commands short (docShortEnv). The
// commands that cannot run here are listed with the reason in
// docNotRun; a command that is in neither list fails the test.
func TestDocumentedCommandsRun(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	groups := map[string][]docCommand{}
	var order []string
	var install []docCommand
	for _, c := range docCommands(t) {
		if why := docNotRun(c.text); why != "" {
			t.Logf("not run %s:%d (%s): %s", c.file, c.line, why, c.text)
			continue
		}
		g := docGroup(c.text)
		switch g {
		case "":
			t.Errorf("%s:%d: no way to run `%s` is known: add it to docGroup (and docSetup), or to docNotRun with the reason", c.file, c.line, c.text)
			continue
		case "install":
			install = append(install, c)
			continue
		case "bench":
			// Each bench runs for a minute: in parallel, with servers of
			// its own.
			g = fmt.Sprintf("bench-%s:%d", c.file, c.line)
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], c)
	}
	if len(install) != 1 {
		t.Fatalf("the documentation has %d `go install ./cmd/outbox` commands; the others use the outbox it builds", len(install))
	}
	// The README's build command, as written, into a directory of the test.
	env := &docEnv{root: root, dir: t.TempDir(), path: bin}
	env.env = append(env.env, "GOBIN="+bin)
	env.run(t, install[0])
	if _, err := os.Stat(filepath.Join(bin, "outbox")); err != nil {
		t.Fatalf("%s did not build outbox: %v", install[0].text, err)
	}
	ran := 1
	for _, g := range order {
		ran += len(groups[g])
		t.Run(g, func(t *testing.T) {
			t.Parallel()
			e := docSetup(t, g, root, bin)
			for _, c := range groups[g] {
				if t.Failed() {
					t.Logf("not run after the failure above: %s:%d", c.file, c.line)
					continue
				}
				e.run(t, c)
			}
		})
	}
	if ran < 40 {
		t.Fatalf("ran %d documented commands; the extraction finds too few", ran)
	}
	t.Logf("running %d documented commands in %d groups", ran, len(order))
}

// docNotRun says why a documented command is not run here ("" if it is).
func docNotRun(text string) string {
	first := strings.Fields(text)[0]
	switch first {
	case "docker":
		return "needs a Docker engine; deploy/deploy_test.go runs the Dockerfile's build line and checks its image's settings"
	case "install":
		return "needs root (it writes /usr/local/bin, /etc); deploy/deploy_test.go checks the files it installs"
	case "systemctl", "journalctl":
		return "needs systemd as the init system; deploy/deploy_test.go verifies the unit with systemd-analyze"
	case "scripts/test.sh":
		return "it is the suite this test belongs to"
	}
	return ""
}

// docGroup names the group of servers and files a documented command runs
// with; the commands of a group run in their documentation order.
func docGroup(text string) string {
	has := func(s ...string) bool {
		for _, x := range s {
			if !strings.Contains(text, x) {
				return false
			}
		}
		return true
	}
	switch {
	case text == "go install ./cmd/outbox":
		return "install"
	case has("go build", "outbox_slim"), has("outbox version"):
		return "slim"
	case has("go run ./cmd/outbox demo"):
		return "demo"
	case has("go run ./cmd/outbox bench"):
		return "bench"
	case has("go test ./store/postgres", "-bench Backlog"):
		return "backlog-bench"
	case has("mysql://"):
		return "mysql"
	case has("relay@db/app"), has("app@db/app"):
		return "wal"
	case has("tls://nats.example", "--nats-creds-file"):
		return "nats-creds"
	case has("tls://nats.example", "--nats-nkey-file"):
		return "nats-mtls-nkey"
	case has("nats://nats.example", "--nats-token-file"):
		return "nats-token"
	case has("nats://nats.example", "--nats-password-file"):
		return "nats-password"
	case has("kafka://", "--kafka-sasl-mechanism"):
		return "kafka-sasl"
	case has("kafka://", "--broker-cert-file"):
		return "kafka-mtls"
	case has("amqps://"):
		return "amqps"
	case has("rediss://"):
		return "rediss"
	case has("sqs://"):
		return "sqs"
	case has("kinesis://"):
		return "kinesis"
	case has("db.example", "sslcert="):
		return "postgres-cert"
	case has("db.example", "PGPASSFILE"):
		return "postgres-password"
	case has("OTEL_EXPORTER_OTLP_ENDPOINT"):
		return "otel"
	case has("outbox "):
		return "postgres-nats" // the quick start, the console, CloudEvents, docs/deploy.md's migrations
	}
	return ""
}

// docShortEnv makes the documented demo and benchmarks short: the same
// scenarios and flags, on small backlogs and one run (a flag on the
// command line beats its OUTBOX_* variable, so a documented flag stays).
var docShortEnv = []string{
	// demo
	"OUTBOX_DURATION=2s",
	// bench
	"OUTBOX_MESSAGES=300", "OUTBOX_RUNS=1", "OUTBOX_STEADY_DURATION=1s", "OUTBOX_STEADY_WARMUP=0s", "OUTBOX_IDLE_DURATION=1s",
}

// docEnv is how one group's commands run.
type docEnv struct {
	root  string   // the module's root: go commands run there
	dir   string   // the working directory of the other commands, holding their files
	path  string   // the directory whose outbox comes first on PATH
	pairs []string // documented text, test text: replaced in every command
	env   []string // KEY=value added to the environment
	// before, if set, runs before each command (fixtures the commands
	// before it made possible, such as a dead letter once tables exist).
	before func(t *testing.T, text string)
	// check, if set, checks a command's output after it succeeded.
	check func(t *testing.T, text, stdout string)
	// publish, if not 0, is how many messages a relay must have published
	// (its /metrics) before it is stopped; before writes them.
	publish int
}

// replace adds documented → test replacements.
func (e *docEnv) replace(pairs ...string) { e.pairs = append(e.pairs, pairs...) }

// file writes a file of the working directory; a documented absolute path
// (/etc/outbox/ca.pem) becomes the same path under the directory.
func (e *docEnv) file(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// copyFile copies src into the working directory as name.
func (e *docEnv) copyFile(t *testing.T, name, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	e.file(t, name, b)
}

// environ is the commands' environment: the test's, without the
// developer's OUTBOX_, PG and AWS variables, with outbox on PATH, port 0
// for the HTTP servers (parallel relays do not share 7467) and the
// group's variables.
func (e *docEnv) environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OUTBOX_") || strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "AWS_") || k == "PATH" || k == "GOBIN" {
			continue
		}
		out = append(out, kv)
	}
	out = append(out, "PATH="+e.path+string(os.PathListSeparator)+os.Getenv("PATH"), "OUTBOX_HTTP_ADDR=127.0.0.1:0")
	out = append(out, docShortEnv...)
	return append(out, e.env...)
}

// httpListeningRe finds the address in the "http listening" log line.
var httpListeningRe = regexp.MustCompile(`msg="http listening" addr=(\S+)`)

// docRunTimeout bounds one command that ends by itself.
const docRunTimeout = 4 * time.Minute

// run runs one documented command and checks how it ends.
func (e *docEnv) run(t *testing.T, c docCommand) {
	t.Helper()
	if e.before != nil {
		e.before(t, c.text)
	}
	text := c.text
	for i := 0; i+1 < len(e.pairs); i += 2 {
		text = strings.ReplaceAll(text, e.pairs[i], e.pairs[i+1])
	}
	words := shellWords(text)
	for len(words) > 0 && assignmentRe.MatchString(words[0]) {
		words = words[1:]
	}
	long := len(words) >= 2 && words[0] == "outbox" && (words[1] == "relay" || words[1] == "console") && !strings.Contains(text, "--print-config")
	script := text
	if long {
		// exec: the signal reaches the outbox process, and its exit code
		// is the shell's.
		off := firstCommandWord(text)
		script = text[:off] + "exec " + text[off:]
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = e.dir
	if len(words) > 0 && words[0] == "go" {
		cmd.Dir = e.root
	}
	cmd.Env = e.environ()
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	where := fmt.Sprintf("%s:%d `%s`", c.file, c.line, c.text)
	if text != c.text {
		where += fmt.Sprintf(" (run as `%s`)", text)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	kill := func(sig syscall.Signal) { _ = syscall.Kill(-cmd.Process.Pid, sig) }
	defer func() {
		select {
		case <-done:
		default:
			kill(syscall.SIGKILL)
			<-done
		}
	}()
	if long {
		var addr string
		deadline := time.Now().Add(waitFor)
		for ready := false; !ready; {
			select {
			case <-done:
				t.Fatalf("%s exited %d before it was ready:\n%s%s", where, cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was not ready within %v:\n%s%s", where, waitFor, stdout.String(), stderr.String())
			}
			if addr == "" {
				if m := httpListeningRe.FindStringSubmatch(stderr.String()); m != nil {
					addr = m[1]
				}
				continue
			}
			path := "/"
			if words[1] == "relay" {
				path = "/readyz"
			}
			ready = httpStatus("http://"+addr+path) == http.StatusOK
			if ready && words[1] == "relay" && e.publish > 0 {
				ready = publishedTotal("http://"+addr+"/metrics") >= float64(e.publish)
			}
		}
		kill(syscall.SIGTERM)
	}
	select {
	case <-done:
	case <-time.After(docRunTimeout):
		t.Fatalf("%s did not end within %v:\n%s%s", where, docRunTimeout, stdout.String(), stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d:\nstdout:\n%s\nstderr:\n%s", where, code, stdout.String(), stderr.String())
	}
	t.Logf("ran %s:%d in %v", c.file, c.line, time.Since(start).Round(time.Millisecond))
	if e.check != nil {
		e.check(t, c.text, stdout.String())
	}
}

// httpStatus returns the status of GET url, or 0.
func httpStatus(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// publishedTotal sums outbox_published_total at a relay's /metrics.
func publishedTotal(url string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "outbox_published_total") {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

var assignmentRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// firstCommandWord returns the offset in a command line of its first word
// that is not a VAR=value assignment.
func firstCommandWord(s string) int {
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		start := i
		for i < len(s) && s[i] != ' ' && s[i] != '\t' {
			switch s[i] {
			case '\'', '"':
				if j := strings.IndexByte(s[i+1:], s[i]); j >= 0 {
					i += j + 1
				}
			case '\\':
				i++
			}
			i++
		}
		if !assignmentRe.MatchString(s[start:min(i, len(s))]) {
			return start
		}
	}
}

// docSetup starts the servers of a group and says how its commands map
// onto them.
func docSetup(t *testing.T, group, root, bin string) *docEnv {
	t.Helper()
	e := &docEnv{root: root, dir: t.TempDir(), path: bin}
	e.replace("/etc/outbox/", e.dir+"/etc/outbox/", "/run/secrets/", e.dir+"/run/secrets/")
	// $DB and $BROKER: a migrated outbox and a NATS server.
	dbAndBroker := func() {
		e.env = append(e.env, "DB="+migrated(t, 4), "BROKER="+testenv.NATS(t).ClientURL())
	}
	kind := group
	if strings.HasPrefix(group, "bench-") {
		kind = "bench-"
	}
	switch kind {
	case "slim":
		// docs/deploy.md's static build writes ./outbox: into a directory
		// of the test, first on PATH for `outbox version`.
		slim := t.TempDir()
		e.path = slim
		e.replace("-o outbox ", "-o "+filepath.Join(slim, "outbox")+" ")
		e.check = func(t *testing.T, text, stdout string) {
			if strings.HasPrefix(text, "outbox version") && (!strings.HasPrefix(stdout, "outbox ") || !strings.Contains(stdout, "tags outbox_slim")) {
				t.Errorf("outbox version of the slim build printed %q", stdout)
			}
		}

	case "demo":
		// As written: its own SQLite file and embedded NATS server, for
		// OUTBOX_DURATION (docShortEnv).

	case "bench-":
		// As written (throwaway PostgreSQL and NATS of its own) with the
		// sizes of docShortEnv, except the documented servers:
		e.before = func(t *testing.T, text string) {
			switch {
			case strings.Contains(text, "postgres://…fsync-on-server…"):
				e.replace("postgres://…fsync-on-server…", testenv.PostgresDSN(t))
			case strings.Contains(text, "amqp://guest:guest@localhost:5672/"):
				e.replace("amqp://guest:guest@localhost:5672/", testenv.RabbitMQ(t))
			case strings.Contains(text, "http://localhost:8000"):
				e.replace("http://localhost:8000", testenv.Dynalite(t))
			}
		}

	case "backlog-bench":
		// As written, on a backlog of 20,000 rows instead of a million,
		// twice instead of 20 times.
		e.replace("OUTBOX_BENCH_BACKLOG_ROWS=1000000", "OUTBOX_BENCH_BACKLOG_ROWS=20000", "-benchtime 20x", "-benchtime 2x")

	case "postgres-nats":
		dsn := testenv.PostgresDSN(t)
		nats := testenv.NATS(t).ClientURL()
		e.replace(
			"postgres://app@localhost:5432/app", dsn,
			"nats://localhost:4222", nats,
			"--store …", "--store "+dsn,
			"--broker …", "--broker "+nats,
		)
		e.env = append(e.env, "DATABASE_URL="+dsn)
		// Each relay publishes 5 messages of orders.created (to the
		// stream ORDERS the documented `destinations create` made) before
		// it is stopped. `dlq show ID` shows the documented ID: a dead
		// letter of that ID (and of the documented topic) once migrate
		// made the tables.
		e.publish = 5
		deadLetter := false
		e.before = func(t *testing.T, text string) {
			if strings.HasPrefix(text, "outbox relay") {
				write(t, dsn, messages("orders.created", e.publish, 3))
			}
			if strings.Contains(text, "outbox dlq") && !deadLetter {
				deadLetter = true
				testenv.ExecPostgres(t, dsn, `INSERT INTO outbox_dead_letters (id, partition, topic, key, payload, created_at, attempts, last_error, failed_at)
VALUES ('0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d', 0, 'orders.created', 'customer-42', '{"order":"A-1042"}', now(), 10, 'nats: maximum payload exceeded', now())`)
			}
		}
		e.check = func(t *testing.T, text, stdout string) {
			switch {
			case strings.HasPrefix(text, "outbox dlq show"), strings.HasPrefix(text, "outbox dlq list"):
				if !strings.Contains(stdout, "0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d") {
					t.Errorf("`%s` does not show the dead letter:\n%s", text, stdout)
				}
			case strings.Contains(text, "> V1__outbox.sql"):
				b, err := os.ReadFile(filepath.Join(e.dir, "V1__outbox.sql"))
				if err != nil || !strings.Contains(string(b), "CREATE TABLE") {
					t.Errorf("`%s` wrote no SQL: %v\n%s", text, err, b)
				}
			}
		}

	case "mysql":
		// A MariaDB server of its own with TLS (db-ca.pem is its CA) and
		// user app, whose password is in /run/secrets/db.
		pki := testenv.NewPKI(t, "mariadb")
		cert := pki.Server("mariadb")
		// mariadbd runs as user mysql: its files in a directory it can read.
		tlsDir, err := os.MkdirTemp("", "outbox-doc-mariadb-tls-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tlsDir) })
		settings := map[string]string{}
		for flag, pem := range map[string][]byte{"ssl-ca": pki.CAPEM, "ssl-cert": cert.CertPEM, "ssl-key": cert.KeyPEM} {
			p := filepath.Join(tlsDir, flag+".pem")
			if err := os.WriteFile(p, pem, 0o644); err != nil {
				t.Fatal(err)
			}
			settings[flag] = p
		}
		if err := os.Chmod(tlsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		s := testenv.MariaDBServer(t, testenv.MariaDBOptions{Settings: settings})
		const password = "app-doc-pw-6d2e91"
		testenv.ExecMySQL(t, s.URL(), "CREATE DATABASE app")
		testenv.ExecMySQL(t, s.URL(), "CREATE USER app@'%' IDENTIFIED BY '"+password+"'")
		testenv.ExecMySQL(t, s.URL(), "GRANT ALL ON app.* TO app@'%'")
		e.file(t, "run/secrets/db", []byte(password+"\n"))
		e.copyFile(t, "etc/outbox/db-ca.pem", pki.CAFile)
		e.replace("app@db:3306/app", fmt.Sprintf("app@127.0.0.1:%d/app", s.Port()), "nats://localhost:4222", testenv.NATS(t).ClientURL())

	case "wal":
		// A PostgreSQL server of its own (the slot's default name is the
		// cluster's), database app, users relay (REPLICATION, owns the
		// tables it creates) and app (reads them).
		s := testenv.PostgresServer(t, testenv.PostgresOptions{})
		for _, q := range []string{
			"CREATE ROLE relay LOGIN REPLICATION", "CREATE ROLE app LOGIN",
			"CREATE DATABASE app OWNER relay",
		} {
			testenv.ExecPostgres(t, s.DSN(), q)
		}
		u, err := url.Parse(s.DSN())
		if err != nil {
			t.Fatal(err)
		}
		appDB := *u
		appDB.Path = "/app"
		testenv.ExecPostgres(t, appDB.String(), "ALTER DEFAULT PRIVILEGES FOR ROLE relay GRANT SELECT ON TABLES TO app")
		e.replace("relay@db/app", "relay@"+u.Host+"/app", "app@db/app", "app@"+u.Host+"/app", "nats://localhost:4222", testenv.NATS(t).ClientURL())

	case "nats-creds":
		opts, issue := natsAccount(t)
		pki := testenv.NewPKI(t, "nats")
		opts.TLS, opts.TLSConfig = true, pki.ServerTLS(false)
		s := testenv.NATSWith(t, opts)
		creds, _ := issue("relay")
		e.copyFile(t, "etc/outbox/relay.creds", creds)
		e.copyFile(t, "etc/outbox/nats-ca.pem", pki.CAFile)
		e.replace("tls://nats.example:4222", s.ClientURL())
		dbAndBroker()

	case "nats-mtls-nkey":
		user, _ := nkeys.CreateUser()
		pub, _ := user.PublicKey()
		seed, _ := user.Seed()
		pki := testenv.NewPKI(t, "nats")
		s := testenv.NATSWith(t, server.Options{TLS: true, TLSVerify: true, TLSConfig: pki.ServerTLS(true), Nkeys: []*server.NkeyUser{{Nkey: pub}}})
		client := pki.Client("relay")
		e.copyFile(t, "ca.pem", pki.CAFile)
		e.file(t, "relay.pem", client.CertPEM)
		e.file(t, "relay-key.pem", client.KeyPEM)
		e.file(t, "relay.nk", seed)
		e.replace("tls://nats.example:4222", s.ClientURL())
		dbAndBroker()

	case "nats-token":
		const token = "doc-token-3e8a0c5b71"
		s := testenv.NATSWith(t, server.Options{Authorization: token})
		e.file(t, "etc/outbox/nats-token", []byte(token+"\n"))
		e.replace("nats://nats.example:4222", s.ClientURL())
		dbAndBroker()

	case "nats-password":
		const password = "doc-pw-91c4e7a20f"
		s := testenv.NATSWith(t, server.Options{Username: "relay", Password: password})
		e.file(t, "pw", []byte(password+"\n"))
		e.replace("nats://nats.example:4222", s.ClientURL())
		dbAndBroker()

	case "kafka-sasl":
		const password = "doc-scram-pw-5a7e2c"
		pki := testenv.NewPKI(t, "kafka")
		seeds, _ := testenv.Kafka(t, kfake.NumBrokers(2), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "outbox-relay", password), kfake.TLS(pki.ServerTLS(false)))
		e.file(t, "run/secrets/kafka-password", []byte(password+"\n"))
		e.copyFile(t, "kafka-ca.pem", pki.CAFile)
		e.replace("kafka-1.example:9093,kafka-2.example:9093", strings.Join(seeds, ","))
		dbAndBroker()

	case "kafka-mtls":
		pki := testenv.NewPKI(t, "kafka")
		seeds, _ := testenv.Kafka(t, kfake.TLS(pki.ServerTLS(true)))
		client := pki.Client("relay")
		e.copyFile(t, "kafka-ca.pem", pki.CAFile)
		e.file(t, "relay.pem", client.CertPEM)
		e.file(t, "relay-key.pem", client.KeyPEM)
		e.replace("kafka-1.example:9093", strings.Join(seeds, ","))
		dbAndBroker()

	case "amqps":
		// RabbitMQ with TLS and client certificates; its user is guest.
		pki := testenv.NewPKI(t, "rabbitmq")
		u, err := url.Parse(testenv.RabbitMQTLS(t, pki, true))
		if err != nil {
			t.Fatal(err)
		}
		client := pki.Client("relay")
		e.file(t, "run/secrets/amqp-password", []byte("guest\n"))
		e.copyFile(t, "rabbit-ca.pem", pki.CAFile)
		e.file(t, "relay.pem", client.CertPEM)
		e.file(t, "relay-key.pem", client.KeyPEM)
		e.replace("outbox-relay@rabbit.example:5671", "guest@"+u.Host)
		dbAndBroker()

	case "rediss":
		// Redis with TLS and an ACL user outbox-relay.
		const password = "doc-redis-pw-0b6f3d"
		pki := testenv.NewPKI(t, "redis")
		cert := pki.Server("redis")
		s := testenv.Redis(t, testenv.RedisOptions{TLSCertFile: cert.CertFile, TLSKeyFile: cert.KeyFile})
		rc := s.Client()
		defer rc.Close()
		if err := rc.Do(t.Context(), "ACL", "SETUSER", "outbox-relay", "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		e.file(t, "run/secrets/redis-password", []byte(password+"\n"))
		e.copyFile(t, "redis-ca.pem", pki.CAFile)
		e.replace("redis.example:6380", s.TLSAddr())
		dbAndBroker()

	case "sqs":
		// goaws; the AWS SDK's own configuration files hold profile
		// outbox-relay and the endpoint (AWS_ENDPOINT_URL).
		g := testenv.GoAWSServer(t)
		cfg := e.file(t, "aws/config", []byte("[default]\nregion = eu-west-1\n[profile outbox-relay]\nregion = eu-west-1\n"))
		creds := e.file(t, "aws/credentials", []byte("[default]\naws_access_key_id = doc\naws_secret_access_key = doc\n[outbox-relay]\naws_access_key_id = doc\naws_secret_access_key = doc\n"))
		e.env = append(e.env, "AWS_CONFIG_FILE="+cfg, "AWS_SHARED_CREDENTIALS_FILE="+creds, "AWS_ENDPOINT_URL="+g.Endpoint())
		e.replace("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", g.QueueURL("orders.fifo"))
		dbAndBroker()

	case "kinesis":
		// kinesalite; the profile and the endpoint in the AWS SDK's own
		// configuration, as for sqs.
		k := testenv.KinesaliteServer(t)
		cfg := e.file(t, "aws/config", []byte("[default]\nregion = eu-west-1\n[profile outbox-relay]\nregion = eu-west-1\n"))
		creds := e.file(t, "aws/credentials", []byte("[default]\naws_access_key_id = doc\naws_secret_access_key = doc\n[outbox-relay]\naws_access_key_id = doc\naws_secret_access_key = doc\n"))
		e.env = append(e.env, "AWS_CONFIG_FILE="+cfg, "AWS_SHARED_CREDENTIALS_FILE="+creds, "AWS_ENDPOINT_URL="+k.Endpoint())
		dbAndBroker()

	case "postgres-cert", "postgres-password":
		// PostgreSQL with TLS; user outbox_relay logs in with its client
		// certificate (postgres-cert) or its password from the pgpass
		// file (postgres-password), into database app.
		const password = "doc-pg-pw-4f1a9e"
		pki := testenv.NewPKI(t, "pg")
		method := "cert"
		if group == "postgres-password" {
			method = "scram-sha-256"
		}
		hostPort, admin := testenv.PostgresSSL(t, pki, "hostssl all outbox_relay 127.0.0.1/32 "+method)
		testenv.ExecPostgres(t, admin, "CREATE ROLE outbox_relay LOGIN PASSWORD '"+password+"'")
		testenv.ExecPostgres(t, admin, "CREATE DATABASE app OWNER outbox_relay")
		client := pki.Client("outbox_relay")
		e.copyFile(t, "etc/outbox/db-ca.pem", pki.CAFile)
		e.file(t, "etc/outbox/relay.pem", client.CertPEM)
		e.file(t, "etc/outbox/relay-key.pem", client.KeyPEM)
		e.file(t, "run/secrets/pgpass", []byte("*:*:*:outbox_relay:"+password+"\n"))
		e.replace("db.example:5432", hostPort)
		// The relay needs the tables: migrated as the admin would.
		adminApp, err := url.Parse(admin)
		if err != nil {
			t.Fatal(err)
		}
		adminApp.Path = "/app"
		mustRun(t, nil, "migrate", "--store", adminApp.String())
		testenv.ExecPostgres(t, adminApp.String(), "GRANT ALL ON ALL TABLES IN SCHEMA public TO outbox_relay")
		e.env = append(e.env, "BROKER="+testenv.NATS(t).ClientURL())

	case "otel":
		r := &otlpReceiver{}
		dsn := migrated(t, 4)
		nats := testenv.NATS(t).ClientURL()
		e.replace("http://collector:4318", r.serveHTTP(t), "--store …", "--store "+dsn, "--broker …", "--broker "+nats)

	default:
		t.Fatalf("docSetup knows no group %q", group)
	}
	return e
}
