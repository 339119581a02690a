package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/console"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// liteStore returns a migrated SQLite store in a temporary file.
func liteStore(t *testing.T) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "outbox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// liteDead inserts dead letters into a SQLite store and returns their IDs.
func liteDead(t *testing.T, s *sqlite.Store, n int, topic, key, lastError string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := outbox.NewID()
		now := time.Now().Add(-time.Duration(n-i) * time.Second).UnixNano()
		if _, err := s.DB().ExecContext(t.Context(), `INSERT INTO outbox_dead_letters (id, seq, partition, topic, key, payload, created_at, attempts, last_error, failed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, 3, ?, ?)`, id, i+1, outbox.PartitionOf(key, 64), topic, key, []byte("{}"), now, lastError, now); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func liteWrite(t *testing.T, s *sqlite.Store, msgs ...outbox.Message) {
	t.Helper()
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := sqlite.Write(t.Context(), tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// handler returns a console handler of o.
func handler(t *testing.T, o console.Options) http.Handler {
	t.Helper()
	if o.StoreKind == "" {
		o.StoreKind = "sqlite"
	}
	srv, err := console.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv.Handler()
}

// do sends a request to h and returns the response and body. A request
// without a remote address of its own comes from 127.0.0.1.
func do(t *testing.T, h http.Handler, req *http.Request) (*http.Response, string) {
	t.Helper()
	if req.RemoteAddr == "192.0.2.1:1234" { // httptest's default
		req.RemoteAddr = "127.0.0.1:40000"
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func get(t *testing.T, h http.Handler, target string) (*http.Response, string) {
	t.Helper()
	return do(t, h, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "http://127.0.0.1:9080"+target, nil))
}

// post sends a same-origin form POST.
func post(t *testing.T, h http.Handler, target string, form url.Values) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "http://127.0.0.1:9080"+target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return do(t, h, req)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

func TestLoopbackOnlyWithoutAuth(t *testing.T) {
	t.Parallel()
	h := handler(t, console.Options{Store: liteStore(t)})
	for _, tc := range []struct {
		remote, host string
		want         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:9080", 200},
		{"127.0.0.1:5000", "localhost:9080", 200},
		{"[::1]:5000", "[::1]:9080", 200},
		{"203.0.113.7:5000", "127.0.0.1:9080", 403},     // a client beyond loopback
		{"10.1.2.3:5000", "console.internal:9080", 403}, // the same, by name
		{"127.0.0.1:5000", "attacker.example", 403},     // DNS rebinding: a page of another host
	} {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/", nil)
		req.RemoteAddr, req.Host = tc.remote, tc.host
		resp, body := do(t, h, req)
		if resp.StatusCode != tc.want {
			t.Errorf("GET / from %s for host %s: %d, want %d", tc.remote, tc.host, resp.StatusCode, tc.want)
		}
		if tc.want == 403 && !strings.Contains(body, "--basic-auth-file") {
			t.Errorf("refusal does not say how to allow it: %q", body)
		}
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("b0b-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(file, []byte("# console users\nalice:wonderland\nbob:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := console.LoadAuth(file, "")
	if err != nil {
		t.Fatal(err)
	}
	h := handler(t, console.Options{Store: liteStore(t), Auth: auth})
	for _, tc := range []struct {
		user, pass string
		want       int
	}{{"", "", 401}, {"alice", "nope", 401}, {"mallory", "wonderland", 401}, {"alice", "wonderland", 200}, {"bob", "b0b-secret", 200}, {"bob", "b0b-secreT", 401}} {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "http://203.0.113.9/dead-letters", nil)
		req.RemoteAddr = "203.0.113.7:5000" // beyond loopback: allowed with credentials
		if tc.user != "" {
			req.SetBasicAuth(tc.user, tc.pass)
		}
		resp, body := do(t, h, req)
		if resp.StatusCode != tc.want {
			t.Errorf("%s:%s: %d, want %d", tc.user, tc.pass, resp.StatusCode, tc.want)
		}
		if tc.want == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("401 without a basic challenge: %v", resp.Header)
		}
		if tc.want == 200 && !strings.Contains(body, `<span class="user">`+tc.user+`</span>`) {
			t.Errorf("the page does not show the user %s", tc.user)
		}
	}
}

func TestLoadAuthErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		basic, token, want string
	}{
		{write("nocolon", "alice\n"), "", "line 1: want user:password"},
		{write("empty", "\nalice:\n"), "", `line 2: user "alice" has an empty password`},
		{write("dup", "a:x\na:y\n"), "", `line 2: user "a" appears twice`},
		{write("none", "# nobody\n"), "", "no user:password line"},
		{write("badhash", "a:$2y$10$short\n"), "", "bad bcrypt hash"},
		{"", write("short", "abc\n"), "use at least 16"},
		{"", write("spaces", "abcdefgh ijklmnopqrs\n"), "one line without spaces"},
		{filepath.Join(dir, "missing"), "", "password file"},
	} {
		_, err := console.LoadAuth(tc.basic, tc.token)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadAuth(%s, %s) = %v, want an error containing %q", tc.basic, tc.token, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "ijklmnopqrs") {
			t.Errorf("the error prints the secret: %v", err)
		}
	}
	if a, err := console.LoadAuth("", ""); a != nil || err != nil {
		t.Errorf("LoadAuth without files = %v, %v; want nil, nil", a, err)
	}
}

func TestListenIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9080": true, "localhost:0": true, "[::1]:9080": true, "127.9.9.9:1": true,
		":9080": false, "0.0.0.0:9080": false, "[::]:9080": false, "192.168.1.2:9080": false, "console.example:9080": false, "bad": false,
	} {
		if got := console.ListenIsLoopback(addr); got != want {
			t.Errorf("ListenIsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestActionsNeedCSRFAndConfirmation: an action without the form's token,
// from another site, or without its confirmation changes nothing.
func TestActionsNeedCSRFAndConfirmation(t *testing.T) {
	t.Parallel()
	s := liteStore(t)
	ids := liteDead(t, s, 2, "orders.paid", "k", "boom")
	h := handler(t, console.Options{Store: s})
	_, page := get(t, h, "/dead-letters")
	token := csrfOf(t, page)
	form := url.Values{"act": {"purge:matching"}, "confirmed": {"yes"}}

	if resp, _ := post(t, h, "/dead-letters/apply", form); resp.StatusCode != 403 {
		t.Errorf("apply without a CSRF token: %d, want 403", resp.StatusCode)
	}
	form.Set("csrf", "forged")
	if resp, _ := post(t, h, "/dead-letters/apply", form); resp.StatusCode != 403 {
		t.Errorf("apply with a forged CSRF token: %d, want 403", resp.StatusCode)
	}
	form.Set("csrf", token)
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "http://127.0.0.1:9080/dead-letters/apply", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, _ := do(t, h, req); resp.StatusCode != 403 {
		t.Errorf("apply from another site: %d, want 403", resp.StatusCode)
	}
	form.Del("confirmed")
	if resp, _ := post(t, h, "/dead-letters/apply", form); resp.StatusCode != 400 {
		t.Errorf("apply without confirmation: %d, want 400", resp.StatusCode)
	}
	if n, _ := s.CountDeadLetters(t.Context(), outbox.DeadLetterFilter{}); n != 2 {
		t.Fatalf("refused actions changed the dead letters: %d left, want 2", n)
	}
	// The confirmation counts; the confirmed action purges.
	resp, body := post(t, h, "/dead-letters/confirm", url.Values{"csrf": {token}, "act": {"purge:selected"}, "id": {ids[0], outbox.NewID()}})
	if resp.StatusCode != 200 || !strings.Contains(body, `<strong id="confirm-count">1</strong>`) {
		t.Fatalf("confirm: %d\n%s", resp.StatusCode, body)
	}
	resp, _ = post(t, h, "/dead-letters/apply", url.Values{"csrf": {token}, "act": {"purge:selected"}, "id": {ids[0]}, "confirmed": {"yes"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "done=purge&done_n=1") {
		t.Errorf("apply: %d to %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n, _ := s.CountDeadLetters(t.Context(), outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("%d dead letters left, want 1", n)
	}
}

func TestDeadLetterPaging(t *testing.T) {
	t.Parallel()
	s := liteStore(t)
	ids := liteDead(t, s, 7, "orders.paid", "k", "boom")
	liteDead(t, s, 2, "orders.other", "k", "boom")
	h := handler(t, console.Options{Store: s})
	next := "/dead-letters?topic=orders.paid&n=3"
	var seen []string
	linkRe := regexp.MustCompile(`class="dl-link">([0-9a-f-]{36})<`)
	nextRe := regexp.MustCompile(`href="([^"]+)" id="next-page"`)
	for page := 0; next != ""; page++ {
		if page > 5 {
			t.Fatal("paging does not end")
		}
		resp, body := get(t, h, next)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d\n%s", next, resp.StatusCode, body)
		}
		if !strings.Contains(body, `<strong id="match-count">7</strong>`) {
			t.Errorf("page %d does not count 7 matches", page)
		}
		for _, m := range linkRe.FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		next = ""
		if m := nextRe.FindStringSubmatch(body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if strings.Join(seen, ",") != strings.Join(ids, ",") {
		t.Errorf("pages listed %v, want %v in failure order", seen, ids)
	}
	// A bad filter names the field.
	if resp, body := get(t, h, "/dead-letters?older=soon"); resp.StatusCode != 400 || !strings.Contains(body, "failed more than … ago") {
		t.Errorf("bad age: %d %s", resp.StatusCode, body)
	}
}

func TestFindPage(t *testing.T) {
	t.Parallel()
	s := liteStore(t)
	msg := outbox.Message{ID: outbox.NewID(), Topic: "orders.created", Key: "customer-1", Payload: []byte("{}")}
	liteWrite(t, s, msg)
	dead := liteDead(t, s, 1, "orders.paid", "customer-1", "boom")
	h := handler(t, console.Options{Store: s})
	_, body := get(t, h, "/find?q="+msg.ID)
	if !strings.Contains(body, `<tr class="state-outstanding">`) || !strings.Contains(body, ">"+strconv.Itoa(outbox.PartitionOf("customer-1", 64))+"<") {
		t.Errorf("find an outstanding ID:\n%s", body)
	}
	_, body = get(t, h, "/find?q="+outbox.NewID())
	if !strings.Contains(body, `id="unknown"`) {
		t.Errorf("find an unknown ID:\n%s", body)
	}
	_, body = get(t, h, "/find?q=customer-1")
	if !strings.Contains(body, `state-outstanding`) || !strings.Contains(body, `href="/dead-letters/`+dead[0]+`"`) {
		t.Errorf("find by key:\n%s", body)
	}
}

func TestPartitionsHot(t *testing.T) {
	t.Parallel()
	s := liteStore(t)
	var msgs []outbox.Message
	for range 300 {
		msgs = append(msgs, outbox.Message{Topic: "orders.created", Key: "whale", Payload: []byte("{}")})
	}
	for i := range 64 {
		msgs = append(msgs, outbox.Message{Topic: "orders.created", Key: "k" + strings.Repeat("x", i), Payload: []byte("{}")})
	}
	liteWrite(t, s, msgs...)
	h := handler(t, console.Options{Store: s})
	_, body := get(t, h, "/partitions")
	hot := outbox.PartitionOf("whale", 64)
	if !regexp.MustCompile(`<tr class="hot" data-partition="` + strconv.Itoa(hot) + `">`).MatchString(body) {
		t.Errorf("partition %d is not marked hot:\n%s", hot, body)
	}
	if n := strings.Count(body, `<tr class="hot"`); n != 1 {
		t.Errorf("%d hot partitions, want 1", n)
	}
}

func TestOverviewJSON(t *testing.T) {
	t.Parallel()
	s := liteStore(t)
	liteWrite(t, s, outbox.Message{Topic: "orders.created", Key: "k", Payload: []byte("{}")})
	h := handler(t, console.Options{Store: s})
	resp, body := get(t, h, "/api/overview")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out struct {
		StatusKnown bool            `json:"status_known"`
		Outstanding int64           `json:"outstanding"`
		Topics      []struct{}      `json:"topics"`
		Relay       json.RawMessage `json:"relay"`
		BlockedNote string          `json:"blocked_note"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if !out.StatusKnown || out.Outstanding != 1 || len(out.Topics) != 1 || string(out.Relay) != "null" || !strings.Contains(out.BlockedNote, "running relay") {
		t.Errorf("overview JSON: %s", body)
	}
}

// TestOverviewSharesReads: viewers within RefreshMin share one status read.
func TestOverviewSharesReads(t *testing.T) {
	t.Parallel()
	cs := &countingStatus{Store: liteStore(t)}
	h := handler(t, console.Options{Store: cs, RefreshMin: time.Hour})
	for range 5 {
		get(t, h, "/api/overview")
	}
	if cs.n != 1 {
		t.Errorf("5 overviews within RefreshMin read the status %d times, want 1", cs.n)
	}
}

type countingStatus struct {
	*sqlite.Store
	n int
}

func (c *countingStatus) Status(ctx context.Context) (*outbox.Status, error) {
	c.n++
	return c.Store.Status(ctx)
}

// TestStoreWithoutAbilities: what a store cannot answer is shown as such,
// not as an error.
func TestStoreWithoutAbilities(t *testing.T) {
	t.Parallel()
	h := handler(t, console.Options{Store: memstore.New(8, time.Now), StoreKind: "memory"})
	for page, want := range map[string]string{
		"/":                "This store cannot report its status",
		"/partitions":      "This store cannot report its partitions",
		"/dead-letters":    "The memory store has no dead letters",
		"/find?q=customer": "This store cannot look messages up",
	} {
		resp, body := get(t, h, page)
		if resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 200 saying %q:\n%s", page, resp.StatusCode, want, body)
		}
	}
}

// blockingLive is a Live source whose relay reports blocked destinations,
// as a relay will once it pauses destinations that cannot take messages.
type blockingLive struct{ blocked []console.BlockedDestination }

func (blockingLive) Node() string        { return "relay-b" }
func (blockingLive) Stats() outbox.Stats { return outbox.Stats{Published: 42, Leases: 3} }
func (blockingLive) Ready() bool         { return true }
func (l blockingLive) BlockedDestinations() []console.BlockedDestination {
	return l.blocked
}

func TestOverviewShowsBlockedDestinations(t *testing.T) {
	t.Parallel()
	since := time.Now().Add(-time.Minute)
	live := blockingLive{blocked: []console.BlockedDestination{{Destination: "orders.refunded", Reason: "nats: no stream matches subject <b>", Since: since, Waiting: 1234}}}
	h := handler(t, console.Options{Store: liteStore(t), Live: live})
	_, body := get(t, h, "/")
	if !strings.Contains(body, `<tr class="blocked"><td>orders.refunded</td>`) || !strings.Contains(body, "1,234") ||
		!strings.Contains(body, "no stream matches subject &lt;b&gt;") {
		t.Errorf("blocked destination not shown (escaped):\n%s", body)
	}
	_, body = get(t, h, "/api/overview")
	if !strings.Contains(body, `"blocked_known": true`) || !strings.Contains(body, `"destination": "orders.refunded"`) {
		t.Errorf("JSON overview lacks the blocked destination:\n%s", body)
	}
	h = handler(t, console.Options{Store: liteStore(t), Live: blockingLive{}})
	if _, body := get(t, h, "/"); !strings.Contains(body, "None: every destination takes messages.") {
		t.Errorf("no blocked destination:\n%s", body)
	}
}

// TestOverviewEveryDestinationBlocked: the HTML and the counts behind
// TestBrowserEveryDestinationBlocked, without a browser.
func TestOverviewEveryDestinationBlocked(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	for i := range 3 {
		write(t, store, outbox.Message{Topic: "orders.created", Key: "k" + strconv.Itoa(i), Payload: []byte("{}")})
	}
	live := blockingLive{blocked: []console.BlockedDestination{{Destination: "app.orders.created", Reason: "no stream covers it", Since: time.Now()}}}
	_, body := get(t, handler(t, console.Options{Store: store, Live: live}), "/")
	if !strings.Contains(body, `id="all-blocked"`) || !strings.Contains(body, "outbox destinations create") {
		t.Errorf("no banner that nothing can be published:\n%s", body)
	}
	if !regexp.MustCompile(`<td>app\.orders\.created</td><td>[^<]*</td><td>[^<]*</td><td class="n">3</td>`).MatchString(body) {
		t.Errorf("the blocked row does not count the 3 waiting messages:\n%s", body)
	}
	// Another topic with messages and no block: some still go out.
	write(t, store, outbox.Message{Topic: "invoices.sent", Key: "k", Payload: []byte("{}")})
	if _, body := get(t, handler(t, console.Options{Store: store, Live: live}), "/"); strings.Contains(body, `id="all-blocked"`) {
		t.Errorf("banner while invoices.sent is not blocked:\n%s", body)
	}
}

// TestMessagePageSaysWhyItWaits: a message found by ID has a page of its
// own that answers "why is this message not out?": its blocked
// destination, the earlier message of its key, its partition without a
// relay; the find page links to it; an unknown ID is a 404 saying so.
func TestMessagePageSaysWhyItWaits(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	write(t, store, outbox.Message{Topic: "orders.created", Key: "cust-7", Payload: []byte("{}")})
	write(t, store, outbox.Message{Topic: "orders.created", Key: "cust-7", Payload: []byte("{}")})
	res, err := store.FindMessages(context.Background(), outbox.FindQuery{Key: "cust-7"})
	if err != nil || len(res.Messages) != 2 {
		t.Fatalf("find: %v %+v", err, res)
	}
	first, second := res.Messages[0], res.Messages[1]
	if second.Seq < first.Seq {
		first, second = second, first
	}
	live := blockingLive{blocked: []console.BlockedDestination{{Destination: "app.orders.created", Reason: "no stream covers it", Since: time.Now()}}}
	h := handler(t, console.Options{Store: store, Live: live})
	resp, body := get(t, h, "/messages/"+second.ID)
	code := resp.StatusCode
	for _, want := range []string{
		"Its destination app.orders.created is blocked", "no stream covers it", "outbox destinations create",
		"1 earlier message(s) of its key &#34;cust-7&#34; wait before it",
		"No relay holds partition " + strconv.Itoa(second.Partition),
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("message page (%d) lacks %q:\n%s", code, want, body)
		}
	}
	if _, body := get(t, h, "/find?q=cust-7"); !strings.Contains(body, `href="/messages/`+first.ID+`"`) {
		t.Errorf("the find page does not link to the message page:\n%s", body)
	}
	if resp, body := get(t, h, "/messages/0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d"); resp.StatusCode != 404 || !strings.Contains(body, "it is unknown") {
		t.Errorf("unknown message: %d\n%s", resp.StatusCode, body)
	}
}
