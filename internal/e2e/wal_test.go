package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// walOptions are the WAL capture options of the crash test's relays and
// writers: quick to confirm and to take the slot over.
func walOptions() postgres.Options {
	return postgres.Options{Partitions: 16, WAL: postgres.WALOptions{
		StatusInterval: 50 * time.Millisecond, RetryInterval: 100 * time.Millisecond, Timeout: 2 * time.Second,
	}}
}

// childWALRelay runs a capture-wal relay process for TestWALCrashTakeover
// until killed or stopped (SIGTERM: a graceful stop).
func childWALRelay() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	st, err := postgres.OpenWAL(ctx, os.Getenv("OUTBOX_E2E_DSN"), walOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer st.Close()
	pub, err := backends.OpenPublisher(ctx, os.Getenv("OUTBOX_E2E_BROKER"), backends.BrokerOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pub.Close()
	cfg := crashConfig(os.Getenv("OUTBOX_E2E_NODE"))
	// A takeover publishes the killed relay's unconfirmed tail again: the
	// broker's duplicate acknowledgements would flood the log at WARN.
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	r, err := outbox.NewRelay(st, pub, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestWALCrashTakeover: capture wal under fire. Writers emit into the WAL
// while two relay processes run, one streaming from the slot and one
// standing by; the one streaming is SIGKILLed at random moments, the
// standby takes the slot over, and a new standby is started, again and
// again. At the end the slot is drained and the relays stopped: the
// broker must hold every message, first delivered in per-key commit
// order; a message may come twice only from a killed relay's
// unconfirmed tail.
//
// It runs once per broker.
func TestWALCrashTakeover(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) { walCrashTakeover(t, b.start(t)) })
	}
}

// walProc is a relay process of the crash test.
type walProc struct {
	node string
	cmd  *exec.Cmd
}

func walCrashTakeover(t *testing.T, tg *target) {
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	st, err := postgres.OpenWAL(ctx, dsn, walOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pool := st.Pool()
	w := st.Writer()
	checker := brokertest.NewChecker()
	var stopWriting atomic.Bool
	var written atomic.Int64
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			for n := 0; !stopWriting.Load(); n++ {
				msgs := make([]outbox.Message, 1+rng.IntN(10))
				for j := range msgs {
					msgs[j] = outbox.Message{ID: outbox.NewID(), Topic: fmt.Sprintf("e2e.w%d", i), Key: fmt.Sprintf("w%d-k%d", i, rng.IntN(50)), Payload: []byte(strconv.Itoa(n))}
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				for _, m := range msgs {
					checker.Written(m.Key, m.ID)
				}
				written.Add(int64(len(msgs)))
			}
		})
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	seq := 0
	spawn := func() *walProc {
		seq++
		node := fmt.Sprintf("wal-%d", seq)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", node) // names its replication connection
		u.RawQuery = q.Encode()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=walrelay", "OUTBOX_E2E_DSN="+u.String(), "OUTBOX_E2E_BROKER="+tg.url, "OUTBOX_E2E_NODE="+node)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return &walProc{node: node, cmd: cmd}
	}
	// streaming returns the node streaming from the slot, or "".
	streaming := func() string {
		var node string
		err := pool.QueryRow(ctx, `SELECT coalesce((SELECT r.application_name FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1), '')`, st.Options().WAL.Slot).Scan(&node)
		if err != nil {
			t.Fatal(err)
		}
		return node
	}
	procs := map[string]*walProc{}
	for range 2 {
		p := spawn()
		procs[p.node] = p
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	kills := 0
	for round := range 5 {
		var holder string
		waitFor(t, "a relay to stream from the slot", time.Minute, func() bool { holder = streaming(); return procs[holder] != nil })
		before := written.Load()
		// A random moment to crash: the schedule of the chaos, not a
		// synchronisation.
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		p := procs[holder]
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
		delete(procs, holder)
		kills++
		killedAt := time.Now()
		var next string
		waitFor(t, "the standby to take the slot over", time.Minute, func() bool { next = streaming(); return procs[next] != nil })
		t.Logf("round %d: killed %s while streaming (+%d written); %s took over in %v", round, holder, written.Load()-before, next, time.Since(killedAt).Round(time.Millisecond))
		n := spawn() // the new standby
		procs[n.node] = n
	}
	stopWriting.Store(true)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var end string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slot to be confirmed past the last write", 2*time.Minute, func() bool {
		var done bool
		err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, st.Options().WAL.Slot, end).Scan(&done)
		return err == nil && done
	})
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("relay %s after SIGTERM: %v", p.node, err)
		}
	}
	n := tg.read(t, checker)
	rep := checker.Verify()
	t.Logf("%s delivered %d messages after %d kills; %s", tg.name, n, kills, rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.DeliveredUnique != rep.Written || rep.Written < 1000 {
		t.Fatalf("%d written, %d delivered", rep.Written, rep.DeliveredUnique)
	}
}
