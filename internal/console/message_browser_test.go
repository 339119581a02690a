package console_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/console"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// The message page's other answers to "why is this message not out?": a
// dead letter (with the way to its dead-letter page), a published message
// (kept by retention, or gone), and the relay holding the lease of a
// waiting message's partition.

// TestBrowserMessagePageDeadLetter: a dead letter's page says it failed
// for good and after how many attempts, and leads to its dead-letter page.
func TestBrowserMessagePageDeadLetter(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ids := insertDead(t, store, deadLetter{Topic: "orders.paid", Key: "cust-3", Attempts: 7, FailedAgo: 2 * time.Minute,
		LastError: "nats: maximum payload exceeded", Payload: []byte(`{"order":"A-7"}`)})
	base, _, _ := serve(t, "", console.Options{Store: store})
	ctx := browse(t)
	// The find page links a dead letter to its dead-letter page; its
	// message page is where links and bookmarks of a message lead.
	open(t, ctx, base+"/messages/"+ids[0], "#why")
	if got := text(t, ctx, "#why"); !contains(got, "It failed for good after 7 attempts and waits in the dead letters") {
		t.Errorf("why it is not out: %q", got)
	}
	if got := text(t, ctx, "#message"); !contains(got, "dead") || !contains(got, "nats: maximum payload exceeded") || !contains(got, "cust-3") {
		t.Errorf("the message's fields: %q", got)
	}
	click(t, ctx, `#why li.why-dead a[href="/dead-letters/`+ids[0]+`"]`, "#dl-payload")
	if got := text(t, ctx, "#dl-payload"); !contains(got, `"order": "A-7"`) {
		t.Errorf("the dead letter's page shows the payload %q", got)
	}
}

// TestBrowserMessagePagePublished: a message the relay published is "out"
// on its page while retention keeps it, and unknown once it is gone.
func TestBrowserMessagePagePublished(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	kept, err := postgres.Open(t.Context(), testenv.PostgresDSN(t), postgres.Options{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kept.Close() })
	if err := kept.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	gone := newStore(t) // no retention: a published message is deleted
	ctx := browse(t)
	for _, c := range []struct {
		name  string
		store *postgres.Store
		sel   string
		want  string
	}{
		{"kept", kept, "#why li.why-published", "It is out: the broker acknowledged it"},
		{"gone", gone, "#unknown", "it is unknown (never written, or published and deleted)"},
	} {
		id := outbox.NewID()
		write(t, c.store, outbox.Message{ID: id, Topic: "orders.created", Key: "cust-" + c.name, Payload: []byte("{}")})
		startRelay(t, c.store, b, "relay-"+c.name)
		b.waitPublished(t, id)
		base, _, _ := serve(t, "", console.Options{Store: c.store})
		poll(t, c.name+": the relay to settle the message", func() bool {
			res, err := c.store.FindMessages(t.Context(), outbox.FindQuery{ID: id})
			if err != nil {
				t.Fatal(err)
			}
			return len(res.Messages) == 0 || res.Messages[0].State == outbox.StatePublished
		})
		open(t, ctx, base+"/messages/"+id, c.sel)
		if got := text(t, ctx, c.sel); !contains(got, c.want) {
			t.Errorf("%s: %s says %q, want %q", c.name, c.sel, got, c.want)
		}
		if c.name == "kept" {
			if got := text(t, ctx, "#message"); !contains(got, "published") {
				t.Errorf("kept: the message's fields %q, want the state published", got)
			}
		}
	}
}

// TestBrowserMessagePageLeaseOwner: a message waiting for a destination
// the broker lacks names the relay holding its partition's lease, next to
// the blocked destination.
func TestBrowserMessagePageLeaseOwner(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	b := newBroker(t) // its stream covers orders.>, not invoices.>
	id := outbox.NewID()
	write(t, store, outbox.Message{ID: id, Topic: "invoices.created", Key: "cust-5", Payload: []byte("{}")})
	relay := startRelay(t, store, b, "relay-lease-holder")
	base, _, _ := serve(t, "", console.Options{Store: store, Live: console.RelayLive(relay)})
	ctx := browse(t)
	// The page reads the leases as the overview last refreshed them:
	// reload until the relay's leases show.
	var why string
	poll(t, "the message page to name the lease holder", func() bool {
		open(t, ctx, base+"/messages/"+id, "#why")
		why = text(t, ctx, "#why")
		return contains(why, "is leased by relay relay-lease-holder (lease expires in")
	})
	if !contains(why, "Its destination invoices.created is blocked") {
		t.Errorf("why it is not out: %q, want the blocked destination too", why)
	}
	if contains(why, "No relay holds partition") {
		t.Errorf("why it is not out: %q says no relay holds the partition", why)
	}
}
