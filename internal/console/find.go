package console

import (
	"cmp"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

// findView is the find page.
type findView struct {
	page
	Q          string
	ByID       bool
	CanFind    bool
	Searched   bool
	Rows       []foundRow
	Truncated  bool
	Unsearched []string
}

type foundRow struct {
	outbox.FoundMessage
	Created, NextAttempt, Failed, Published string
}

func (s *Server) handleFind(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	v := &findView{page: s.page(r, "find", "Find a message"), Q: q, CanFind: s.admin != nil}
	if q == "" || s.admin == nil {
		s.render(w, r, http.StatusOK, "find", v)
		return
	}
	if len(q) > filterTextMax {
		s.fail(w, r, http.StatusBadRequest, "a key is at most %d bytes", filterTextMax)
		return
	}
	fq := outbox.FindQuery{Key: q}
	if outbox.ValidateID(q) == nil {
		fq = outbox.FindQuery{ID: q}
		v.ByID = true
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	res, err := s.admin.FindMessages(ctx, fq)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, "find: %v", err)
		return
	}
	v.Searched, v.Truncated = true, res.Truncated
	now := s.now()
	for _, m := range res.Messages {
		v.Rows = append(v.Rows, foundRowOf(m, now))
	}
	slices.SortStableFunc(v.Rows, func(a, b foundRow) int { return cmp.Compare(stateOrder(a.State), stateOrder(b.State)) })
	for _, st := range slices.Sorted(maps.Keys(res.Unsearched)) {
		v.Unsearched = append(v.Unsearched, string(st)+" messages: "+res.Unsearched[st])
	}
	s.render(w, r, http.StatusOK, "find", v)
}

// foundRowOf is m with its times said relative to now.
func foundRowOf(m outbox.FoundMessage, now time.Time) foundRow {
	row := foundRow{FoundMessage: m, Created: age(now.Sub(m.CreatedAt)) + " ago"}
	if !m.NextAttemptAt.IsZero() {
		if d := m.NextAttemptAt.Sub(now); d > 0 {
			row.NextAttempt = "in " + age(d)
		} else {
			row.NextAttempt = "due"
		}
	}
	if !m.FailedAt.IsZero() {
		row.Failed = age(now.Sub(m.FailedAt)) + " ago"
	}
	if !m.PublishedAt.IsZero() {
		row.Published = age(now.Sub(m.PublishedAt)) + " ago"
	}
	return row
}

func stateOrder(s outbox.MessageState) int {
	switch s {
	case outbox.StateOutstanding:
		return 0
	case outbox.StateDead:
		return 1
	}
	return 2
}
