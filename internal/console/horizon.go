package console

import (
	"fmt"
	"time"

	"github.com/outboxrelay/outbox"
)

// horizonHeldAfter: the overview calls the xmin horizon held once its
// oldest holder has held it this long (the relay's WARN threshold by
// default).
const horizonHeldAfter = time.Minute

// horizonView is the overview's line on the database's xmin horizon
// (stores whose cost depends on vacuum: PostgreSQL with capture table).
type horizonView struct {
	Held bool `json:"held"`
	// Text says who holds it, for how long, and what it costs; or that it
	// is free.
	Text    string `json:"text"`
	AgeXids int64  `json:"age_xids"`
	// Holder is the holder, when held.
	Holder *outbox.HorizonHolder `json:"holder,omitempty"`
}

func newHorizonView(hz *outbox.XminHorizon) *horizonView {
	if hz == nil {
		return nil
	}
	v := &horizonView{AgeXids: hz.AgeXids}
	h, held := hz.Held(horizonHeldAfter)
	if !held {
		v.Text = "free"
		if hz.AgeSeconds != nil {
			v.Text += fmt.Sprintf(": the oldest transaction is %s old (%d transaction IDs)", age(time.Duration(*hz.AgeSeconds*float64(time.Second))), hz.AgeXids)
		}
		return v
	}
	v.Held, v.Holder = true, &h
	v.Text = fmt.Sprintf("held for %s (%d transaction IDs) by %s: vacuum cannot remove the outbox's deleted rows and the relay slows down with every message written meanwhile; end that transaction (outbox status lists every holder).",
		age(time.Duration(*h.AgeSeconds*float64(time.Second))), h.AgeXids, h)
	return v
}
