package console

import (
	"strconv"
	"strings"
	"time"
)

// Chart geometry, in SVG user units (the SVG scales to its box), and the
// shortest time span shown.
const (
	chartSpanMin = 30 * time.Second
	chartWidth   = 600
	chartHeight  = 100
)

// chart is a small line chart rendered as inline SVG.
type chart struct {
	Title  string
	Unit   string
	Width  int
	Height int
	Series []chartSeries
	// Max is the value of the top edge; Span how long ago the left edge
	// is; Empty says why there is no line.
	Max   string
	Span  string
	Empty string
}

// chartSeries is one line: polylines split where samples are missing.
type chartSeries struct {
	Name   string
	Class  string
	Latest string
	Lines  []string // SVG points attributes
}

// seriesData is a series to draw.
type seriesData struct {
	name, class string
	points      []chartPoint
}

type chartPoint struct {
	At time.Time
	V  float64
	// Every is how often samples were due when this one was taken (zero:
	// the chart's maxGap applies).
	Every time.Duration
}

// makeChart scales the series to the last HistoryWindow before now. A gap
// of more than maxGap between two samples breaks the line, so that time
// nobody watched is not drawn as a straight line.
func makeChart(title, unit string, now time.Time, maxGap time.Duration, series ...seriesData) chart {
	c := chart{Title: title, Unit: unit, Width: chartWidth, Height: chartHeight}
	top := 0.0
	n := 0
	for _, s := range series {
		for _, p := range s.points {
			top = max(top, p.V)
			n++
		}
	}
	if n == 0 {
		c.Empty = "no samples yet"
		return c
	}
	top = niceCeil(top)
	c.Max = formatNumber(top)
	// The x axis spans from the first sample (at most HistoryWindow ago,
	// at least chartSpanMin) to now.
	span := chartSpanMin
	for _, s := range series {
		if len(s.points) > 0 {
			span = max(span, now.Sub(s.points[0].At))
		}
	}
	span = min(span, HistoryWindow)
	c.Span = age(span)
	from := now.Add(-span)
	for _, s := range series {
		cs := chartSeries{Name: s.name, Class: s.class}
		if len(s.points) == 1 {
			// Just opened: one sample. A line across the chart at its
			// value shows it at once (a tick at the right edge was all but
			// invisible for the first half minute).
			p := s.points[0]
			y := strconv.FormatFloat(chartHeight-p.V/top*(chartHeight-4)-2, 'f', 1, 64)
			cs.Lines = []string{"0.0," + y + " " + strconv.FormatFloat(chartWidth, 'f', 1, 64) + "," + y}
			cs.Latest = formatNumber(p.V)
			c.Series = append(c.Series, cs)
			continue
		}
		var line strings.Builder
		var prev time.Time
		flush := func() {
			if line.Len() > 0 {
				cs.Lines = append(cs.Lines, line.String())
				line.Reset()
			}
		}
		inLine := 0
		for i, p := range s.points {
			if i > 0 && p.At.Sub(prev) > max(maxGap, 3*p.Every) {
				if inLine == 1 {
					line.WriteString(tick(line.String()))
				}
				flush()
				inLine = 0
			}
			inLine++
			prev = p.At
			x := max(0, float64(p.At.Sub(from))/float64(span)*chartWidth)
			y := chartHeight - p.V/top*(chartHeight-4) - 2
			if line.Len() > 0 {
				line.WriteByte(' ')
			}
			line.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
			line.WriteByte(',')
			line.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
		}
		if inLine == 1 {
			line.WriteString(tick(line.String()))
		}
		flush()
		if len(s.points) > 0 {
			cs.Latest = formatNumber(s.points[len(s.points)-1].V)
		}
		c.Series = append(c.Series, cs)
	}
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// formatNumber prints a count or rate for a person: 1,234,567 or 12.5.
func formatNumber(v float64) string {
	if v != float64(int64(v)) && v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return groupThousands(int64(v + 0.5))
}

func groupThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// tick returns the points that make a lone sample "x,y" a short dash.
func tick(point string) string {
	xs, ys, _ := strings.Cut(point, ",")
	x, _ := strconv.ParseFloat(xs, 64)
	return " " + strconv.FormatFloat(x+3, 'f', 1, 64) + "," + ys
}
