// Command pack rewrites traces in gpumem-trace v2, the packed form (IDs
// implicit, times as deltas: about a quarter of v1's size gzipped), in
// place, and checks each against its original before replacing it:
//
//	go run ./bench/corpus/pack bench/corpus/traces/*.trace.gz
//	go run ./bench/corpus/pack -format v1 TRACE...   # back to v1, for tools that read only v1
//
// Requests are numbered in order of allocation (v2 has no IDs; a v1 trace
// whose IDs were not 0, 1, ... reads back with those numbers), sites are
// written first, and a trim ("t" line) at the time of the event before it
// (no reader uses a trim's time; Trace.Trims keeps only its place). Every
// other field reads back the same: the events' kinds, sizes, streams,
// times and sites, the sites' texts and the trims' places. A trace already
// in v2 is rewritten the same way.
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/gpumem/gpumem/trace"
)

func main() {
	format := flag.String("format", "v2", "the format to write: v2 or v1")
	flag.Parse()
	f, ok := trace.ParseFormat(*format)
	if flag.NArg() == 0 || !ok {
		fmt.Fprintln(os.Stderr, "usage: pack [-format v2|v1] TRACE...")
		os.Exit(2)
	}
	failed := false
	for _, path := range flag.Args() {
		before, after, err := pack(path, f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pack: %s: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: %d -> %d bytes\n", path, before, after)
	}
	if failed {
		os.Exit(1)
	}
}

// pack rewrites the trace at path in format f and returns its sizes
// before and after. The original stays if anything fails.
func pack(path string, f trace.Format) (int64, int64, error) {
	old, err := trace.Load(path)
	if err != nil {
		return 0, 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	tmp := path + ".pack.gz" // .gz: compressed as the original when it is
	defer os.Remove(tmp)
	if err := write(tmp, old, f); err != nil {
		return 0, 0, err
	}
	got, err := trace.Load(tmp)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the packed trace back: %w", err)
	}
	if err := same(old, got); err != nil {
		return 0, 0, fmt.Errorf("the packed trace differs: %w", err)
	}
	nst, err := os.Stat(tmp)
	if err != nil {
		return 0, 0, err
	}
	return st.Size(), nst.Size(), os.Rename(tmp, path)
}

func write(path string, t *trace.Trace, f trace.Format) error {
	w, err := trace.CreateFormat(path, f)
	if err != nil {
		return err
	}
	for _, s := range slices.Sorted(maps.Keys(t.Sites)) {
		if err := w.Site(s, t.Sites[s]); err != nil {
			w.Close()
			return err
		}
	}
	trims := t.Trims
	var last uint64
	for i, ev := range t.Events {
		for len(trims) > 0 && int(trims[0]) == i {
			if err := w.Trim(last); err != nil {
				w.Close()
				return err
			}
			trims = trims[1:]
		}
		id := uint64(t.Slot[i])
		if ev.Kind == trace.Alloc {
			err = w.AllocSite(id, ev.Size, ev.Stream, ev.TimeUS, ev.Site)
		} else {
			err = w.Free(id, ev.TimeUS)
		}
		if err != nil {
			w.Close()
			return err
		}
		last = ev.TimeUS
	}
	for range trims {
		if err := w.Trim(last); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

// same reports how b, read back from a's packed form, differs from a.
func same(a, b *trace.Trace) error {
	if len(a.Events) != len(b.Events) {
		return fmt.Errorf("%d events, want %d", len(b.Events), len(a.Events))
	}
	for i, ev := range a.Events {
		want := ev
		want.ID = uint64(a.Slot[i])
		if b.Events[i] != want {
			return fmt.Errorf("event %d: %v, want %v", i, b.Events[i], want)
		}
	}
	switch {
	case !slices.Equal(a.Trims, b.Trims):
		return fmt.Errorf("trims at %v, want %v", b.Trims, a.Trims)
	case !maps.Equal(a.Sites, b.Sites):
		return fmt.Errorf("sites differ")
	case a.PeakLiveBytes != b.PeakLiveBytes || a.Requests != b.Requests:
		return fmt.Errorf("peak live %d, requests %d; want %d, %d", b.PeakLiveBytes, b.Requests, a.PeakLiveBytes, a.Requests)
	}
	return nil
}
