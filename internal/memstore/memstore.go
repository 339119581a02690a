// Package memstore is an in-memory outbox.Store for the relay engine's own
// tests: it makes faults (failing calls, expiring leases, late commits) easy
// to provoke deterministically. It passes the storetest conformance suite.
// It is not for production: nothing survives the process.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/leasetable"
)

// Store is an in-memory outbox store. Safe for concurrent use.
type Store struct {
	mu         sync.Mutex
	partitions int
	now        func() time.Time
	seq        int64
	commits    int64
	msgs       map[string]*entry // unpublished, by ID
	dead       map[string]outbox.DeadLetter
	leases     leasetable.Table
	relays     map[string]time.Time
	locked     map[string]bool // claimed by an unordered claim
	psubs      []chan []int

	// FailNext, when set, is returned (once) by the next call of the named
	// method ("Fetch", "Settle", "AcquireLeases", "Heartbeat", "Unsettled").
	failNext map[string]error
	// Calls counts calls per method.
	calls map[string]int
}

type entry struct {
	rec      outbox.Record
	visible  bool  // committed
	commitNo int64 // order of commit, for marks
}

// New returns a store with p partitions. now is its clock (nil: time.Now).
func New(p int, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{
		partitions: p,
		now:        now,
		msgs:       map[string]*entry{},
		dead:       map[string]outbox.DeadLetter{},
		leases:     leasetable.New(p),
		relays:     map[string]time.Time{},
		locked:     map[string]bool{},
		failNext:   map[string]error{},
		calls:      map[string]int{},
	}
}

// FailNext makes the next call of method fail with err.
func (s *Store) FailNext(method string, err error) {
	s.mu.Lock()
	s.failNext[method] = err
	s.mu.Unlock()
}

// Calls returns how many times method was called.
func (s *Store) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

func (s *Store) enter(method string) error {
	s.calls[method]++
	if err := s.failNext[method]; err != nil {
		delete(s.failNext, method)
		return err
	}
	return nil
}

// Write commits msgs at once (one transaction).
func (s *Store) Write(ctx context.Context, msgs ...outbox.Message) error {
	commit, err := s.Begin(msgs...)
	if err != nil {
		return err
	}
	commit()
	return nil
}

// Begin assigns sequence numbers to msgs now but makes them visible only
// when the returned commit function runs: a transaction that commits late.
func (s *Store) Begin(msgs ...outbox.Message) (commit func(), err error) {
	now := s.now()
	prepared := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		if err := m.Prepare(now, 0); err != nil {
			return nil, err
		}
		m.Payload = slices.Clone(m.Payload)
		m.Headers = maps.Clone(m.Headers)
		prepared[i] = m
	}
	s.mu.Lock()
	var es []*entry
	for _, m := range prepared {
		if _, dup := s.msgs[m.ID]; dup {
			s.mu.Unlock()
			return nil, errors.New("memstore: duplicate message ID " + m.ID)
		}
	}
	for _, m := range prepared {
		s.seq++
		e := &entry{rec: outbox.Record{Message: m, Partition: outbox.PartitionOf(m.Key, s.partitions), Seq: s.seq}}
		s.msgs[m.ID] = e
		es = append(es, e)
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.commits++
		seen := map[int]bool{}
		var parts []int
		for _, e := range es {
			e.visible, e.commitNo = true, s.commits
			if !seen[e.rec.Partition] {
				seen[e.rec.Partition] = true
				parts = append(parts, e.rec.Partition)
			}
		}
		psubs := slices.Clone(s.psubs)
		s.mu.Unlock()
		for _, c := range psubs {
			c <- parts // buffered generously; a test store, not a queue
		}
	}, nil
}

// Outstanding returns how many messages are not yet published.
func (s *Store) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// Dead returns the dead letters.
func (s *Store) Dead() []outbox.DeadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.dead))
}

// Record returns the stored record with that ID.
func (s *Store) Record(id string) (outbox.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.msgs[id]
	if !ok {
		return outbox.Record{}, false
	}
	return e.rec, true
}

// Owner returns the owner and epoch of partition p's lease.
func (s *Store) Owner(p int) (string, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases.Owner(p, s.now())
	return l.Owner, l.Epoch
}

func (s *Store) Partitions(ctx context.Context) (int, error) { return s.partitions, nil }

func (s *Store) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Heartbeat"); err != nil {
		return 0, err
	}
	now := s.now()
	s.relays[node] = now.Add(ttl)
	for n, exp := range s.relays {
		if !exp.After(now) {
			delete(s.relays, n)
		}
	}
	return len(s.relays), nil
}

func (s *Store) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("AcquireLeases"); err != nil {
		return nil, err
	}
	return s.leases.Acquire(node, held, want, ttl, s.now()), nil
}

func (s *Store) ReleaseLeases(ctx context.Context, node string, leases []outbox.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leases.Release(node, leases)
	return nil
}

func (s *Store) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	if err := s.ReleaseLeases(ctx, node, leases); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Leave"); err != nil {
		return err
	}
	delete(s.relays, node)
	return nil
}

func (s *Store) sorted(part int) []*entry {
	var es []*entry
	for _, e := range s.msgs {
		if e.visible && e.rec.Partition == part {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].rec.Seq < es[j].rec.Seq })
	return es
}

func (s *Store) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Fetch"); err != nil {
		return nil, err
	}
	var out []outbox.Record
	for _, c := range cursors {
		n := 0
		for _, e := range s.sorted(c.Partition) {
			if e.rec.Seq <= c.After {
				continue
			}
			if n == limit {
				break
			}
			r := e.rec
			r.Payload = slices.Clone(r.Payload)
			r.Headers = maps.Clone(r.Headers)
			out = append(out, r)
			n++
		}
	}
	return out, nil
}

// FetchMarked implements outbox.MarkedFetcher: a mark is the number of
// commits seen, and records below a cursor that committed after the mark
// come first, at most limit records per cursor in all. When the late
// records fill the limit, the returned mark carries, for that partition,
// " <partition>/<resume>/<base>": the late records are still those that
// committed after commit number base, minus those at or below seq resume
// that this fetch saw (as PostgreSQL's marks do with snapshots).
func (s *Store) FetchMarked(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Fetch"); err != nil {
		return nil, "", err
	}
	next := strconv.FormatInt(s.commits, 10)
	var out []outbox.Record
	for _, c := range cursors {
		base, resume, seen := parseMark(c.Mark, c.Partition)
		n, lastLate := 0, int64(0)
		for _, e := range s.sorted(c.Partition) {
			if n == limit {
				break
			}
			if e.rec.Seq <= c.After {
				late := base >= 0 && e.commitNo > base && (e.rec.Seq > resume || e.commitNo > seen)
				if !late {
					continue
				}
				lastLate = e.rec.Seq
			}
			r := e.rec
			r.Payload = slices.Clone(r.Payload)
			r.Headers = maps.Clone(r.Headers)
			out = append(out, r)
			n++
		}
		if lastLate > 0 && n == limit && lastLate == out[len(out)-1].Seq {
			next += fmt.Sprintf(" %d/%d/%d", c.Partition, lastLate, base)
		}
	}
	return out, next, nil
}

// parseMark returns the state of partition p in a mark of FetchMarked:
// base is -1 without a mark; resume and seen are 0 unless a fetch was cut
// short.
func parseMark(mark string, p int) (base, resume, seen int64) {
	if mark == "" {
		return -1, 0, 0
	}
	fields := strings.Fields(mark)
	base, _ = strconv.ParseInt(fields[0], 10, 64)
	for _, f := range fields[1:] {
		var fp int
		var fr, fb int64
		if _, err := fmt.Sscanf(f, "%d/%d/%d", &fp, &fr, &fb); err == nil && fp == p {
			return fb, fr, base
		}
	}
	return base, 0, 0
}

func (s *Store) Unsettled(ctx context.Context, cursors []outbox.Cursor) ([]outbox.RecordRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Unsettled"); err != nil {
		return nil, err
	}
	var out []outbox.RecordRef
	for _, c := range cursors {
		for _, e := range s.sorted(c.Partition) {
			if e.rec.Seq <= c.After {
				out = append(out, outbox.RecordRef{ID: e.rec.ID, Partition: e.rec.Partition, Seq: e.rec.Seq})
			}
		}
	}
	return out, nil
}

func (s *Store) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Settle"); err != nil {
		return err
	}
	return s.settleLocked(settlements, func(l outbox.Lease) bool { return s.leases.Holds(node, l) })
}

// settleUnfenced applies settlements under the fence of a caller that
// owns partitions its own way (Stream), with the injected failures.
func (s *Store) settleUnfenced(settlements []outbox.Settlement, holds func(outbox.Lease) bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Settle"); err != nil {
		return err
	}
	return s.settleLocked(settlements, holds)
}

func (s *Store) settleLocked(settlements []outbox.Settlement, holds func(outbox.Lease) bool) error {
	now := s.now()
	var fenced []outbox.Lease
	for _, st := range settlements {
		if !holds(st.Lease) {
			fenced = append(fenced, st.Lease)
			continue
		}
		s.apply(st, now)
	}
	if len(fenced) > 0 {
		return &outbox.FencedError{Leases: fenced}
	}
	return nil
}

func (s *Store) apply(st outbox.Settlement, now time.Time) {
	for _, id := range st.Delivered {
		delete(s.msgs, id)
	}
	for _, f := range st.Retry {
		if e, ok := s.msgs[f.ID]; ok {
			e.rec.Attempts, e.rec.NextAttemptAt, e.rec.LastError = f.Attempts, f.NextAttemptAt, f.Err
		}
	}
	for _, f := range st.Dead {
		if e, ok := s.msgs[f.ID]; ok {
			s.dead[f.ID] = outbox.DeadLetter{Message: e.rec.Message, Attempts: f.Attempts, LastError: f.Err, FailedAt: now}
			delete(s.msgs, f.ID)
		}
	}
}

// ClaimUnordered implements outbox.UnorderedStore with in-memory locks.
func (s *Store) ClaimUnordered(ctx context.Context, limit int, skip []string) (outbox.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("ClaimUnordered"); err != nil {
		return nil, err
	}
	now := s.now()
	var es []*entry
	for _, e := range s.msgs {
		if e.visible && !s.locked[e.rec.ID] && !e.rec.NextAttemptAt.After(now) && !slices.Contains(skip, e.rec.Topic) {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].rec.Seq < es[j].rec.Seq })
	if len(es) > limit {
		es = es[:limit]
	}
	c := &claim{s: s}
	for _, e := range es {
		s.locked[e.rec.ID] = true
		c.recs = append(c.recs, e.rec)
	}
	return c, nil
}

type claim struct {
	s    *Store
	recs []outbox.Record
	done bool
}

func (c *claim) Records() []outbox.Record { return c.recs }

func (c *claim) Settle(ctx context.Context, st outbox.Settlement) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.done {
		return errors.New("memstore: claim already settled")
	}
	if err := c.s.enter("ClaimSettle"); err != nil {
		return err
	}
	c.s.apply(st, c.s.now())
	c.unlock()
	return nil
}

func (c *claim) Release(ctx context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.unlock()
	return nil
}

func (c *claim) unlock() {
	if c.done {
		return
	}
	c.done = true
	for _, r := range c.recs {
		delete(c.s.locked, r.ID)
	}
}

// SubscribePartitions implements outbox.PartitionNotifier.
func (s *Store) SubscribePartitions(ctx context.Context, fn func([]int)) error {
	c := make(chan []int, 1<<16)
	s.mu.Lock()
	s.psubs = append(s.psubs, c)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.psubs = slices.DeleteFunc(s.psubs, func(x chan []int) bool { return x == c })
		s.mu.Unlock()
	}()
	fn(nil) // subscribed: what was written before was not announced
	for {
		select {
		case <-ctx.Done():
			return nil
		case ps := <-c:
			fn(ps)
		}
	}
}

var (
	_ outbox.Store             = (*Store)(nil)
	_ outbox.UnorderedStore    = (*Store)(nil)
	_ outbox.MarkedFetcher     = (*Store)(nil)
	_ outbox.PartitionNotifier = (*Store)(nil)
)
