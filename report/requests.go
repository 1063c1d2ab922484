package report

// See doc.go for the overview.

import (
	"cmp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/gpumem/gpumem/trace"
)

// A Request is one allocation of the trace.
type Request struct {
	ID      uint64 `json:"id"`
	Size    uint64 `json:"size"`
	Stream  uint64 `json:"stream"`
	AllocUS uint64 `json:"t_us"`
	// FreeUS is when it was freed, -1 if never (live at the trace's end).
	FreeUS int64  `json:"free_us"`
	Site   uint32 `json:"site,omitempty"` // 0: none
}

// SiteBytes is what the requests of one call site held at the trace's
// peak of live bytes. Site 0 gathers the requests without a site.
type SiteBytes struct {
	Site     uint32 `json:"site"`
	Bytes    uint64 `json:"bytes"`
	Requests int    `json:"requests"`
}

// maxSiteText is the most of a site's text a report keeps, in bytes, cut
// at a frame: a stack is read from its innermost frames.
const maxSiteText = 1500

// requests fills Largest, AtPeak and Sites: the n largest requests (ties in
// the order of allocation) and the n sites holding the most bytes at the
// peak of live bytes.
func (d *Data) requests(tr *trace.Trace, n int) {
	reqs := make([]Request, tr.Requests)
	alive := make([]bool, tr.Requests) // at the peak
	for i, e := range tr.Events {
		slot := tr.Slot[i]
		if e.Kind == trace.Alloc {
			reqs[slot] = Request{ID: e.ID, Size: e.Size, Stream: e.Stream, AllocUS: e.TimeUS, FreeUS: -1, Site: e.Site}
		} else {
			reqs[slot].FreeUS = int64(e.TimeUS)
		}
		if i <= d.PeakLive.Event {
			alive[slot] = e.Kind == trace.Alloc
		}
	}

	d.Sites = map[uint32]string{}
	d.AtPeak = []SiteBytes{} // [], not null, in the JSON
	if len(tr.Sites) > 0 {
		by := map[uint32]*SiteBytes{}
		for slot, r := range reqs {
			if !alive[slot] {
				continue
			}
			sb := by[r.Site]
			if sb == nil {
				sb = &SiteBytes{Site: r.Site}
				by[r.Site] = sb
			}
			sb.Bytes += r.Size
			sb.Requests++
		}
		for _, sb := range by {
			d.AtPeak = append(d.AtPeak, *sb)
		}
		slices.SortFunc(d.AtPeak, func(a, b SiteBytes) int {
			return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Site, b.Site))
		})
		d.AtPeak = d.AtPeak[:min(n, len(d.AtPeak))]
		for _, sb := range d.AtPeak {
			if sb.Site != 0 {
				d.Sites[sb.Site] = shortSite(tr.Sites[sb.Site])
			}
		}
	}

	// Stable: equal sizes stay in the order of allocation.
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(b.Size, a.Size) })
	d.Largest = reqs[:min(n, len(reqs)):min(n, len(reqs))]
	for _, r := range d.Largest {
		if r.Site != 0 {
			d.Sites[r.Site] = shortSite(tr.Sites[r.Site])
		}
	}
}

// shortSite cuts a site's text to at most maxSiteText bytes, after a whole
// frame, marking the cut with " < ...".
func shortSite(s string) string {
	if len(s) <= maxSiteText {
		return s
	}
	cut := strings.LastIndex(s[:maxSiteText], " < ")
	if cut <= 0 { // one frame longer than the limit: cut at a rune
		cut = maxSiteText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
	}
	return s[:cut] + " < ..."
}
