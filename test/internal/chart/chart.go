// Package chart draws the benchmarks' figures as SVG (gonum.org/v1/plot): the deadline matrix,
// a migration's timeline, the network's interruption beside the migration's downtime and a
// drain's stages. The benchmarks call it with what they measured, beside their raw output.
package chart

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Colours, so that the same thing has the same colour in every chart.
var (
	green  = color.RGBA{R: 0x1b, G: 0x9e, B: 0x77, A: 0xff}
	orange = color.RGBA{R: 0xd9, G: 0x5f, B: 0x02, A: 0xff}
	red    = color.RGBA{R: 0xc0, G: 0x1c, B: 0x28, A: 0xff}
	blue   = color.RGBA{R: 0x37, G: 0x7e, B: 0xb8, A: 0xff}
	purple = color.RGBA{R: 0x75, G: 0x70, B: 0xb3, A: 0xff}
	grey   = color.RGBA{R: 0x66, G: 0x66, B: 0x66, A: 0xff}
	pink   = color.RGBA{R: 0xe7, G: 0x29, B: 0x8a, A: 0xff}
)

var stageColours = []color.Color{grey, blue, purple, orange, green, pink, red}

// Dir is where the benchmarks write their charts: $LIFEBOAT_BENCH_OUT, which the Makefile's
// bench targets set to the directory of their raw outputs; empty when unset (no charts).
func Dir() string { return os.Getenv("LIFEBOAT_BENCH_OUT") }

// WriteFile draws with draw into dir/name, creating dir.
func WriteFile(dir, name string, draw func(io.Writer) error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := draw(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// MatrixCell is one policy's outcome in one row of the deadline matrix: the guest and the grace
// it was given (Row), how many runs put the guest on its destination before the grace and the
// guest's stop at the switch (median over the runs that finished).
type MatrixCell struct {
	Row, Policy  string
	InTime, Runs int
	Stop         time.Duration
	// Finished is false when no run moved the guest (Stop then means nothing).
	Finished bool
}

// Matrix draws the deadline matrix: a row per guest and grace, a column per policy, each cell a
// mark coloured by how many runs were in time (all, some, none) and labelled with the stop.
func Matrix(w io.Writer, title string, cells []MatrixCell) error {
	var rows, policies []string
	rowIndex, policyIndex := map[string]int{}, map[string]int{}
	for _, c := range cells {
		if _, ok := rowIndex[c.Row]; !ok {
			rowIndex[c.Row] = len(rows)
			rows = append(rows, c.Row)
		}
		if _, ok := policyIndex[c.Policy]; !ok {
			policyIndex[c.Policy] = len(policies)
			policies = append(policies, c.Policy)
		}
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "policy"
	p.Y.Label.Text = "guest, grace"
	groups := []struct {
		name   string
		colour color.Color
		in     func(MatrixCell) bool
	}{
		{"in time, every run", green, func(c MatrixCell) bool { return c.Runs > 0 && c.InTime == c.Runs }},
		{"in time, some runs", orange, func(c MatrixCell) bool { return c.InTime > 0 && c.InTime < c.Runs }},
		{"in time, no run", red, func(c MatrixCell) bool { return c.InTime == 0 }},
	}
	labels := plotter.XYLabels{}
	for _, c := range cells {
		// Rows top down, in the order given.
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(policyIndex[c.Policy]), Y: float64(len(rows) - 1 - rowIndex[c.Row])})
		stop := "not moved"
		if c.Finished {
			stop = "stop " + c.Stop.Round(10*time.Millisecond).String()
		}
		labels.Labels = append(labels.Labels, fmt.Sprintf("   %d/%d, %s", c.InTime, c.Runs, stop))
	}
	for _, g := range groups {
		var xys plotter.XYs
		for i, c := range cells {
			if g.in(c) {
				xys = append(xys, labels.XYs[i])
			}
		}
		if len(xys) == 0 {
			continue
		}
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		s.GlyphStyle = draw.GlyphStyle{Color: g.colour, Radius: vg.Points(4), Shape: draw.CircleGlyph{}}
		p.Add(s)
		p.Legend.Add(g.name, s)
	}
	l, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(7)
		l.TextStyle[i].YAlign = -0.5
	}
	p.Add(l)
	reversed := make([]string, len(rows))
	for i, r := range rows {
		reversed[len(rows)-1-i] = r
	}
	p.NominalX(policies...)
	p.NominalY(reversed...)
	p.X.Max += 0.6 // room for the last column's labels
	p.Y.Max += 2   // and for the legend, above the first row
	p.Legend.Top = true
	return save(w, p, 22*vg.Centimeter, vg.Length(len(rows))*0.55*vg.Centimeter+5*vg.Centimeter)
}

// Sample is what libvirt reported of a running migration At a time since its start.
type Sample struct {
	At                      time.Duration
	Remaining               uint64 // bytes of memory left to send
	DirtyRate, TransferRate uint64 // bytes per second
}

// Timeline is one migration: its samples, the deadline (0 for none), when the guest was
// switched over to its destination (paused to converge, switched to post-copy, or stopped for
// pre-copy's last pass) and when the migration returned.
type Timeline struct {
	Title                  string
	Samples                []Sample
	Deadline, Switch, Done time.Duration
}

// MigrationTimeline draws t in two panels over the same time axis: the memory left to send,
// and the dirty and transfer rates, each with the deadline and the switch-over.
func MigrationTimeline(w io.Writer, t Timeline) error {
	left, rates := plot.New(), plot.New()
	left.Title.Text = t.Title
	left.Y.Label.Text = "MiB left"
	rates.Y.Label.Text = "MiB/s"
	rates.X.Label.Text = "seconds since the migration's start"
	remaining, dirty, transfer := make(plotter.XYs, len(t.Samples)), make(plotter.XYs, len(t.Samples)), make(plotter.XYs, len(t.Samples))
	for i, s := range t.Samples {
		x := s.At.Seconds()
		remaining[i] = plotter.XY{X: x, Y: float64(s.Remaining) / (1 << 20)}
		dirty[i] = plotter.XY{X: x, Y: float64(s.DirtyRate) / (1 << 20)}
		transfer[i] = plotter.XY{X: x, Y: float64(s.TransferRate) / (1 << 20)}
	}
	series := []struct {
		p      *plot.Plot
		name   string
		xys    plotter.XYs
		colour color.Color
	}{{left, "memory left to send", remaining, blue}, {rates, "dirty rate", dirty, orange}, {rates, "transfer rate", transfer, green}}
	for _, s := range series {
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return err
		}
		l.Color, l.Width = s.colour, vg.Points(1.5)
		s.p.Add(l)
		s.p.Legend.Add(s.name, l)
	}
	end := t.Done.Seconds()
	if t.Deadline > 0 {
		end = max(end, t.Deadline.Seconds())
	}
	for _, p := range []*plot.Plot{left, rates} {
		p.X.Min, p.X.Max = 0, end*1.05
		p.Y.Min = 0
		p.Y.Max = max(p.Y.Max, 1) * 1.1
		for _, m := range []struct {
			name   string
			at     time.Duration
			colour color.Color
		}{{"switch-over", t.Switch, purple}, {"deadline", t.Deadline, red}} {
			if m.at <= 0 {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{{X: m.at.Seconds(), Y: 0}, {X: m.at.Seconds(), Y: p.Y.Max}})
			if err != nil {
				return err
			}
			l.Color, l.Width, l.Dashes = m.colour, vg.Points(1), []vg.Length{vg.Points(4), vg.Points(2)}
			p.Add(l)
			p.Legend.Add(m.name, l)
		}
		p.Legend.Top = true
	}
	return saveStacked(w, []*plot.Plot{left, rates}, 20*vg.Centimeter, 14*vg.Centimeter)
}

// Interruption is one run of the network benchmark: the longest a client asking the VM's
// Service had no answer, the guest's stop at the switch-over as its counter shows it, and the
// migration's downtime as libvirt measured it, in the same run (zero: not measured).
type Interruption struct {
	Run                          string
	Interruption, Stop, Downtime time.Duration
}

// Interruptions draws each run's network interruption beside the guest's stop and libvirt's
// downtime (each series only where some run measured it).
func Interruptions(w io.Writer, title string, runs []Interruption) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "milliseconds"
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.Run
	}
	type series struct {
		name   string
		of     func(Interruption) time.Duration
		colour color.Color
	}
	var drawn []series
	for _, s := range []series{
		{"longest without an answer", func(r Interruption) time.Duration { return r.Interruption }, orange},
		{"the guest's stop at the switch (its counter)", func(r Interruption) time.Duration { return r.Stop }, blue},
		{"libvirt's downtime (on the target)", func(r Interruption) time.Duration { return r.Downtime }, purple},
	} {
		if slices.ContainsFunc(runs, func(r Interruption) bool { return s.of(r) > 0 }) {
			drawn = append(drawn, s)
		}
	}
	width := vg.Points(12)
	for i, s := range drawn {
		v := make(plotter.Values, len(runs))
		for j, r := range runs {
			v[j] = float64(s.of(r).Milliseconds())
		}
		b, err := plotter.NewBarChart(v, width)
		if err != nil {
			return err
		}
		b.Color, b.LineStyle.Width = s.colour, 0
		// The bars of a run side by side, centred on it.
		b.Offset = (vg.Length(i) - vg.Length(len(drawn)-1)/2) * width
		p.Add(b)
		p.Legend.Add(s.name, b)
	}
	p.NominalX(names...)
	p.X.Label.Text = "run"
	p.X.Min, p.X.Max = -0.7, float64(len(runs))-0.3
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max *= 1.3 // room for the legend
	return save(w, p, 16*vg.Centimeter, 10*vg.Centimeter)
}

// Stage is a step of one VM's migration in a drain, in time since the drain's start.
type Stage struct {
	Name       string
	Start, End time.Duration
}

// DrainVM is one VM's stages, in order.
type DrainVM struct {
	VMI    string
	Stages []Stage
}

// Drain draws a drain as a bar per VM, each stage of its migration a segment of its own colour.
func Drain(w io.Writer, title string, vms []DrainVM) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the drain's start"
	colours := map[string]color.Color{}
	names := make([]string, len(vms))
	for i, vm := range vms {
		y := float64(len(vms) - 1 - i)
		names[len(vms)-1-i] = vm.VMI
		for _, s := range vm.Stages {
			l, err := plotter.NewLine(plotter.XYs{{X: s.Start.Seconds(), Y: y}, {X: s.End.Seconds(), Y: y}})
			if err != nil {
				return err
			}
			c, ok := colours[s.Name]
			if !ok {
				c = stageColours[len(colours)%len(stageColours)]
				colours[s.Name] = c
				p.Legend.Add(s.Name, l)
			}
			l.Color, l.Width = c, vg.Points(9)
			p.Add(l)
		}
	}
	p.NominalY(names...)
	p.X.Min = 0
	// Room above the first VM for the legend, a stage a line.
	p.Y.Max += 0.9 * float64(len(colours))
	p.Legend.Top = true
	return save(w, p, 20*vg.Centimeter, vg.Length(len(vms))*0.5*vg.Centimeter+6*vg.Centimeter+vg.Length(len(colours))*0.45*vg.Centimeter)
}

func save(w io.Writer, p *plot.Plot, width, height vg.Length) error {
	c := vgsvg.New(width, height)
	p.Draw(draw.New(c))
	_, err := c.WriteTo(w)
	return err
}

func saveStacked(w io.Writer, plots []*plot.Plot, width, height vg.Length) error {
	c := vgsvg.New(width, height)
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}, draw.New(c))
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}
