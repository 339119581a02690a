package console_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/console"
)

// TestBrowserOverviewBacklogFalls loads the overview of a backlog in a real
// browser, starts a relay, and watches the backlog fall to zero on the page
// without reloading it.
func TestBrowserOverviewBacklogFalls(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	b := newBroker(t)
	const n = 30000
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: []string{"orders.created", "orders.paid", "orders.shipped"}[i%3],
			Key: "customer-" + strconv.Itoa(i%500), Payload: fmt.Appendf(nil, `{"order":%d}`, i)}
	}
	write(t, store, msgs...)
	insertDead(t, store, deadLetter{Topic: "orders.paid", Key: "customer-7", LastError: "nats: maximum payload exceeded", Payload: []byte(`{"order":7}`)})
	// One worker with one batch in flight drains slowly enough for the
	// page to show the backlog on its way down (600 publishes: with batches
	// of 10, 3,000 of them outlasted the wait on a loaded machine).
	relay := newRelayConfig(t, store, b, outbox.Config{Node: "relay-a", Workers: 1, InFlight: 1, BatchSize: 50, PollInterval: 100 * time.Millisecond})
	base, _, _ := serve(t, "", console.Options{Store: store, Live: console.RelayLive(relay),
		RefreshMin: 100 * time.Millisecond, PollEvery: 250 * time.Millisecond})

	ctx := browse(t)
	open(t, ctx, base+"/", "#outstanding")
	outstanding := func() int64 {
		v, err := strconv.ParseInt(eval[string](t, ctx, `document.getElementById("outstanding").dataset.value`), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := outstanding(); got != n {
		t.Fatalf("overview before the relay starts: outstanding %d, want %d", got, n)
	}
	if got := text(t, ctx, "#topics"); !contains(got, "orders.created") || !contains(got, "10,000") {
		t.Errorf("topics table %q, want orders.created with 10,000", got)
	}
	// Mark this document: a reload would lose the mark.
	eval[bool](t, ctx, `window.__sameDocument = true`)

	if err := relay.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var seen []int64
	shot := false
	poll(t, "the overview shows the backlog drained", func() bool {
		v := outstanding()
		if len(seen) == 0 || seen[len(seen)-1] != v {
			seen = append(seen, v)
		}
		if !shot && v > 0 && v < n/2 {
			screenshot(t, ctx, "console-overview") // on its way down
			shot = true
		}
		return v == 0
	})
	t.Logf("outstanding as the page showed it: %v", seen)
	for i := 1; i < len(seen); i++ {
		if seen[i] > seen[i-1] {
			t.Errorf("the backlog rose on the page: %v", seen)
		}
	}
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Fatal("the page was reloaded; the overview must refresh in place")
	}
	if r := eval[string](t, ctx, `document.getElementById("live").dataset.refreshed || "0"`); r == "0" {
		t.Error("the live part was never refreshed")
	}
	// The relay of this process, its throughput chart and the relays table.
	poll(t, "the relay table lists relay-a with its leases", func() bool {
		return contains(eval[string](t, ctx, `document.getElementById("relays").innerText`), "relay-a")
	})
	if got := text(t, ctx, "#this-relay"); !contains(got, "relay-a") || !contains(got, "ready") {
		t.Errorf("this relay: %q", got)
	}
	if got := text(t, ctx, "#blocked"); !contains(got, "every destination takes messages") {
		t.Errorf("blocked destinations of a relay whose destinations all work: %q", got)
	}
	if lines := eval[int](t, ctx, `document.querySelectorAll("polyline.s-published").length`); lines == 0 {
		t.Error("no throughput line")
	}
	if lines := eval[int](t, ctx, `document.querySelectorAll("polyline.s-outstanding").length`); lines == 0 {
		t.Error("no backlog line")
	}
	screenshot(t, ctx, "console-overview-drained")
}

// TestBrowserStoreOnlyOverview: without a relay the overview says that the
// store does not know blocked destinations nor throughput.
func TestBrowserStoreOnlyOverview(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	write(t, store, outbox.Message{Topic: "orders.created", Key: "k", Payload: []byte("{}")})
	base, _, _ := serve(t, "", console.Options{Store: store})
	ctx := browse(t)
	open(t, ctx, base+"/", "#outstanding")
	if got := text(t, ctx, "#blocked"); !contains(got, "The store does not know about blocked destinations") {
		t.Errorf("blocked destinations without a relay: %q", got)
	}
	if got := text(t, ctx, "#throughput-note"); !contains(got, "known only to a running relay") {
		t.Errorf("throughput without a relay: %q", got)
	}
	if got := text(t, ctx, "#outstanding"); got != "1" {
		t.Errorf("outstanding %q, want 1", got)
	}
}

// TestBrowserRequeueDeadLetter opens a dead letter, requeues it from the
// page and sees it published on the broker.
func TestBrowserRequeueDeadLetter(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	b := newBroker(t)
	relay := startRelay(t, store, b, "relay-a")
	ids := insertDead(t, store,
		deadLetter{Topic: "orders.paid", Key: "customer-42", Attempts: 10, FailedAgo: 3 * time.Minute,
			LastError: "nats: no responders available for request", Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			Payload: []byte(`{"order":"A-1042","amount":{"value":"129.90","currency":"EUR"},"items":[{"sku":"BOOK-7","qty":2}]}`)},
		deadLetter{Topic: "orders.created", Key: "customer-7", Attempts: 10, FailedAgo: 10 * time.Minute,
			LastError: "context deadline exceeded", Payload: []byte{0x00, 0x01, 0xfe, 'b', 'i', 'n'}},
		deadLetter{Topic: "orders.shipped", Key: "customer-9", Attempts: 1, FailedAgo: time.Hour,
			LastError: "outbox: permanent: message too large for the stream (max 1 MB)", Payload: []byte(`{"shipment":"S-77"}`)},
	)
	base, _, logs := serve(t, "", console.Options{Store: store, Live: console.RelayLive(relay)})

	ctx := browse(t)
	open(t, ctx, base+"/dead-letters", "#dead-letters")
	if got := text(t, ctx, "#match-count"); got != "3" {
		t.Errorf("match count %q, want 3", got)
	}
	screenshot(t, ctx, "console-dead-letters")
	click(t, ctx, `a.dl-link[href="/dead-letters/`+ids[0]+`"]`, "#dl-payload")
	if got := text(t, ctx, "#dl-payload"); !contains(got, "\"amount\": {\n") {
		t.Errorf("JSON payload not pretty-printed: %q", got)
	}
	screenshot(t, ctx, "console-dead-letter")
	click(t, ctx, `button[data-action="requeue"]`, "#confirm-count")
	if got := text(t, ctx, "#confirm-count"); got != "1" {
		t.Fatalf("confirmation count %q, want 1", got)
	}
	if n := countDead(t, store, outbox.DeadLetterFilter{IDs: ids[:1]}); n != 1 {
		t.Fatalf("the confirmation page changed something: %d dead letters left of the one", n)
	}
	click(t, ctx, "#confirm", "#done")
	if got := text(t, ctx, "#done"); got != "Requeued 1 dead letter." {
		t.Errorf("flash %q", got)
	}
	b.waitPublished(t, ids[0])
	if n := countDead(t, store, outbox.DeadLetterFilter{}); n != 2 {
		t.Errorf("%d dead letters left, want 2", n)
	}
	if l := logs.String(); !contains(l, `msg="console action"`) || !contains(l, "user=local") || !contains(l, "op=requeue") || !contains(l, "count=1") {
		t.Errorf("the action was not logged with who did it:\n%s", l)
	}
	// Binary payloads render as a hex dump.
	open(t, ctx, base+"/dead-letters/"+ids[1], "#dl-payload")
	if got := text(t, ctx, "#dl-payload"); !contains(got, "00 01 fe 62 69 6e") {
		t.Errorf("binary payload %q, want a hex dump", got)
	}
}

// TestBrowserPurgeAsksConfirmation: purging asks first, says how many, and
// cancelling changes nothing.
func TestBrowserPurgeAsksConfirmation(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ids := insertDead(t, store,
		deadLetter{Topic: "orders.paid", Key: "k1", LastError: "boom", Payload: []byte("{}")},
		deadLetter{Topic: "orders.paid", Key: "k2", LastError: "boom", Payload: []byte("{}")},
		deadLetter{Topic: "orders.paid", Key: "k3", LastError: "other", Payload: []byte("{}")},
	)
	base, _, _ := serve(t, "", console.Options{Store: store})
	ctx := browse(t)

	// Purge every match of a filter: the confirmation counts them.
	open(t, ctx, base+"/dead-letters?error=boom", "#dead-letters")
	click(t, ctx, `button[data-action="purge-matching"]`, "#confirm-count")
	if got := text(t, ctx, "#confirm-count"); got != "2" {
		t.Fatalf("confirmation count %q, want 2", got)
	}
	if got := text(t, ctx, "#confirm-text"); !contains(got, "delete for good") || !contains(got, `last error containing "boom"`) {
		t.Errorf("confirmation text %q", got)
	}
	click(t, ctx, "#cancel", "#dead-letters")
	if n := countDead(t, store, outbox.DeadLetterFilter{}); n != 3 {
		t.Fatalf("cancelled purge deleted something: %d left, want 3", n)
	}

	// Purge one selected on the list.
	open(t, ctx, base+"/dead-letters", "#dead-letters")
	run(t, ctx, chromedp.Click(chromedp.CSS(`input[name="id"][value="`+ids[2]+`"]`)))
	click(t, ctx, `button[data-action="purge-selected"]`, "#confirm-count")
	if got := text(t, ctx, "#confirm-count"); got != "1" {
		t.Fatalf("confirmation count %q, want 1", got)
	}
	click(t, ctx, "#confirm", "#done")
	if got := text(t, ctx, "#done"); got != "Purged 1 dead letter." {
		t.Errorf("flash %q", got)
	}
	if n := countDead(t, store, outbox.DeadLetterFilter{IDs: ids[2:]}); n != 0 {
		t.Errorf("the purged dead letter is still there")
	}
	if n := countDead(t, store, outbox.DeadLetterFilter{}); n != 2 {
		t.Errorf("%d dead letters left, want 2", n)
	}
}

// TestBrowserReadOnly: a read-only console shows no action and refuses
// every change.
func TestBrowserReadOnly(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ids := insertDead(t, store, deadLetter{Topic: "orders.paid", Key: "k1", LastError: "boom", Payload: []byte("{}")})
	base, _, _ := serve(t, "", console.Options{Store: store, ReadOnly: true})
	ctx := browse(t)
	for _, page := range []string{"/", "/dead-letters", "/dead-letters/" + ids[0], "/partitions", "/find?q=" + ids[0]} {
		open(t, ctx, base+page, "main")
		if n := eval[int](t, ctx, `document.querySelectorAll("form[method=post], button[data-action], input[name=id]").length`); n != 0 {
			t.Errorf("read-only page %s has %d action elements", page, n)
		}
		if got := text(t, ctx, "#read-only"); got != "read-only" {
			t.Errorf("page %s does not say it is read-only: %q", page, got)
		}
	}
	// A forged POST is refused too.
	resp, err := http.PostForm(base+"/dead-letters/apply", map[string][]string{"act": {"purge:matching"}, "confirmed": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST to a read-only console: %s, want 403", resp.Status)
	}
	if n := countDead(t, store, outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("read-only console changed the dead letters: %d left", n)
	}
}

// TestBrowserAuthRequired: a console listening on every interface with a
// token refuses the unauthenticated browser, then lets it sign in.
func TestBrowserAuthRequired(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" // 64: a hex 256-bit token
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := console.LoadAuth("", tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	insertDead(t, store, deadLetter{Topic: "orders.paid", Key: "secret-key", LastError: "boom", Payload: []byte("{}")})
	base, _, _ := serve(t, "0.0.0.0:0", console.Options{Store: store, Auth: auth})
	ctx := browse(t)

	for _, page := range []string{"/", "/dead-letters", "/api/overview"} {
		resp, err := http.Get(base + page)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without credentials: %s, want 401", page, resp.Status)
		}
	}
	open(t, ctx, base+"/dead-letters", "form.signin")
	if html := eval[string](t, ctx, `document.body.innerText`); contains(html, "secret-key") || contains(html, "Dead letters match") {
		t.Fatalf("an unauthenticated browser sees dead letters:\n%s", html)
	}
	// Before sign-in: no navigation nor quick find (they lead back here);
	// the token input shows a 64-character token whole.
	if n := eval[int](t, ctx, `document.querySelectorAll("header nav, form.quickfind").length`); n != 0 {
		t.Errorf("the sign-in page shows %d navigation elements", n)
	}
	fits := eval[bool](t, ctx, `(() => {
		const in_ = document.querySelector('input[name="token"]');
		const probe = document.createElement("span");
		probe.style.font = getComputedStyle(in_).font;
		probe.style.whiteSpace = "pre";
		probe.textContent = "•".repeat(64);
		document.body.appendChild(probe);
		const ok = in_.clientWidth >= probe.offsetWidth;
		probe.remove();
		return ok;
	})()`)
	if !fits {
		t.Errorf("the token input is narrower than 64 characters: %d px", eval[int](t, ctx, `document.querySelector('input[name="token"]').clientWidth`))
	}
	run(t, ctx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "wrong-token-wrong-token"))
	click(t, ctx, `form.signin button`, "form.signin")
	if got := text(t, ctx, ".error"); !contains(got, "not the console's token") {
		t.Errorf("wrong token: %q", got)
	}
	run(t, ctx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token))
	click(t, ctx, `form.signin button`, "#outstanding")
	if n := eval[int](t, ctx, `document.querySelectorAll("header nav a").length`); n == 0 {
		t.Error("signed in, the navigation is missing")
	}
	open(t, ctx, base+"/dead-letters", "#dead-letters")
	if got := text(t, ctx, "#dead-letters"); !contains(got, "secret-key") {
		t.Errorf("signed in, the dead letters are not shown: %q", got)
	}
	if got := text(t, ctx, ".who .user"); got != "token" {
		t.Errorf("user %q, want token", got)
	}
	// Scripts use the bearer token.
	req, _ := http.NewRequest(http.MethodGet, base+"/api/overview", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/overview with the bearer token: %s", resp.Status)
	}
}

// TestBrowserHostilePayload: payloads, keys, headers and errors come from
// applications; markup in them renders as text and runs nothing.
func TestBrowserHostilePayload(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	const xss = `<script>window.__pwned=1;document.title="pwned"</script><img src=x onerror="window.__pwned=2">`
	ids := insertDead(t, store,
		deadLetter{Topic: "orders.paid", Key: xss, LastError: xss, Payload: []byte(`{"html":"` + strings.ReplaceAll(xss, `"`, `\"`) + `"}`),
			Headers: map[string]string{"x-evil": xss, `"><svg onload=window.__pwned=3>`: "v"}},
		deadLetter{Topic: "orders.paid", Key: "k2", LastError: "e", Payload: []byte(xss)},
	)
	base, _, _ := serve(t, "", console.Options{Store: store})
	ctx := browse(t)
	check := func(page string) {
		t.Helper()
		if p := eval[bool](t, ctx, `window.__pwned !== undefined`); p {
			t.Fatalf("%s ran injected script", page)
		}
		if title := eval[string](t, ctx, `document.title`); contains(title, "pwned") {
			t.Fatalf("%s: title changed to %q", page, title)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll("main img, main script, main svg[onload]").length`); n != 0 {
			t.Fatalf("%s has %d injected elements", page, n)
		}
	}
	open(t, ctx, base+"/dead-letters", "#dead-letters")
	check("the dead-letter list")
	if got := text(t, ctx, "#dead-letters"); !contains(got, "<script>window.__pwned=1") {
		t.Errorf("the hostile key does not show as text: %q", got)
	}
	open(t, ctx, base+"/dead-letters/"+ids[0], "#dl-payload")
	check("the dead-letter page")
	for _, sel := range []string{"#dl-key", "#dl-error", "#dl-payload", "#dl-headers"} {
		if got := text(t, ctx, sel); !contains(got, "<script>window.__pwned=1") {
			t.Errorf("%s: %q does not show the markup as text", sel, got)
		}
	}
	open(t, ctx, base+"/dead-letters/"+ids[1], "#dl-payload")
	check("a dead letter with a markup payload")
	open(t, ctx, base+"/find?q="+ids[0], "#found")
	check("the find page")
	open(t, ctx, base+"/find?q=%3Cscript%3Ewindow.__pwned%3D1%3C%2Fscript%3E", "main")
	check("a find query with markup")
}

// TestBrowserEveryDestinationBlocked: a relay whose only destination with
// messages waiting is blocked (it did not say how many wait) shows, at the
// top of the front page, that nothing can be published and how to create
// the destination; the blocked row counts the messages from the store,
// not "–".
func TestBrowserEveryDestinationBlocked(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	for i := range 3 {
		write(t, store, outbox.Message{Topic: "orders.created", Key: fmt.Sprint("k", i), Payload: []byte("{}")})
	}
	live := blockingLive{blocked: []console.BlockedDestination{{Destination: "app.orders.created", Reason: "no stream covers it", Since: time.Now()}}}
	base, _, _ := serve(t, "", console.Options{Store: store, Live: live})
	ctx := browse(t)
	open(t, ctx, base+"/", "#outstanding")
	poll(t, "the banner that nothing can be published", func() bool {
		return eval[int](t, ctx, `document.querySelectorAll("#all-blocked").length`) == 1
	})
	if got := text(t, ctx, "#all-blocked"); !contains(got, "Nothing can be published") || !contains(got, "outbox destinations create") {
		t.Errorf("banner: %q", got)
	}
	if got := text(t, ctx, "#blocked"); !contains(got, "app.orders.created") {
		t.Errorf("blocked destinations: %q", got)
	}
	if got := eval[string](t, ctx, `document.querySelector("#blocked tbody tr td:nth-child(4)").innerText`); got != "3" {
		t.Errorf("the blocked row's Waiting cell is %q, want the 3 messages waiting", got)
	}
}

// TestBrowserBacklogChartAtOpen: the backlog chart shows the outstanding
// count as soon as the overview opens, across the chart, not as a tick at
// its edge half a minute later.
func TestBrowserBacklogChartAtOpen(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	write(t, store, outbox.Message{Topic: "orders.created", Key: "k", Payload: []byte("{}")})
	base, _, _ := serve(t, "", console.Options{Store: store})
	ctx := browse(t)
	open(t, ctx, base+"/", "#outstanding")
	wide := eval[bool](t, ctx, `(() => {
		const l = document.querySelector("polyline.s-outstanding");
		if (!l) return false;
		const svg = l.ownerSVGElement.getBoundingClientRect();
		return l.getBoundingClientRect().width > svg.width / 2;
	})()`)
	if !wide {
		t.Errorf("at open the backlog chart has no line across it: %s", eval[string](t, ctx, `document.querySelector("figure.chart").outerHTML`))
	}
}

// TestBrowserMessagePage: from the find page to a waiting message's own
// page, which says why it waits.
func TestBrowserMessagePage(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	write(t, store, outbox.Message{Topic: "orders.created", Key: "cust-9", Payload: []byte("{}")})
	live := blockingLive{blocked: []console.BlockedDestination{{Destination: "orders.created", Reason: "no stream covers it", Since: time.Now()}}}
	base, _, _ := serve(t, "", console.Options{Store: store, Live: live})
	ctx := browse(t)
	open(t, ctx, base+"/find?q=cust-9", "#found")
	click(t, ctx, `#found a[href^="/messages/"]`, "#why")
	if got := text(t, ctx, "#why"); !contains(got, "Its destination orders.created is blocked") || !contains(got, "No relay holds partition") {
		t.Errorf("why it waits: %q", got)
	}
	if got := text(t, ctx, "#message"); !contains(got, "cust-9") || !contains(got, "outstanding") {
		t.Errorf("the message's fields: %q", got)
	}
}
