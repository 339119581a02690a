package postgres

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// A claim looks at the recent IDs first (claimRecent), and at the older
// ones when the recent ones give nothing: records whose IDs are old (a
// long transaction, a skewed clock, an ID that is not UUIDv7) are claimed
// too, and a claim comes back empty only when nothing is claimable.
func TestClaimOlderIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := func(ago time.Duration) string { return uuid.Format(uuidAt(time.Now().Add(-ago)).Bytes) }
	ids := func(c outbox.Claim) []string {
		var out []string
		for _, r := range c.Records() {
			out = append(out, r.ID)
		}
		slices.Sort(out)
		return out
	}
	hour, day := old(time.Hour), old(24*time.Hour)
	notV7 := "ffffffff-ffff-4fff-bfff-ffffffffffff" // above every UUIDv7 of today
	if err := b.write(t, outbox.Message{ID: hour, Topic: "t"}, outbox.Message{ID: day, Topic: "t"}, outbox.Message{ID: notV7, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	recent := outbox.NewID()
	if err := b.write(t, outbox.Message{ID: recent, Topic: "t"}); err != nil {
		t.Fatal(err)
	}

	// A claim of 2 finds 2 recent IDs (notV7 sorts above today's): the
	// older ones are not needed.
	c1, err := b.store.ClaimUnordered(b.ctx, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(c1), []string{recent, notV7}; !slices.Equal(got, want) {
		t.Fatalf("first claim: %v, want the recent IDs %v", got, want)
	}
	// Every recent ID is held: the next claim finds the older ones.
	c2, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(c2), []string{day, hour}; !slices.Equal(got, want) {
		t.Fatalf("second claim: %v, want the old IDs %v", got, want)
	}
	// Nothing left to claim: empty.
	c3, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(c3.Records()); n != 0 {
		t.Fatalf("third claim: %d records, want none: all are held", n)
	}
	if err := c1.Settle(b.ctx, outbox.Settlement{Delivered: ids(c1)}); err != nil {
		t.Fatal(err)
	}
	if err := c2.Release(b.ctx); err != nil {
		t.Fatal(err)
	}
	// Released, the old ones are claimed again, with no recent ID left.
	c4, err := b.store.ClaimUnordered(b.ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Release(b.ctx)
	if got, want := ids(c4), []string{day, hour}; !slices.Equal(got, want) {
		t.Fatalf("claim after release: %v, want %v", got, want)
	}
}

// uuidAt is the least UUIDv7 of its millisecond.
func TestUUIDAt(t *testing.T) {
	at := time.UnixMilli(0x0190f1b47c8e)
	if got, want := uuid.Format(uuidAt(at).Bytes), "0190f1b4-7c8e-0000-0000-000000000000"; got != want {
		t.Errorf("uuidAt = %s, want %s", got, want)
	}
	id := outbox.NewID()
	if now := uuid.Format(uuidAt(time.Now().Add(-time.Second)).Bytes); !(now < id) {
		t.Errorf("uuidAt(a second ago) = %s, not below a new ID %s", now, id)
	}
}
