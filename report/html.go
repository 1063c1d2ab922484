package report

// See doc.go for the overview.

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
)

var (
	//go:embed page.html
	pageHTML string
	//go:embed page.css
	pageCSS string
	//go:embed page.js
	pageJS string
)

// colors are the policies' colors, as page.js has them.
var colors = []string{"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"}

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"gib":   func(b uint64) string { return fmt.Sprintf("%.3f GiB", float64(b)/(1<<30)) },
	"secs":  func(us uint64) string { return fmt.Sprintf("%.2f s", float64(us)/1e6) },
	"color": func(i int) template.CSS { return template.CSS(colors[i%len(colors)]) },
}).Parse(pageHTML))

// WriteHTML writes the report as one HTML page that needs nothing else:
// no network, no other file.
func (d *Data) WriteHTML(w io.Writer) error {
	js, err := json.Marshal(d) // escapes <, > and &: the JSON cannot end the script element
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	// Times in the header count from the first event, as the charts' do.
	rel := *d
	rel.PeakLive.TimeUS -= d.Clock.T0
	rel.Policies = make([]PolicyData, len(d.Policies))
	best := -1
	for i, p := range d.Policies {
		p.PeakReserved.TimeUS -= d.Clock.T0
		rel.Policies[i] = p
		if b := d.Policies[max(best, 0)]; best < 0 || p.OOMs < b.OOMs || p.OOMs == b.OOMs && p.Ratio < b.Ratio {
			best = i
		}
	}
	err = page.Execute(w, struct {
		D        *Data
		Best     int
		Duration string
		JSON     template.JS
		CSS      template.CSS
		JS       template.JS
	}{&rel, best, fmt.Sprintf("%.2f s", float64(d.Duration)/1e6), template.JS(js), template.CSS(pageCSS), template.JS(pageJS)})
	if err != nil {
		return fmt.Errorf("report: writing the page: %w", err)
	}
	return nil
}
