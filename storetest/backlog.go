package storetest

import (
	"maps"
	"time"

	"github.com/outboxrelay/outbox"
)

// testBacklog checks outbox.BacklogReader: exact figures while the backlog
// is under the limit; under a smaller limit, a sample that says so, the
// oldest message still exact, and dead letters counted up to the limit.
func testBacklog(s *suite) {
	br, ok := s.src.(outbox.BacklogReader)
	if !ok {
		s.Skip("the store does not implement outbox.BacklogReader")
	}
	if _, err := br.Backlog(s.ctx, 0); err == nil {
		s.Errorf("Backlog with limit 0: no error, want one naming the limit")
	}
	empty, err := br.Backlog(s.ctx, 10)
	if err != nil {
		s.Fatalf("Backlog on an empty outbox: %v", err)
	}
	if !empty.Exact || empty.Outstanding != 0 || len(empty.Topics) != 0 || !empty.OldestCreatedAt.IsZero() || empty.DeadLetters != 0 {
		s.Errorf("Backlog on an empty outbox = %+v, want exact and empty", empty)
	}

	now := time.Now()
	a := newMessages(3, "backlog.a", "backlog-key-a")
	a[0].CreatedAt = now.Add(-time.Hour) // the oldest of all, and first written: the head of its partition
	b := newMessages(2, "backlog.b", "backlog-key-b")
	b[0].CreatedAt = now.Add(-30 * time.Minute)
	c := newMessages(5, "backlog.c", "")
	s.write(a...)
	s.write(b...)
	s.write(c...)

	// Dead-letter two backlog.c messages, holding every lease as node-a.
	for _, node := range []string{"node-a", "node-b"} {
		if s.s == nil {
			break // a stream: no heartbeats
		}
		if _, err := s.s.Heartbeat(s.ctx, node, longTTL); err != nil {
			s.Fatalf("Heartbeat %s: %v", node, err)
		}
	}
	held := s.acquire("node-a", nil, s.p)
	var dead []outbox.Settlement
	for _, r := range s.fetch() {
		if r.Topic != "backlog.c" || len(dead) == 2 {
			continue
		}
		l, _ := leaseOf(held, r.Partition)
		dead = append(dead, outbox.Settlement{Lease: l, Dead: []outbox.Failure{{ID: r.ID, Partition: r.Partition, Attempts: 1, Err: "x"}}})
	}
	s.settle("node-a", dead...)
	if s.s != nil {
		if err := s.s.ReleaseLeases(s.ctx, "node-a", held[2:]); err != nil {
			s.Fatalf("ReleaseLeases: %v", err)
		}
	}

	got, err := br.Backlog(s.ctx, 100)
	if err != nil {
		s.Fatalf("Backlog: %v", err)
	}
	if !got.Exact || got.Outstanding != 8 {
		s.Errorf("Backlog: Exact %v, Outstanding %d; want true, 8", got.Exact, got.Outstanding)
	}
	want := []outbox.TopicBacklog{
		{Topic: "backlog.a", Outstanding: 3, OldestCreatedAt: a[0].CreatedAt},
		{Topic: "backlog.b", Outstanding: 2, OldestCreatedAt: b[0].CreatedAt},
		{Topic: "backlog.c", Outstanding: 3},
	}
	if len(got.Topics) != len(want) {
		s.Fatalf("Backlog.Topics = %+v, want %+v", got.Topics, want)
	}
	for i, w := range want {
		g := got.Topics[i]
		if g.Topic != w.Topic || g.Outstanding != w.Outstanding {
			s.Errorf("Backlog.Topics[%d] = %s: %d, want %s: %d", i, g.Topic, g.Outstanding, w.Topic, w.Outstanding)
		}
		if !w.OldestCreatedAt.IsZero() && !sameInstant(g.OldestCreatedAt, w.OldestCreatedAt) {
			s.Errorf("Backlog.Topics[%d] (%s): oldest %v, want %v", i, g.Topic, g.OldestCreatedAt, w.OldestCreatedAt)
		}
		if g.OldestCreatedAt.Before(a[0].CreatedAt.Add(-time.Second)) || g.OldestCreatedAt.After(time.Now().Add(time.Second)) {
			s.Errorf("Backlog.Topics[%d] (%s): oldest %v is not a write time", i, g.Topic, g.OldestCreatedAt)
		}
	}
	if !sameInstant(got.OldestCreatedAt, a[0].CreatedAt) {
		s.Errorf("Backlog.OldestCreatedAt = %v, want %v", got.OldestCreatedAt, a[0].CreatedAt)
	}
	if got.DeadLetters != 2 {
		s.Errorf("Backlog.DeadLetters = %d, want 2", got.DeadLetters)
	}
	if len(got.Leases) != 2 || got.Leases["node-a"] != 2 || got.Leases["node-b"] != 0 {
		s.Errorf("Backlog.Leases = %v, want node-a: 2, node-b: 0", got.Leases)
	}

	// A limit of 1: a sample, said so; the oldest message is still found.
	small, err := br.Backlog(s.ctx, 1)
	if err != nil {
		s.Fatalf("Backlog with limit 1: %v", err)
	}
	if small.Exact {
		s.Errorf("Backlog with limit 1 of 8 messages says it is exact")
	}
	if small.Outstanding < 1 || small.Outstanding > int64(1+s.p) {
		s.Errorf("Backlog with limit 1: Outstanding %d, want between 1 and 1 + P (%d)", small.Outstanding, 1+s.p)
	}
	if !sameInstant(small.OldestCreatedAt, a[0].CreatedAt) {
		s.Errorf("Backlog with limit 1: OldestCreatedAt %v, want %v (the heads of the partitions are always read)", small.OldestCreatedAt, a[0].CreatedAt)
	}
	var found bool
	for _, t := range small.Topics {
		found = found || t.Topic == "backlog.a" && sameInstant(t.OldestCreatedAt, a[0].CreatedAt)
	}
	if !found {
		s.Errorf("Backlog with limit 1: Topics %+v lack backlog.a with its oldest message", small.Topics)
	}
	if small.DeadLetters != 1 {
		s.Errorf("Backlog with limit 1: DeadLetters %d, want 1 (counted up to the limit)", small.DeadLetters)
	}
}

// testLeaseReader checks outbox.LeaseReader: per live node, the unexpired
// leases it holds (a live node holding none with zero), the same figures
// as Backlog's Leases when the store implements BacklogReader too; a node
// that left is no longer listed.
func testLeaseReader(s *suite) {
	s.needLeases()
	lr, ok := s.src.(outbox.LeaseReader)
	if !ok {
		s.Skip("the store does not implement outbox.LeaseReader")
	}
	check := func(when string, want map[string]int) {
		s.Helper()
		got, err := lr.Leases(s.ctx)
		if err != nil {
			s.Fatalf("Leases %s: %v", when, err)
		}
		if !maps.Equal(got, want) {
			s.Errorf("Leases %s = %v, want %v", when, got, want)
		}
		br, ok := s.src.(outbox.BacklogReader)
		if !ok {
			return
		}
		b, err := br.Backlog(s.ctx, 100)
		if err != nil {
			s.Fatalf("Backlog %s: %v", when, err)
		}
		if !maps.Equal(got, b.Leases) {
			s.Errorf("Leases %s = %v, but Backlog.Leases = %v", when, got, b.Leases)
		}
	}
	check("with no relay", map[string]int{})

	for _, node := range []string{"node-a", "node-b", "node-c"} {
		if _, err := s.s.Heartbeat(s.ctx, node, longTTL); err != nil {
			s.Fatalf("Heartbeat %s: %v", node, err)
		}
	}
	check("with three live relays and no lease", map[string]int{"node-a": 0, "node-b": 0, "node-c": 0})

	held := s.acquire("node-a", nil, s.p)
	if len(held) != s.p {
		s.Fatalf("node-a acquired %d leases of %d", len(held), s.p)
	}
	check("with node-a holding every lease", map[string]int{"node-a": s.p, "node-b": 0, "node-c": 0})

	kept, released := held[:1], held[1:]
	if err := s.s.ReleaseLeases(s.ctx, "node-a", released); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	taken := s.acquire("node-c", nil, len(released))
	if len(taken) != len(released) {
		s.Fatalf("node-c acquired %d of the %d released leases", len(taken), len(released))
	}
	check("after node-c took all but one lease", map[string]int{"node-a": 1, "node-b": 0, "node-c": len(taken)})

	if err := s.s.Leave(s.ctx, "node-c", taken); err != nil {
		s.Fatalf("Leave node-c: %v", err)
	}
	check("after node-c left", map[string]int{"node-a": 1, "node-b": 0})
	if err := s.s.Leave(s.ctx, "node-a", kept); err != nil {
		s.Fatalf("Leave node-a: %v", err)
	}
	check("after node-a left", map[string]int{"node-b": 0})
}
