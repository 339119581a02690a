package cli_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestNoSecretInAnyOutput plants secrets in every place a secret can be
// given (the store URL's password, a NATS token in the broker URL and in a
// flag, a Kafka SASL password in the environment and in the config file)
// and greps every output path for them: errors, logs at debug level in both
// formats, status, dlq, migrate, --help, --print-config, and the relay's
// HTTP endpoints.
func TestNoSecretInAnyOutput(t *testing.T) {
	t.Parallel()
	const (
		pgPassword   = "PLANTED-pg-6f1e0a"
		natsToken    = "PLANTED-nats-93b2c4"
		kafkaPW      = "PLANTED-kafka-0d7e5f"
		kafkaFilePW  = "PLANTED-kafkafile-2c8a1b"
		urlPWInQuery = "PLANTED-query-7a4c9e"
	)
	secrets := []string{pgPassword, natsToken, kafkaPW, kafkaFilePW, urlPWInQuery}
	var out strings.Builder
	collect := func(r result) result {
		out.WriteString(r.stdout)
		out.WriteString(r.stderr)
		return r
	}

	// The shared server trusts every login: the planted password is sent
	// and ignored, so every command really runs.
	u, err := url.Parse(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", pgPassword)
	store := u.String()
	ns := testenv.NATSWith(t, server.Options{Authorization: natsToken})
	hostPort := strings.TrimPrefix(ns.ClientURL(), "nats://")
	broker := "nats://" + natsToken + "@" + hostPort
	count := natsStream(t, broker)
	cfg := writeConfig(t, "kafka-sasl-password: "+kafkaFilePW+"\nstore: "+store+"\n")
	vars := map[string]string{"OUTBOX_KAFKA_SASL_PASSWORD": kafkaPW, "OUTBOX_BROKER": broker, "OUTBOX_NATS_TOKEN": natsToken}

	for _, format := range []string{"text", "json"} {
		collect(mustRun(t, nil, "migrate", "--store", store, "--log-level", "debug", "--log-format", format))
	}
	write(t, store, messages("secure.test", 10, 2))

	// Help, with the secrets in the environment.
	for _, cmd := range []string{"relay", "migrate", "status", "dlq", "demo", "bench"} {
		collect(mustRun(t, vars, cmd, "--help"))
	}
	collect(mustRun(t, vars, "--help"))
	// The effective configuration, from flags, environment and file.
	r := collect(mustRun(t, map[string]string{"OUTBOX_KAFKA_SASL_PASSWORD": kafkaPW}, "relay", "--print-config", "--config", cfg,
		"--broker", broker, "--nats-token", natsToken))
	for _, want := range []string{"kafka-sasl-password", "nats-token", "xxxxx"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, r.stdout)
		}
	}

	// The relay's logs in both formats, and its HTTP endpoints.
	for _, format := range []string{"json", "text"} {
		args := []string{"relay", "--store", store, "--broker", broker, "--log-level", "debug", "--log-format", format, "--poll-interval", "50ms"}
		if format == "json" {
			args = append(args, "--http-addr", "127.0.0.1:0")
		} else {
			args = append(args, "--http-addr", "")
		}
		b := start(t, nil, args...)
		if format == "json" {
			addr := httpAddrFromLog(t, b)
			for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
				_, body := httpGet(t, "http://"+addr+path)
				out.WriteString(body)
			}
			poll(t, "the messages to reach NATS", func() bool { return count() >= 10 })
		} else {
			poll(t, "the relay to start", func() bool { return strings.Contains(b.stderr.String(), "relay started") })
		}
		if code := b.stop(t); code != 0 {
			t.Fatalf("relay exited %d:\n%s", code, b.stderr)
		}
		out.WriteString(b.stdout.String() + b.stderr.String())
	}

	// Status and dead letters.
	collect(mustRun(t, nil, "status", "--store", store))
	collect(mustRun(t, nil, "status", "--store", store, "--json"))
	collect(mustRun(t, nil, "dlq", "list", "--store", store, "--topic", "secure.test"))

	// Errors: usage and runtime, each with secrets in the URL.
	for _, args := range [][]string{
		{"relay", "--store", store, "--broker", broker + "?bogus=1"},
		{"relay", "--store", store, "--broker", "nats://" + natsToken + "@127.0.0.1:1"},
		{"relay", "--store", store, "--broker", "kafka://user:" + kafkaPW + "@127.0.0.1:9092"},
		{"relay", "--store", store, "--broker", "nats://" + hostPort, "--nats-token", "PLANTED-nats-wrong"},
		{"status", "--store", "postgres://app:" + pgPassword + "@127.0.0.1:1/x?connect_timeout=1"},
		{"status", "--store", "postgres://app:" + pgPassword + "@[bad/x"},
		{"status", "--store", store + "&password=" + urlPWInQuery + "&schema=no-such-schema!"},
		{"migrate", "--store", "postgres://app:" + pgPassword + "@127.0.0.1:1/x?sslmode=bogus"},
		{"relay", "--store", store, "--broker", broker, "--workers", "0"},
		{"relay", "--config", cfg, "--broker", broker, "--nats-token", natsToken, "--nats-creds-file", "/nonexistent"},
	} {
		r := run(t, vars, args...)
		if r.code == 0 {
			t.Fatalf("outbox %s succeeded; want an error", strings.Join(args, " "))
		}
		collect(r)
	}
	secrets = append(secrets, "PLANTED-nats-wrong")
	noSecret(t, out.String(), secrets...)
	if !strings.Contains(out.String(), "xxxxx") {
		t.Fatal("no output shows a redacted secret: the test did not exercise redaction")
	}
}
