// Package report shows where a program's GPU memory goes: from an
// allocation trace (package trace; a PyTorch snapshot through package
// torchsnapshot) and a set of allocation policies (package policy), it
// gathers the figures of the report that `gpumem report` writes, and
// writes that report as one self-contained HTML file.
//
// # The data
//
// Build replays the trace once for the program's own figures and twice
// under each policy (policies in parallel, up to Options.Workers):
//
//  1. The trace alone: the live bytes after each event, as a Series, and
//     their peak with the first event that reached it (PeakLive, which
//     equals trace.Trace.PeakLiveBytes; Build checks it). The requests: the
//     largest, and the bytes each call site held at the peak.
//  2. Each policy, through the whole trace: its Reserved() after each event
//     as a Series, its fragmentation (1 - the bytes it serves / reserved)
//     as a Ratio, its peak of reserved bytes with the event at it (the
//     first of those with the most bytes served: see Peak), its OOMs (requests it failed with policy.ErrOutOfMemory:
//     counted and their frees skipped), and at Options.Samples moments its
//     free bytes and largest free block, read from its Segments().
//  3. Each policy again, on a new allocator, up to the event of its peak:
//     the same Reserved() there (else the policy is not deterministic and
//     Build fails), then its Segments() as the Map at the peak.
//
// # Downsampling
//
// A trace of 262k events must draw in a few hundred kilobytes, and its
// peak must still show. Time, from the first event to the last, is cut
// into Options.Buckets buckets of equal width (a Clock); for each bucket a
// Series keeps the least and the greatest value the quantity took while it
// lasted: the value at its start and after every event in it. So
//
//	max over buckets of Series.Max == the quantity's peak, exactly
//
// and the bucket holding the peak's time holds the peak; the page draws the
// band between Min and Max, and marks each peak at its exact time and
// value. A Ratio keeps the extremes and the time-weighted mean of each
// bucket.
//
// # The map at the peak
//
// A Map splits a policy's reserved bytes at its peak four ways, checked
// when it is built:
//
//	Used + Rounding + Split + Cached == Reserved == sum of segment sizes
//
// Used is what the live requests asked for, Rounding what their blocks hold
// beyond it, Split the free blocks inside segments that also hold live
// blocks (lost to splitting: the allocator cannot give them back), Cached
// the free blocks of segments with no live block. A map whose blocks do
// not tile their segments, or whose segments do not add up to Reserved(),
// is the policy's bug, and Build says which segment and block.
//
// # The page
//
// WriteHTML writes one HTML file that opens from disk with no network: the
// data as one JSON object inside a script element, and the style and the
// script that draw it (SVG for the charts, a canvas for the maps) inline,
// embedded in this package from page.html, page.css and page.js. The
// header (trace, peak live, each policy's peak, ratio and OOMs) is written
// as HTML, readable without the script. The script draws, then records
// what it drew on the page's elements (data-drawn-* attributes: the peak
// of each chart's plotted points, the number of points, the map's bytes),
// and the browser test compares those with Build's figures.
package report
