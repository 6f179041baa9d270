package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// chart is one panel's drawing.
type chart struct {
	Title string
	Unit  string // Grafana's unit: percentunit, s, or a plain number
	Span  time.Duration
	Lines []line
	Zero  int // lines left out because they were 0 throughout
}

// Drawing's size and margins, in pixels.
const (
	width, plotHeight       = 640.0, 220.0
	left, right, top, below = 64.0, 16.0, 32.0, 28.0
	legendRow               = 16.0
)

// palette is Grafana's classic series colours.
var palette = []string{"#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0", "#508642", "#cca300"}

// svg draws the lines over the span, the y axis from 0 (or below, for negatives) to the
// largest value, with the legend under the plot. A panel with no data says so.
func (c chart) svg() string {
	rows := len(c.Lines)
	if c.Zero > 0 {
		rows++
	}
	height := top + plotHeight + below + legendRow*float64(max(1, rows)) + 8
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#181b1f"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" fill="#ccccdc" font-size="13" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(c.Title))
	lo, hi := c.yRange()
	plotW := width - left - right
	x := func(s float64) float64 { return left + plotW*s/math.Max(c.Span.Seconds(), 1) }
	y := func(v float64) float64 { return top + plotHeight*(1-(v-lo)/(hi-lo)) }
	// Grid: five rows with the values, and the time every tick of about a fifth of the span.
	for i := 0; i <= 4; i++ {
		v := lo + (hi-lo)*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#2c3235"/>`, left, width-right, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#8e8e8e" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, c.format(v))
	}
	tick := niceTick(c.Span)
	for s := time.Duration(0); s <= c.Span; s += tick {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#8e8e8e" text-anchor="middle">%s</text>`, x(s.Seconds()), top+plotHeight+16, clock(s))
	}
	b.WriteString("\n")
	if len(c.Lines) == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#8e8e8e" text-anchor="middle">No data</text>`+"\n", left+plotW/2, top+plotHeight/2)
	}
	for i, l := range c.Lines {
		colour := palette[i%len(palette)]
		var path strings.Builder
		for j := range l.X {
			// A gap of more than a few steps is a series that was absent: the line breaks.
			cmd := "L"
			if j == 0 || l.X[j]-l.X[j-1] > 5 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, x(l.X[j]), y(l.Y[j]))
		}
		if path.Len() > 0 {
			fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.TrimSpace(path.String()), colour)
		}
		ly := top + plotHeight + below + legendRow*float64(i) + 8
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.1f" width="14" height="3" fill="%s"/>`, left, ly-4, colour)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#ccccdc">%s</text>`+"\n", left+20, ly, html.EscapeString(l.Legend))
	}
	if c.Zero > 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#8e8e8e">and %d series at 0 throughout, not drawn</text>`+"\n", left, top+plotHeight+below+legendRow*float64(len(c.Lines))+8, c.Zero)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// clock writes a tick's time as 0, 30s, 1m, 1m30s.
func clock(d time.Duration) string {
	m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
	switch {
	case m == 0:
		return fmt.Sprintf("%ds", s)
	case s == 0:
		return fmt.Sprintf("%dm", m)
	}
	return fmt.Sprintf("%dm%02ds", m, s)
}

// yRange is the axis: from 0, or the lowest value if negative, to the highest; a flat or empty
// panel gets a range of one.
func (c chart) yRange() (lo, hi float64) {
	for _, l := range c.Lines {
		for _, v := range l.Y {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if c.Unit == "percentunit" {
		hi = math.Max(hi, 1)
	}
	if hi-lo == 0 {
		hi = lo + 1
	}
	return lo, roundUp(hi)
}

// roundUp is the smallest of 1, 2, 2.5, 5 times a power of ten at or above v (v > 0), so the
// grid's values are round.
func roundUp(v float64) float64 {
	if v <= 0 {
		return v
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

func (c chart) format(v float64) string {
	switch c.Unit {
	case "percentunit":
		return fmt.Sprintf("%.0f%%", v*100)
	case "s":
		return time.Duration(v * float64(time.Second)).Round(10 * time.Millisecond).String()
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// niceTick is a round time step giving four to ten ticks over span.
func niceTick(span time.Duration) time.Duration {
	for _, t := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour} {
		if span/t <= 10 {
			return t
		}
	}
	return span / 6
}
