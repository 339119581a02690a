package storetest

import (
	"errors"
	"slices"
	"time"

	"github.com/outboxrelay/outbox"
)

// testStreamHold checks the stream side's ownership: one node at a time
// holds the stream, with every partition; another asking gets 0 and takes
// it over, with a higher epoch, once the holder releases it; settlements
// of a former hold are fenced, and a release by a node that does not hold
// the stream changes nothing.
func testStreamHold(s *suite) {
	if s.st == nil {
		s.Skip("the store is not an outbox.StreamStore")
	}
	key := "stream-key"
	p := outbox.PartitionOf(key, s.p)
	s.write(newMessages(3, "stream.hold", key)...)
	a, b := "node-a", "node-b"
	la, _ := leaseOf(s.hold(a), p)
	if la.Epoch == 0 {
		s.Fatalf("%s holds the stream with epoch 0", a)
	}
	epoch, changed, err := s.st.Hold(s.ctx, b)
	if err != nil || epoch != 0 {
		s.Fatalf("Hold(%s) while %s holds the stream = %d, %v; want 0, nil", b, a, epoch, err)
	}
	if changed == nil {
		s.Fatalf("Hold returned no channel")
	}
	if again, _, err := s.st.Hold(s.ctx, a); err != nil || again != la.Epoch {
		s.Errorf("Hold(%s) again = %d, %v; want its epoch %d", a, again, err, la.Epoch)
	}
	recs := s.fetch(p)
	if len(recs) != 3 {
		s.Fatalf("fetched %d records, want 3", len(recs))
	}
	s.settle(a, outbox.Settlement{Lease: la, Delivered: []string{recs[0].ID}})
	if err := s.st.Release(s.ctx, "node-z"); err != nil {
		s.Fatalf("Release by a node that does not hold the stream: %v", err)
	}
	if again, _, err := s.st.Hold(s.ctx, a); err != nil || again != la.Epoch {
		s.Errorf("after another node's Release, Hold(%s) = %d, %v; want its epoch %d", a, again, err, la.Epoch)
	}

	// a lets go: b's Hold's channel says so, and b holds it, with a
	// higher epoch.
	if err := s.st.Release(s.ctx, a); err != nil {
		s.Fatalf("Release(%s): %v", a, err)
	}
	select {
	case <-changed:
	case <-time.After(waitTimeout):
		s.Fatalf("the channel of %s's Hold was not closed when %s released the stream", b, a)
	}
	lb, _ := leaseOf(s.hold(b), p)
	if lb.Epoch <= la.Epoch {
		s.Fatalf("%s took the stream over with epoch %d, want above %d", b, lb.Epoch, la.Epoch)
	}
	if got, _, err := s.st.Hold(s.ctx, a); err != nil || got != 0 {
		s.Errorf("Hold(%s) while %s holds the stream = %d, %v; want 0", a, b, got, err)
	}
	if err := s.st.Release(s.ctx, a); err != nil {
		s.Fatalf("Release(%s): %v", a, err)
	}

	// a's settlement under its former hold is refused, even under b's
	// epoch as the wrong node; b's applies.
	left := s.fetch(p)
	if len(left) < 2 {
		s.Fatalf("fetched %d records after the takeover, want at least 2", len(left))
	}
	last := left[len(left)-1]
	var fe *outbox.FencedError
	err = s.src.Settle(s.ctx, a, []outbox.Settlement{{Lease: la, Delivered: []string{last.ID}}})
	if !errors.As(err, &fe) || !slices.Equal(fe.Leases, []outbox.Lease{la}) {
		s.Errorf("Settle under a former hold: got %v, want a FencedError for %v", err, la)
	}
	err = s.src.Settle(s.ctx, a, []outbox.Settlement{{Lease: lb, Delivered: []string{last.ID}}})
	if !errors.As(err, &fe) {
		s.Errorf("Settle as %s under %s's hold: got %v, want a FencedError", a, b, err)
	}
	if got := s.fetch(p); !slices.Equal(ids(got), ids(left)) {
		s.Errorf("fenced settlements changed partition %d: %v, want %v", p, ids(got), ids(left))
	}
	s.settle(b, outbox.Settlement{Lease: lb, Delivered: ids(left)})
	if got := s.fetch(p); len(got) != 0 {
		s.Errorf("the holder's delivery left %v", ids(got))
	}
	if err := s.st.Release(s.ctx, b); err != nil {
		s.Fatalf("Release(%s): %v", b, err)
	}
}
