package cli

import "io"

// lineClearer writes "\r\x1b[K" (back to the line's start, clear it)
// before every write, so that a log line replaces the demo's progress line
// on a terminal instead of running into it; the next progress redraw comes
// on the line below.
type lineClearer struct{ w io.Writer }

func (l lineClearer) Write(p []byte) (int, error) {
	if _, err := io.WriteString(l.w, "\r\x1b[K"); err != nil {
		return 0, err
	}
	return l.w.Write(p)
}
