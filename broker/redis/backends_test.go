package redis_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestBackendsScheme checks the redis:// scheme of `outbox relay --broker`:
// the ACL user with its password from a file, the query options and the
// outbox's prefix reach the Publisher, and mistakes are configuration
// errors naming the parameter, never showing the password.
func TestBackendsScheme(t *testing.T) {
	s := testenv.Redis(t, testenv.RedisOptions{Config: []string{"user relay on >file-secret ~pre.* +xadd +ping"}})
	c := client(t, s)
	createStream(t, c, "pre.orders")
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := backends.OpenPublisher(ctx, "redis://relay@"+s.Addr()+"/0?prefix=pre.&maxlen=100&password_file="+pw, backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m := newMessage("orders", "k", "hi")
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	if got := received(t, "pre.orders", newReader(c, "pre.orders").read(t, 1)[0]); got.ID != m.ID {
		t.Fatalf("read %s; want %s", got.ID, m.ID)
	}
	if err := p.Publish(ctx, []*outbox.Message{newMessage("missing", "k", "x")})[0]; !isBlocked(err, "missing") || !strings.Contains(err.Error(), `"pre.missing"`) {
		t.Errorf("publish to a missing stream: got %v; want an error blocking topic \"missing\" and naming stream pre.missing", err)
	}

	for _, tc := range []struct {
		url  string
		o    backends.BrokerOptions
		want string
	}{
		{"redis://h:1?bogus=1", backends.BrokerOptions{}, `unknown query parameter "bogus"`},
		{"redis://u:secret@h:1?pool_size=0", backends.BrokerOptions{}, "pool_size"},
		{"redis://u:secret@h:1", backends.BrokerOptions{MaxInFlight: 5}, "--max-in-flight"},
		{"redis://u:secret@h:1", backends.BrokerOptions{TLS: backends.BrokerTLS{Enable: true}}, "rediss://"},
		{"redis://h:1?publish_timeout=0s", backends.BrokerOptions{}, "publish_timeout"},
	} {
		_, err := backends.OpenPublisher(ctx, tc.url, tc.o)
		if !backends.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenPublisher(%q) = %v; want a configuration error containing %q", tc.url, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("OpenPublisher(%q): the error shows the password: %v", tc.url, err)
		}
	}
	free, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	_, err = backends.OpenPublisher(ctx, "redis://:secret@127.0.0.1:"+strconv.Itoa(free), backends.BrokerOptions{})
	if err == nil || backends.IsConfigError(err) || !strings.Contains(err.Error(), "no server answers") || strings.Contains(err.Error(), "secret") {
		t.Errorf("no server: got %v; want a runtime error saying no server answers, without the password", err)
	}
}
