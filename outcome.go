package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/outbox/internal/storepolicy"
)

// failLogEvery rate-limits the WARN line of retryable publish failures.
const failLogEvery = 10 * time.Second

// observe updates the destinations' state with one publish result.
func (r *Relay) observe(rec *Record, err error, now time.Time) {
	switch {
	case err == errNotAttempted:
		r.dests.unprobe(rec.Topic)
	case err == nil:
		r.dests.reached(rec.Topic)
	default:
		if _, blocked := IsBlocked(err); blocked {
			r.blockedN.Add(1)
			r.dests.blocked(rec.Topic, err, now)
		} else {
			r.dests.reached(rec.Topic) // the broker answered for the message
		}
	}
}

// Outcomes of one publish attempt.
const (
	outcomeDelivered = iota
	outcomeRetry
	outcomeDead
	outcomeBlocked // the destination refused: nothing to settle, no attempt
)

// outcome turns a publish result into the settlement entry for one record,
// updating the record for a retry, and returns which outcome it was.
func (r *Relay) outcome(rec *Record, err error, now time.Time, s *Settlement) int {
	if err == nil || errors.Is(err, ErrDuplicate) {
		if err != nil {
			total := r.dupN.Add(1)
			r.emit(Event{Kind: EventDuplicate, Topic: rec.Topic, Count: 1, Err: err})
			// After a takeover thousands are redelivered at once: one line
			// per failLogEvery, with the count (Stats and the hook have each).
			last := r.dupLog.Load()
			if t := time.Now().UnixNano(); t-last >= int64(failLogEvery) && r.dupLog.CompareAndSwap(last, t) {
				r.log.Warn("the broker acknowledged a duplicate (counted as delivered): a retry after a lost acknowledgement, or two messages sharing an ID (logged at most every 10s)", "id", rec.ID, "topic", rec.Topic, "duplicates_total", total, "err", err)
			}
		}
		s.Delivered = append(s.Delivered, rec.ID)
		return outcomeDelivered
	}
	if _, blocked := IsBlocked(err); blocked {
		return outcomeBlocked
	}
	rec.Attempts++
	// One rule for every store: valid UTF-8, no NUL, at most 4 KiB.
	rec.LastError = storepolicy.ErrorText(err.Error())
	f := Failure{ID: rec.ID, Partition: rec.Partition, Attempts: rec.Attempts, Err: rec.LastError}
	if IsPermanent(err) && r.cfg.OnPermanent == PermanentHoldKey {
		// The user would rather stop the key than deliver it with a gap:
		// the message stays at the head of its key, retried at the
		// longest backoff, and says so every time.
		rec.NextAttemptAt = now.Add(r.cfg.BackoffMax)
		f.NextAttemptAt = rec.NextAttemptAt
		s.Retry = append(s.Retry, f)
		r.heldN.Add(1)
		r.emit(Event{Kind: EventHeld, Topic: rec.Topic, Count: 1, Err: err})
		r.log.Error("message failed permanently; its key is held (Config.OnPermanent = hold): fix it, or dead-letter it with `outbox dlq`", "id", rec.ID, "topic", rec.Topic, "key", rec.Key, "attempts", rec.Attempts, "retry_at", rec.NextAttemptAt, "err", err)
		return outcomeRetry
	}
	if IsPermanent(err) || rec.Attempts >= r.cfg.MaxAttempts {
		s.Dead = append(s.Dead, f)
		r.log.Warn("dead-lettering message", "id", rec.ID, "topic", rec.Topic, "attempts", rec.Attempts, "err", err)
		return outcomeDead
	}
	rec.NextAttemptAt = now.Add(r.cfg.RetryPolicy(rec.Attempts))
	f.NextAttemptAt = rec.NextAttemptAt
	s.Retry = append(s.Retry, f)
	return outcomeRetry
}

// report counts one publish and emits its hook events.
func (r *Relay) report(recs []*Record, outcomes []int, errs []error, took time.Duration, now time.Time) {
	type counts struct{ n [4]int }
	byTopic := map[string]*counts{}
	var oldest time.Time
	var firstErr error
	for i, rec := range recs {
		c := byTopic[rec.Topic]
		if c == nil {
			c = &counts{}
			byTopic[rec.Topic] = c
		}
		c.n[outcomes[i]]++
		if outcomes[i] == outcomeDelivered {
			if oldest.IsZero() || rec.CreatedAt.Before(oldest) {
				oldest = rec.CreatedAt
			}
		} else if firstErr == nil {
			firstErr = errs[i]
		}
	}
	for topic, c := range byTopic {
		if n := c.n[outcomeDelivered]; n > 0 {
			r.published.Add(int64(n))
			r.emit(Event{Kind: EventPublished, Topic: topic, Count: n, Duration: took})
		}
		if n := c.n[outcomeRetry]; n > 0 {
			total := r.failed.Add(int64(n))
			r.emit(Event{Kind: EventFailed, Topic: topic, Count: n, Err: firstErr})
			last := r.failLog.Load()
			if t := time.Now().UnixNano(); t-last >= int64(failLogEvery) && r.failLog.CompareAndSwap(last, t) {
				r.log.Warn("publishes failing; retrying with backoff (logged at most every 10s)", "topic", topic, "failed", n, "failed_total", total, "err", firstErr)
			}
		}
		if n := c.n[outcomeDead]; n > 0 {
			r.dead.Add(int64(n))
			r.emit(Event{Kind: EventDeadLettered, Topic: topic, Count: n, Err: firstErr})
		}
	}
	if !oldest.IsZero() {
		r.emit(Event{Kind: EventLag, Duration: now.Sub(oldest)})
	}
}

// publish publishes msgs (those of recs) and returns one result per
// message. A record the store could not decode is not published: its
// result is a permanent error saying what was wrong, so it is
// dead-lettered alone while the others flow.
func (r *Relay) publish(ctx context.Context, recs []*Record, msgs []*Message) []error {
	bad := 0
	for _, rec := range recs {
		if rec.DecodeError != "" {
			bad++
		}
	}
	if bad == 0 {
		return r.send(ctx, recs, msgs)
	}
	errs := make([]error, len(msgs))
	good := make([]*Message, 0, len(msgs)-bad)
	goodRecs := make([]*Record, 0, len(msgs)-bad)
	idx := make([]int, 0, len(msgs)-bad)
	for i, rec := range recs {
		if rec.DecodeError != "" {
			errs[i] = Permanent(fmt.Errorf("outbox: the stored record cannot be decoded, so it is not published: %s", rec.DecodeError))
			continue
		}
		good = append(good, msgs[i])
		goodRecs = append(goodRecs, rec)
		idx = append(idx, i)
	}
	if len(good) > 0 {
		for j, err := range r.send(ctx, goodRecs, good) {
			errs[idx[j]] = err
		}
	}
	return errs
}

// fixErrs guards against publishers returning the wrong number of results:
// a missing result is a failure, never a success.
func fixErrs(errs []error, n int) []error {
	if len(errs) == n {
		return errs
	}
	out := make([]error, n)
	for i := range out {
		if i < len(errs) {
			out[i] = errs[i]
		} else {
			out[i] = fmt.Errorf("outbox: publisher returned %d results for %d messages", len(errs), n)
		}
	}
	return out
}
