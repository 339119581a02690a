package bench

import "errors"

// WritePlot draws the report into an SVG file.
func (r *Report) WritePlot(file string) error {
	return errors.New("bench: --plot is not available yet")
}
