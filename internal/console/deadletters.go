package console

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

// Bounds of the dead-letter filters.
const (
	filterTextMax = 1024
	selectionMax  = PageSizeMax
)

// dlFilter is the dead-letter filter of a page, as typed.
type dlFilter struct {
	Topic, Key, Error, Older, Newer string
}

// values returns the filter as URL query values (empty ones left out).
func (f dlFilter) values() url.Values {
	v := url.Values{}
	for k, x := range map[string]string{"topic": f.Topic, "key": f.Key, "error": f.Error, "older": f.Older, "newer": f.Newer} {
		if x != "" {
			v.Set(k, x)
		}
	}
	return v
}

// ListURL is the dead-letter list with this filter.
func (f dlFilter) ListURL() string {
	if q := f.values().Encode(); q != "" {
		return "/dead-letters?" + q
	}
	return "/dead-letters"
}

// Empty reports whether the filter selects every dead letter.
func (f dlFilter) Empty() bool { return f == dlFilter{} }

// Describe says what the filter selects, for a confirmation.
func (f dlFilter) Describe() string {
	var parts []string
	if f.Topic != "" {
		parts = append(parts, "topic "+strconv.Quote(f.Topic))
	}
	if f.Key != "" {
		parts = append(parts, "key "+strconv.Quote(f.Key))
	}
	if f.Error != "" {
		parts = append(parts, "last error containing "+strconv.Quote(f.Error))
	}
	if f.Older != "" {
		parts = append(parts, "failed more than "+f.Older+" ago")
	}
	if f.Newer != "" {
		parts = append(parts, "failed less than "+f.Newer+" ago")
	}
	if len(parts) == 0 {
		return "every dead letter"
	}
	return "every dead letter with " + strings.Join(parts, ", ")
}

func readFilter(v url.Values) dlFilter {
	g := func(k string) string { return strings.TrimSpace(v.Get(k)) }
	return dlFilter{Topic: g("topic"), Key: v.Get("key"), Error: g("error"), Older: g("older"), Newer: g("newer")}
}

// storeFilter checks f and turns it into a store filter. Errors name the
// field and say what to change.
func (s *Server) storeFilter(f dlFilter) (outbox.DeadLetterFilter, error) {
	var out outbox.DeadLetterFilter
	if f.Topic != "" {
		if err := outbox.ValidateTopic(f.Topic); err != nil {
			return out, fmt.Errorf("topic: %v", err)
		}
		out.Topic = f.Topic
	}
	if len(f.Key) > filterTextMax || len(f.Error) > filterTextMax {
		return out, fmt.Errorf("key and error text must be at most %d bytes", filterTextMax)
	}
	out.Key, out.ErrorContains = f.Key, f.Error
	now := s.now()
	for _, d := range []struct {
		name, v string
		set     *time.Time
	}{{"failed more than … ago", f.Older, &out.FailedBefore}, {"failed less than … ago", f.Newer, &out.FailedAfter}} {
		if d.v == "" {
			continue
		}
		dur, err := time.ParseDuration(d.v)
		if err != nil || dur <= 0 {
			return out, fmt.Errorf("%s: %q is not a positive duration; write it like 90s, 15m, 2h or 168h", d.name, d.v)
		}
		*d.set = now.Add(-dur)
	}
	return out, nil
}

// deadLettersView is the dead-letter list.
type deadLettersView struct {
	page
	NoDead    bool // the store does not implement AdminStore
	Filter    dlFilter
	FilterErr string
	Rows      []dlRow
	Count     int64
	First     bool   // this is the first page
	Next      string // URL of the next page, or empty
	PageSize  int
	Done      string // the result of the action just applied
}

type dlRow struct {
	ID, Topic, Key, LastError, FailedAgo string
	Attempts                             int
}

func (s *Server) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := &deadLettersView{page: s.page(r, "dead-letters", "Dead letters"), NoDead: s.admin == nil,
		Filter: readFilter(q), PageSize: PageSizeDefault, First: true}
	v.Done = doneMessage(q)
	if v.NoDead {
		s.render(w, r, http.StatusOK, "deadletters", v)
		return
	}
	if n, err := strconv.Atoi(q.Get("n")); err == nil && n >= 1 && n <= PageSizeMax {
		v.PageSize = n
	}
	f, err := s.storeFilter(v.Filter)
	if err != nil {
		v.FilterErr = err.Error()
		s.render(w, r, http.StatusBadRequest, "deadletters", v)
		return
	}
	if at, id := q.Get("after_t"), q.Get("after_id"); at != "" || id != "" {
		t, terr := time.Parse(time.RFC3339Nano, at)
		if terr != nil || outbox.ValidateID(id) != nil {
			v.FilterErr = "the page position (after_t, after_id) is not valid: start again from the first page"
			s.render(w, r, http.StatusBadRequest, "deadletters", v)
			return
		}
		f.After = &outbox.DeadLetterPosition{FailedAt: t, ID: id}
		v.First = false
	}
	f.Limit = v.PageSize + 1
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	dls, err := s.admin.DeadLetters(ctx, f)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, "list dead letters: %v", err)
		return
	}
	cf := f
	cf.After, cf.Limit = nil, 0
	if v.Count, err = s.admin.CountDeadLetters(ctx, cf); err != nil {
		s.fail(w, r, http.StatusBadGateway, "count dead letters: %v", err)
		return
	}
	if len(dls) > v.PageSize {
		dls = dls[:v.PageSize]
		last := dls[len(dls)-1]
		next := v.Filter.values()
		next.Set("after_t", last.FailedAt.UTC().Format(time.RFC3339Nano))
		next.Set("after_id", last.ID)
		if v.PageSize != PageSizeDefault {
			next.Set("n", strconv.Itoa(v.PageSize))
		}
		v.Next = "/dead-letters?" + next.Encode()
	}
	now := s.now()
	for _, d := range dls {
		v.Rows = append(v.Rows, dlRow{ID: d.ID, Topic: d.Topic, Key: d.Key, Attempts: d.Attempts,
			LastError: oneLine(d.LastError, 120), FailedAgo: age(now.Sub(d.FailedAt))})
	}
	s.render(w, r, http.StatusOK, "deadletters", v)
}

// doneMessage reads the result of an action from the redirect's query.
func doneMessage(q url.Values) string {
	n, err := strconv.ParseInt(q.Get("done_n"), 10, 64)
	if err != nil || n < 0 {
		return ""
	}
	verb := map[string]string{"requeue": "Requeued", "purge": "Purged"}[q.Get("done")]
	if verb == "" {
		return ""
	}
	return fmt.Sprintf("%s %s %s.", verb, groupThousands(n), map[bool]string{true: "dead letter", false: "dead letters"}[n == 1])
}

// oneLine flattens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// deadLetterView is one dead letter.
type deadLetterView struct {
	page
	D       outbox.DeadLetter
	Payload payloadView
	Headers []header
	Failed  string
	Created string
}

type header struct{ Name, Value string }

func (s *Server) handleDeadLetter(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.admin == nil {
		s.fail(w, r, http.StatusNotFound, "The %s store has no dead letters.", s.opts.StoreKind)
		return
	}
	if err := outbox.ValidateID(id); err != nil {
		s.fail(w, r, http.StatusBadRequest, "Not a message ID: %v", err)
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	dls, err := s.admin.DeadLetters(ctx, outbox.DeadLetterFilter{IDs: []string{id}, Limit: 1})
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, "read the dead letter: %v", err)
		return
	}
	if len(dls) == 0 {
		s.fail(w, r, http.StatusNotFound, "%s is not a dead letter (any more): it may have been requeued or purged. Find it by ID to see where it is.", id)
		return
	}
	d := dls[0]
	now := s.now()
	v := &deadLetterView{page: s.page(r, "dead-letters", "Dead letter "+id), D: d, Payload: renderPayload(d.Payload),
		Failed: age(now.Sub(d.FailedAt)), Created: age(now.Sub(d.CreatedAt))}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		v.Headers = append(v.Headers, header{k, d.Headers[k]})
	}
	s.render(w, r, http.StatusOK, "deadletter", v)
}

// action is a requeue or purge as posted by a form: its field act is
// "requeue:selected", "purge:matching", ….
type action struct {
	Op     string // requeue or purge
	Scope  string // selected or matching
	IDs    []string
	Filter dlFilter
}

// Act is the form value of the action.
func (a action) Act() string { return a.Op + ":" + a.Scope }

// readAction checks an action form.
func (s *Server) readAction(r *http.Request) (action, outbox.DeadLetterFilter, error) {
	op, scope, _ := strings.Cut(r.PostForm.Get("act"), ":")
	a := action{Op: op, Scope: scope, Filter: readFilter(r.PostForm)}
	var f outbox.DeadLetterFilter
	if a.Op != "requeue" && a.Op != "purge" {
		return a, f, fmt.Errorf("act must start with requeue: or purge:, got %q", r.PostForm.Get("act"))
	}
	switch a.Scope {
	case "selected":
		for _, id := range r.PostForm["id"] {
			if err := outbox.ValidateID(id); err != nil {
				return a, f, fmt.Errorf("id: %v", err)
			}
			if !slices.Contains(a.IDs, id) {
				a.IDs = append(a.IDs, id)
			}
		}
		if len(a.IDs) == 0 {
			return a, f, fmt.Errorf("no dead letter selected: tick the ones to %s, or use the buttons for every match", a.Op)
		}
		if len(a.IDs) > selectionMax {
			return a, f, fmt.Errorf("%d dead letters selected; at most %d at once", len(a.IDs), selectionMax)
		}
		f.IDs = a.IDs
		return a, f, nil
	case "matching":
		var err error
		f, err = s.storeFilter(a.Filter)
		return a, f, err
	}
	return a, f, fmt.Errorf("act must end with :selected or :matching, got %q", r.PostForm.Get("act"))
}

// confirmView is the confirmation of an action.
type confirmView struct {
	page
	Action action
	Count  int64
	What   string
	Back   string
}

// postedAction checks an action POST (read-only mode, CSRF token, a store
// with dead letters, the form) and returns the action; on failure it has
// answered the request.
func (s *Server) postedAction(w http.ResponseWriter, r *http.Request) (action, outbox.DeadLetterFilter, bool) {
	if !s.checkAction(w, r) {
		return action{}, outbox.DeadLetterFilter{}, false
	}
	if s.admin == nil {
		s.fail(w, r, http.StatusNotFound, "The %s store has no dead letters.", s.opts.StoreKind)
		return action{}, outbox.DeadLetterFilter{}, false
	}
	a, f, err := s.readAction(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return action{}, outbox.DeadLetterFilter{}, false
	}
	return a, f, true
}

// handleConfirm counts what an action would touch and asks to confirm.
func (s *Server) handleConfirm(w http.ResponseWriter, r *http.Request) {
	a, f, ok := s.postedAction(w, r)
	if !ok {
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	var (
		n   int64
		err error
	)
	if a.Scope == "selected" {
		dls, err := s.admin.DeadLetters(ctx, outbox.DeadLetterFilter{IDs: a.IDs, Limit: len(a.IDs)})
		if err != nil {
			s.fail(w, r, http.StatusBadGateway, "read the selected dead letters: %v", err)
			return
		}
		n = int64(len(dls))
	} else if n, err = s.admin.CountDeadLetters(ctx, f); err != nil {
		s.fail(w, r, http.StatusBadGateway, "count dead letters: %v", err)
		return
	}
	v := &confirmView{page: s.page(r, "dead-letters", "Confirm"), Action: a, Count: n, Back: a.Filter.ListURL()}
	if a.Scope == "selected" {
		v.What = "the selected dead letters"
		if len(a.IDs) == 1 {
			v.Back = "/dead-letters/" + a.IDs[0]
		}
	} else {
		v.What = a.Filter.Describe()
	}
	s.render(w, r, http.StatusOK, "confirm", v)
}

// handleApply runs a confirmed action, logs it with who did it, and goes
// back to the list with the result.
func (s *Server) handleApply(w http.ResponseWriter, r *http.Request) {
	a, f, ok := s.postedAction(w, r)
	if !ok {
		return
	}
	if r.PostForm.Get("confirmed") != "yes" {
		s.fail(w, r, http.StatusBadRequest, "This action was not confirmed: go back and use the confirmation page.")
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	var (
		n   int64
		err error
	)
	if a.Op == "requeue" {
		n, err = s.admin.Requeue(ctx, f)
	} else {
		n, err = s.admin.PurgeDeadLetters(ctx, f)
	}
	vis := visitorOf(r)
	attrs := []any{"user", vis.User, "remote", vis.Remote, "op", a.Op, "scope", a.Scope, "count", n}
	if a.Scope == "selected" {
		attrs = append(attrs, "ids", a.IDs)
	} else {
		attrs = append(attrs, "filter", a.Filter.Describe())
	}
	if err != nil {
		s.log.Error("console action failed", append(attrs, "err", err)...)
		s.fail(w, r, http.StatusBadGateway, "%s dead letters: %v (%d done before the failure)", a.Op, err, n)
		return
	}
	s.log.Info("console action", attrs...)
	back := a.Filter.values()
	back.Set("done", a.Op)
	back.Set("done_n", strconv.FormatInt(n, 10))
	http.Redirect(w, r, "/dead-letters?"+back.Encode(), http.StatusSeeOther)
}
