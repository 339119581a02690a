package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"":                                                 "",
		"nats://127.0.0.1:4222":                            "nats://127.0.0.1:4222",
		"nats://alice:s3cret@host:4222":                    "nats://alice:xxxxx@host:4222",
		"nats://tok3n@host:4222":                           "nats://xxxxx@host:4222",
		"nats://a:b@h1:4222, nats://c:d@h2:4222":           "nats://a:xxxxx@h1:4222, nats://c:xxxxx@h2:4222",
		"nats://alice:se cr%zzet@host:4222":                "nats://alice:xxxxx@host:4222",
		"alice:s3cret@host:4222":                           "alice:xxxxx@host:4222",
		"nats://user:p@ss@host:4222":                       "nats://user:xxxxx@host:4222",
		"amqps://guest:gu?est@h:5671/v?cacertfile=/ca.pem": "amqps://guest:xxxxx@h:5671/v?cacertfile=/ca.pem",
		"kafka://h1:9092,h2:9092?client_id=x":              "kafka://h1:9092,h2:9092?client_id=x",
		"kafka://u:p@h1:9092":                              "kafka://u:xxxxx@h1:9092",
		"postgres://app@h:5432/db?sslmode=verify-full&password=hunter2&sslpassword=k3y#f": "postgres://app@h:5432/db?sslmode=verify-full&password=xxxxx&sslpassword=xxxxx",
		// Issue 23: what pgx reads, not the last '@' of the string.
		"postgres://host/app?password=p@ss":                               "postgres://host/app?password=xxxxx",
		"postgres://app:secret,tail@db/app":                               "postgres://app:xxxxx@db/app",
		"postgres://app:p@ss@db/app":                                      "postgres://app:xxxxx@db/app",
		"postgresql://app@h1:5432,h2:5433/app?pass%77ord=hunter2":         "postgresql://app@h1:5432,h2:5433/app?pass%77ord=xxxxx",
		"postgres://h/app?sslmode=disable#frag":                           "postgres://h/app?sslmode=disable#xxxxx",
		"host=h\tpassword=hunter2\tdbname=app":                            "host=h\tpassword=xxxxx\tdbname=app",
		"host=h password = 'hunt er' dbname=app":                          "host=h password = xxxxx dbname=app",
		"host=h password=hunt\\ er dbname=app":                            "host=h password=xxxxx dbname=app",
		"host=h password='never closed dbname=app":                        "host=h password=xxxxx",
		"user=app password=a'b sslpassword='k\\'ey' x=1":                  "user=app password=xxxxx sslpassword=xxxxx x=1",
		"amqp://guest:gu,est@rabbit:5672/":                                "amqp://guest:xxxxx@rabbit:5672/",
		"nats://tok,en@h:4222":                                            "nats://xxxxx@h:4222",
		"tls://u:p%40ss@h:4222,tls://h2:4222":                             "tls://u:xxxxx@h:4222,tls://h2:4222",
		"postgres://app:hunter2@h/db?sslrootcert=/etc/ca.pem":             "postgres://app:xxxxx@h/db?sslrootcert=/etc/ca.pem",
		"host=h user=app password=hunter2 sslmode=verify-full":            "host=h user=app password=xxxxx sslmode=verify-full",
		"host=h password='hunt er\\'2' dbname=x":                          "host=h password=xxxxx dbname=x",
		"sqlite:///tmp/x.db":                                              "sqlite:///tmp/x.db",
		"dynamodb://outbox?endpoint=http://localhost:8000&secret_key=abc": "dynamodb://outbox?endpoint=http://localhost:8000&secret_key=xxxxx",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestSecret(t *testing.T) {
	if Secret("") != "" || Secret("s") != Mask {
		t.Fatalf("Secret: got %q, %q", Secret(""), Secret("s"))
	}
}

// FuzzURL checks that no password, token or secret parameter survives,
// whatever it holds.
func FuzzURL(f *testing.F) {
	for _, s := range []string{"s3cret", "p@ss", "se cr%zzet", "a:b", "/slash?q#f", "tok&en"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, secret string) {
		if len(secret) < 4 || strings.ContainsAny(secret, ",") {
			return // too short to tell from the rest of the URL; a comma splits URLs
		}
		check := func(template string) {
			t.Helper()
			in := strings.ReplaceAll(template, "SECRET", secret)
			// The secret may also be a piece of the URL around it (pass in
			// password): count only what the URL has besides the secret.
			around := strings.Count(URL(strings.ReplaceAll(template, "SECRET", "")), secret)
			if out := URL(in); strings.Count(out, secret) > around {
				t.Fatalf("URL(%q) = %q shows the secret", in, out)
			}
		}
		check("nats://alice:SECRET@host.example:4222")
		check("postgres://app:SECRET@db.example:5432/app?sslmode=verify-full")
		if !strings.ContainsAny(secret, "@:/") {
			check("nats://SECRET@host.example:4222")
		}
		if !strings.ContainsAny(secret, "&#@ ") {
			check("postgres://db.example/app?password=SECRET")
		}
		if !strings.ContainsAny(secret, " '\\") {
			check("host=db.example password=SECRET sslmode=verify-full")
		}
	})
}
