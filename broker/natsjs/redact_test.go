package natsjs

import (
	"strings"
	"testing"
)

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                  "nats://127.0.0.1:4222",
		"nats://alice:s3cret@host:4222":          "nats://alice:xxxxx@host:4222",
		"nats://tok3n@host:4222":                 "nats://xxxxx@host:4222",
		"nats://a:b@h1:4222, nats://c:d@h2:4222": "nats://a:xxxxx@h1:4222,nats://c:xxxxx@h2:4222",
		"nats://alice:se cr%zzet@host:4222":      "nats://alice:xxxxx@host:4222",
		"alice:s3cret@host:4222":                 "alice:xxxxx@host:4222",
		"nats://user:p@ss@host:4222":             "nats://user:xxxxx@host:4222",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q; want %q", in, got, want)
		}
	}
}

// FuzzRedactURLs checks that no password survives, whatever it holds.
func FuzzRedactURLs(f *testing.F) {
	for _, s := range []string{"s3cret", "p@ss", "se cr%zzet", "a:b", "with,comma", "/slash?q#f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, secret string) {
		if len(secret) < 4 || strings.ContainsAny(secret, ",") {
			return // too short to tell from the rest of the URL; a comma splits URLs
		}
		in := "nats://alice:" + secret + "@host.example:4222"
		if out := redactURLs(in); strings.Contains(out, secret) {
			t.Fatalf("redactURLs(%q) = %q shows the password", in, out)
		}
	})
}
