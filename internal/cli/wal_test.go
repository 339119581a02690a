package cli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// writeWAL commits msgs into the WAL of dsn (capture wal, default names).
func writeWAL(t *testing.T, dsn string, msgs []outbox.Message) {
	t.Helper()
	w, err := postgres.NewWriter(postgres.Options{Capture: postgres.CaptureWAL})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error { return w.Write(t.Context(), tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// TestCaptureWAL: migrate --capture wal creates the slot; a relay given
// ?capture=wal in the store URL publishes what writers emit into the WAL,
// exports the slot's lag on /metrics; status shows the slot; after a
// stop, the messages written meanwhile wait in the slot and a new relay
// publishes them.
func TestCaptureWAL(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	r := mustRun(t, nil, "migrate", "--store", dsn, "--capture", "wal", "--partitions", "8")
	if !strings.Contains(r.stdout, "(8 partitions)") || !strings.Contains(r.stdout, "replication slot outbox is ready") {
		t.Fatalf("migrate --capture wal: %v", r)
	}
	mustRun(t, nil, "migrate", "--store", dsn, "--capture", "wal") // again: a no-op
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	writeWAL(t, dsn, messages("orders.created", 100, 10))

	relay := func() *background {
		return start(t, map[string]string{"OUTBOX_HTTP_ADDR": "127.0.0.1:0"}, "relay", "--store", dsn+"&capture=wal", "--broker", ns.ClientURL(),
			"--log-format", "json", "--poll-interval", "50ms")
	}
	b := relay()
	addr := httpAddrFromLog(t, b)
	poll(t, "the first messages to reach the stream", func() bool { return streamMsgs(t, st) >= 100 })
	writeWAL(t, dsn, messages("orders.paid", 50, 5))
	poll(t, "the later messages to reach the stream", func() bool { return streamMsgs(t, st) >= 150 })
	poll(t, "/metrics to show the slot held", func() bool {
		_, body := httpGet(t, "http://"+addr+"/metrics")
		return strings.Contains(body, `outbox_wal_slot_held{slot="outbox"} 1`) && strings.Contains(body, `outbox_wal_slot_lag_bytes{slot="outbox"}`) && strings.Contains(body, `outbox_wal_parked_messages{slot="outbox"} 0`)
	})
	s := statusJSON(t, dsn+"&capture=wal")
	if s.Slot == nil || s.Slot.Name != "outbox" || !s.Slot.Active || s.Slot.Held || s.Slot.WALStatus == "lost" {
		t.Fatalf("status --json slot = %+v, want outbox, streamed by the relay", s.Slot)
	}
	text := mustRun(t, nil, "status", "--store", dsn, "--capture", "wal").stdout
	for _, re := range []string{`(?m)^replication slot\s+outbox: streamed by a relay`, `(?m)^lag\s+\d`, `(?m)^outstanding\s+- \(capture wal`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Fatalf("status text lacks %s:\n%s", re, text)
		}
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	if got := streamMsgs(t, st); got != 150 {
		t.Fatalf("stream holds %d messages, want 150", got)
	}
	// Written while no relay runs: kept by the slot, published by the next.
	writeWAL(t, dsn, messages("orders.shipped", 30, 3))
	b = relay()
	poll(t, "the messages written during the stop to reach the stream", func() bool { return streamMsgs(t, st) >= 180 })
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	if got := streamMsgs(t, st); got != 180 {
		t.Fatalf("stream holds %d messages, want 180: a graceful stop published some twice or lost some", got)
	}
	mustRun(t, nil, "dlq", "list", "--store", dsn, "--capture", "wal") // the dead-letter table of the table mode
}

// TestCaptureWALUsageErrors: a bad --capture, or wal on a store that is
// not PostgreSQL, is a usage error naming the flag.
func TestCaptureWALUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"migrate", "--store", "postgres://u@127.0.0.1:1/app", "--capture", "logical"}, []string{"--capture", `"table" or "wal"`}},
		{[]string{"status", "--store", "postgres://u@127.0.0.1:1/app?capture=cdc"}, []string{"--capture", `got "cdc"`}},
		{[]string{"relay", "--store", "sqlite://" + t.TempDir() + "/x.db", "--broker", "nats://127.0.0.1:1", "--capture", "wal"}, []string{"--capture", "needs a postgres:// store", "sqlite"}},
		{[]string{"status", "--store", "postgres://u@127.0.0.1:1/app?capture=wal", "--capture", "table"}, []string{"capture=", "conflicts with --capture"}},
	} {
		r := run(t, nil, tc.args...)
		if r.code != 2 {
			t.Fatalf("%v: want exit 2: %v", tc.args, r)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v: stderr %q lacks %q", tc.args, r.stderr, w)
			}
		}
	}
}

// TestAdminDetectsTheCaptureMode: on an outbox captured from the WAL,
// `status` and `dlq requeue` without --capture read it as capture wal
// (its replication slot exists): status shows the slot instead of "live
// relays 0", and a requeue goes into the WAL, where the relay reads. With
// --capture table, a requeue refuses (exit 2) and names the fix: requeued
// into the table, the messages would wait where no relay reads them. (On
// 443b377 it exited 0 and parked them there.)
func TestAdminDetectsTheCaptureMode(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { dropSlot(t, "outbox_adm_outbox") })
	dsn := testenv.PostgresDSN(t)
	// Its own schema, so its own slot (slots are the server's, and other
	// tests use the default one).
	st, err := postgres.Open(t.Context(), dsn, postgres.Options{Schema: "adm"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dsn += "&schema=adm"
	mustRun(t, nil, "migrate", "--store", dsn, "--capture", "wal", "--partitions", "8")
	// A dead letter, as a relay would have written it.
	if _, err := st.Pool().Exec(t.Context(), `INSERT INTO adm.outbox_dead_letters (id, seq, partition, topic, key, payload, created_at, attempts, last_error, failed_at)
VALUES (gen_random_uuid(), 1, 0, 'orders.created', 'k', '\x00', now(), 3, 'boom', now())`); err != nil {
		t.Fatal(err)
	}
	text := mustRun(t, nil, "status", "--store", dsn).stdout
	for _, re := range []string{`(?m)^replication slot\s+outbox_adm_outbox`, `(?m)^live relays\s+- \(capture wal`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Fatalf("status without --capture on a WAL-captured outbox lacks %s:\n%s", re, text)
		}
	}
	r := run(t, nil, "dlq", "requeue", "--store", dsn, "--capture", "table", "--topic", "orders.created")
	if r.code != 2 || !strings.Contains(r.stderr, "--capture wal") || !strings.Contains(r.stderr, `replication slot "outbox_adm_outbox"`) {
		t.Fatalf("dlq requeue --capture table on a WAL-captured outbox: %v\nwant exit 2 naming the slot and --capture wal", r)
	}
	r = mustRun(t, nil, "dlq", "requeue", "--store", dsn, "--topic", "orders.created")
	if !strings.Contains(r.stdout, "requeued 1 dead letter") {
		t.Fatalf("dlq requeue (capture detected): %v", r)
	}
	if n, err := st.CountDeadLetters(t.Context(), outbox.DeadLetterFilter{}); err != nil || n != 0 {
		t.Fatalf("%d dead letters left (%v), want 0", n, err)
	}
	var rows int
	if err := st.Pool().QueryRow(t.Context(), `SELECT count(*) FROM adm.outbox_messages`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows requeued into the table (%v): want none, the message goes into the WAL", rows, err)
	}
}

// dropSlot drops a replication slot a test made: slots are the server's,
// shared by every test database.
func dropSlot(t *testing.T, name string) {
	conn, err := pgx.Connect(context.Background(), testenv.PostgresServerDSN(t))
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name); err != nil {
		t.Error(err)
	}
}
