package redis_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func publishOne(t testing.TB, p *redis.Publisher, m *outbox.Message) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.Publish(ctx, []*outbox.Message{m})[0]
}

// TestStreamDeletedAndRecreated: a stream deleted by mistake blocks its
// topic (it is not silently recreated without its consumer groups); once
// the operator recreates it, publishing works again. Other streams of the
// same batch are not affected.
func TestStreamDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := client(t, s)
	ctx := context.Background()
	createStream(t, c, "orders")
	createStream(t, c, "other")
	p := dial(t, redis.Options{Addr: s.Addr()})
	if err := publishOne(t, p, newMessage("orders", "k", "1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, "orders").Err(); err != nil {
		t.Fatal(err)
	}
	errs := p.Publish(ctx, []*outbox.Message{newMessage("orders", "k", "2"), newMessage("other", "k", "x")})
	if !isBlocked(errs[0], "orders") {
		t.Fatalf("publish to a deleted stream: %v; want an error blocking topic orders", errs[0])
	}
	errorContains(t, errs[0], `"orders"`, "does not exist", "create_streams")
	if errs[1] != nil {
		t.Fatalf("the other stream's message: %v", errs[1])
	}
	if n, _ := c.Exists(ctx, "orders").Result(); n != 0 {
		t.Fatal("the publisher recreated the deleted stream")
	}
	createStream(t, c, "orders")
	if err := publishOne(t, p, newMessage("orders", "k", "3")); err != nil {
		t.Fatalf("after the stream was recreated: %v", err)
	}
	if got := newReader(c, "orders").read(t, 1); got[0].Values[redis.FieldPayload] != "3" {
		t.Fatalf("read %v; want the message published after the stream came back", got[0].Values)
	}
}

// TestCreateStreams: with CreateStreams, XADD creates a missing stream.
func TestCreateStreams(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := client(t, s)
	p := dial(t, redis.Options{Addr: s.Addr(), CreateStreams: true})
	m := newMessage("fresh", "k", "v")
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	if got := received(t, "fresh", newReader(c, "fresh").read(t, 1)[0]); got.ID != m.ID || got.Key != "k" {
		t.Fatalf("read %+v; want %s", got, m.ID)
	}
}

// TestMaxLen: MAXLEN ~ keeps a stream near its bound, never below it.
func TestMaxLen(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{Config: []string{"stream-node-max-entries 10"}})
	c := client(t, s)
	createStream(t, c, "capped")
	p := dial(t, redis.Options{Addr: s.Addr(), MaxLen: 50})
	ctx := context.Background()
	for range 20 {
		var msgs []*outbox.Message
		for i := range 50 {
			msgs = append(msgs, newMessage("capped", fmt.Sprint(i), "x"))
		}
		for i, err := range p.Publish(ctx, msgs) {
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	n, err := c.XLen(ctx, "capped").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Redis trims whole nodes of 10 entries: between 50 and 59 remain.
	if n < 50 || n >= 60 {
		t.Fatalf("the stream holds %d entries after 1000 XADDs with MAXLEN ~ 50; want 50 to 59", n)
	}
}

// TestACLUser: an ACL user allowed to XADD only streams under "allowed:"
// publishes there; a message to another stream is refused with NOPERM,
// which blocks its topic; a wrong password fails Dial with an error naming
// the user, not the password.
func TestACLUser(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{Config: []string{
		"user relay on >s3cret-pass ~allowed:* +xadd +ping",
	}})
	c := client(t, s)
	createStream(t, c, "allowed:orders")
	createStream(t, c, "forbidden:orders")
	p := dial(t, redis.Options{Addr: s.Addr(), Username: "relay", Password: "s3cret-pass"})
	if err := publishOne(t, p, newMessage("allowed:orders", "k", "v")); err != nil {
		t.Fatalf("publish as relay to an allowed stream: %v", err)
	}
	err := publishOne(t, p, newMessage("forbidden:orders", "k", "v"))
	if !isBlocked(err, "forbidden:orders") {
		t.Fatalf("publish to a stream the user may not write: %v; want an error blocking the topic", err)
	}
	errorContains(t, err, "not authorized", "NOPERM")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = redis.Dial(ctx, redis.Options{Addr: s.Addr(), Username: "relay", Password: "wrong-pass"})
	errorContains(t, err, "refused the credentials", "user relay")
	if strings.Contains(err.Error(), "wrong-pass") {
		t.Errorf("the Dial error shows the password: %v", err)
	}
}

// TestOutOfMemory: a server at maxmemory with noeviction refuses XADD with
// OOM, which blocks the topic (no attempt spent, nothing dead-lettered);
// once memory is raised, publishing works again.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{Config: []string{"maxmemory 3mb", "maxmemory-policy noeviction"}})
	c := client(t, s)
	createStream(t, c, "big")
	p := dial(t, redis.Options{Addr: s.Addr()})
	ctx := context.Background()
	payload := strings.Repeat("x", 64<<10)
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		err = publishOne(t, p, newMessage("big", "k", payload))
	}
	if !isBlocked(err, "big") {
		t.Fatalf("publish beyond maxmemory: %v; want an error blocking the topic", err)
	}
	errorContains(t, err, "out of memory", "OOM")
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(t, p, newMessage("big", "k", payload)); err != nil {
		t.Fatalf("after maxmemory was lifted: %v", err)
	}
}

// TestWrongType: a key that holds another type blocks its topic.
func TestWrongType(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := client(t, s)
	if err := c.Set(context.Background(), "plain", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := dial(t, redis.Options{Addr: s.Addr()})
	err := publishOne(t, p, newMessage("plain", "k", "v"))
	if !isBlocked(err, "plain") {
		t.Fatalf("publish to a string key: %v; want an error blocking the topic", err)
	}
	errorContains(t, err, "not a stream", "WRONGTYPE")
}

// TestPermanent: a message without ID, a topic mapped to an empty key and
// an entry over MaxMessageBytes fail permanently without being sent; the
// rest of the batch goes through.
func TestPermanent(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := client(t, s)
	createStream(t, c, "s")
	p := dial(t, redis.Options{Addr: s.Addr(), MaxMessageBytes: 1000, StreamMapper: func(topic string) string {
		if topic == "unmapped" {
			return ""
		}
		return topic
	}})
	noID := newMessage("s", "k", "x")
	noID.ID = ""
	big := newMessage("s", "k2", strings.Repeat("x", 1000))
	ok := newMessage("s", "k3", "fine")
	errs := p.Publish(context.Background(), []*outbox.Message{noID, newMessage("unmapped", "k", "x"), big, ok})
	for i, want := range []string{"no ID", "stream key of 0 bytes", "MaxMessageBytes (1000)"} {
		if !outbox.IsPermanent(errs[i]) {
			t.Errorf("message %d: %v; want a permanent error", i, errs[i])
		}
		errorContains(t, errs[i], want)
	}
	if errs[3] != nil {
		t.Fatal(errs[3])
	}
	if got := newReader(c, "s").read(t, 1); got[0].Values[redis.FieldID] != ok.ID {
		t.Fatalf("read %v; want only %s", got[0].Values, ok.ID)
	}
	if n, _ := c.XLen(context.Background(), "s").Result(); n != 1 {
		t.Fatalf("the stream holds %d entries; want 1", n)
	}
}

// TestTLS: rediss:// with the server's CA publishes over TLS; without the
// CA the handshake fails at Dial.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "redis")
	cert := pki.Server("redis")
	s := testenv.Redis(t, testenv.RedisOptions{TLSCertFile: cert.CertFile, TLSKeyFile: cert.KeyFile, Password: "pw"})
	c := client(t, s)
	createStream(t, c, "secure")
	p := dial(t, redis.Options{Addr: s.TLSAddr(), Password: "pw", TLS: &tls.Config{RootCAs: pki.Pool(), MinVersion: tls.VersionTLS12}})
	if err := publishOne(t, p, newMessage("secure", "k", "v")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := redis.Dial(ctx, redis.Options{Addr: s.TLSAddr(), Password: "pw", TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	errorContains(t, err, "certificate")
}

// TestDialUnreachable: no server at the address fails Dial with an error
// naming it.
func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = redis.Dial(ctx, redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	errorContains(t, err, "no server answers", fmt.Sprintf("127.0.0.1:%d", port))
}

// TestParseURL covers the URL forms and their mistakes.
func TestParseURL(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := redis.ParseURL("rediss://relay:pa55@cache.example:6380/2?maxlen=1000&create_streams=true&publish_timeout=3s&pool_size=4&client_name=x&max_message_bytes=2048&dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "cache.example:6380" || o.Username != "relay" || o.Password != "pa55" || o.DB != 2 || o.TLS == nil || o.TLS.ServerName != "cache.example" ||
		o.MaxLen != 1000 || !o.CreateStreams || o.PublishTimeout != 3*time.Second || o.PoolSize != 4 || o.ClientName != "x" || o.MaxMessageBytes != 2048 || o.DialTimeout != time.Second {
		t.Fatalf("ParseURL: %+v", o)
	}
	o, err = redis.ParseURL("redis://relay@h?password_file=" + pwFile)
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "h:6379" || o.Password != "from-file" || o.Username != "relay" || o.TLS != nil {
		t.Fatalf("ParseURL with password_file: %+v", o)
	}
	for _, tc := range []struct{ url, want string }{
		{"http://h", "redis:// or rediss://"},
		{"redis://", "no host"},
		{"redis://h/x", "database number"},
		{"redis://h?bogus=1", `unknown query parameter "bogus"`},
		{"redis://h?maxlen=-1", "maxlen"},
		{"redis://:secret@h?password_file=" + pwFile, "two passwords"},
		{"redis://h?password_file=/nonexistent/file", "password_file"},
	} {
		_, err := redis.ParseURL(tc.url)
		errorContains(t, err, tc.want)
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q) shows the password: %v", tc.url, err)
		}
	}
	if err := (redis.Options{Addr: "h:1", Username: "u"}).Validate(); err == nil || !strings.Contains(err.Error(), "Password") {
		t.Errorf("Validate of a user without password: %v", err)
	}
}

// TestHealth: nil while the server answers, an error while it is stopped,
// nil again once it is back, and ErrClosed after Close.
func TestHealth(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := redis.Dial(ctx, redis.Options{Addr: s.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health with the server up: %v", err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); err == nil {
		t.Fatal("Health with the server stopped: nil, want an error")
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health after the server came back: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}
