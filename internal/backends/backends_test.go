package backends

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// errOpened is what the test openers return: reaching them means the URL
// and options were accepted.
var errOpened = errors.New("test opener reached")

// opened records what the test store opener was given.
var opened struct {
	u *url.URL
	o StoreOptions
}

func init() {
	RegisterStore("teststore", func(_ context.Context, u *url.URL, o StoreOptions) (Store, error) {
		opened.u, opened.o = u, o
		return nil, errOpened
	})
	RegisterBroker("testbroker", func(_ context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
		return nil, errOpened
	})
}

func TestOpenStoreRejectsBadURLs(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, url string
		opts      StoreOptions
		want      []string // substrings of the error
	}{
		{"empty", "", StoreOptions{}, []string{"--store", "is empty", "accepted schemes:", "postgres"}},
		{"unknown scheme", "oracle://u:pw@localhost/db", StoreOptions{}, []string{"--store", `unknown scheme "oracle"`, "postgres", "teststore"}},
		{"no scheme", "localhost:5432", StoreOptions{}, []string{"--store", `unknown scheme "localhost"`}},
		{"relative", "just-a-name", StoreOptions{}, []string{"--store", "has no scheme"}},
		{"bad port", "postgres://u:hunter22@host:port/db", StoreOptions{}, []string{"--store", "not a valid URL", "invalid port"}},
		{"bad escape", "postgres://host/%zz", StoreOptions{}, []string{"--store", "not a valid URL"}},
		{"fragment", "postgres://host/db#frag", StoreOptions{}, []string{"--store", "fragment"}},
		{"hostile schema flag", "teststore://h/db", StoreOptions{Schema: `public"; DROP TABLE x; --`}, []string{"--schema", `'"'`}},
		{"hostile schema param", "teststore://h/db?schema=a%20b", StoreOptions{}, []string{"--schema", `' '`}},
		{"schema starting with digit", "teststore://h/db", StoreOptions{Schema: "1abc"}, []string{"--schema", "starting with a letter"}},
		{"long prefix", "teststore://h/db", StoreOptions{TablePrefix: strings.Repeat("p", 40)}, []string{"--table-prefix", "is 40 bytes; the limit is 39"}},
		{"partitions not a number", "teststore://h/db?partitions=many", StoreOptions{}, []string{"--store", "partitions=", "integer"}},
		{"partitions too many", "teststore://h/db?partitions=5000", StoreOptions{}, []string{"--partitions", "4096"}},
		{"retention not a duration", "teststore://h/db?retention=forever", StoreOptions{}, []string{"--store", "duration"}},
		{"param twice", "teststore://h/db?schema=a&schema=b", StoreOptions{}, []string{"--store", `"schema" is given 2 times`}},
		{"param conflicts with flag", "teststore://h/db?schema=a", StoreOptions{Schema: "b"}, []string{"--store", "conflicts with --schema"}},
		{"bad query", "teststore://h/db?a=%zz", StoreOptions{}, []string{"--store", "malformed query"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := OpenStore(ctx, tc.url, tc.opts)
			if err == nil {
				t.Fatal("no error")
			}
			if !IsConfigError(err) {
				t.Fatalf("error is not a *ConfigError: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter22") {
				t.Errorf("error %q shows the password", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

func TestOpenStoreHandsTheOpenerTheDriverURL(t *testing.T) {
	o := StoreOptions{TablePrefix: "app"}
	_, err := OpenStore(context.Background(), "TESTSTORE://u:pw@h:5432/db?sslmode=disable&schema=s1&partitions=8&retention=1h&prefix=app&max_payload=1024", o)
	if !errors.Is(err, errOpened) {
		t.Fatalf("err = %v, want the opener's error", err)
	}
	if IsConfigError(err) {
		t.Fatalf("an opener's runtime error became a config error: %v", err)
	}
	if strings.Contains(err.Error(), ":pw@") {
		t.Errorf("error %q shows the password", err)
	}
	want := StoreOptions{Schema: "s1", TablePrefix: "app", Partitions: 8, Retention: time.Hour, MaxPayload: 1024}
	if opened.o != want {
		t.Errorf("options = %+v, want %+v", opened.o, want)
	}
	if got := opened.u.String(); got != "teststore://u:pw@h:5432/db?sslmode=disable" {
		t.Errorf("driver URL = %q: the outbox's parameters must be removed and the driver's kept", got)
	}
}

func TestOpenPublisher(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, url string
		opts      BrokerOptions
		want      string
	}{
		{"empty", "", BrokerOptions{}, "--broker: is empty"},
		{"unknown scheme", "kafkaesque://h:1", BrokerOptions{}, `--broker: unknown scheme "kafkaesque"`},
		{"bad prefix", "testbroker://h?prefix=a..b", BrokerOptions{}, "--subject-prefix"},
		{"bad max in flight", "testbroker://h?max_in_flight=-1", BrokerOptions{}, "--max-in-flight"},
		{"bad ack timeout", "testbroker://h?ack_timeout=soon", BrokerOptions{}, "ack_timeout"},
		{"conflict", "testbroker://h?prefix=a.", BrokerOptions{SubjectPrefix: "b."}, "conflicts with --subject-prefix"},
		{"nats without host", "nats:///", BrokerOptions{}, "has no host"},
		{"nats with unknown param", "nats://h:4222?foo=bar", BrokerOptions{}, "foo=bar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := OpenPublisher(ctx, tc.url, tc.opts)
			if !IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a config error containing %q", err, tc.want)
			}
		})
	}
	_, err := OpenPublisher(ctx, "testbroker://h:1?prefix=outbox.&max_in_flight=10&ack_timeout=2s", BrokerOptions{})
	if !errors.Is(err, errOpened) {
		t.Fatalf("err = %v, want the opener's error", err)
	}
}

func TestRegisterPanicsOnDuplicatesAndBadSchemes(t *testing.T) {
	open := func(context.Context, *url.URL, StoreOptions) (Store, error) { return nil, nil }
	for name, f := range map[string]func(){
		"duplicate":  func() { RegisterStore("postgres", open) },
		"upper case": func() { RegisterStore("Pg", open) },
		"empty":      func() { RegisterStore("", open) },
		"nil":        func() { RegisterBroker("nilbroker", nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

// FuzzOpenStoreURL checks that any --store value gives either a usable
// URL and valid options or a one-line *ConfigError, never a panic, and
// that an accepted URL keeps none of the outbox's own parameters. It stops
// before any I/O.
func FuzzOpenStoreURL(f *testing.F) {
	for _, s := range []string{
		"postgres://postgres@127.0.0.1:5432/app?sslmode=disable",
		"postgres://u:secret@h/db?schema=outbox&prefix=o&partitions=8&retention=24h",
		"postgresql:///db?host=/tmp",
		"teststore://h/db?schema=a&schema=b",
		"mysql://x", "localhost:5432", "postgres://%zz", "postgres://h:port/db",
		"postgres://h/db?partitions=-1", "postgres://h/db?schema=%22x%22", "::", "",
	} {
		f.Add(s, "", "")
	}
	f.Add("teststore://h/db", "s", "p")
	f.Fuzz(func(t *testing.T, raw, schema, prefix string) {
		u, o, open, err := prepareStore(raw, StoreOptions{Schema: schema, TablePrefix: prefix})
		if err != nil {
			if !IsConfigError(err) {
				t.Fatalf("error is not a *ConfigError: %v", err)
			}
			if strings.ContainsAny(err.Error(), "\n\r") && !strings.ContainsAny(raw+schema+prefix, "\n\r") {
				t.Fatalf("error is not one line: %q", err)
			}
			if pu, perr := url.Parse(raw); perr == nil && pu.User != nil {
				if pw, ok := pu.User.Password(); ok && len(pw) >= 6 && strings.Count(raw, pw) == 1 && !strings.Contains(schema+prefix, pw) &&
					strings.Contains(err.Error(), pw) {
					t.Fatalf("error %q shows the password %q", err, pw)
				}
			}
			return
		}
		if open == nil || u == nil {
			t.Fatal("accepted without an opener")
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("accepted invalid options: %v", err)
		}
		q, qerr := url.ParseQuery(u.RawQuery)
		if qerr != nil {
			t.Fatalf("driver URL has a malformed query: %v", qerr)
		}
		for _, p := range StoreParams {
			if q.Has(p.Param) {
				t.Fatalf("driver URL %q still has the outbox parameter %q", u, p.Param)
			}
		}
	})
}
