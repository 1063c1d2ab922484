// Command ideal computes issue 11's ideal model of a trace: what an allocator
// would hold with best fit and coalescing in one address range per pool,
// physical memory mapped page by page and given back the moment a page
// empties. It is the yardstick of the first-pass bar ("at most 1.02, or
// the ideal model's ratio + 0.005 where the model itself needs more").
//
//	go run ./bench/core/ideal [--json] TRACE...
//
// The model, exactly:
//
//   - Every request is rounded up to 512 bytes (gpumem's minBlock).
//   - Requests under 1 MiB (the size the trace asked for) go to the small
//     pool, the rest to the large pool; each pool is one unbounded address
//     range starting at 0. Streams are ignored: the model shares all memory
//     between streams at once.
//   - A request takes the smallest free block that holds it (lowest address
//     among equals), at its start; if no free block below the top of the
//     range holds it, it is placed at the top (on the free block that ends
//     there, if any). A freed block coalesces with its free neighbours.
//   - Physical memory is the 2 MiB pages that live blocks touch, in both
//     pools; a page is given back the moment its last block goes. The model
//     holds the peak of that over the trace.
//
// Per trace it prints the peak live bytes, the model's peak, their ratio,
// and at the model's peak the part of its pages that live blocks do not
// cover (partly used pages). With --json, one object per line.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/gpumem/gpumem/trace"
)

const (
	minBlock  = 512
	smallSize = 1 << 20
	page      = 2 << 20
)

// result is the model's figures for one trace.
type result struct {
	Trace        string  `json:"trace"`
	PeakLive     uint64  `json:"peak_live_bytes"`
	PeakHeld     uint64  `json:"ideal_peak_bytes"`
	Ratio        float64 `json:"ideal_ratio"`
	LiveAtPeak   uint64  `json:"live_at_ideal_peak_bytes"`
	RoundAtPeak  uint64  `json:"rounding_at_ideal_peak_bytes"`
	SmallAtPeak  uint64  `json:"small_pool_pages_at_ideal_peak_bytes"`
	LargeTopPeak uint64  `json:"large_pool_top_bytes"`
}

func main() {
	asJSON := flag.Bool("json", false, "one JSON object per trace")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: ideal [--json] TRACE...\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if !*asJSON {
		fmt.Printf("%-24s %16s %16s %8s %12s\n", "trace", "peak live", "ideal peak", "ratio", "partly used")
	}
	for _, path := range flag.Args() {
		tr, err := trace.Load(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ideal:", err)
			os.Exit(1)
		}
		r, err := model(tr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ideal: %s: %v\n", path, err)
			os.Exit(1)
		}
		if *asJSON {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
			continue
		}
		fmt.Printf("%-24s %16d %16d %8.4f %12d\n", r.Trace, r.PeakLive, r.PeakHeld, r.Ratio, r.PeakHeld-r.LiveAtPeak)
	}
}

// model replays tr through the ideal model.
func model(tr *trace.Trace) (result, error) {
	res := result{Trace: tr.Name, PeakLive: tr.PeakLiveBytes}
	pools := [2]*space{newSpace(), newSpace()}
	type live struct {
		pool       int
		addr, size uint64
		req        uint64
	}
	blocks := make([]live, tr.Requests)
	var held, liveBytes, rounded, smallPages uint64
	for i, e := range tr.Events {
		s := tr.Slot[i]
		switch e.Kind {
		case trace.Alloc:
			k := 1
			if e.Size < smallSize {
				k = 0
			}
			size := max(minBlock, (e.Size+minBlock-1)&^(minBlock-1))
			addr := pools[k].alloc(size)
			blocks[s] = live{k, addr, size, e.Size}
			held += pools[k].touch(addr, size, 1)
			liveBytes += e.Size
			rounded += size - e.Size
		case trace.Free:
			b := blocks[s]
			if b.size == 0 {
				return res, fmt.Errorf("event %d frees request %d, which is not live", i+1, e.ID)
			}
			held -= pools[b.pool].touch(b.addr, b.size, -1)
			pools[b.pool].free(b.addr, b.size)
			liveBytes -= b.req
			rounded -= b.size - b.req
			blocks[s] = live{}
		}
		if held > res.PeakHeld {
			res.PeakHeld, res.LiveAtPeak, res.RoundAtPeak = held, liveBytes, rounded
			smallPages = pools[0].pages * page
		}
	}
	res.SmallAtPeak = smallPages
	res.LargeTopPeak = pools[1].maxTop
	if res.PeakLive > 0 {
		res.Ratio = float64(res.PeakHeld) / float64(res.PeakLive)
	}
	return res, nil
}

// space is one pool's address range: free blocks below top, indexed by
// (size, address) for best fit and by both ends for coalescing; pages
// counts the live blocks touching each page.
type space struct {
	top, maxTop uint64
	bySize      treap
	byStart     map[uint64]uint64 // free block start -> size
	byEnd       map[uint64]uint64 // free block end -> start
	count       []int32           // live blocks per page
	pages       uint64            // pages with count > 0
}

func newSpace() *space {
	return &space{byStart: map[uint64]uint64{}, byEnd: map[uint64]uint64{}}
}

func (s *space) alloc(size uint64) uint64 {
	if addr, bsize, ok := s.bySize.ceil(size); ok {
		s.remove(addr, bsize)
		if bsize > size {
			s.insert(addr+size, bsize-size)
		}
		return addr
	}
	// Nothing below the top holds it: the free block ending at the top,
	// if any, and the range above.
	addr := s.top
	if start, ok := s.byEnd[s.top]; ok {
		s.remove(start, s.top-start)
		addr = start
	}
	s.top = addr + size
	s.maxTop = max(s.maxTop, s.top)
	return addr
}

func (s *space) free(addr, size uint64) {
	if start, ok := s.byEnd[addr]; ok {
		n := addr - start
		s.remove(start, n)
		addr, size = start, size+n
	}
	if n, ok := s.byStart[addr+size]; ok {
		s.remove(addr+size, n)
		size += n
	}
	if addr+size == s.top {
		s.top = addr
		return
	}
	s.insert(addr, size)
}

func (s *space) insert(addr, size uint64) {
	s.byStart[addr] = size
	s.byEnd[addr+size] = addr
	s.bySize.insert(size, addr)
}

func (s *space) remove(addr, size uint64) {
	delete(s.byStart, addr)
	delete(s.byEnd, addr+size)
	s.bySize.delete(size, addr)
}

// touch adds d live blocks, [addr, addr+size), to the pages it touches, and
// returns by how many bytes the pages held changed (in absolute value).
func (s *space) touch(addr, size uint64, d int32) uint64 {
	p0, p1 := addr/page, (addr+size-1)/page
	for uint64(len(s.count)) <= p1 {
		s.count = append(s.count, 0)
	}
	var n uint64
	for p := p0; p <= p1; p++ {
		c := &s.count[p]
		if (d > 0 && *c == 0) || (d < 0 && *c == 1) {
			n++
		}
		*c += d
	}
	if d > 0 {
		s.pages += n
	} else {
		s.pages -= n
	}
	return n * page
}
