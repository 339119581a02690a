package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// holdXid opens a session named app on dsn that takes a transaction ID and
// stays idle in transaction until the test ends (or release is called).
func holdXid(t *testing.T, ctx context.Context, dsn, app string) (pid int, release func()) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, _ = conn.Exec(context.Background(), "ROLLBACK")
			_ = conn.Close(context.Background())
		})
	}
	t.Cleanup(release)
	return int(conn.PgConn().PID()), release
}

// lockedBuffer is a log sink for slog, safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records returns the JSON log records written so far.
func (l *lockedBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.b.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func findHolder(hz *outbox.XminHorizon, kind string, pid int, name string) *outbox.HorizonHolder {
	for i, h := range hz.Holders {
		if h.Kind == kind && (pid == 0 || h.PID == pid) && (name == "" || h.Name == name) {
			return &hz.Holders[i]
		}
	}
	return nil
}

// A session idle in transaction with an xid is named as the holder, with
// its pid, application, user and state; the writes after it age it in
// transaction IDs; Status carries it; the relay's heartbeat warns once,
// naming the session, and says so when it is released.
func TestXminHorizonIdleSession(t *testing.T) {
	b := setup(t, Options{HorizonWarnAfter: time.Nanosecond})
	s := b.store
	var logs lockedBuffer
	s.SetLogger(slog.New(slog.NewJSONHandler(&logs, nil)))

	pid, release := holdXid(t, b.ctx, b.dsn, "report-job")
	const writes = 5
	for i := range writes {
		if err := b.write(t, outbox.Message{Topic: "t", Key: fmt.Sprint(i), Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}

	hz, err := s.XminHorizon(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := findHolder(hz, outbox.HolderSession, pid, "")
	if h == nil {
		t.Fatalf("the idle session (pid %d) is not among the holders: %+v", pid, hz.Holders)
	}
	if h.Application != "report-job" || h.State != "idle in transaction" || h.User == "" || h.XactStart.IsZero() || h.AgeSeconds == nil {
		t.Errorf("holder %+v: want application report-job, state idle in transaction, a user, a transaction start and an age", *h)
	}
	if h.AgeXids < writes {
		t.Errorf("holder age %d xids after %d writing transactions: want at least %d", h.AgeXids, writes, writes)
	}
	if hz.AgeXids < h.AgeXids || hz.AgeSeconds == nil {
		t.Errorf("horizon age %d xids (seconds %v), below its holder's %d", hz.AgeXids, hz.AgeSeconds, h.AgeXids)
	}
	if hz.Holders[0].AgeXids != hz.AgeXids && hz.Holders[0].Kind != outbox.HolderSlotCatalog {
		t.Errorf("holders not oldest first: %+v", hz.Holders)
	}

	st, err := s.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.XminHorizon == nil || findHolder(st.XminHorizon, outbox.HolderSession, pid, "") == nil {
		t.Errorf("Status().XminHorizon %+v does not name pid %d", st.XminHorizon, pid)
	}

	// The heartbeat samples and warns once; a second heartbeat within
	// HorizonWarnEvery does not repeat it.
	for range 2 {
		if _, err := s.Heartbeat(b.ctx, "n1", time.Minute); err != nil {
			t.Fatal(err)
		}
		s.horizon.mu.Lock()
		s.horizon.sampledAt = time.Time{} // sample at every heartbeat
		s.horizon.mu.Unlock()
	}
	var warns []map[string]any
	for _, r := range logs.records(t) {
		if r["level"] == "WARN" {
			warns = append(warns, r)
		}
	}
	if len(warns) != 1 {
		t.Fatalf("got %d WARN records, want 1: %v", len(warns), logs.records(t))
	}
	w := warns[0]
	if w["pid"] != float64(pid) || w["application"] != "report-job" || w["holder"] != "session" ||
		!strings.Contains(w["msg"].(string), fmt.Sprintf("session pid %d", pid)) ||
		!strings.Contains(w["msg"].(string), fmt.Sprintf("pg_terminate_backend(%d)", pid)) {
		t.Errorf("WARN %v: want the session named (pid, application) with how to end it", w)
	}

	release()
	if _, err := s.Heartbeat(b.ctx, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	recs := logs.records(t)
	if last := recs[len(recs)-1]; last["level"] != "INFO" || !strings.Contains(last["msg"].(string), "no longer held") {
		t.Errorf("after the release the last record is %v, want an INFO that the horizon is released", last)
	}
	hz, err = s.XminHorizon(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if findHolder(hz, outbox.HolderSession, pid, "") != nil {
		t.Errorf("the released session %d is still listed: %+v", pid, hz.Holders)
	}
}

// Without a logger, or with the warning off, the heartbeat reads nothing
// more and logs nothing.
func TestXminHorizonWarnOff(t *testing.T) {
	b := setup(t, Options{HorizonWarnAfter: -1})
	var logs lockedBuffer
	b.store.SetLogger(slog.New(slog.NewJSONHandler(&logs, nil)))
	holdXid(t, b.ctx, b.dsn, "holder")
	if err := b.write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Heartbeat(b.ctx, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if recs := logs.records(t); len(recs) != 0 {
		t.Errorf("HorizonWarnAfter < 0 logged %v", recs)
	}
	b.store.horizon.mu.Lock()
	sampled := b.store.horizon.sampledAt
	b.store.horizon.mu.Unlock()
	if !sampled.IsZero() {
		t.Error("HorizonWarnAfter < 0: the heartbeat still sampled the horizon")
	}
}

// Prepared transactions and replication slots are holders too, on a server
// of their own (prepared transactions need max_prepared_transactions): a
// prepared transaction holds the outbox table's horizon; a logical slot's
// catalog_xmin is listed but holds back only the catalogs.
func TestXminHorizonPreparedAndSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serverDSN, stop, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{
		Settings: map[string]string{"max_prepared_transactions": "5"},
	})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = stop() })
	s, err := Open(ctx, serverDSN, Options{Schema: "horizon", Partitions: 2, HorizonWarnAfter: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	s.SetLogger(slog.New(slog.NewJSONHandler(&logs, nil)))

	const gid = "order's 42"
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The slot first: creating a logical slot waits for the transactions
	// in progress, the prepared one included.
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('other_tool', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot('other_tool')") }()
	for _, q := range []string{"BEGIN", "SELECT pg_current_xact_id()", "PREPARE TRANSACTION 'order''s 42'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	defer func() { _, _ = conn.Exec(context.Background(), "ROLLBACK PREPARED 'order''s 42'") }()
	for range 3 {
		if err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			return s.Writer().Write(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")})
		}); err != nil {
			t.Fatal(err)
		}
	}

	hz, err := s.XminHorizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := findHolder(hz, outbox.HolderPrepared, 0, gid)
	if p == nil || p.AgeXids < 3 || p.AgeSeconds == nil || p.XactStart.IsZero() || p.Database == "" {
		t.Fatalf("prepared transaction %q: got %+v among %+v", gid, p, hz.Holders)
	}
	if hz.AgeXids != p.AgeXids {
		t.Errorf("horizon age %d xids, want the prepared transaction's %d", hz.AgeXids, p.AgeXids)
	}
	sl := findHolder(hz, outbox.HolderSlotCatalog, 0, "other_tool")
	if sl == nil || sl.State != "inactive" || sl.AgeSeconds == nil {
		t.Errorf("slot other_tool (catalog_xmin): got %+v among %+v", sl, hz.Holders)
	}
	if findHolder(hz, outbox.HolderSlot, 0, "other_tool") != nil {
		t.Errorf("a logical slot has no xmin, only a catalog_xmin: %+v", hz.Holders)
	}

	if _, err := s.Heartbeat(ctx, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	recs := logs.records(t)
	if len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["holder"] != "prepared" ||
		!strings.Contains(recs[0]["msg"].(string), `ROLLBACK PREPARED 'order''s 42'`) {
		t.Errorf("logs %v: want one WARN naming the prepared transaction and how to end it", recs)
	}
}
