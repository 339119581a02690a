package storetest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

func testUnordered(s *suite) {
	us, ok := s.src.(outbox.UnorderedStore)
	if !ok {
		s.Skip("the store does not implement outbox.UnorderedStore")
	}
	var msgs []outbox.Message
	for _, k := range []string{"", "a", "b", "c", "d"} {
		msgs = append(msgs, newMessages(6, "unordered", k)...)
	}
	s.write(msgs...) // 30
	claim := func(limit int) outbox.Claim {
		s.Helper()
		c, err := us.ClaimUnordered(s.ctx, limit, nil)
		if err != nil {
			s.Fatalf("ClaimUnordered: %v", err)
		}
		s.checkSeqOrder(c.Records())
		return c
	}
	release := func(c outbox.Claim) {
		s.Helper()
		if err := c.Release(s.ctx); err != nil {
			s.Fatalf("Release: %v", err)
		}
	}

	// A claim takes no record of a topic in skip (a paused destination),
	// and only those of another topic.
	s.write(newMessages(3, "unordered.other", "k")...)
	if c, err := us.ClaimUnordered(s.ctx, 100, []string{"unordered"}); err != nil {
		s.Fatalf("ClaimUnordered with skip: %v", err)
	} else {
		got := c.Records()
		release(c)
		if len(got) != 3 {
			s.Fatalf("a claim skipping topic \"unordered\" got %d records, want the 3 of \"unordered.other\"", len(got))
		}
		for _, r := range got {
			if r.Topic != "unordered.other" {
				s.Fatalf("a claim skipping topic \"unordered\" got a record of %q", r.Topic)
			}
		}
		// Out of the way of the checks below.
		c, err := us.ClaimUnordered(s.ctx, 100, []string{"unordered"})
		if err != nil {
			s.Fatalf("ClaimUnordered with skip: %v", err)
		}
		if err := c.Settle(s.ctx, outbox.Settlement{Delivered: ids(c.Records())}); err != nil {
			s.Fatalf("claim Settle: %v", err)
		}
	}

	// Two concurrent claims never overlap.
	var c1, c2 outbox.Claim
	var err1, err2 error
	var wg sync.WaitGroup
	wg.Go(func() { c1, err1 = us.ClaimUnordered(s.ctx, 12, nil) })
	wg.Go(func() { c2, err2 = us.ClaimUnordered(s.ctx, 12, nil) })
	wg.Wait()
	if err1 != nil || err2 != nil {
		for _, c := range []outbox.Claim{c1, c2} {
			if c != nil {
				c.Release(s.ctx)
			}
		}
		s.Fatalf("concurrent ClaimUnordered: %v, %v", err1, err2)
	}
	defer c1.Release(context.WithoutCancel(s.ctx))
	defer c2.Release(context.WithoutCancel(s.ctx))
	r1, r2 := c1.Records(), c2.Records()
	if len(r1) != 12 || len(r2) != 12 {
		s.Fatalf("claims of 12 got %d and %d records", len(r1), len(r2))
	}
	s.checkSeqOrder(r1)
	s.checkSeqOrder(r2)
	c3 := claim(12)
	defer c3.Release(context.WithoutCancel(s.ctx))
	r3 := c3.Records()
	if len(r3) != 6 {
		s.Fatalf("third claim got %d records, want the 6 left", len(r3))
	}
	union := append(append(ids(r1), ids(r2)...), ids(r3)...)
	slices.Sort(union)
	if len(slices.Compact(union)) != 30 {
		s.Fatalf("three claims overlap: %d distinct records of 30", len(slices.Compact(union)))
	}
	if c := claim(12); len(c.Records()) != 0 {
		release(c)
		s.Fatalf("a fourth claim got %d records while all are claimed", len(c.Records()))
	} else {
		release(c)
	}

	// Released records come back, and only they.
	release(c1)
	c4 := claim(100)
	if !slices.Equal(ids(c4.Records()), ids(r1)) {
		release(c4)
		s.Fatalf("after releasing a claim, a new claim got %v, want the released %v", ids(c4.Records()), ids(r1))
	}
	release(c4)

	// Settling deletes delivered, delays retried, buries dead records.
	if err := c2.Settle(s.ctx, outbox.Settlement{Delivered: ids(r2)}); err != nil {
		s.Fatalf("claim Settle: %v", err)
	}
	if err := c2.Release(s.ctx); err != nil {
		s.Errorf("Release after Settle: %v, want nil", err)
	}
	retry, due, dead := r3[0], r3[1], r3[2]
	next := time.Now().Add(time.Hour)
	err := c3.Settle(s.ctx, outbox.Settlement{
		Delivered: ids(r3[3:]),
		Retry: []outbox.Failure{
			{ID: retry.ID, Partition: retry.Partition, Attempts: 1, NextAttemptAt: next, Err: "later"},
			{ID: due.ID, Partition: due.Partition, Attempts: 4, NextAttemptAt: time.Now().Add(-time.Hour), Err: "due"},
		},
		Dead: []outbox.Failure{{ID: dead.ID, Partition: dead.Partition, Attempts: 2, Err: "never"}},
	})
	if err != nil {
		s.Fatalf("claim Settle: %v", err)
	}
	left := s.fetch()
	want := append(ids(r1), retry.ID, due.ID)
	slices.Sort(want)
	if !slices.Equal(ids(left), want) {
		s.Fatalf("after settling: records %v, want %v", ids(left), want)
	}
	if r := s.byID(left)[retry.ID]; r.Attempts != 1 || r.LastError != "later" || !sameInstant(r.NextAttemptAt, next) {
		s.Errorf("retried record: Attempts %d, LastError %q, NextAttemptAt %v", r.Attempts, r.LastError, r.NextAttemptAt)
	}
	// A record waiting for its retry time is not claimed; a retried record
	// whose time has come is.
	c5 := claim(100)
	want = append(ids(r1), due.ID)
	slices.Sort(want)
	if !slices.Equal(ids(c5.Records()), want) {
		s.Errorf("claim got %v, want %v: the due retry but not the record waiting for its retry", ids(c5.Records()), want)
	}
	for _, r := range c5.Records() {
		if r.ID == due.ID && (r.Attempts != 4 || r.LastError != "due") {
			s.Errorf("claimed retry: Attempts %d, LastError %q; want 4, \"due\"", r.Attempts, r.LastError)
		}
	}
	release(c5)
	if dls, ok := s.src.(outbox.AdminStore); ok {
		dl, err := dls.DeadLetters(s.ctx, outbox.DeadLetterFilter{})
		if err != nil {
			s.Fatalf("DeadLetters: %v", err)
		}
		if len(dl) != 1 || dl[0].ID != dead.ID || dl[0].Attempts != 2 || dl[0].LastError != "never" {
			s.Errorf("DeadLetters = %+v, want %s with 2 attempts and error \"never\"", dl, dead.ID)
		}
	}
}

func testStatus(s *suite) {
	sr, ok := s.src.(outbox.AdminStore)
	if !ok {
		s.Skip("the store does not implement outbox.AdminStore")
	}
	key := "status-key"
	p := outbox.PartitionOf(key, s.p)
	a := newMessages(3, "status.a", key)
	a[0].CreatedAt = time.Now().Add(-time.Hour) // the oldest
	b := newMessages(2, "status.b", key)
	s.write(append(a, b...)...)
	node := "node-a"
	if s.s != nil {
		if _, err := s.s.Heartbeat(s.ctx, node, longTTL); err != nil {
			s.Fatalf("Heartbeat: %v", err)
		}
	}
	held := s.acquire(node, nil, s.p)
	lp, _ := leaseOf(held, p)
	recs := s.fetch(p)
	// Dead-letter one status.b record.
	var deadID string
	for _, r := range recs {
		if r.Topic == "status.b" {
			deadID = r.ID
			break
		}
	}
	s.settle(node, outbox.Settlement{Lease: lp, Dead: []outbox.Failure{{ID: deadID, Partition: p, Attempts: 1, Err: "x"}}})
	// Release all but two leases (a stream: the node holds every partition).
	keep := held
	if s.s != nil {
		keep = []outbox.Lease{lp}
		for _, l := range held {
			if l.Partition != p && len(keep) < 2 {
				keep = append(keep, l)
			}
		}
		var release []outbox.Lease
		for _, l := range held {
			if !slices.Contains(keep, l) {
				release = append(release, l)
			}
		}
		if err := s.s.ReleaseLeases(s.ctx, node, release); err != nil {
			s.Fatalf("ReleaseLeases: %v", err)
		}
	}

	st, err := sr.Status(s.ctx)
	if err != nil {
		s.Fatalf("Status: %v", err)
	}
	if st.Outstanding != 4 {
		s.Errorf("Outstanding = %d, want 4", st.Outstanding)
	}
	if !sameInstant(st.OldestCreatedAt, a[0].CreatedAt) {
		s.Errorf("OldestCreatedAt = %v, want %v", st.OldestCreatedAt, a[0].CreatedAt)
	}
	topics := map[string]int64{}
	for _, tc := range st.Topics {
		topics[tc.Topic] += tc.Count
		// OldestCreatedAt is optional; a store that sets it sets it right.
		if tc.Topic == "status.a" && !tc.OldestCreatedAt.IsZero() && !sameInstant(tc.OldestCreatedAt, a[0].CreatedAt) {
			s.Errorf("topic status.a: OldestCreatedAt = %v, want %v", tc.OldestCreatedAt, a[0].CreatedAt)
		}
		if tc.Topic == "status.b" && !tc.OldestCreatedAt.IsZero() && tc.OldestCreatedAt.Before(a[0].CreatedAt.Add(time.Minute)) {
			s.Errorf("topic status.b: OldestCreatedAt = %v, want the time of its write", tc.OldestCreatedAt)
		}
	}
	if len(topics) != 2 || topics["status.a"] != 3 || topics["status.b"] != 1 {
		s.Errorf("Topics = %v, want status.a: 3, status.b: 1", st.Topics)
	}
	if len(st.Partitions) != s.p {
		s.Fatalf("Status lists %d partitions, want %d", len(st.Partitions), s.p)
	}
	var sum int64
	for _, ps := range st.Partitions {
		sum += ps.Outstanding
		if ps.Partition == p && ps.Outstanding != 4 {
			s.Errorf("partition %d: Outstanding %d, want 4", p, ps.Outstanding)
		}
		if l, ok := leaseOf(keep, ps.Partition); ok {
			if ps.Owner != node || ps.Epoch != l.Epoch || !ps.LeaseExpiresAt.After(time.Now()) {
				s.Errorf("partition %d: owner %q, epoch %d, expires %v; want %s, %d, in the future", ps.Partition, ps.Owner, ps.Epoch, ps.LeaseExpiresAt, node, l.Epoch)
			}
		} else if ps.Owner != "" {
			s.Errorf("partition %d: owner %q, want none (released)", ps.Partition, ps.Owner)
		}
	}
	if sum != st.Outstanding {
		s.Errorf("partition backlogs sum to %d, Outstanding is %d", sum, st.Outstanding)
	}
	if st.DeadLetters != 1 {
		s.Errorf("DeadLetters = %d, want 1", st.DeadLetters)
	}
	if len(st.Relays) != 1 || st.Relays[0].Node != node || st.Relays[0].Partitions != len(keep) || !st.Relays[0].ExpiresAt.After(time.Now()) {
		s.Errorf("Relays = %+v, want %s holding %d partitions, expiring in the future", st.Relays, node, len(keep))
	}
}

func testDeadLetters(s *suite) {
	dls, ok := s.src.(outbox.AdminStore)
	if !ok {
		s.Skip("the store does not implement outbox.AdminStore")
	}
	key := "dead-key"
	p := outbox.PartitionOf(key, s.p)
	x := newMessages(2, "dead.x", key)
	y := newMessages(1, "dead.y", key)
	s.write(append(x, y...)...)
	node := "node-a"
	lease, _ := leaseOf(s.acquire(node, nil, s.p), p)
	recs := s.fetch(p)
	var dead []outbox.Failure
	for _, r := range recs {
		dead = append(dead, outbox.Failure{ID: r.ID, Partition: p, Attempts: 7, Err: "failed " + r.Topic})
	}
	s.settle(node, outbox.Settlement{Lease: lease, Dead: dead})
	// A later message of the same key, written after the failures.
	later := newMessages(1, "dead.later", key)
	s.write(later...)

	list := func(f outbox.DeadLetterFilter) []outbox.DeadLetter {
		s.Helper()
		dl, err := dls.DeadLetters(s.ctx, f)
		if err != nil {
			s.Fatalf("DeadLetters(%+v): %v", f, err)
		}
		return dl
	}
	dlIDs := func(dl []outbox.DeadLetter) []string {
		out := make([]string, len(dl))
		for i, d := range dl {
			out[i] = d.ID
		}
		slices.Sort(out)
		return out
	}
	all := list(outbox.DeadLetterFilter{})
	if len(all) != 3 {
		s.Fatalf("DeadLetters = %d entries, want 3", len(all))
	}
	for _, d := range all {
		if d.Attempts != 7 || d.LastError != "failed "+d.Topic {
			s.Errorf("dead letter %s: Attempts %d, LastError %q", d.ID, d.Attempts, d.LastError)
		}
	}
	if got := list(outbox.DeadLetterFilter{Topic: "dead.y"}); len(got) != 1 || got[0].ID != y[0].ID {
		s.Errorf("Topic filter: got %v, want [%s]", dlIDs(got), y[0].ID)
	}
	if got := list(outbox.DeadLetterFilter{IDs: []string{x[1].ID, outbox.NewID()}}); len(got) != 1 || got[0].ID != x[1].ID {
		s.Errorf("IDs filter: got %v, want [%s]", dlIDs(got), x[1].ID)
	}
	if got := list(outbox.DeadLetterFilter{FailedBefore: time.Now().Add(-time.Hour)}); len(got) != 0 {
		s.Errorf("FailedBefore an hour ago: got %v, want none", dlIDs(got))
	}
	if got := list(outbox.DeadLetterFilter{FailedBefore: time.Now().Add(time.Hour)}); len(got) != 3 {
		s.Errorf("FailedBefore in an hour: got %d, want 3", len(got))
	}
	if got := list(outbox.DeadLetterFilter{Limit: 2}); len(got) != 2 {
		s.Errorf("Limit 2: got %d", len(got))
	}

	// Requeue moves them back, after the later message of their key.
	n, err := dls.Requeue(s.ctx, outbox.DeadLetterFilter{Topic: "dead.x"})
	if err != nil || n != 2 {
		s.Fatalf("Requeue(dead.x) = %d, %v; want 2", n, err)
	}
	s.sync()
	if got := list(outbox.DeadLetterFilter{}); len(got) != 1 || got[0].ID != y[0].ID {
		s.Errorf("after Requeue: dead letters %v, want [%s]", dlIDs(got), y[0].ID)
	}
	back := s.fetch(p)
	if len(back) != 3 || back[0].ID != later[0].ID {
		s.Fatalf("after Requeue: records %v, want %s first, then the requeued %s, %s", ids(back), later[0].ID, x[0].ID, x[1].ID)
	}
	s.checkSeqOrder(back)
	byID := s.byID(back)
	for _, m := range x {
		r, ok := byID[m.ID]
		if !ok {
			s.Fatalf("requeued %s not fetched", m.ID)
		}
		if r.Attempts != 0 || r.LastError != "" || !r.NextAttemptAt.IsZero() {
			s.Errorf("requeued %s: Attempts %d, LastError %q, NextAttemptAt %v; want them reset", m.ID, r.Attempts, r.LastError, r.NextAttemptAt)
		}
		if r.Seq <= recs[len(recs)-1].Seq {
			s.Errorf("requeued %s has Seq %d, not after the previous records", m.ID, r.Seq)
		}
		m.CreatedAt = r.CreatedAt
		s.checkMessage(r.Message, m)
	}

	// Purge deletes for good.
	n, err = dls.PurgeDeadLetters(s.ctx, outbox.DeadLetterFilter{})
	if err != nil || n != 1 {
		s.Fatalf("PurgeDeadLetters = %d, %v; want 1", n, err)
	}
	if got := list(outbox.DeadLetterFilter{}); len(got) != 0 {
		s.Errorf("after Purge: %v", dlIDs(got))
	}
	if n, err := dls.Requeue(s.ctx, outbox.DeadLetterFilter{}); err != nil || n != 0 {
		s.Errorf("Requeue of nothing = %d, %v; want 0", n, err)
	}
}

func testSubscribe(s *suite) {
	pn, ok := s.src.(outbox.PartitionNotifier)
	if !ok {
		s.Skip("the store does not implement outbox.PartitionNotifier")
	}
	p, err := s.src.Partitions(s.ctx)
	if err != nil {
		s.Fatalf("Partitions: %v", err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		calls [][]int
	)
	signal := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- pn.SubscribePartitions(ctx, func(ps []int) {
			mu.Lock()
			calls = append(calls, slices.Clone(ps))
			mu.Unlock()
			select {
			case signal <- struct{}{}:
			default:
			}
		})
	}()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	// wait waits for a call that match accepts.
	wait := func(what string, match func(i int, ps []int) bool) {
		for {
			found := false
			mu.Lock()
			for i, ps := range calls {
				found = found || match(i, ps)
			}
			mu.Unlock()
			if found {
				return
			}
			select {
			case <-signal:
			case err := <-done:
				s.Fatalf("SubscribePartitions returned %v before ctx ended (waiting for %s)", err, what)
			case <-timer.C:
				s.Fatalf("no %s within %v", what, waitTimeout)
			}
		}
	}
	wait("fn(nil) once subscribed", func(i int, ps []int) bool { return i == 0 })
	mu.Lock()
	first := calls[0]
	mu.Unlock()
	if first != nil {
		s.Fatalf("first call fn(%v), want fn(nil) once subscribed (writes before were not announced)", first)
	}
	s.write(newMessages(2, "subscribe", "k")...)
	want := outbox.PartitionOf("k", p)
	wait("call naming the written partition (or nil)", func(i int, ps []int) bool {
		return i > 0 && (ps == nil || slices.Contains(ps, want))
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			s.Errorf("SubscribePartitions returned %v after ctx ended, want nil", err)
		}
	case <-timer.C:
		s.Fatalf("SubscribePartitions did not return within %v of cancelling", waitTimeout)
	}
}

func testFetchMarked(s *suite) {
	mf, ok := s.src.(outbox.MarkedFetcher)
	if !ok {
		s.Skip("the store does not implement outbox.MarkedFetcher")
	}
	key := "marked-key"
	p := outbox.PartitionOf(key, s.p)
	msgs := newMessages(5, "marked", key)
	s.write(msgs...)
	fetch := func(after int64, mark string, limit int) ([]outbox.Record, string) {
		s.Helper()
		recs, m, err := mf.FetchMarked(s.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: p}, After: after, Mark: mark}}, limit)
		if err != nil {
			s.Fatalf("FetchMarked: %v", err)
		}
		s.checkSeqOrder(recs)
		return recs, m
	}
	// Without a mark it is Fetch.
	first, mark := fetch(0, "", 3)
	plain, err := s.src.Fetch(s.ctx, s.cursors(p), 3)
	if err != nil {
		s.Fatalf("Fetch: %v", err)
	}
	if !slices.Equal(ids(first), ids(plain)) || len(first) != 3 || first[0].ID != msgs[0].ID {
		s.Fatalf("FetchMarked without a mark = %v, want Fetch's %v (the first 3)", ids(first), ids(plain))
	}
	// With the mark, records below the cursor that the first fetch saw are
	// not returned again.
	next, mark := fetch(first[2].Seq, mark, 10)
	if want := []string{msgs[3].ID, msgs[4].ID}; !slices.Equal(ids(next), sortedCopy(want)) {
		s.Fatalf("FetchMarked after the 3rd record with the first mark = %v, want %v", ids(next), want)
	}
	// Records written after the mark, above the cursor, come next.
	more := newMessages(2, "marked.more", key)
	s.write(more...)
	last, _ := fetch(next[len(next)-1].Seq, mark, 10)
	if want := []string{more[0].ID, more[1].ID}; !slices.Equal(ids(last), sortedCopy(want)) {
		s.Fatalf("FetchMarked after new writes = %v, want %v", ids(last), want)
	}
	if last[0].ID != more[0].ID {
		s.Errorf("FetchMarked returned %v, want write order", ids(last))
	}
}

func sortedCopy(ss []string) []string {
	ss = slices.Clone(ss)
	slices.Sort(ss)
	return ss
}

// testRequeueSeqOrder: dead letters of one key go back in the order they
// were first written (their original Seq), not in the order of their
// CreatedAt, which is the writer's clock and may go backwards between
// writers.
func testRequeueSeqOrder(s *suite) {
	dls, ok := s.src.(outbox.AdminStore)
	if !ok {
		s.Skip("the store does not implement outbox.AdminStore")
	}
	key := "requeue-order-key"
	p := outbox.PartitionOf(key, s.p)
	msgs := newMessages(3, "requeue.order", key)
	now := time.Now()
	for i := range msgs { // each written by a writer whose clock is an hour behind the previous one
		msgs[i].CreatedAt = now.Add(-time.Duration(i) * time.Hour)
		s.write(msgs[i])
	}
	node := "node-a"
	lease, _ := leaseOf(s.acquire(node, nil, s.p), p)
	want := make([]string, len(msgs))
	for i, m := range msgs {
		want[i] = m.ID
	}
	inOrder := func(recs []outbox.Record) []string {
		out := make([]string, len(recs))
		for i, r := range recs {
			out[i] = r.ID
		}
		return out
	}
	recs := s.fetch(p)
	if got := inOrder(recs); !slices.Equal(got, want) {
		s.Fatalf("fetched %v, want %v", got, want)
	}
	var dead []outbox.Failure
	for _, r := range slices.Backward(recs) { // dead-lettered newest first
		dead = append(dead, outbox.Failure{ID: r.ID, Partition: p, Attempts: 1, Err: "x"})
	}
	s.settle(node, outbox.Settlement{Lease: lease, Dead: dead})
	if n, err := dls.Requeue(s.ctx, outbox.DeadLetterFilter{Topic: "requeue.order"}); err != nil || n != 3 {
		s.Fatalf("Requeue = %d, %v; want 3", n, err)
	}
	s.sync()
	back := s.fetch(p)
	if got := inOrder(back); !slices.Equal(got, want) {
		s.Fatalf("after Requeue: records in Seq order %v, want the original order %v", got, want)
	}
}
