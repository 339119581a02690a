package console

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

// messageView is the page of one message: its fields and why it has not
// gone out.
type messageView struct {
	page
	Found   bool
	ID      string
	Row     foundRow
	Reasons []waitReason
}

// waitReason is one answer to "why is this message not out?". Link, when
// set, leads to the message or page the reason is about.
type waitReason struct {
	Kind, Text, Link string
}

// handleMessage shows the message with ID id, found as the find page
// finds it, and, for a message still waiting, why: a blocked destination,
// an earlier message of its key that waits or fails (messages of a key go
// out in order), its next attempt time, and the relay holding its
// partition's lease (or none).
func (s *Server) handleMessage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := outbox.ValidateID(id); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	v := &messageView{page: s.page(r, "find", "Message "+id), ID: id}
	if s.admin == nil {
		s.fail(w, r, http.StatusNotImplemented, "this store cannot look messages up")
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	res, err := s.admin.FindMessages(ctx, outbox.FindQuery{ID: id})
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, "find: %v", err)
		return
	}
	if len(res.Messages) == 0 {
		s.render(w, r, http.StatusNotFound, "message", v)
		return
	}
	now := s.now()
	m := res.Messages[0]
	v.Found, v.Row = true, foundRowOf(m, now)
	switch m.State {
	case outbox.StateDead:
		v.Reasons = append(v.Reasons, waitReason{Kind: "dead", Text: "It failed for good after " + fmt.Sprint(m.Attempts) + " attempts and waits in the dead letters: requeue or purge it there.", Link: "/dead-letters/" + m.ID})
		s.render(w, r, http.StatusOK, "message", v)
		return
	case outbox.StatePublished:
		v.Reasons = append(v.Reasons, waitReason{Kind: "published", Text: "It is out: the broker acknowledged it " + v.Row.Published + "."})
		s.render(w, r, http.StatusOK, "message", v)
		return
	}
	// Its destination.
	if l := s.opts.Live; l != nil {
		if br, ok := l.(BlockedReporter); ok {
			for _, b := range br.BlockedDestinations() {
				if b.Destination == m.Topic || strings.HasSuffix(b.Destination, m.Topic) {
					v.Reasons = append(v.Reasons, waitReason{Kind: "blocked", Text: fmt.Sprintf("Its destination %s is blocked since %s: %s. The relay tries it again %s; create it on the broker (outbox destinations create) and the message goes out.",
						b.Destination, b.Since.UTC().Format("2006-01-02 15:04:05 UTC"), b.Reason, nextProbe(b, now))})
				}
			}
		}
	}
	// Earlier messages of its key.
	if m.Key != "" {
		keyed, err := s.admin.FindMessages(ctx, outbox.FindQuery{Key: m.Key})
		if err == nil {
			var earlier []outbox.FoundMessage
			for _, k := range keyed.Messages {
				if k.State == outbox.StateOutstanding && k.ID != m.ID && k.Partition == m.Partition && (k.Seq < m.Seq || k.Seq == m.Seq && k.CreatedAt.Before(m.CreatedAt)) {
					earlier = append(earlier, k)
				}
			}
			for _, k := range earlier {
				if k.Attempts > 0 || k.LastError != "" {
					v.Reasons = append(v.Reasons, waitReason{Kind: "key", Link: "/messages/" + k.ID,
						Text: fmt.Sprintf("An earlier message of its key, %s, is failing (%d attempts; last error: %s); messages of a key go out in order, so this one waits for it.", k.ID, k.Attempts, k.LastError)})
				}
			}
			if len(earlier) > 0 {
				v.Reasons = append(v.Reasons, waitReason{Kind: "key-order", Text: fmt.Sprintf("%d earlier message(s) of its key %q wait before it.", len(earlier), m.Key)})
			}
		}
	}
	// Its own attempts.
	if m.Attempts > 0 {
		v.Reasons = append(v.Reasons, waitReason{Kind: "attempts", Text: fmt.Sprintf("It failed %d time(s); last error: %s. Next attempt %s.", m.Attempts, m.LastError, cmpStr(v.Row.NextAttempt, "now"))})
	} else if v.Row.NextAttempt != "" && v.Row.NextAttempt != "due" {
		v.Reasons = append(v.Reasons, waitReason{Kind: "attempts", Text: "Its next attempt is " + v.Row.NextAttempt + "."})
	}
	// Its partition's lease.
	if snap := s.ov.snapshot(ctx); snap.Status != nil {
		for _, p := range snap.Status.Partitions {
			if p.Partition != m.Partition {
				continue
			}
			if p.Owner == "" || !p.LeaseExpiresAt.After(now) {
				v.Reasons = append(v.Reasons, waitReason{Kind: "lease", Text: fmt.Sprintf("No relay holds partition %d: is a relay running? (outbox status lists the live ones.)", m.Partition)})
			} else {
				v.Reasons = append(v.Reasons, waitReason{Kind: "lease", Text: fmt.Sprintf("Partition %d is leased by relay %s (lease expires in %s).", m.Partition, p.Owner, age(p.LeaseExpiresAt.Sub(now)))})
			}
		}
	}
	if len(v.Reasons) == 0 {
		v.Reasons = append(v.Reasons, waitReason{Kind: "due", Text: "Nothing holds it back: it goes out with the relay's next fetch."})
	}
	s.render(w, r, http.StatusOK, "message", v)
}

// nextProbe says when the relay tries a blocked destination again.
func nextProbe(b BlockedDestination, now time.Time) string {
	switch {
	case b.NextProbe.IsZero():
		return "soon"
	case b.NextProbe.After(now):
		return "in " + age(b.NextProbe.Sub(now))
	}
	return "now"
}

func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
