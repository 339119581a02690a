package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// The relay's guarantees, each tried against the three capture sides that
// feed its publishing pipeline, on a real PostgreSQL: the partition-lease
// poller (table capture, ordering key), the SKIP LOCKED claim (table
// capture, ordering none) and the stream (WAL capture).

// captureSide opens a fresh outbox read by one capture side.
type captureSide struct {
	name    string
	ordered bool // a key's messages are published in order
	open    func(t *testing.T) *sideOutbox
}

// sideOutbox is an outbox of one side: its store, how to write to it,
// how to open another store on it (the next relay process) and how many
// messages wait in it.
type sideOutbox struct {
	ctx     context.Context
	store   outbox.Store
	cfg     outbox.Config
	write   func(msgs ...outbox.Message) error
	reopen  func(t *testing.T) outbox.Store
	dead    func() int64
	pending func() int // messages not yet published (-1: the store cannot say)
}

var captureSides = []captureSide{
	{name: "poller", ordered: true, open: func(t *testing.T) *sideOutbox { return tableSide(t, outbox.OrderingKey) }},
	{name: "claim", ordered: false, open: func(t *testing.T) *sideOutbox { return tableSide(t, outbox.OrderingNone) }},
	{name: "stream", ordered: true, open: streamSide},
}

func sideConfig(node string) outbox.Config {
	cfg := walRelayConfig(node)
	cfg.MaxAttempts = 1 // a blocked destination must spend no attempt
	return cfg
}

func tableSide(t *testing.T, ord outbox.Ordering) *sideOutbox {
	b := setup(t)
	cfg := sideConfig("a")
	cfg.Ordering = ord
	return &sideOutbox{
		ctx: b.ctx, store: b.store, cfg: cfg,
		write: func(msgs ...outbox.Message) error { return b.write(t, msgs...) },
		reopen: func(t *testing.T) outbox.Store {
			s, err := Open(b.ctx, b.dsn, b.opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		dead:    func() int64 { return int64(b.count(t, "_dead_letters")) },
		pending: func() int { return b.count(t, "_messages") },
	}
}

func streamSide(t *testing.T) *sideOutbox {
	// A buffer smaller than the tests' backlogs: what fills it is parked.
	b := setupWAL(t, Options{WAL: WALOptions{BufferMessages: 100, ParkAfter: 100 * time.Millisecond}})
	return &sideOutbox{
		ctx: b.ctx, store: b.store, cfg: sideConfig("a"),
		write: func(msgs ...outbox.Message) error { return b.write(b.ctx, msgs...) },
		reopen: func(t *testing.T) outbox.Store {
			s, err := OpenWAL(b.ctx, b.dsn, b.store.Options())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		dead: func() int64 {
			n, err := b.store.CountDeadLetters(b.ctx, outbox.DeadLetterFilter{})
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
		pending: func() int { return -1 },
	}
}

// sideWriter writes messages with IDs and records them in a checker, per
// topic and key (the default order scope).
type sideWriter struct {
	t  *testing.T
	o  *sideOutbox
	ch *brokertest.Checker
}

func (w sideWriter) write(topic string, keys ...string) []string {
	w.t.Helper()
	var msgs []outbox.Message
	var ids []string
	for _, k := range keys {
		m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: k, Payload: []byte("x")}
		msgs = append(msgs, m)
		ids = append(ids, m.ID)
	}
	if err := w.o.write(msgs...); err != nil {
		w.t.Fatal(err)
	}
	for _, m := range msgs {
		w.ch.Written(m.Topic+"|"+m.Key, m.ID)
	}
	return ids
}

// sideBroker acknowledges what fail lets through, recording it per topic
// and key (the checker's key: the default order scope).
func sideBroker(ch *brokertest.Checker) *walBroker {
	return &walBroker{onAck: func(m *outbox.Message) {
		ch.Delivered(brokertest.Received{ID: m.ID, Key: m.Topic + "|" + m.Key, Topic: m.Topic})
	}}
}

func allIn(ch *brokertest.Checker, ids []string) bool {
	rep := ch.Verify()
	lost := map[string]bool{}
	for _, id := range rep.Lost {
		lost[id] = true
	}
	for _, id := range ids {
		if lost[id] {
			return false
		}
	}
	return true
}

func verifySide(t *testing.T, side captureSide, ch *brokertest.Checker, dupsAllowed bool) {
	t.Helper()
	rep := ch.Verify()
	if len(rep.Lost) > 0 || len(rep.Unknown) > 0 || len(rep.WrongKey) > 0 {
		t.Fatalf("%s: %s", side.name, rep)
	}
	if side.ordered && len(rep.OrderViolations) > 0 {
		t.Fatalf("%s: order violations: %v", side.name, rep.OrderViolations)
	}
	if !dupsAllowed && len(rep.Duplicates) > 0 {
		t.Fatalf("%s: %d messages published twice: %v", side.name, len(rep.Duplicates), rep.Duplicates[:min(5, len(rep.Duplicates))])
	}
}

// A blocked destination pauses only itself, on every capture side: its
// many keys spend no attempt (MaxAttempts 1: nothing dead-lettered), a key
// it shares with another topic goes on on that topic, and once it works
// everything is delivered in order.
func TestSidesBlockedDestinationPausesOnlyItself(t *testing.T) {
	t.Parallel()
	for _, side := range captureSides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			o := side.open(t)
			ch := brokertest.NewChecker()
			w := sideWriter{t, o, ch}
			var keys []string
			for k := range 150 {
				keys = append(keys, fmt.Sprint("k", k))
			}
			gone := append(w.write("gone", keys...), w.write("gone", keys...)...)
			fine := w.write("fine", keys[:20]...)
			var blocked atomic.Bool
			blocked.Store(true)
			pub := sideBroker(ch)
			pub.setFail(func(m *outbox.Message) error {
				if m.Topic == "gone" && blocked.Load() {
					return outbox.Blocked("gone", errors.New("nats: no response from stream"))
				}
				return nil
			})
			cfg := o.cfg
			cfg.BatchSize, cfg.FetchSize = 16, 64
			r := relaytest.Start(t, o.store, pub, cfg)
			relaytest.WaitFor(t, "the other topic delivered", time.Minute, func() bool { return allIn(ch, fine) })
			relaytest.WaitFor(t, "the destination reported blocked", time.Minute, func() bool {
				bl := r.Blocked()
				return len(bl) == 1 && bl[0].Destination == "gone" && bl[0].Probes >= 2
			})
			if n := o.dead(); n != 0 {
				t.Fatalf("%d messages dead-lettered for a blocked destination", n)
			}
			if s := r.Stats(); s.Failed != 0 || s.DeadLettered != 0 {
				t.Fatalf("Stats %+v: a blocked destination must spend no attempt", s)
			}
			blocked.Store(false)
			relaytest.WaitFor(t, "everything delivered", time.Minute, func() bool { return allIn(ch, gone) })
			verifySide(t, side, ch, true)
		})
	}
}

// A failing key holds back only itself, on every capture side: while one
// key's message keeps failing (retryable), the other keys are delivered;
// when it succeeds, its later messages follow in order.
func TestSidesFailingKeyHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	for _, side := range captureSides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			o := side.open(t)
			ch := brokertest.NewChecker()
			w := sideWriter{t, o, ch}
			bad := w.write("t", "bad", "bad", "bad")
			var others []string
			for range 5 {
				var keys []string
				for k := range 20 {
					keys = append(keys, fmt.Sprint("k", k))
				}
				others = append(others, w.write("t", keys...)...)
			}
			var failing atomic.Bool
			failing.Store(true)
			pub := sideBroker(ch)
			pub.setFail(func(m *outbox.Message) error {
				if m.Key == "bad" && failing.Load() {
					return errors.New("broker: internal error")
				}
				return nil
			})
			cfg := o.cfg
			cfg.MaxAttempts = 1000
			relaytest.Start(t, o.store, pub, cfg)
			relaytest.WaitFor(t, "the other keys delivered", time.Minute, func() bool { return allIn(ch, others) })
			if side.ordered {
				for _, id := range bad[1:] {
					if allIn(ch, []string{id}) {
						t.Fatalf("a later message of the failing key was delivered before its first")
					}
				}
			}
			failing.Store(false)
			relaytest.WaitFor(t, "the failing key delivered", time.Minute, func() bool { return allIn(ch, bad) })
			verifySide(t, side, ch, false)
		})
	}
}

// A clean stop publishes nothing twice, on every capture side: a relay
// drains, stops; the next relay (another process: another store value)
// publishes only what was written after.
func TestSidesCleanStopRepublishesNothing(t *testing.T) {
	t.Parallel()
	for _, side := range captureSides {
		t.Run(side.name, func(t *testing.T) {
			t.Parallel()
			o := side.open(t)
			ch := brokertest.NewChecker()
			w := sideWriter{t, o, ch}
			pub := sideBroker(ch)
			r := relaytest.Start(t, o.store, pub, o.cfg)
			var keys []string
			for k := range 50 {
				keys = append(keys, fmt.Sprint("k", k))
			}
			var ids []string
			for range 4 {
				ids = append(ids, w.write("t", keys...)...)
			}
			relaytest.WaitFor(t, "every message delivered", time.Minute, func() bool { return allIn(ch, ids) })
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			cfg := o.cfg
			cfg.Node = "b"
			relaytest.Start(t, o.reopen(t), pub, cfg)
			marker := w.write("t", "marker")
			relaytest.WaitFor(t, "the next relay delivered a new message", time.Minute, func() bool { return allIn(ch, marker) })
			if n := o.pending(); n > 0 {
				relaytest.WaitFor(t, "the outbox empty", time.Minute, func() bool { return o.pending() == 0 })
			}
			verifySide(t, side, ch, false)
		})
	}
}
