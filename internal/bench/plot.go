package bench

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WritePlot draws the report into an SVG file: the median throughput of
// every drain scenario as bars with min–max error bars, and, when the
// scaling scenarios ran, msgs/s over workers for relay/key next to the
// ADR's figures.
func (r *Report) WritePlot(file string) error {
	var plots []*plot.Plot
	if p, err := r.throughputPlot(); err != nil {
		return err
	} else if p != nil {
		plots = append(plots, p)
	}
	if p, err := r.scalingPlot(); err != nil {
		return err
	} else if p != nil {
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return errors.New("bench: nothing to plot: no drain or scaling scenario succeeded")
	}
	const panelW, h = 7 * vg.Inch, 5 * vg.Inch
	c := vgsvg.New(panelW*vg.Length(len(plots)), h)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Centimeter, PadTop: vg.Millimeter * 5, PadBottom: vg.Millimeter * 5,
		PadLeft: vg.Millimeter * 5, PadRight: vg.Millimeter * 5}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("bench: --plot: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: --plot: write %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: --plot: write %s: %w", file, err)
	}
	return nil
}

// errBars are the min–max ranges around the medians.
type errBars struct {
	plotter.XYs
	plotter.YErrors
}

func (r *Report) throughputPlot() (*plot.Plot, error) {
	var (
		names []string
		vals  plotter.Values
		bars  errBars
	)
	for _, res := range r.Results {
		if res.Err != "" || res.MsgsPerSec <= 0 || res.Latency != nil || strings.HasPrefix(res.Scenario, "scaling/") {
			continue
		}
		x := float64(len(names))
		names = append(names, res.Scenario)
		vals = append(vals, res.MsgsPerSec)
		bars.XYs = append(bars.XYs, plotter.XY{X: x, Y: res.MsgsPerSec})
		bars.YErrors = append(bars.YErrors, struct{ Low, High float64 }{res.MsgsPerSec - res.Min, res.Max - res.MsgsPerSec})
	}
	if len(names) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("throughput, %s messages of %d bytes (median, min–max of %d run%s)", thousands(float64(r.Options.Messages)), r.Options.Payload, r.Options.Runs, plural(r.Options.Runs))
	p.Y.Label.Text = "msgs/s"
	p.Y.Min = 0
	for _, res := range r.Results {
		if slices.Contains(names, res.Scenario) {
			p.Y.Max = max(p.Y.Max, res.Max*1.08)
		}
	}
	bc, err := plotter.NewBarChart(vals, vg.Points(22))
	if err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	bc.Color = color.RGBA{R: 66, G: 133, B: 244, A: 255}
	bc.LineStyle.Width = 0
	p.Add(bc)
	eb, err := plotter.NewYErrorBars(bars)
	if err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	p.Add(eb)
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 5
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YTop
	p.Y.Tick.Marker = thousandsTicks{}
	p.Add(plotter.NewGrid())
	return p, nil
}

func (r *Report) scalingPlot() (*plot.Plot, error) {
	var ours, adr plotter.XYs
	messages := 0
	for i, w := range ScalingWorkers {
		res := r.Result(ScalingName(w))
		if res == nil || res.Err != "" || res.MsgsPerSec <= 0 {
			continue
		}
		ours = append(ours, plotter.XY{X: float64(w), Y: res.MsgsPerSec})
		adr = append(adr, plotter.XY{X: float64(w), Y: ADRRates[i]})
		messages = res.Messages
	}
	if len(ours) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("workers scaling, relay/key, %s messages (median)", thousands(float64(messages)))
	p.X.Label.Text = "workers"
	p.Y.Label.Text = "msgs/s"
	p.Y.Min = 0
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	lo, lp, err := plotter.NewLinePoints(ours)
	if err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	lo.Color, lp.Color = color.RGBA{R: 66, G: 133, B: 244, A: 255}, color.RGBA{R: 66, G: 133, B: 244, A: 255}
	la, ap, err := plotter.NewLinePoints(adr)
	if err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	la.Color, ap.Color = color.RGBA{R: 219, G: 68, B: 55, A: 255}, color.RGBA{R: 219, G: 68, B: 55, A: 255}
	la.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(lo, lp, la, ap)
	p.Legend.Add("ours (relay/key)", lo, lp)
	p.Legend.Add("ADR (SKIP LOCKED)", la, ap)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Millimeter * 3
	p.Legend.YOffs = -vg.Millimeter * 3
	top := 0.0
	for _, xy := range append(ours, adr...) {
		top = max(top, xy.Y)
	}
	p.Y.Max = top * 1.2 // room for the legend
	p.Y.Tick.Marker = thousandsTicks{}
	ticks := make([]plot.Tick, 0, len(ScalingWorkers))
	for _, w := range ScalingWorkers {
		ticks = append(ticks, plot.Tick{Value: float64(w), Label: fmt.Sprint(w)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	return p, nil
}

// thousandsTicks are the default ticks labelled like the table (12,345).
type thousandsTicks struct{}

func (thousandsTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = thousands(ts[i].Value)
		}
	}
	return ts
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
