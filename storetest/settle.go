package storetest

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

func testSettle(s *suite) {
	key := "settle-key"
	p := outbox.PartitionOf(key, s.p)
	msgs := newMessages(5, "settle", key)
	msgs[2].Headers = map[string]string{"h": "v"}
	msgs[2].CreatedAt = time.Now().Add(-time.Minute)
	s.write(msgs...)
	node := "node-a"
	lease, _ := leaseOf(s.acquire(node, nil, s.p), p)
	recs := s.fetch(p)
	if len(recs) != 5 {
		s.Fatalf("fetched %d records, want 5", len(recs))
	}

	next := time.Now().Add(time.Hour)
	longErr := strings.Repeat("e", 100_000) + "\xff\x00 invalid UTF-8 and NUL"
	s.settle(node, outbox.Settlement{
		Lease:     lease,
		Delivered: []string{recs[0].ID},
		Retry: []outbox.Failure{
			{ID: recs[1].ID, Partition: p, Attempts: 1, NextAttemptAt: next, Err: "boom"},
			{ID: recs[4].ID, Partition: p, Attempts: 3, NextAttemptAt: next, Err: longErr},
		},
		Dead: []outbox.Failure{{ID: recs[2].ID, Partition: p, Attempts: 5, Err: "permanent: bad"}},
	})
	after := s.fetch(p)
	if got, want := ids(after), ids([]outbox.Record{recs[1], recs[3], recs[4]}); !slices.Equal(got, want) {
		s.Fatalf("after settle: records %v, want %v (delivered and dead gone)", got, want)
	}
	s.checkSeqOrder(after)
	byID := s.byID(after)
	r1 := byID[recs[1].ID]
	if r1.Attempts != 1 || !sameInstant(r1.NextAttemptAt, next) || r1.LastError != "boom" || r1.Seq != recs[1].Seq {
		s.Errorf("retried record: Attempts %d, NextAttemptAt %v, LastError %q, Seq %d; want 1, %v, \"boom\", %d",
			r1.Attempts, r1.NextAttemptAt, r1.LastError, r1.Seq, next, recs[1].Seq)
	}
	s.checkMessage(r1.Message, recs[1].Message)
	if r4 := byID[recs[4].ID]; r4.Attempts != 3 || r4.LastError == "" || !strings.HasPrefix(r4.LastError, "eeee") {
		s.Errorf("retried record with a long, invalid error: Attempts %d, LastError %.20q…; want 3 and the (possibly truncated) error", r4.Attempts, r4.LastError)
	}
	if r3 := byID[recs[3].ID]; r3.Attempts != 0 || r3.LastError != "" || !r3.NextAttemptAt.IsZero() {
		s.Errorf("untouched record changed: %+v", r3)
	}

	if dls, ok := s.src.(outbox.AdminStore); ok {
		dl, err := dls.DeadLetters(s.ctx, outbox.DeadLetterFilter{})
		if err != nil {
			s.Fatalf("DeadLetters: %v", err)
		}
		if len(dl) != 1 {
			s.Fatalf("DeadLetters = %d entries, want 1", len(dl))
		}
		s.checkMessage(dl[0].Message, recs[2].Message)
		if dl[0].Attempts != 5 || dl[0].LastError != "permanent: bad" || dl[0].FailedAt.IsZero() {
			s.Errorf("dead letter: Attempts %d, LastError %q, FailedAt %v; want 5, \"permanent: bad\", a time", dl[0].Attempts, dl[0].LastError, dl[0].FailedAt)
		}
	}

	// A second failure updates the record again; settling an ID already
	// delivered, or unknown, changes nothing and is not an error.
	s.settle(node, outbox.Settlement{
		Lease:     lease,
		Delivered: []string{recs[0].ID, outbox.NewID()},
		Retry:     []outbox.Failure{{ID: recs[1].ID, Partition: p, Attempts: 2, NextAttemptAt: next.Add(time.Hour), Err: "boom again"}},
	})
	r1 = s.byID(s.fetch(p))[recs[1].ID]
	if r1.Attempts != 2 || r1.LastError != "boom again" || !sameInstant(r1.NextAttemptAt, next.Add(time.Hour)) {
		s.Errorf("second retry: Attempts %d, LastError %q, NextAttemptAt %v; want 2, \"boom again\", %v", r1.Attempts, r1.LastError, r1.NextAttemptAt, next.Add(time.Hour))
	}
	// Empty settlements are fine.
	s.settle(node, outbox.Settlement{Lease: lease})
	if err := s.src.Settle(s.ctx, node, nil); err != nil {
		s.Errorf("Settle(nil): %v", err)
	}
	// Delivering the rest empties the partition.
	s.settle(node, outbox.Settlement{Lease: lease, Delivered: ids(after)})
	if left := s.fetch(); len(left) != 0 {
		s.Errorf("after delivering everything: %d records left", len(left))
	}
}

func testSettleFenced(s *suite) {
	s.needLeases()
	if s.p < 2 {
		s.Skip("needs at least 2 partitions")
	}
	kp := "fenced-key"
	p := outbox.PartitionOf(kp, s.p)
	q := s.otherPartition(p)
	kq := s.keysIn(q, 1)[0]
	mp := newMessages(3, "fenced.p", kp)
	mq := newMessages(2, "fenced.q", kq)
	s.write(append(slices.Clone(mp), mq...)...)
	a, b := "node-a", "node-b"
	held := s.acquire(a, nil, s.p)
	lp, _ := leaseOf(held, p)
	lq, _ := leaseOf(held, q)
	recsP := s.fetch(p)
	recsQ := s.fetch(q)

	// b takes p over after a released it; a's settlements under the old
	// lease are refused, the one under its valid lease applies.
	if err := s.s.ReleaseLeases(s.ctx, a, []outbox.Lease{lp}); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	lb := s.acquire(b, nil, 1)
	if len(lb) != 1 || lb[0].Partition != p {
		s.Fatalf("%s took %v, want partition %d", b, lb, p)
	}
	err := s.src.Settle(s.ctx, a, []outbox.Settlement{
		{
			Lease:     lp,
			Delivered: []string{recsP[0].ID},
			Retry:     []outbox.Failure{{ID: recsP[1].ID, Partition: p, Attempts: 1, NextAttemptAt: time.Now().Add(time.Hour), Err: "x"}},
			Dead:      []outbox.Failure{{ID: recsP[2].ID, Partition: p, Attempts: 9, Err: "y"}},
		},
		{Lease: lq, Delivered: []string{recsQ[0].ID}},
	})
	var fe *outbox.FencedError
	if !errors.As(err, &fe) {
		s.Fatalf("Settle under a lost lease: got %v, want *outbox.FencedError", err)
	}
	if !slices.Equal(fe.Leases, []outbox.Lease{lp}) {
		s.Errorf("FencedError.Leases = %v, want [%v]", fe.Leases, lp)
	}
	// Nothing changed in p; q's delivery applied.
	gotP := s.fetch(p)
	if !slices.Equal(ids(gotP), ids(recsP)) {
		s.Fatalf("fenced settle changed partition %d: records %v, want %v", p, ids(gotP), ids(recsP))
	}
	for _, r := range gotP {
		if r.Attempts != 0 || r.LastError != "" {
			s.Errorf("fenced retry applied to %s: Attempts %d, LastError %q", r.ID, r.Attempts, r.LastError)
		}
	}
	if got := s.fetch(q); !slices.Equal(ids(got), ids(recsQ[1:])) {
		s.Errorf("valid settlement of partition %d: records %v, want %v", q, ids(got), ids(recsQ[1:]))
	}
	if dls, ok := s.src.(outbox.AdminStore); ok {
		if dl, err := dls.DeadLetters(s.ctx, outbox.DeadLetterFilter{}); err != nil || len(dl) != 0 {
			s.Errorf("fenced dead letter applied: DeadLetters = %d entries, %v; want none", len(dl), err)
		}
	}

	// The wrong node with the right epoch, and a lease never taken, are
	// fenced too.
	err = s.src.Settle(s.ctx, a, []outbox.Settlement{{Lease: lb[0], Delivered: []string{recsP[0].ID}}})
	if !errors.As(err, &fe) || !slices.Equal(fe.Leases, []outbox.Lease{lb[0]}) {
		s.Errorf("Settle as %s under %s's lease: got %v, want a FencedError for %v", a, b, err, lb[0])
	}
	err = s.src.Settle(s.ctx, "node-z", []outbox.Settlement{{Lease: outbox.Lease{Partition: q, Epoch: 0}, Delivered: []string{recsQ[1].ID}}})
	if !errors.As(err, &fe) {
		s.Errorf("Settle under a lease never taken: got %v, want a FencedError", err)
	}
	if len(s.fetch(p)) != 3 || len(s.fetch(q)) != 1 {
		s.Errorf("fenced settlements changed records")
	}
	// The new owner settles fine.
	s.settle(b, outbox.Settlement{Lease: lb[0], Delivered: ids(recsP)})
	if left := s.fetch(p); len(left) != 0 {
		s.Errorf("new owner's delivery left %v", ids(left))
	}

	// The same node holding the partition again (a restart under the same
	// name) is fenced off under its former epoch: the epoch alone decides.
	if err := s.s.ReleaseLeases(s.ctx, a, []outbox.Lease{lq}); err != nil {
		s.Fatalf("ReleaseLeases: %v", err)
	}
	again := s.acquire(a, nil, 1)
	if len(again) != 1 || again[0].Partition != q || again[0].Epoch <= lq.Epoch {
		s.Fatalf("%s re-took %v, want partition %d with an epoch above %d", a, again, q, lq.Epoch)
	}
	err = s.src.Settle(s.ctx, a, []outbox.Settlement{{Lease: lq, Delivered: []string{recsQ[1].ID}}})
	if !errors.As(err, &fe) || !slices.Equal(fe.Leases, []outbox.Lease{lq}) {
		s.Errorf("Settle under the node's former epoch: got %v, want a FencedError for %v", err, lq)
	}
	if got := s.fetch(q); !slices.Equal(ids(got), ids(recsQ[1:])) {
		s.Errorf("settle under a former epoch changed partition %d: records %v, want %v", q, ids(got), ids(recsQ[1:]))
	}
	s.settle(a, outbox.Settlement{Lease: again[0], Delivered: []string{recsQ[1].ID}})
	if left := s.fetch(q); len(left) != 0 {
		s.Errorf("delivery under the current epoch left %v", ids(left))
	}
}
