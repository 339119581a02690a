package storetest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// suite is one subtest's state.
type suite struct {
	*testing.T
	h   Harness
	src outbox.Source
	s   outbox.Store       // the table side, or nil
	st  outbox.StreamStore // the stream side, or nil
	p   int
	ctx context.Context
}

// needLeases skips a check of the partition-lease protocol on a stream,
// whose relay owns partitions by Hold (checked by StreamHold).
func (s *suite) needLeases() {
	s.Helper()
	if s.s == nil {
		s.Skip("a StreamStore owns partitions by Hold, not leases: StreamHold checks it")
	}
}

// write commits msgs in one transaction or fails the test.
func (s *suite) write(msgs ...outbox.Message) {
	s.Helper()
	if err := s.h.Write(s.ctx, msgs...); err != nil {
		s.Fatalf("Write: %v", err)
	}
	s.sync()
}

// sync waits for the writes committed so far to be fetchable (Harness.Sync).
func (s *suite) sync() {
	s.Helper()
	if s.h.Sync == nil {
		return
	}
	if err := s.h.Sync(s.ctx); err != nil {
		s.Fatalf("Sync: %v", err)
	}
}

// cursors returns a cursor with After 0 for each partition of parts, or for
// every partition when parts is empty.
func (s *suite) cursors(parts ...int) []outbox.Cursor {
	if len(parts) == 0 {
		for p := range s.p {
			parts = append(parts, p)
		}
	}
	cs := make([]outbox.Cursor, len(parts))
	for i, p := range parts {
		cs[i] = outbox.Cursor{Lease: outbox.Lease{Partition: p}}
	}
	return cs
}

// fetch returns the pending records of parts (every partition when empty).
func (s *suite) fetch(parts ...int) []outbox.Record {
	s.Helper()
	recs, err := s.src.Fetch(s.ctx, s.cursors(parts...), fetchAll)
	if err != nil {
		s.Fatalf("Fetch: %v", err)
	}
	return recs
}

// byID indexes records by ID, failing on duplicates.
func (s *suite) byID(recs []outbox.Record) map[string]outbox.Record {
	s.Helper()
	m := make(map[string]outbox.Record, len(recs))
	for _, r := range recs {
		if _, dup := m[r.ID]; dup {
			s.Fatalf("record %s returned twice", r.ID)
		}
		m[r.ID] = r
	}
	return m
}

// acquire takes up to want leases for node with a long ttl. On a stream it
// holds the stream for node and returns every partition under the hold's
// epoch.
func (s *suite) acquire(node string, held []outbox.Lease, want int) []outbox.Lease {
	s.Helper()
	if s.st != nil {
		return s.hold(node)
	}
	ls, err := s.s.AcquireLeases(s.ctx, node, held, want, longTTL)
	if err != nil {
		s.Fatalf("AcquireLeases(%s): %v", node, err)
	}
	return ls
}

// hold waits until node holds the stream and returns every partition under
// the hold's epoch.
func (s *suite) hold(node string) []outbox.Lease {
	s.Helper()
	var epoch int64
	s.eventually(node+" holding the stream", func() (bool, error) {
		e, changed, err := s.st.Hold(s.ctx, node)
		if err != nil || e != 0 {
			epoch = e
			return e != 0, err
		}
		select { // the answer changes, or eventually's next try
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		}
		return false, nil
	})
	ls := make([]outbox.Lease, s.p)
	for p := range ls {
		ls[p] = outbox.Lease{Partition: p, Epoch: epoch}
	}
	return ls
}

// leaseOf returns the lease of partition p in ls.
func leaseOf(ls []outbox.Lease, p int) (outbox.Lease, bool) {
	for _, l := range ls {
		if l.Partition == p {
			return l, true
		}
	}
	return outbox.Lease{}, false
}

// settle applies settlements as node, failing on any error.
func (s *suite) settle(node string, sts ...outbox.Settlement) {
	s.Helper()
	if err := s.src.Settle(s.ctx, node, sts); err != nil {
		s.Fatalf("Settle: %v", err)
	}
}

// keysIn returns n distinct keys of partition p.
func (s *suite) keysIn(p, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if outbox.PartitionOf(k, s.p) == p {
			keys = append(keys, k)
		}
	}
	return keys
}

// otherPartition returns a partition other than p, or -1 when P is 1.
func (s *suite) otherPartition(p int) int {
	if s.p == 1 {
		return -1
	}
	return (p + 1) % s.p
}

// eventually polls cond every few milliseconds until it returns true, failing
// the test after waitTimeout or on error.
func (s *suite) eventually(what string, cond func() (bool, error)) {
	s.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			s.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.Fatalf("%s did not happen within %v", what, waitTimeout)
		}
		select {
		case <-tick.C:
		case <-s.ctx.Done():
			s.Fatalf("waiting for %s: %v", what, s.ctx.Err())
		}
	}
}

// sameInstant reports whether a and b are within a microsecond (stores keep
// at least microseconds).
func sameInstant(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Microsecond && d < time.Microsecond
}

// checkMessage compares the message fields of got with want (whose ID and
// CreatedAt must be set).
func (s *suite) checkMessage(got outbox.Message, want outbox.Message) {
	s.Helper()
	if got.ID != want.ID {
		s.Errorf("ID %q, want %q", got.ID, want.ID)
	}
	if got.Topic != want.Topic {
		s.Errorf("%s: Topic %q, want %q", want.ID, got.Topic, want.Topic)
	}
	if got.Key != want.Key {
		s.Errorf("%s: Key %q, want %q", want.ID, got.Key, want.Key)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		s.Errorf("%s: Payload %q, want %q", want.ID, got.Payload, want.Payload)
	}
	if !maps.Equal(got.Headers, want.Headers) {
		s.Errorf("%s: Headers %v, want %v", want.ID, got.Headers, want.Headers)
	}
	if !sameInstant(got.CreatedAt, want.CreatedAt) {
		s.Errorf("%s: CreatedAt %v, want %v (to the microsecond)", want.ID, got.CreatedAt, want.CreatedAt)
	}
}

// checkSeqOrder fails unless recs are in increasing Seq order within each
// partition, with positive Seqs.
func (s *suite) checkSeqOrder(recs []outbox.Record) {
	s.Helper()
	last := map[int]int64{}
	for _, r := range recs {
		if r.Seq <= 0 {
			s.Errorf("record %s has Seq %d, want > 0", r.ID, r.Seq)
		}
		if prev, ok := last[r.Partition]; ok && r.Seq <= prev {
			s.Errorf("partition %d: Seq %d after %d, want increasing", r.Partition, r.Seq, prev)
		}
		last[r.Partition] = r.Seq
	}
}

// ids returns the IDs of recs, sorted.
func ids(recs []outbox.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	slices.Sort(out)
	return out
}

// sortLeases sorts leases by partition.
func sortLeases(ls []outbox.Lease) []outbox.Lease {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b outbox.Lease) int { return cmp.Compare(a.Partition, b.Partition) })
	return ls
}

// newMessages returns n messages of topic with key, fresh IDs and payloads
// "<topic>-<i>".
func newMessages(n int, topic, key string) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: fmt.Appendf(nil, "%s-%d", topic, i)}
	}
	return msgs
}
