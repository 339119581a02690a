package storetest

import (
	"slices"
	"time"

	"github.com/outboxrelay/outbox"
)

// testAdmin checks outbox.AdminStore: the dead-letter filters by key, error
// text and failure time, paging, counting, and finding messages by ID or
// key.
func testAdmin(s *suite) {
	as, ok := s.src.(outbox.AdminStore)
	if !ok {
		s.Skip("the store does not implement outbox.AdminStore")
	}
	// Two keys, each with messages dead and outstanding. The error texts
	// hold LIKE wildcards, which must match only themselves.
	const keyA, keyB = "admin-a", "admin-b"
	a := newMessages(3, "admin.x", keyA)
	b := newMessages(2, "admin.y", keyB)
	s.write(append(a, b...)...)
	node := "node-admin"
	leases := s.acquire(node, nil, s.p)
	pa, pb := outbox.PartitionOf(keyA, s.p), outbox.PartitionOf(keyB, s.p)
	errA, errB := "Broker said NO: 100%_full", "publish timeout"
	dead := map[int][]outbox.Failure{}
	for _, d := range []struct {
		m   outbox.Message
		p   int
		err string
	}{{a[0], pa, errA}, {a[1], pa, errA}, {b[0], pb, errB}} {
		dead[d.p] = append(dead[d.p], outbox.Failure{ID: d.m.ID, Partition: d.p, Attempts: 4, Err: d.err})
	}
	for p, fs := range dead {
		l, _ := leaseOf(leases, p)
		s.settle(node, outbox.Settlement{Lease: l, Dead: fs})
	}

	list := func(f outbox.DeadLetterFilter) []string {
		s.Helper()
		dl, err := as.DeadLetters(s.ctx, f)
		if err != nil {
			s.Fatalf("DeadLetters(%+v): %v", f, err)
		}
		out := make([]string, len(dl))
		for i, d := range dl {
			out[i] = d.ID
		}
		return out
	}
	count := func(f outbox.DeadLetterFilter) int64 {
		s.Helper()
		n, err := as.CountDeadLetters(s.ctx, f)
		if err != nil {
			s.Fatalf("CountDeadLetters(%+v): %v", f, err)
		}
		return n
	}
	want := func(what string, got []string, ids ...string) {
		s.Helper()
		if !slices.Equal(sortedCopy(got), sortedCopy(ids)) {
			s.Errorf("%s: got %v, want %v", what, got, ids)
		}
	}
	now := time.Now()
	for _, tc := range []struct {
		name string
		f    outbox.DeadLetterFilter
		ids  []string
	}{
		{"everything", outbox.DeadLetterFilter{}, []string{a[0].ID, a[1].ID, b[0].ID}},
		{"Key", outbox.DeadLetterFilter{Key: keyA}, []string{a[0].ID, a[1].ID}},
		{"Key of no dead letter", outbox.DeadLetterFilter{Key: "admin-none"}, nil},
		{"Key and Topic", outbox.DeadLetterFilter{Key: keyA, Topic: "admin.y"}, nil},
		{"ErrorContains ignores case", outbox.DeadLetterFilter{ErrorContains: "no: 100"}, []string{a[0].ID, a[1].ID}},
		{"ErrorContains %", outbox.DeadLetterFilter{ErrorContains: "%"}, []string{a[0].ID, a[1].ID}},
		{"ErrorContains _", outbox.DeadLetterFilter{ErrorContains: "_"}, []string{a[0].ID, a[1].ID}},
		{"ErrorContains TIMEOUT", outbox.DeadLetterFilter{ErrorContains: "TIMEOUT"}, []string{b[0].ID}},
		{"FailedAfter an hour ago", outbox.DeadLetterFilter{FailedAfter: now.Add(-time.Hour)}, []string{a[0].ID, a[1].ID, b[0].ID}},
		{"FailedAfter in an hour", outbox.DeadLetterFilter{FailedAfter: now.Add(time.Hour)}, nil},
	} {
		want("DeadLetters "+tc.name, list(tc.f), tc.ids...)
		if n := count(tc.f); n != int64(len(tc.ids)) {
			s.Errorf("CountDeadLetters %s = %d, want %d", tc.name, n, len(tc.ids))
		}
	}
	if n := count(outbox.DeadLetterFilter{Limit: 1}); n != 3 {
		s.Errorf("CountDeadLetters ignores Limit: got %d, want 3", n)
	}

	// Paging one at a time visits each dead letter once, in listing order.
	var paged []string
	var after *outbox.DeadLetterPosition
	var last outbox.DeadLetterPosition
	for range 5 {
		dl, err := as.DeadLetters(s.ctx, outbox.DeadLetterFilter{Limit: 1, After: after})
		if err != nil {
			s.Fatalf("DeadLetters(After %+v): %v", after, err)
		}
		if len(dl) == 0 {
			break
		}
		d := dl[0]
		pos := outbox.DeadLetterPosition{FailedAt: d.FailedAt, ID: d.ID}
		if after != nil && (pos.FailedAt.Before(last.FailedAt) || pos.FailedAt.Equal(last.FailedAt) && pos.ID <= last.ID) {
			s.Errorf("page after %+v returned %+v: not later in (FailedAt, ID) order", last, pos)
		}
		paged = append(paged, d.ID)
		last, after = pos, &pos
	}
	want("paging one at a time", paged, a[0].ID, a[1].ID, b[0].ID)

	// Finding by ID: outstanding, dead, unknown.
	find := func(q outbox.FindQuery) *outbox.FindResult {
		s.Helper()
		r, err := as.FindMessages(s.ctx, q)
		if err != nil {
			s.Fatalf("FindMessages(%+v): %v", q, err)
		}
		return r
	}
	if r := find(outbox.FindQuery{ID: a[2].ID}); len(r.Messages) != 1 || r.Messages[0].State != outbox.StateOutstanding ||
		r.Messages[0].Partition != pa || r.Messages[0].Topic != "admin.x" || r.Messages[0].Key != keyA {
		s.Errorf("FindMessages(outstanding ID) = %+v, want one outstanding message of partition %d", r, pa)
	} else {
		s.checkMessage(r.Messages[0].Message, withCreatedAt(a[2], r.Messages[0].CreatedAt))
	}
	if r := find(outbox.FindQuery{ID: b[0].ID}); len(r.Messages) != 1 || r.Messages[0].State != outbox.StateDead ||
		r.Messages[0].Attempts != 4 || r.Messages[0].LastError != errB || r.Messages[0].FailedAt.IsZero() {
		s.Errorf("FindMessages(dead ID) = %+v, want one dead letter with 4 attempts and error %q", r, errB)
	}
	if r := find(outbox.FindQuery{ID: outbox.NewID()}); len(r.Messages) != 0 {
		s.Errorf("FindMessages(unknown ID) = %+v, want nothing", r.Messages)
	}
	// Finding by key: every state is either searched or said to be
	// unsearched.
	r := find(outbox.FindQuery{Key: keyA})
	byState := map[outbox.MessageState][]string{}
	for _, m := range r.Messages {
		if m.Key != keyA {
			s.Errorf("FindMessages(key %s) returned a message of key %q", keyA, m.Key)
		}
		byState[m.State] = append(byState[m.State], m.ID)
	}
	for st, ids := range map[outbox.MessageState][]string{outbox.StateOutstanding: {a[2].ID}, outbox.StateDead: {a[0].ID, a[1].ID}} {
		if reason, unsearched := r.Unsearched[st]; unsearched {
			if reason == "" {
				s.Errorf("FindMessages(key): state %s unsearched without a reason", st)
			}
			continue
		}
		want("FindMessages(key) "+string(st), byState[st], ids...)
	}
	if r := find(outbox.FindQuery{Key: keyA, Limit: 1}); len(r.Messages) > 2 || (len(r.Messages) == 2 && !r.Truncated) {
		s.Errorf("FindMessages(key, Limit 1) = %d messages, Truncated %v; want at most one per state and Truncated", len(r.Messages), r.Truncated)
	}
	for _, q := range []outbox.FindQuery{{}, {ID: a[0].ID, Key: keyA}, {ID: "not-an-id"}} {
		if _, err := as.FindMessages(s.ctx, q); err == nil {
			s.Errorf("FindMessages(%+v) = nil error, want one naming the field", q)
		}
	}

	// Requeue and purge honour the new filters.
	if n, err := as.Requeue(s.ctx, outbox.DeadLetterFilter{Key: keyB}); err != nil || n != 1 {
		s.Errorf("Requeue(Key %s) = %d, %v; want 1", keyB, n, err)
	}
	if n, err := as.PurgeDeadLetters(s.ctx, outbox.DeadLetterFilter{ErrorContains: "TIMEOUT"}); err != nil || n != 0 {
		s.Errorf("PurgeDeadLetters(ErrorContains TIMEOUT) after its requeue = %d, %v; want 0", n, err)
	}
	if n, err := as.PurgeDeadLetters(s.ctx, outbox.DeadLetterFilter{ErrorContains: "%_"}); err != nil || n != 2 {
		s.Errorf("PurgeDeadLetters(ErrorContains %%_) = %d, %v; want 2", n, err)
	}
	want("after requeue and purge", list(outbox.DeadLetterFilter{}))
}

func withCreatedAt(m outbox.Message, t time.Time) outbox.Message {
	m.CreatedAt = t
	return m
}
