package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// newDatabase creates a database on the server of adminDSN and returns its
// DSN (the server is the test's own: it goes away with it).
func newDatabase(t *testing.T, adminDSN, name string) string {
	t.Helper()
	testenv.ExecPostgres(t, adminDSN, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	u, err := url.Parse(adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func wantErr(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want one saying %q", what, parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: error %q does not say %q", what, err, p)
		}
	}
}

// TestWALCheckWALLevel: a server without wal_level = logical is refused
// with what to change, by Migrate and Check.
func TestWALCheckWALLevel(t *testing.T) {
	t.Parallel()
	srv := testenv.PostgresServer(t, testenv.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
	s, err := OpenWAL(context.Background(), newDatabase(t, srv.DSN(), "app"), walTestOptions(t, Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	wantErr(t, "Migrate", s.Migrate(ctx), "wal_level = logical", `"replica"`, "restart PostgreSQL")
	wantErr(t, "Check", s.Check(ctx), "ALTER SYSTEM SET wal_level = logical")
	// A relay asking for the stream gets the same error, every round.
	s.Start()
	wantErr(t, "WaitStreaming", s.WaitStreaming(ctx), "wal_level = logical")
	_, _, err = s.Hold(ctx, "n")
	wantErr(t, "Hold", err, "wal_level = logical")
}

// TestWALCheckPrivilegeAndWriter: a user without the REPLICATION attribute
// is told how to get it; an application user without it can still write.
func TestWALCheckPrivilegeAndWriter(t *testing.T) {
	t.Parallel()
	b := setupWAL(t, Options{})
	role := testenv.Name(t)
	admin := testenv.PostgresServerDSN(t)
	testenv.ExecPostgres(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN`, pgx.Identifier{role}.Sanitize()))
	t.Cleanup(func() {
		testenv.ExecPostgres(t, b.dsn, fmt.Sprintf(`DROP OWNED BY %s`, pgx.Identifier{role}.Sanitize()))
		testenv.ExecPostgres(t, admin, fmt.Sprintf(`DROP ROLE %s`, pgx.Identifier{role}.Sanitize()))
	})
	testenv.ExecPostgres(t, b.dsn, fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA %[1]s TO %[2]s`,
		pgx.Identifier{b.store.opts.Schema}.Sanitize(), pgx.Identifier{role}.Sanitize()))
	u, _ := url.Parse(b.dsn)
	u.User = url.User(role)
	app, err := OpenWAL(b.ctx, u.String(), b.store.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	wantErr(t, "Check", app.Check(b.ctx), role, "ALTER ROLE", "WITH REPLICATION")
	// Writing needs no privilege beyond a transaction.
	b.streaming(t)
	m := outbox.Message{Topic: "t", Key: "k", Payload: []byte("by the app")}
	err = pgx.BeginFunc(b.ctx, app.Pool(), func(tx pgx.Tx) error { return app.Writer().Write(b.ctx, tx, m) })
	if err != nil {
		t.Fatalf("a user without REPLICATION cannot write: %v", err)
	}
	if err := b.store.Sync(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.store.Stats().Buffered; got != 1 {
		t.Fatalf("%d messages captured, want the application's 1", got)
	}
}

// TestWALSlotsAndInvalidation: with every replication slot in use, Migrate
// says to raise max_replication_slots; a slot the server invalidates
// (max_slot_wal_keep_size exceeded while no relay read it) is a loud error
// saying messages were lost, from Check, the relay's lease rounds and the
// status.
func TestWALSlotsAndInvalidation(t *testing.T) {
	t.Parallel()
	srv := testenv.PostgresServer(t, testenv.PostgresOptions{Settings: map[string]string{
		"max_replication_slots": "1", "max_slot_wal_keep_size": "1MB", "wal_keep_size": "0",
	}})
	ctx := context.Background()
	testenv.ExecPostgres(t, srv.DSN(), `SELECT pg_create_logical_replication_slot('squatter', 'pgoutput')`)
	s, err := OpenWAL(ctx, newDatabase(t, srv.DSN(), "app"), walTestOptions(t, Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantErr(t, "Migrate with no free slot", s.Migrate(ctx), "all 1 slots", "raise max_replication_slots")
	testenv.ExecPostgres(t, srv.DSN(), `SELECT pg_drop_replication_slot('squatter')`)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of a fresh slot: %v", err)
	}
	if err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		return s.Writer().Write(ctx, tx, outbox.Message{Topic: "t", Key: "k"})
	}); err != nil {
		t.Fatal(err)
	}
	// No relay reads the slot while the WAL grows past the limit.
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE filler (v text)`); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitFor(t, "the server to invalidate the slot", 2*time.Minute, func() bool {
		if _, err := s.Pool().Exec(ctx, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); SELECT pg_switch_wal(); CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		var status string
		if err := s.Pool().QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, s.w.Slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "lost"
	})
	err = s.Check(ctx)
	if !errors.Is(err, ErrSlotLost) {
		t.Fatalf("Check of a lost slot: %v, want ErrSlotLost", err)
	}
	wantErr(t, "Check", err, "LOST", "max_slot_wal_keep_size", "pg_drop_replication_slot")
	s.Start()
	if err := s.WaitStreaming(ctx); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("WaitStreaming: %v, want ErrSlotLost", err)
	}
	if _, _, err := s.Hold(ctx, "relay"); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("Hold: %v, want ErrSlotLost", err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Slot == nil || st.Slot.WALStatus != "lost" || !strings.Contains(st.Slot.Error, "LOST") {
		t.Fatalf("Status.Slot = %+v, want wal_status lost and an error saying messages were lost", st.Slot)
	}
}

// retryWriter writes messages of its own keys until stopped, retrying a
// failed transaction (the server restarting) with the same messages: a
// commit whose outcome was unknown may then publish a message twice,
// never out of order.
func retryWriter(t *testing.T, b *walBundle, c *brokertest.Checker, id int, stop *atomic.Bool, written *atomic.Int64) {
	ctx := context.Background()
	for n := 0; !stop.Load(); n++ {
		msgs := []outbox.Message{
			{ID: outbox.NewID(), Topic: "r", Key: fmt.Sprintf("w%d-k%d", id, n%5)},
			{ID: outbox.NewID(), Topic: "r", Key: fmt.Sprintf("w%d-k%d", id, (n+1)%5)},
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := b.write(wctx, msgs...)
			cancel()
			if err == nil {
				break
			}
			if stop.Load() {
				return // never known to be committed: not recorded
			}
			time.Sleep(20 * time.Millisecond) // the server is restarting: retry pace, not synchronisation
		}
		for _, m := range msgs {
			c.Written(m.Key, m.ID)
		}
		written.Add(2)
	}
}

// TestWALPostgresRestart: PostgreSQL crashes (immediate shutdown) and
// restarts while writers write and a relay publishes; the relay takes the
// slot again and publishes everything, per key in commit order.
func TestWALPostgresRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.PostgresServer(t, testenv.PostgresOptions{})
	b := setupWAL(t, Options{}, newDatabase(t, srv.DSN(), "app"))
	checker := brokertest.NewChecker()
	pub := &walBroker{checker: checker}
	startRelay(t, b.store, pub, walRelayConfig("a"))
	b.streaming(t)
	var stop atomic.Bool
	var written atomic.Int64
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { retryWriter(t, b, checker, i, &stop, &written) })
	}
	relaytest.WaitFor(t, "writes before the crash", time.Minute, func() bool { return pub.acked.Load() > 200 })
	if err := srv.Restart(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	at := written.Load()
	relaytest.WaitFor(t, "the relay to stream again", 2*time.Minute, func() bool { return b.store.Stats().Active && b.store.Stats().Acquisitions >= 2 })
	relaytest.WaitFor(t, "writes after the restart", time.Minute, func() bool { return written.Load() > at+200 })
	stop.Store(true)
	wg.Wait()
	total := int(written.Load())
	relaytest.WaitFor(t, "every message published", 2*time.Minute, func() bool { return checker.Verify().DeliveredUnique == total })
	verifyChecker(t, checker)
}

// proxy forwards TCP connections to a server until partitioned: then it
// stops moving bytes either way without closing anything, like a network
// that drops every packet.
type proxy struct {
	ln     net.Listener
	target string
	cut    chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, cut: make(chan struct{})}
	p.wg.Go(p.accept)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		select {
		case <-p.cut:
			return // bytes stop here; the connections stay open
		default:
		}
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.cut:
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// partition stops all traffic, on the connections open and on new ones.
func (p *proxy) partition() { p.once.Do(func() { close(p.cut) }) }

// close ends the partition by closing every connection.
func (p *proxy) close() {
	p.partition()
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestWALTakeoverAfterPartition: the relay holding the slot is cut off
// from PostgreSQL (every packet dropped, nothing closed) while writers
// write; the server drops its stream after the timeout, a standby relay
// takes the slot over and publishes everything. The former holder can
// only have published copies of messages the new one publishes too: no
// loss, and the first deliveries of each key in commit order.
func TestWALTakeoverAfterPartition(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	b := setupWAL(t, Options{WAL: WALOptions{Timeout: timeout, StatusInterval: 100 * time.Millisecond}})
	checker := brokertest.NewChecker()
	pub := &walBroker{checker: checker}
	u, _ := url.Parse(b.dsn)
	px := startProxy(t, u.Host)
	u.Host = px.ln.Addr().String()
	opts := b.store.Options()
	cutOff, err := OpenWAL(b.ctx, u.String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cutOff.Close() })
	startRelay(t, cutOff, pub, walRelayConfig("holder"))
	t.Cleanup(px.close) // runs first: unblocks the cut-off relay's connections
	cutOff.Start()
	if err := cutOff.WaitStreaming(b.ctx); err != nil {
		t.Fatal(err)
	}
	standby := b.store
	startRelay(t, standby, pub, walRelayConfig("standby"))
	relaytest.WaitFor(t, "the standby to stand by", time.Minute, func() bool {
		standby.mu.Lock()
		defer standby.mu.Unlock()
		return standby.standby
	})
	var stop atomic.Bool
	w := &keyWriter{b: b, checker: checker}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { w.run(t, i, 10, 1<<30, &stop) })
	}
	relaytest.WaitFor(t, "the holder to publish", time.Minute, func() bool { return pub.acked.Load() > 300 })
	cutAt := time.Now()
	px.partition()
	relaytest.WaitFor(t, "the standby to take the slot over", time.Minute, func() bool { return standby.Stats().Active })
	t.Logf("takeover %v after the partition (Timeout %v, RetryInterval %v)", time.Since(cutAt).Round(time.Millisecond), timeout, opts.WAL.RetryInterval)
	relaytest.WaitFor(t, "the former holder to notice", time.Minute, func() bool { return !cutOff.Stats().Active })
	at := w.written.Load()
	relaytest.WaitFor(t, "writes after the takeover", time.Minute, func() bool { return w.written.Load() > at+300 })
	stop.Store(true)
	wg.Wait()
	total := int(w.written.Load())
	relaytest.WaitFor(t, "every message published", 2*time.Minute, func() bool { return checker.Verify().DeliveredUnique == total })
	rep := verifyChecker(t, checker)
	t.Logf("%d duplicates from the former holder's unconfirmed tail", len(rep.Duplicates))
}
