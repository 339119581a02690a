package mysql

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// The relay-level suites the SQLite and PostgreSQL stores run, on MariaDB:
// chaos with several relays and late commits, ordering none, lease
// takeover, relay processes killed with SIGKILL, a failing key, a blocked
// destination.

// recorder is a publisher that records every message it receives in a
// Checker, in call order, and signals each call.
type recorder struct {
	c      *brokertest.Checker
	called chan struct{}
}

func newRecorder() *recorder {
	return &recorder{c: brokertest.NewChecker(), called: make(chan struct{}, 1)}
}

func (r *recorder) Publish(_ context.Context, msgs []*outbox.Message) []error {
	for _, m := range msgs {
		r.c.Delivered(brokertest.Received{ID: m.ID, Key: m.Key, Topic: m.Topic, Payload: m.Payload})
	}
	select {
	case r.called <- struct{}{}:
	default:
	}
	return make([]error, len(msgs))
}

func (r *recorder) Close() error { return nil }

// writeLoad runs writers writers, each writing perWriter messages over its
// own keys in transactions of 1 to 5 messages: a key has one writer, so
// its commit order is the order of the writer's calls. Writers of
// different keys interleave, so rows commit out of seq order in a
// partition (late commits below the relays' cursors). It returns a channel
// that receives nil or the first error once every writer is done.
func writeLoad(b *bundle, c *brokertest.Checker, writers, keysPerWriter, perWriter int) <-chan error {
	done := make(chan error, 1)
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for n := 0; n < perWriter; {
				size := min(1+rng.IntN(5), perWriter-n)
				msgs := make([]outbox.Message, size)
				for i := range msgs {
					msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: "orders.created", Key: fmt.Sprintf("key-%d-%d", w, rng.IntN(keysPerWriter)), Payload: []byte(fmt.Sprint(n + i))}
				}
				if err := b.write(context.Background(), msgs...); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				for _, m := range msgs {
					c.Written(m.Key, m.ID)
				}
				n += size
			}
		})
	}
	go func() {
		wg.Wait()
		if e := first.Load(); e != nil {
			done <- *e
		} else {
			done <- nil
		}
	}()
	return done
}

func chaosConfig(node string, ordering outbox.Ordering) outbox.Config {
	return outbox.Config{
		Node:           node,
		Ordering:       ordering,
		Workers:        2,
		BatchSize:      50,
		PublishTimeout: time.Second,
		LeaseTTL:       3 * time.Second,
		BackoffMin:     5 * time.Millisecond,
		BackoffMax:     50 * time.Millisecond,
		MaxAttempts:    1000,
		SweepInterval:  100 * time.Millisecond,
	}
}

// drain waits until every written message was delivered and settled.
func drain(t *testing.T, b *bundle, rec *recorder, writes <-chan error, total int, during func(brokertest.Report)) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for {
		rep := rec.c.Verify()
		if during != nil {
			during(rep)
		}
		// Delivered is not enough: a message whose acknowledgement the
		// chaos publisher lost is on the broker but waits for its retry.
		if rep.Written == total && rep.DeliveredUnique == rep.Written && b.count(t, "_messages") == 0 {
			return
		}
		select {
		case <-rec.called:
		case <-time.After(20 * time.Millisecond): // settles signal nothing: look again
		case err := <-writes:
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
			writes = nil
		case <-deadline.C:
			t.Fatalf("not every message published within two minutes: %v", rep)
		}
	}
}

// TestRelayChaos drains the store with three relay nodes through a
// publisher that fails and loses acknowledgements at random, while writers
// keep writing; one node stops half way and the others take its
// partitions over. Nothing is lost and each key's messages are first
// published in commit order.
func TestRelayChaos(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	pub := &brokertest.Chaos{Inner: rec, FailRate: 0.05, BatchFailRate: 0.02, LostAckRate: 0.02, MaxLatency: 2 * time.Millisecond, Seed: 1}
	late := &lateLog{}
	var relays []*outbox.Relay
	for _, node := range []string{"a", "b", "c"} {
		cfg := chaosConfig(node, outbox.OrderingKey)
		cfg.Logger = slog.New(late)
		relays = append(relays, relaytest.Start(t, b.store, pub, cfg))
	}
	const writers, keys, perWriter = 4, 5, 300
	writes := writeLoad(b, rec.c, writers, keys, perWriter)
	stopped := false
	drain(t, b, rec, writes, writers*perWriter, func(rep brokertest.Report) {
		if !stopped && rep.DeliveredUnique >= writers*perWriter/2 {
			if err := relays[0].Stop(); err != nil {
				t.Fatalf("stop node a: %v", err)
			}
			stopped = true
		}
	})
	for _, r := range relays {
		if err := r.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	rep := rec.c.Verify()
	t.Logf("%v; chaos: %+v; late records found by the sweep: %d", rep, pub.Stats(), late.count())
	if len(rep.Lost) > 0 || len(rep.Unknown) > 0 || len(rep.WrongKey) > 0 {
		t.Fatal(rep.Err())
	}
	// The one reordering the store allows (doc.go, "Commit order"): a row
	// whose seq was drawn but not yet in the pending index when a fetch
	// read past it, found later by the sweep. Any other is a bug.
	for _, v := range rep.OrderViolations {
		_, rest, _ := strings.Cut(v, ": ")
		id, _, _ := strings.Cut(rest, " ")
		if !late.has(id) {
			t.Errorf("order violation not explained by a late commit found by the sweep: %s", v)
		}
	}
}

// lateLog is a slog handler that records the IDs of the records the
// relay reports as late commits found by its sweep.
type lateLog struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (l *lateLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *lateLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lateLog) WithGroup(string) slog.Handler            { return l }
func (l *lateLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "late record found by the sweep" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "id" {
			l.mu.Lock()
			if l.ids == nil {
				l.ids = map[string]bool{}
			}
			l.ids[a.Value.String()] = true
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *lateLog) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids[id]
}

func (l *lateLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// TestRelayOrderingNone: two relays in ordering none (claims with FOR
// UPDATE SKIP LOCKED) under the same chaos lose nothing.
func TestRelayOrderingNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	pub := &brokertest.Chaos{Inner: rec, FailRate: 0.05, BatchFailRate: 0.02, LostAckRate: 0.02, MaxLatency: 2 * time.Millisecond, Seed: 2}
	relaytest.Start(t, b.store, pub, chaosConfig("a", outbox.OrderingNone))
	relaytest.Start(t, b.store, pub, chaosConfig("b", outbox.OrderingNone))
	const writers, keys, perWriter = 3, 5, 300
	drain(t, b, rec, writeLoad(b, rec.c, writers, keys, perWriter), writers*perWriter, nil)
	rep := rec.c.Verify()
	t.Logf("%v; chaos: %+v", rep, pub.Stats())
	if len(rep.Lost) > 0 || len(rep.Unknown) > 0 {
		t.Fatal(rep.Err())
	}
}

// TestLeaseTakeover: a relay that stops heartbeating loses its partitions
// to another within the lease TTL, and its late settles are fenced off by
// the epoch.
func TestLeaseTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 2})
	status := func() *outbox.Status {
		s, err := b.store.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	relaytest.LeaseTakeover(t, relaytest.Harness{
		Store:       b.store,
		Write:       b.write,
		Outstanding: func() int64 { return status().Outstanding },
		Owner: func(p int) string {
			for _, ps := range status().Partitions {
				if ps.Partition == p {
					return ps.Owner
				}
			}
			return ""
		},
		DeadLetters: func() int64 { return status().DeadLetters },
	})
}

// gated fails every message of one key (retryable) until opened, and
// records everything it acknowledges.
type gated struct {
	rec  *recorder
	key  string
	open atomic.Bool
	hits atomic.Int64
}

var errGated = errors.New("the broker refuses this key for now")

func (g *gated) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	var ok []*outbox.Message
	for i, m := range msgs {
		if m.Key == g.key && !g.open.Load() {
			errs[i] = errGated
			g.hits.Add(1)
			continue
		}
		ok = append(ok, m)
	}
	g.rec.Publish(ctx, ok)
	return errs
}

func (g *gated) Close() error { return nil }

// TestFailingKeyHoldsOnlyItself: a key whose messages keep failing holds
// back only its own later messages: every other key of every partition
// flows, and once the key's broker answers, its messages go in order.
func TestFailingKeyHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	pub := &gated{rec: rec, key: "bad"}
	cfg := chaosConfig("n", outbox.OrderingKey)
	cfg.PollInterval = 20 * time.Millisecond
	r := relaytest.Start(t, b.store, pub, cfg)
	var msgs []outbox.Message
	for i := range 200 {
		key := fmt.Sprintf("good-%d", i%20)
		if i%50 == 0 {
			key = "bad"
		}
		msgs = append(msgs, outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key})
	}
	for i := 0; i < len(msgs); i += 10 {
		if err := b.write(b.ctx, msgs[i:i+10]...); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs[i : i+10] {
			rec.c.Written(m.Key, m.ID)
		}
	}
	relaytest.WaitFor(t, "every good message delivered and settled", time.Minute, func() bool {
		return rec.c.Verify().DeliveredUnique == 196 && b.count(t, "_messages") == 4
	})
	relaytest.WaitFor(t, "the bad key retried", time.Minute, func() bool { return pub.hits.Load() >= 3 })
	pub.open.Store(true)
	relaytest.WaitFor(t, "the outbox to drain", time.Minute, func() bool { return b.count(t, "_messages") == 0 })
	rep := rec.c.Verify()
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(); s.DeadLettered != 0 || s.Failed == 0 {
		t.Fatalf("relay stats %+v: want retries and no dead letters", s)
	}
}

// blocking refuses a whole destination (outbox.Blocked) until opened.
type blocking struct {
	rec   *recorder
	topic string
	open  atomic.Bool
}

func (p *blocking) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	var ok []*outbox.Message
	for i, m := range msgs {
		if m.Topic == p.topic && !p.open.Load() {
			errs[i] = outbox.Blocked(m.Topic, errors.New("no such stream"))
			continue
		}
		ok = append(ok, m)
	}
	p.rec.Publish(ctx, ok)
	return errs
}

func (p *blocking) Close() error { return nil }

// TestBlockedDestinationPausesOnlyItself: a destination the broker
// refuses as a whole spends no attempt and dead-letters nothing even with
// MaxAttempts 1, other destinations keep flowing, and once it is fixed
// every message arrives in per-key order.
func TestBlockedDestinationPausesOnlyItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	pub := &blocking{rec: rec, topic: "blocked"}
	cfg := chaosConfig("n", outbox.OrderingKey)
	cfg.MaxAttempts = 1
	r := relaytest.Start(t, b.store, pub, cfg)
	var blocked, open []outbox.Message
	for i := range 100 {
		blocked = append(blocked, outbox.Message{ID: outbox.NewID(), Topic: "blocked", Key: fmt.Sprintf("b-%d", i%7)})
		open = append(open, outbox.Message{ID: outbox.NewID(), Topic: "open", Key: fmt.Sprintf("o-%d", i%7)})
	}
	for i := 0; i < 100; i += 10 {
		batch := append(append([]outbox.Message(nil), blocked[i:i+10]...), open[i:i+10]...)
		if err := b.write(b.ctx, batch...); err != nil {
			t.Fatal(err)
		}
		for _, m := range batch {
			rec.c.Written(m.Key, m.ID)
		}
	}
	relaytest.WaitFor(t, "the open destination delivered", time.Minute, func() bool { return rec.c.Verify().DeliveredUnique == 100 })
	relaytest.WaitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	pub.open.Store(true)
	relaytest.WaitFor(t, "the outbox to drain", time.Minute, func() bool { return b.count(t, "_messages") == 0 })
	if err := rec.c.Verify().Err(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "_dead_letters"); n != 0 || r.Stats().DeadLettered != 0 {
		t.Fatalf("%d dead letters: a blocked destination must spend no attempt", n)
	}
}

// The crash test runs relays in child processes of the test binary.
const (
	childEnv    = "OUTBOX_MYSQL_CHILD"
	childURL    = "OUTBOX_MYSQL_URL"
	childOutput = "OUTBOX_MYSQL_OUTPUT"
	childNode   = "OUTBOX_MYSQL_NODE"
)

// filePublisher appends "id key" lines to a file and acknowledges a batch
// once its lines are written and synced: a relay killed at any moment
// leaves every acknowledged message in the file.
type filePublisher struct {
	mu sync.Mutex
	f  *os.File
}

func (p *filePublisher) Publish(_ context.Context, msgs []*outbox.Message) []error {
	var sb strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&sb, "%s %s\n", m.ID, m.Key)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(msgs))
	_, err := p.f.WriteString(sb.String()) // one write: whole lines
	if err == nil {
		err = p.f.Sync()
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

func (p *filePublisher) Close() error { return p.f.Close() }

func crashConfig(node string) outbox.Config {
	return outbox.Config{
		Node: node, Workers: 2, BatchSize: 100, LeaseTTL: time.Second, PublishTimeout: 300 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
	}
}

// childRelay runs a relay until the process is killed.
func childRelay() int {
	ctx := context.Background()
	s, err := Open(ctx, os.Getenv(childURL), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := os.OpenFile(os.Getenv(childOutput), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r, err := outbox.NewRelay(s, &filePublisher{f: f}, crashConfig(os.Getenv(childNode)))
	if err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	r.Stop()
	return 0
}

// TestCrashRestart kills relay processes with SIGKILL at random moments
// and starts new ones, several times, while writers keep writing; a last
// relay drains what is left. The published file must hold every message,
// first delivered in per-key commit order.
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{Partitions: 16})
	out := filepath.Join(t.TempDir(), "published")
	checker := brokertest.NewChecker()
	var stop atomic.Bool
	var written atomic.Int64
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for n := 0; !stop.Load(); n++ {
				msgs := make([]outbox.Message, 1+rng.IntN(5))
				for i := range msgs {
					msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: "crash", Key: fmt.Sprintf("w%d-k%d", w, rng.IntN(20))}
				}
				if err := b.write(context.Background(), msgs...); err != nil {
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
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	kills := 0
	for round := range 4 {
		var procs []*exec.Cmd
		for j := range 2 {
			cmd := exec.Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=relay", childURL+"="+b.url, childOutput+"="+out, fmt.Sprintf("%s=crash-%d-%d", childNode, round, j))
			cmd.Stderr = os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, cmd)
		}
		// A random moment to crash: the schedule of the chaos, not a
		// synchronisation.
		time.Sleep(time.Duration(800+rng.IntN(1200)) * time.Millisecond)
		for _, cmd := range procs {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			kills++
		}
		t.Logf("round %d: killed 2 relays; %d written so far, %d outstanding", round, written.Load(), b.count(t, "_messages"))
	}
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	r := relaytest.Start(t, b.store, &filePublisher{f: f}, crashConfig("final"))
	relaytest.WaitFor(t, "the outbox to drain", 2*time.Minute, func() bool { return b.count(t, "_messages") == 0 })
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		id, key, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("torn line %q in the published file", sc.Text())
		}
		checker.Delivered(brokertest.Received{ID: id, Key: key})
	}
	rep := checker.Verify()
	t.Logf("%v; %d kills", rep, kills)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Written < 500 || kills < 8 {
		t.Fatalf("only %d messages written and %d kills: the test did not exercise the relay", rep.Written, kills)
	}
}
