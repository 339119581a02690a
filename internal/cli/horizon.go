package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/outboxrelay/outbox"
)

// horizonHeldAfter: status calls the xmin horizon held once its oldest
// holder has held it this long (the relay's WARN threshold by default).
const horizonHeldAfter = time.Minute

// horizonHeld reports whether hz is held back for the outbox table for
// longer than horizonHeldAfter, and by whom.
func horizonHeld(hz *outbox.XminHorizon) (outbox.HorizonHolder, bool) {
	return hz.Held(horizonHeldAfter)
}

// horizonLine is the one-line summary of the xmin horizon, for status and
// the console.
func horizonLine(hz *outbox.XminHorizon) string {
	h, held := horizonHeld(hz)
	if !held {
		s := "free"
		if hz.AgeSeconds != nil {
			s += fmt.Sprintf(" (oldest transaction %s, %d xids)", age(secondsDuration(*hz.AgeSeconds)), hz.AgeXids)
		}
		return s
	}
	return fmt.Sprintf("HELD for %s (%d xids) by %s: vacuum cannot remove the outbox's deleted rows, and the relay slows down", age(secondsDuration(*h.AgeSeconds)), h.AgeXids, h)
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// writeHorizonText prints the xmin horizon: one line, and the holders
// when it is held.
func writeHorizonText(w io.Writer, hz *outbox.XminHorizon) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "xmin horizon\t%s\n", horizonLine(hz))
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, held := horizonHeld(hz); !held {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "HORIZON HOLDER\tPID\tAGE\tXIDS\tSTATE\tTRANSACTION START\tSTATEMENT START\n")
	for _, h := range hz.Holders {
		pid, held, state, xs, qs := "-", "-", "-", "-", "-"
		if h.PID != 0 {
			pid = fmt.Sprint(h.PID)
		}
		if h.AgeSeconds != nil {
			held = age(secondsDuration(*h.AgeSeconds))
		}
		if h.State != "" {
			state = h.State
		}
		if !h.XactStart.IsZero() {
			xs = h.XactStart.UTC().Format(time.RFC3339)
		}
		if !h.QueryStart.IsZero() {
			qs = h.QueryStart.UTC().Format(time.RFC3339)
		}
		name := h.String()
		if h.Kind == outbox.HolderSlotCatalog {
			name += " [catalogs only]"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", name, pid, held, h.AgeXids, state, xs, qs)
	}
	return tw.Flush()
}
