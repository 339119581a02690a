// Package sidetest holds the relay's guarantees written once and run
// against every capture side that feeds its publishing pipeline: the
// partition-lease poller (ordering key), the SKIP LOCKED-style claim
// (ordering none) and the stream (a log captured in commit order, like
// PostgreSQL's WAL capture). The root package runs them on the in-memory
// stores, store/postgres on a real PostgreSQL.
package sidetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/relaytest"
)

// Side opens a fresh outbox read by one capture side.
type Side struct {
	Name    string
	Ordered bool // a key's messages are published in order
	Open    func(t *testing.T) *Outbox
}

// Outbox is an outbox of one side: its store, the relay configuration to
// use, how to write to it, how to open another store on it (the next relay
// process), how many messages were dead-lettered and how many wait.
type Outbox struct {
	Store   outbox.Source
	Config  outbox.Config
	Write   func(msgs ...outbox.Message) error
	Reopen  func(t *testing.T) outbox.Source
	Dead    func() int64
	Pending func() int // messages not yet published (-1: the store cannot say)
}

// Config reacts quickly, for tests that wait on conditions; MaxAttempts 1,
// so that a blocked destination that spent an attempt would dead-letter.
func Config(node string) outbox.Config {
	return outbox.Config{
		Node: node, Workers: 4, BatchSize: 100,
		PollInterval: 20 * time.Millisecond, PublishTimeout: time.Second, LeaseTTL: 3 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		MaxAttempts: 1, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	}
}

// writer writes messages with IDs and records them in a checker, per
// topic and key (the default order scope).
type writer struct {
	t  *testing.T
	o  *Outbox
	ch *brokertest.Checker
}

func (w writer) write(topic string, keys ...string) []string {
	w.t.Helper()
	var msgs []outbox.Message
	var ids []string
	for _, k := range keys {
		m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: k, Payload: []byte("x")}
		msgs = append(msgs, m)
		ids = append(ids, m.ID)
	}
	if err := w.o.Write(msgs...); err != nil {
		w.t.Fatal(err)
	}
	for _, m := range msgs {
		w.ch.Written(m.Topic+"|"+m.Key, m.ID)
	}
	return ids
}

// Broker acknowledges what its fail function lets through, recording it
// per topic and key (the checker's key: the default order scope).
type Broker struct {
	ch   *brokertest.Checker
	mu   sync.Mutex
	fail func(m *outbox.Message) error
}

// NewBroker returns a broker recording into ch.
func NewBroker(ch *brokertest.Checker) *Broker { return &Broker{ch: ch} }

// SetFail sets what fails (nil: nothing).
func (b *Broker) SetFail(f func(m *outbox.Message) error) {
	b.mu.Lock()
	b.fail = f
	b.mu.Unlock()
}

func (b *Broker) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	b.mu.Lock()
	fail := b.fail
	b.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if fail != nil {
			if errs[i] = fail(m); errs[i] != nil {
				continue
			}
		}
		b.ch.Delivered(brokertest.Received{ID: m.ID, Key: m.Topic + "|" + m.Key, Topic: m.Topic})
	}
	return errs
}

func (b *Broker) Close() error { return nil }

// AllIn reports whether every one of ids was delivered.
func AllIn(ch *brokertest.Checker, ids []string) bool {
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

// Verify fails t if a message was lost, unknown or on the wrong key,
// published out of order (on an ordered side), or, unless dupsAllowed,
// published twice.
func Verify(t *testing.T, side Side, ch *brokertest.Checker, dupsAllowed bool) {
	t.Helper()
	rep := ch.Verify()
	if len(rep.Lost) > 0 || len(rep.Unknown) > 0 || len(rep.WrongKey) > 0 {
		t.Fatalf("%s: %s", side.Name, rep)
	}
	if side.Ordered && len(rep.OrderViolations) > 0 {
		t.Fatalf("%s: order violations: %v", side.Name, rep.OrderViolations)
	}
	if !dupsAllowed && len(rep.Duplicates) > 0 {
		t.Fatalf("%s: %d messages published twice: %v", side.Name, len(rep.Duplicates), rep.Duplicates[:min(5, len(rep.Duplicates))])
	}
}

// BlockedDestinationPausesOnlyItself: a blocked destination pauses only
// itself, on every capture side: its many keys spend no attempt
// (MaxAttempts 1: nothing dead-lettered), a key it shares with another
// topic goes on on that topic, and once it works everything is delivered
// in order.
func BlockedDestinationPausesOnlyItself(t *testing.T, sides []Side) {
	for _, side := range sides {
		t.Run(side.Name, func(t *testing.T) {
			t.Parallel()
			o := side.Open(t)
			ch := brokertest.NewChecker()
			w := writer{t, o, ch}
			var keys []string
			for k := range 150 {
				keys = append(keys, fmt.Sprint("k", k))
			}
			gone := append(w.write("gone", keys...), w.write("gone", keys...)...)
			fine := w.write("fine", keys[:20]...)
			var blocked atomic.Bool
			blocked.Store(true)
			pub := NewBroker(ch)
			pub.SetFail(func(m *outbox.Message) error {
				if m.Topic == "gone" && blocked.Load() {
					return outbox.Blocked("gone", errors.New("nats: no response from stream"))
				}
				return nil
			})
			cfg := o.Config
			cfg.BatchSize, cfg.FetchSize = 16, 64
			r := relaytest.Start(t, o.Store, pub, cfg)
			relaytest.WaitFor(t, "the other topic delivered", time.Minute, func() bool { return AllIn(ch, fine) })
			relaytest.WaitFor(t, "the destination reported blocked", time.Minute, func() bool {
				bl := r.Blocked()
				return len(bl) == 1 && bl[0].Destination == "gone" && bl[0].Probes >= 2
			})
			if n := o.Dead(); n != 0 {
				t.Fatalf("%d messages dead-lettered for a blocked destination", n)
			}
			if s := r.Stats(); s.Failed != 0 || s.DeadLettered != 0 {
				t.Fatalf("Stats %+v: a blocked destination must spend no attempt", s)
			}
			blocked.Store(false)
			relaytest.WaitFor(t, "everything delivered", time.Minute, func() bool { return AllIn(ch, gone) })
			Verify(t, side, ch, true)
		})
	}
}

// FailingKeyHoldsBackOnlyItself: while one key's message keeps failing
// (retryable), the other keys are delivered; when it succeeds, its later
// messages follow in order.
func FailingKeyHoldsBackOnlyItself(t *testing.T, sides []Side) {
	for _, side := range sides {
		t.Run(side.Name, func(t *testing.T) {
			t.Parallel()
			o := side.Open(t)
			ch := brokertest.NewChecker()
			w := writer{t, o, ch}
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
			pub := NewBroker(ch)
			pub.SetFail(func(m *outbox.Message) error {
				if m.Key == "bad" && failing.Load() {
					return errors.New("broker: internal error")
				}
				return nil
			})
			cfg := o.Config
			cfg.MaxAttempts = 1000
			relaytest.Start(t, o.Store, pub, cfg)
			relaytest.WaitFor(t, "the other keys delivered", time.Minute, func() bool { return AllIn(ch, others) })
			if side.Ordered {
				for _, id := range bad[1:] {
					if AllIn(ch, []string{id}) {
						t.Fatalf("a later message of the failing key was delivered before its first")
					}
				}
			}
			failing.Store(false)
			relaytest.WaitFor(t, "the failing key delivered", time.Minute, func() bool { return AllIn(ch, bad) })
			Verify(t, side, ch, false)
		})
	}
}

// CleanStopRepublishesNothing: a relay stops while it publishes (about
// half of the messages out, publishes taking a millisecond each); the next
// relay (another process: another store value) publishes the rest, and
// nothing the first one had published is published again.
func CleanStopRepublishesNothing(t *testing.T, sides []Side) {
	for _, side := range sides {
		t.Run(side.Name, func(t *testing.T) {
			t.Parallel()
			o := side.Open(t)
			ch := brokertest.NewChecker()
			w := writer{t, o, ch}
			pub := NewBroker(ch)
			pub.SetFail(func(*outbox.Message) error {
				time.Sleep(time.Millisecond) // a broker's latency: the stop comes mid-flow
				return nil
			})
			cfg := o.Config
			cfg.BatchSize = 10
			var keys []string
			for k := range 50 {
				keys = append(keys, fmt.Sprint("k", k))
			}
			var ids []string
			for range 8 {
				ids = append(ids, w.write("t", keys...)...)
			}
			r := relaytest.Start(t, o.Store, pub, cfg)
			relaytest.WaitFor(t, "half of the messages delivered", time.Minute, func() bool { return ch.Verify().DeliveredUnique >= len(ids)/2 })
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			pub.SetFail(nil)
			cfg.Node = "b"
			relaytest.Start(t, o.Reopen(t), pub, cfg)
			marker := w.write("t", "marker")
			relaytest.WaitFor(t, "the next relay delivered the rest and a new message", time.Minute, func() bool { return AllIn(ch, append(ids, marker...)) })
			if n := o.Pending(); n > 0 {
				relaytest.WaitFor(t, "the outbox empty", time.Minute, func() bool { return o.Pending() == 0 })
			}
			Verify(t, side, ch, false)
		})
	}
}
