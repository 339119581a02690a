package storetest

import (
	"slices"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// checkLeaseSet fails unless ls holds distinct partitions in [0, P) with
// positive epochs.
func (s *suite) checkLeaseSet(who string, ls []outbox.Lease) {
	s.Helper()
	seen := map[int]bool{}
	for _, l := range ls {
		if l.Partition < 0 || l.Partition >= s.p || seen[l.Partition] || l.Epoch < 1 {
			s.Fatalf("%s: bad lease set %v: want distinct partitions in [0, %d) with epochs >= 1", who, ls, s.p)
		}
		seen[l.Partition] = true
	}
}

func testLeases(s *suite) {
	s.needLeases()
	a, b, c := "node-a", "node-b", "node-c"
	held := s.acquire(a, nil, s.p)
	s.checkLeaseSet(a, held)
	if len(held) != s.p {
		s.Fatalf("%s took %d leases of a fresh store, want all %d", a, len(held), s.p)
	}
	// Renewal keeps partitions and epochs.
	renewed := s.acquire(a, held, 0)
	if !slices.Equal(sortLeases(renewed), sortLeases(held)) {
		s.Fatalf("renewal returned %v, want the same leases %v", renewed, held)
	}
	// Nothing is free for another node.
	if got := s.acquire(b, nil, s.p); len(got) != 0 {
		s.Fatalf("%s took %v while %s holds every lease", b, got, a)
	}
	// Released leases go to the next taker with a higher epoch.
	half := max(1, s.p/2)
	released, kept := sortLeases(held)[:half], sortLeases(held)[half:]
	if err := s.s.ReleaseLeases(s.ctx, a, released); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	taken := sortLeases(s.acquire(b, nil, s.p))
	if len(taken) != len(released) {
		s.Fatalf("%s took %v after %s released %v", b, taken, a, released)
	}
	for i, l := range taken {
		if l.Partition != released[i].Partition || l.Epoch <= released[i].Epoch {
			s.Fatalf("%s took %v after %s released %v: want the same partitions with higher epochs", b, taken, a, released)
		}
	}
	// a's renewal of its old set loses the released leases, keeps the others.
	if got := sortLeases(s.acquire(a, held, 0)); !slices.Equal(got, kept) {
		s.Fatalf("%s renewing %v got %v, want %v", a, held, got, kept)
	}
	// Releasing with a stale epoch, or as another node, is ignored.
	if err := s.s.ReleaseLeases(s.ctx, a, released); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	if err := s.s.ReleaseLeases(s.ctx, c, taken); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	if got := sortLeases(s.acquire(b, taken, 0)); !slices.Equal(got, taken) {
		s.Fatalf("after stale releases %s renewed %v, want %v", b, got, taken)
	}
	// Leave frees the leases a node holds.
	if err := s.s.Leave(s.ctx, a, kept); err != nil {
		s.Fatalf("Leave: %v", err)
	}
	got := sortLeases(s.acquire(c, nil, s.p))
	if len(got) != len(kept) {
		s.Fatalf("%s took %v after %s left, want the partitions of %v", c, got, a, kept)
	}
	for i, l := range got {
		if l.Partition != kept[i].Partition || l.Epoch <= kept[i].Epoch {
			s.Fatalf("%s took %v after %s left holding %v: want the same partitions with higher epochs", c, got, a, kept)
		}
	}
	// want bounds what is taken.
	if err := s.s.Leave(s.ctx, c, got); err != nil {
		s.Fatalf("Leave: %v", err)
	}
	if got := s.acquire(a, nil, 1); len(got) != 1 {
		s.Fatalf("want 1 took %v", got)
	}
}

func testLeaseExpiry(s *suite) {
	s.needLeases()
	a, b := "node-a", "node-b"
	short, err := s.s.AcquireLeases(s.ctx, a, nil, 1, shortTTL)
	if err != nil {
		s.Fatalf("AcquireLeases: %v", err)
	}
	if len(short) != 1 {
		s.Fatalf("want 1 took %v", short)
	}
	old := short[0]
	// b takes the free partitions at once and a's once it expires.
	var bHeld []outbox.Lease
	s.eventually("takeover of the expired lease", func() (bool, error) {
		ls, err := s.s.AcquireLeases(s.ctx, b, bHeld, s.p, longTTL)
		if err != nil {
			return false, err
		}
		bHeld = ls
		_, ok := leaseOf(bHeld, old.Partition)
		return ok, nil
	})
	s.checkLeaseSet(b, bHeld)
	if len(bHeld) != s.p {
		s.Fatalf("%s holds %v, want every partition", b, bHeld)
	}
	nl, _ := leaseOf(bHeld, old.Partition)
	if nl.Epoch <= old.Epoch {
		s.Fatalf("taken-over lease %v, want an epoch above %d", nl, old.Epoch)
	}
	// a's renewal fails: the lease is lost.
	if got := s.acquire(a, []outbox.Lease{old}, 0); len(got) != 0 {
		s.Fatalf("%s renewed %v after losing it: got %v", a, old, got)
	}
}

func testLeaseSplit(s *suite) {
	s.needLeases()
	if s.p < 2 {
		s.Skip("needs at least 2 partitions")
	}
	a, b := "node-a", "node-b"
	la := s.acquire(a, nil, s.p/2)
	lb := s.acquire(b, nil, s.p)
	s.checkLeaseSet(a, la)
	s.checkLeaseSet(b, lb)
	if len(la) != s.p/2 || len(la)+len(lb) != s.p {
		s.Fatalf("%s took %d and %s %d leases, want %d and %d", a, len(la), b, len(lb), s.p/2, s.p-s.p/2)
	}
	s.checkLeaseSet("both", append(slices.Clone(la), lb...)) // disjoint
}

func testLeaseConcurrent(s *suite) {
	s.needLeases()
	nodes := []string{"node-a", "node-b", "node-c", "node-d"}
	got := make([][]outbox.Lease, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			got[i], errs[i] = s.s.AcquireLeases(s.ctx, n, nil, s.p, longTTL)
		})
	}
	wg.Wait()
	var all []outbox.Lease
	for i := range nodes {
		if errs[i] != nil {
			s.Fatalf("AcquireLeases(%s): %v", nodes[i], errs[i])
		}
		all = append(all, got[i]...)
	}
	s.checkLeaseSet("all nodes", all) // no partition has two owners
	// Whatever was skipped by a race is still free.
	rest := s.acquire("node-e", nil, s.p)
	if len(all)+len(rest) != s.p {
		s.Fatalf("nodes took %d leases concurrently and %d afterwards, want %d in all", len(all), len(rest), s.p)
	}
	s.checkLeaseSet("all", append(all, rest...))
}

func testHeartbeat(s *suite) {
	s.needLeases()
	hb := func(node string, ttl time.Duration) int {
		s.Helper()
		n, err := s.s.Heartbeat(s.ctx, node, ttl)
		if err != nil {
			s.Fatalf("Heartbeat(%s): %v", node, err)
		}
		return n
	}
	if n := hb("node-a", longTTL); n != 1 {
		s.Fatalf("first heartbeat: %d live, want 1", n)
	}
	if n := hb("node-b", longTTL); n != 2 {
		s.Fatalf("second node: %d live, want 2", n)
	}
	if n := hb("node-a", longTTL); n != 2 {
		s.Fatalf("repeated heartbeat: %d live, want 2", n)
	}
	if err := s.s.Leave(s.ctx, "node-b", nil); err != nil {
		s.Fatalf("Leave: %v", err)
	}
	if n := hb("node-a", longTTL); n != 1 {
		s.Fatalf("after Leave: %d live, want 1", n)
	}
	if n := hb("node-c", shortTTL); n != 2 {
		s.Fatalf("short-lived node: %d live, want 2", n)
	}
	s.eventually("expiry of a node's heartbeat", func() (bool, error) {
		n, err := s.s.Heartbeat(s.ctx, "node-a", longTTL)
		return n == 1, err
	})
}

// testLeaveOwnEpochs: a relay process leaving releases only the leases it
// held, with their epochs. Here its leases expired and another process
// with the same node name (a restart, two replicas configured alike) took
// them with higher epochs: the first one's Leave must leave them alone.
func testLeaveOwnEpochs(s *suite) {
	s.needLeases()
	a, b := "node-a", "node-b"
	old, err := s.s.AcquireLeases(s.ctx, a, nil, 1, shortTTL)
	if err != nil || len(old) != 1 {
		s.Fatalf("AcquireLeases = %v, %v; want 1 lease", old, err)
	}
	var again []outbox.Lease // the second process's leases
	s.eventually("the expired lease taken again by the same node name", func() (bool, error) {
		ls, err := s.s.AcquireLeases(s.ctx, a, again, s.p, longTTL)
		again = ls
		_, ok := leaseOf(ls, old[0].Partition)
		return ok, err
	})
	if l, _ := leaseOf(again, old[0].Partition); l.Epoch <= old[0].Epoch {
		s.Fatalf("lease taken again %v, want an epoch above %d", l, old[0].Epoch)
	}
	if err := s.s.Leave(s.ctx, a, old); err != nil {
		s.Fatalf("Leave: %v", err)
	}
	if got := sortLeases(s.acquire(a, again, 0)); !slices.Equal(got, sortLeases(again)) {
		s.Fatalf("after the first process left with %v, the second renewed %v, want all of %v", old, got, again)
	}
	if got := s.acquire(b, nil, s.p); len(got) != 0 {
		s.Fatalf("%s took %v after the first %s left with %v", b, got, a, old)
	}
	// The second process's Leave frees them.
	if err := s.s.Leave(s.ctx, a, again); err != nil {
		s.Fatalf("Leave: %v", err)
	}
	if got := s.acquire(b, nil, s.p); len(got) != len(again) {
		s.Fatalf("%s took %v after %s left with %v, want them all", b, got, a, again)
	}
}
