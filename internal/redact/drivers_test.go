package redact_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/redact"
)

// hidden is the mask the driver test redacts with: a byte no driver accepts
// in a secret it reads, so that a secret found in the output is a leak, not
// the mask.
const hidden = "\x00"

// driverSecrets returns what the drivers would use as a secret when given
// s: pgx's password (s as a postgres URL or keyword/value string, and s
// after the command's net/url check, which passes u.String() to pgx),
// amqp091-go's password, and nats.go's password or token for each server of
// its comma-separated list. Each is read by the driver's own parser; only
// nats.go keeps its URL handling unexported, so its two steps (split on
// commas and trim, put nats:// before a part without a scheme, net/url) are
// written here as nats.go v1.55 writes them (processUrlString,
// parseServerURL, and the token rule of connectProto).
func driverSecrets(s string) []string {
	var out []string
	pg := func(conn string) {
		// The allowed keys keep pgx from reading files the fuzzer names
		// (sslrootcert=/dev/stdin would block).
		cfg, err := pgconn.ParseConfigWithOptions(conn, pgconn.ParseConfigOptions{ConnStringAllowedKeys: []string{
			"host", "port", "user", "password", "database", "dbname", "sslmode", "application_name",
			"connect_timeout", "target_session_attrs", "search_path",
		}})
		if err != nil {
			return
		}
		out = append(out, cfg.Password) // its fallbacks (other hosts) share it
	}
	pg(s)
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		pg(u.String())
	}
	if uri, err := amqp.ParseURI(s); err == nil {
		// Without user info amqp091-go uses guest:guest, which is not in s.
		if u, err := url.Parse(s); err == nil && u.User != nil {
			out = append(out, uri.Password)
		}
	}
	scheme, _, hasScheme := strings.Cut(s, "://")
	if !hasScheme || scheme == "nats" || scheme == "tls" || scheme == "ws" || scheme == "wss" {
		for part := range strings.SplitSeq(s, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			if !strings.Contains(part, "://") {
				part = "nats://" + part
			}
			u, err := url.Parse(part)
			if err != nil || u.User == nil {
				continue
			}
			if pass, ok := u.User.Password(); ok {
				out = append(out, pass)
			} else {
				out = append(out, u.User.Username()) // a token
			}
		}
	}
	return out
}

// decodeAll undoes what may stand between a secret's text in s and its
// value: percent escapes ('+' too) and backslashes.
func decodeAll(s string) string {
	if d, err := url.QueryUnescape(s); err == nil {
		s = d
	} else if d, err := url.PathUnescape(s); err == nil {
		s = d
	}
	return strings.ReplaceAll(s, `\`, "")
}

// checkHidden fails when a piece of secret shows in out, the redaction of
// s. A piece is 3 bytes of the secret that occur exactly once in s, both as
// written and once escapes are undone: then that one occurrence is the
// secret's, and only a leak can bring it into the output.
func checkHidden(t *testing.T, s, out, secret string) {
	t.Helper()
	if len(secret) < 3 || strings.Contains(secret, hidden) {
		return
	}
	decoded, unescaped := decodeAll(s), strings.ReplaceAll(s, `\`, "")
	for i := 0; i+3 <= len(secret); i++ {
		w := secret[i : i+3]
		if strings.Count(s, w) != 1 || strings.Count(decoded, w) != 1 || strings.Count(unescaped, w) != 1 {
			continue
		}
		if strings.Contains(out, w) {
			t.Fatalf("redact.URL(%q) shows %q of the secret %q a driver reads from it:\n%q", s, w, secret, out)
		}
	}
}

// driverSeeds are URLs and connection strings of every shape the drivers
// accept, and mistakes users make (a password holding '@', ',', '#', '?',
// '/' or a space).
var driverSeeds = []string{
	"postgres://host/app?password=p@ss",
	"postgres://app:secret,tail@db/app",
	"postgres://app:p@ss@db/app",
	"postgres://app:hun%40ter2@db:5432/app?sslmode=verify-full",
	"postgresql://app:abc:def@h1:5432,h2:5433/app?target_session_attrs=read-write",
	"postgres://app@db/app?pass%77ord=hunter2&sslmode=disable",
	"postgres://app@db?password=hunter2@x",
	"postgres://app:pa#ss@db/app",
	"postgres://app:pa?ss@db/app",
	"postgres://app:pa/ss@db/app",
	"postgres://[::1]:5432/app?password=hunter2",
	"host=db user=app password=hunter2 dbname=app",
	"host=db\tuser=app\tpassword=hunter2\tdbname=app",
	"host=db password = 'hunt er2' dbname=app",
	"host=db password='hun\\'ter2' dbname=app",
	"host=db password=hun\\ ter2 dbname=app",
	"  password=hunter2",
	"host=db password=p@ss:w/rd?x#y dbname=app",
	"1=2 password=hunter2",
	"amqp://guest:hunter2@rabbit:5672/",
	"amqps://relay:hun%2Fter2@rabbit.example:5671/vhost?cacertfile=/ca.pem",
	"amqp://guest:gu,est2@rabbit:5672/%2F?heartbeat=10",
	"nats://alice:hunter2@h:4222",
	"nats://tok3nvalue@h:4222",
	"nats://a:b1c2@h1:4222, nats://c:d3e4@h2:4222",
	"nats://tok,en123@h:4222",
	"alice:hunter2@h:4222,bob:s3cr3t@h2",
	"tls://u:p%40ss@h:4222,tls://h2:4222",
	"nats://u:hun ter@h",
	"kafka://h1:9092,h2:9092?client_id=x",
	"kafka://u:hunter2@h1:9092",
	"dynamodb://outbox?endpoint=http://localhost:8000&secret_key=abc123",
}

// TestRedactionAgainstDrivers runs the seeds through the drivers' parsers
// in every go test run; FuzzRedactionAgainstDrivers explores from them.
func TestRedactionAgainstDrivers(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", "/nonexistent")
	used := 0
	for _, s := range driverSeeds {
		secrets := driverSecrets(s)
		for _, secret := range secrets {
			if len(secret) >= 3 {
				used++
			}
		}
		checkHidden1(t, s, secrets)
	}
	// The seeds must exercise the drivers, or the test proves nothing.
	if used < 20 {
		t.Fatalf("the drivers read only %d secrets from %d seeds", used, len(driverSeeds))
	}
}

func checkHidden1(t *testing.T, s string, secrets []string) {
	t.Helper()
	out := redact.WithMask(s, hidden)
	for _, secret := range secrets {
		checkHidden(t, s, out, secret)
	}
}

// FuzzRedactionAgainstDrivers: whatever the string, no piece of a secret a
// driver would read from it survives redaction; and kafka:// URLs, whose
// credentials come from flags, never carry one past kafka.ParseURL.
func FuzzRedactionAgainstDrivers(f *testing.F) {
	f.Setenv("PGPASSWORD", "")
	f.Setenv("PGPASSFILE", "/nonexistent")
	for _, s := range driverSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkHidden1(t, s, driverSecrets(s))
		if _, err := kafka.ParseURL(s); err == nil {
			if u, err := url.Parse(s); err == nil && u.User != nil {
				t.Fatalf("kafka.ParseURL accepted credentials in %q", s)
			}
		}
	})
}
