// Package e2e tests the relay end to end against real servers: PostgreSQL
// started from the system's binaries and an embedded NATS JetStream with
// file storage. It checks the guarantees with a chaos publisher, two relays
// sharing one database, and relay processes killed with SIGKILL.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

const childEnv = "OUTBOX_E2E_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "relay":
		os.Exit(childRelay())
	case "walrelay":
		os.Exit(childWALRelay())
	}
	testenv.Main(m)
}

// env is one test's servers: a migrated database and a broker whose
// destinations capture the topics "e2e.*".
type env struct {
	dsn   string
	store *postgres.Store
	*target
}

// target is a broker to relay to: the URL for backends.OpenPublisher, and
// a reader that feeds every delivery, in the broker's order per key, to a
// checker.
type target struct {
	name string
	url  string
	read func(t *testing.T, c *brokertest.Checker) int
}

// brokers are the brokers the chaos and crash tests run against.
var brokers = []struct {
	name  string
	start func(t *testing.T) *target
}{
	{"nats", natsTarget},
	{"rabbitmq", rabbitTarget},
	{"kafka", kafkaTarget},
	{"redis", redisTarget},
	{"kinesis", kinesisTarget},
}

func setup(t *testing.T, partitions int) *env {
	return setupWith(t, partitions, natsTarget)
}

func setupWith(t *testing.T, partitions int, broker func(t *testing.T) *target) *env {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	st, err := postgres.Open(ctx, dsn, postgres.Options{Partitions: partitions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &env{dsn: dsn, store: st, target: broker(t)}
}

// natsTarget: an embedded JetStream server with a file-storage stream on
// "e2e.>" (de-duplicating on Nats-Msg-Id), read back with an ordered
// consumer.
func natsTarget(t *testing.T) *target {
	ctx := context.Background()
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "E2E", Subjects: []string{"e2e.>"}, Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	return &target{name: "nats", url: ns.ClientURL(), read: func(t *testing.T, c *brokertest.Checker) int {
		return readStream(t, js, "E2E", c)
	}}
}

// writer writes messages in transactions of 1 to 10 while running, each
// writer owning its keys so that per-key commit order is its call order.
type writer struct {
	e       *env
	checker *brokertest.Checker
	written atomic.Int64
}

// run writes total messages, or until stop is set. Transactions use a
// context that is never cancelled, so that every commit is known.
func (w *writer) run(stop *atomic.Bool, t *testing.T, id, keys, total int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(id), 7))
	pool := w.e.store.Pool()
	for n := 0; n < total && !stop.Load(); {
		size := min(1+rng.IntN(10), total-n)
		msgs := make([]outbox.Message, size)
		for i := range msgs {
			msgs[i] = outbox.Message{
				ID:      outbox.NewID(),
				Topic:   fmt.Sprintf("e2e.w%d", id),
				Key:     fmt.Sprintf("w%d-k%d", id, rng.IntN(keys)),
				Payload: []byte(strconv.Itoa(n + i)),
			}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return postgres.Write(ctx, tx, msgs...)
		})
		if err != nil {
			t.Errorf("write: %v", err)
			return
		}
		for _, m := range msgs {
			w.checker.Written(m.Key, m.ID)
		}
		n += size
		w.written.Add(int64(size))
	}
}

func outstanding(t *testing.T, e *env) int64 {
	t.Helper()
	s, err := e.store.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s.Outstanding
}

// waitFor polls a condition with a deadline.
var waitFor = relaytest.WaitFor

// readStream feeds every message of the stream, in stream order, to the
// checker and returns how many it read.
func readStream(t *testing.T, js jetstream.JetStream, stream string, c *brokertest.Checker) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := int(info.State.Msgs)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < want {
		batch, err := cons.Fetch(min(1000, want-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			h := m.Headers()
			c.Delivered(brokertest.Received{ID: h.Get(jetstream.MsgIDHeader), Key: h.Get(outbox.HeaderKey), Topic: m.Subject()})
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

func verify(t *testing.T, e *env, c *brokertest.Checker) brokertest.Report {
	t.Helper()
	n := e.read(t, c)
	rep := c.Verify()
	t.Logf("%s delivered %d messages; %s", e.name, n, rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.DeliveredUnique != rep.Written {
		t.Fatalf("%d written, %d delivered", rep.Written, rep.DeliveredUnique)
	}
	return rep
}

// TestChaosTwoRelays: 8 workers in two relays share one database; the
// publisher fails messages and whole batches, loses acknowledgements and
// adds latency, while writers keep writing 50,000 messages over 500 keys.
// Nothing may be lost, the first deliveries of each key must follow commit
// order, and every duplicate must be a redelivery of an ID already seen.
//
// It runs once per broker, with 50,000 messages on NATS and 20,000 on the
// others (the checker's work is the same; the suite's time is not).
func TestChaosTwoRelays(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			perWriter := 10000
			if b.name != "nats" {
				perWriter = 4000
			}
			chaosTwoRelays(t, setupWith(t, 32, b.start), perWriter)
		})
	}
}

func chaosTwoRelays(t *testing.T, e *env, perWriter int) {
	checker := brokertest.NewChecker()
	var relays []*outbox.Relay
	var chaos []*brokertest.Chaos
	for i := 0; i < 2; i++ {
		pub, err := backends.OpenPublisher(context.Background(), e.url, backends.BrokerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		c := &brokertest.Chaos{
			Inner: pub, FailRate: 0.03, BatchFailRate: 0.02, LostAckRate: 0.02, BatchLostAckRate: 0.01,
			MaxLatency: 3 * time.Millisecond, Seed: int64(i + 1),
		}
		chaos = append(chaos, c)
		r, err := outbox.NewRelay(e.store, c, outbox.Config{
			Node: fmt.Sprintf("relay-%d", i), Workers: 4, BatchSize: 200,
			PollInterval: 50 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
			PublishTimeout: 5 * time.Second, LeaseTTL: 15 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
			MaxAttempts: 1000, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
		relays = append(relays, r)
	}

	const writers, keysPerWriter = 5, 100 // 500 keys
	w := &writer{e: e, checker: checker}
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Go(func() { w.run(new(atomic.Bool), t, i, keysPerWriter, perWriter) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	waitFor(t, "the outbox to drain", 5*time.Minute, func() bool { return outstanding(t, e) == 0 })
	for _, r := range relays {
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("relay stats: %+v", r.Stats())
	}
	for i, c := range chaos {
		t.Logf("chaos %d: %+v", i, c.Stats())
		if s := c.Stats(); s.FailedBefore == 0 || s.LostAcks == 0 {
			t.Fatalf("chaos %d injected nothing: %+v", i, s)
		}
	}
	for i, r := range relays {
		if r.Stats().Published == 0 {
			t.Fatalf("relay %d published nothing: the two relays did not share the work", i)
		}
	}
	verify(t, e, checker)
	dead, err := e.store.DeadLetters(context.Background(), outbox.DeadLetterFilter{})
	if err != nil || len(dead) != 0 {
		t.Fatalf("dead letters: %d, %v", len(dead), err)
	}
}

// childRelay runs a relay process for TestCrashRestart until killed.
func childRelay() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	st, err := postgres.Open(ctx, os.Getenv("OUTBOX_E2E_DSN"), postgres.Options{RingRotate: ringRotateFromEnv()})
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
	r, err := outbox.NewRelay(st, pub, crashConfig(os.Getenv("OUTBOX_E2E_NODE")))
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

func crashConfig(node string) outbox.Config {
	return outbox.Config{
		Node: node, Workers: 4, BatchSize: 100,
		PollInterval: 20 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
		PublishTimeout: 300 * time.Millisecond, LeaseTTL: time.Second, HeartbeatInterval: 150 * time.Millisecond,
		MaxAttempts: 1000, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// TestCrashRestart kills relay processes with SIGKILL at random moments and
// starts new ones, several times, while writers keep writing; a last relay
// drains what is left. The stream must hold every message, first delivered
// in per-key commit order.
//
// It runs once per broker.
func TestCrashRestart(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) { crashRestart(t, setupWith(t, 16, b.start)) })
	}
}

func crashRestart(t *testing.T, e *env) {
	checker := brokertest.NewChecker()
	w := &writer{e: e, checker: checker}
	var stopWriting atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Go(func() { w.run(&stopWriting, t, i, 50, 1<<30) })
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	kills := 0
	for round := 0; round < 5; round++ {
		var procs []*exec.Cmd
		for j := 0; j < 2; j++ { // two relay processes at a time
			cmd := exec.Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=relay", "OUTBOX_E2E_DSN="+e.dsn, "OUTBOX_E2E_BROKER="+e.url,
				fmt.Sprintf("OUTBOX_E2E_NODE=crash-%d-%d", round, j))
			cmd.Stderr = os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, cmd)
		}
		// A random moment to crash: the schedule of the chaos, not a
		// synchronisation. Leases of the killed processes expire after
		// one TTL, so the next round's relays must take them over.
		before := w.written.Load()
		time.Sleep(time.Duration(800+rng.IntN(1500)) * time.Millisecond)
		for _, cmd := range procs {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			kills++
		}
		t.Logf("round %d: killed 2 relays; %d written so far (+%d), %d outstanding", round, w.written.Load(), w.written.Load()-before, outstanding(t, e))
	}
	stopWriting.Store(true)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// The last relay, in process, drains the rest.
	pub, err := backends.OpenPublisher(context.Background(), e.url, backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := outbox.NewRelay(e.store, pub, crashConfig("final"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain", 2*time.Minute, func() bool { return outstanding(t, e) == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	rep := verify(t, e, checker)
	if rep.Written < 1000 {
		t.Fatalf("only %d messages written: the test did not exercise the relay", rep.Written)
	}
	if kills < 10 {
		t.Fatalf("only %d kills", kills)
	}
}

// TestLeaseTakeoverPostgres: a relay that stops heartbeating loses its
// partitions to another within the lease TTL, and its late settles are
// fenced off by the epoch, on the real store.
func TestLeaseTakeoverPostgres(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, testenv.PostgresDSN(t), postgres.Options{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	status := func() *outbox.Status {
		s, err := st.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	relaytest.LeaseTakeover(t, relaytest.Harness{
		Store: st,
		Write: func(ctx context.Context, msgs ...outbox.Message) error {
			return pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return postgres.Write(ctx, tx, msgs...) })
		},
		Outstanding: func() int64 { return status().Outstanding },
		Owner: func(p int) string {
			for _, ps := range status().Partitions {
				if ps.Partition == p && ps.LeaseExpiresAt.After(time.Now()) {
					return ps.Owner
				}
			}
			return ""
		},
		DeadLetters: func() int64 { return status().DeadLetters },
	})
}
