package rabbitmq_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker/rabbitmq"
)

func TestParseURL(t *testing.T) {
	u, opts, err := rabbitmq.ParseURL("amqps://user:pw@rabbit:5671/prod?exchange=events&passive_exchange=true&transient=1&allow_unroutable=false&channels=8&max_in_flight=100&publish_timeout=3s&max_message_size=1000&connection_name=relay-1&connection_timeout=2500&heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	if u != "amqps://user:pw@rabbit:5671/prod?heartbeat=5" {
		t.Errorf("connection URL %q", u)
	}
	want := rabbitmq.Options{Exchange: "events", PassiveExchange: true, Transient: true, Channels: 8, MaxInFlight: 100,
		PublishTimeout: 3 * time.Second, MaxMessageSize: 1000, ConnectionName: "relay-1", DialTimeout: 2500 * time.Millisecond}
	if opts.Exchange != want.Exchange || opts.PassiveExchange != want.PassiveExchange || opts.Transient != want.Transient ||
		opts.AllowUnroutable || opts.Channels != want.Channels || opts.MaxInFlight != want.MaxInFlight ||
		opts.PublishTimeout != want.PublishTimeout || opts.MaxMessageSize != want.MaxMessageSize ||
		opts.ConnectionName != want.ConnectionName || opts.DialTimeout != want.DialTimeout {
		t.Errorf("options %+v; want %+v", opts, want)
	}

	for _, tc := range []struct{ url, want string }{
		{"http://u:secret@h/", "scheme must be amqp or amqps"},
		{"amqp://u:secret@/", "no host"},
		{"amqp://u:secret@h/?bogus=1", `unknown query parameter "bogus"`},
		{"amqp://u:secret@h/?channels=0", `channels="0" must be a positive integer`},
		{"amqp://u:secret@h/?transient=maybe", "true or false"},
		{"amqp://u:secret@h/?publish_timeout=soon", "duration"},
		{"amqp://u:secret@h/?exchange=a&exchange=b", "given 2 times"},
		{"amqp://u:secret@h:bad/", "invalid URL"},
	} {
		_, _, err := rabbitmq.ParseURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %v; want an error containing %q", tc.url, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q): the error shows the password: %v", tc.url, err)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@localhost:5672/",
		"amqps://u:p@h/vh?exchange=x&channels=3&heartbeat=10",
		"amqp://h/?transient=true&publish_timeout=1s",
		"amqp://u:p%40ss@h:1/%2F?max_message_size=10",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, opts, err := rabbitmq.ParseURL(raw)
		if err != nil {
			if pu, perr := url.Parse(raw); perr == nil && pu.User != nil {
				if pw, ok := pu.User.Password(); ok && pw != "xxxxx" && strings.Count(raw, pw) == 1 && strings.Contains(err.Error(), ":"+pw+"@") {
					t.Fatalf("error shows the password %q: %v", pw, err)
				}
			}
			return
		}
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatalf("ParseURL returned an unparseable URL %q: %v", u, err)
		}
		for _, p := range rabbitmq.URLParams {
			if pu.Query().Has(p) {
				t.Fatalf("ParseURL left %q in %q", p, u)
			}
		}
		_ = opts.Validate() // must not panic
	})
}
