package policy

// The policies "gpumem" and "gpumem-compact" are no emulation: they are
// gpumem's own Allocator, with the default configuration and with
// Config.Compact, on a simulated device (device/sim) of the given capacity,
// driven as package replay drives it: each stream of the trace gets a
// stream of the device, made on first use.

import (
	"errors"
	"fmt"
	"sort"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

type gpumemPolicy struct {
	dev     *sim.Device
	a       *gpumem.Allocator
	streams map[uint64]device.Stream
	bufs    map[uint64]gpumem.Buffer
}

func newGpumem(capacity uint64, cfg gpumem.Config) (*gpumemPolicy, error) {
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return nil, fmt.Errorf("policy gpumem: %w", err)
	}
	a, err := gpumem.New(dev, cfg)
	if err != nil {
		return nil, fmt.Errorf("policy gpumem: %w", err)
	}
	return &gpumemPolicy{dev: dev, a: a, streams: map[uint64]device.Stream{0: 0}, bufs: make(map[uint64]gpumem.Buffer)}, nil
}

func (g *gpumemPolicy) stream(s uint64) (device.Stream, error) {
	if ds, ok := g.streams[s]; ok {
		return ds, nil
	}
	ds, err := g.dev.NewStream()
	if err != nil {
		return 0, fmt.Errorf("policy gpumem: creating a stream for trace stream %d: %w", s, err)
	}
	g.streams[s] = ds
	return ds, nil
}

func (g *gpumemPolicy) Alloc(size, stream uint64) (uint64, error) {
	s, err := g.stream(stream)
	if err != nil {
		return 0, err
	}
	b, err := g.a.Alloc(size, s)
	if err != nil {
		if errors.Is(err, gpumem.ErrOutOfMemory) {
			return 0, fmt.Errorf("%w: gpumem: %w", ErrOutOfMemory, err)
		}
		return 0, err
	}
	addr := uint64(b.Ptr())
	g.bufs[addr] = b
	return addr, nil
}

func (g *gpumemPolicy) Free(addr uint64) error {
	b, ok := g.bufs[addr]
	if !ok {
		return fmt.Errorf("policy: free of %#x, which is not a live request", addr)
	}
	delete(g.bufs, addr)
	return g.a.Free(b)
}

// EmptyCache is gpumem's Trim (torch.cuda.empty_cache under gpumem).
func (g *gpumemPolicy) EmptyCache() { _ = g.a.Trim() }

// Reserved is what the simulated device has given out, which is what the
// allocator holds (Stats.Reserved: plain segments, mapped spans and handles
// not yet released; the device is the allocator's alone), read in O(1):
// Stats walks every pool and costs a replay fifty times its own time when
// read after every request. TestGpumemReserved checks the two agree.
func (g *gpumemPolicy) Reserved() uint64 {
	free, total, err := g.dev.MemInfo()
	if err != nil { // only an injected fault fails it; none is
		return g.a.Stats().Reserved
	}
	return total - free
}

// Segments reports plain segments as they are, and a virtual arena as the
// spans mapped in it, each a Segment with the arena's blocks cut at its
// bounds: what is held from the device is the spans, not the address space
// (a live block always lies on mapped chunks, so no live byte is lost).
func (g *gpumemPolicy) Segments() []Segment {
	snap := g.a.Snapshot()
	var out []Segment
	for _, s := range snap.Segments {
		if s.Kind != "virtual" {
			sg := Segment{Addr: s.Address, Size: s.Size, Stream: s.Stream}
			for _, b := range s.Blocks {
				sg.Blocks = append(sg.Blocks, blockOf(b, b.Address, b.Address+b.Size))
			}
			out = append(out, sg)
			continue
		}
		// Spans and blocks are both in address order: walk them together.
		j := 0
		for _, sp := range s.Spans {
			lo, hi := sp.Address, sp.Address+sp.Size
			sg := Segment{Addr: lo, Size: sp.Size, Stream: s.Stream}
			for j < len(s.Blocks) && s.Blocks[j].Address+s.Blocks[j].Size <= lo {
				j++
			}
			for k := j; k < len(s.Blocks) && s.Blocks[k].Address < hi; k++ {
				b := s.Blocks[k]
				sg.Blocks = append(sg.Blocks, blockOf(b, max(lo, b.Address), min(hi, b.Address+b.Size)))
			}
			out = append(out, sg)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// blockOf is the part [lo, hi) of a block of a snapshot; a pending block
// (freed, waiting for another stream) counts as live: its memory is not
// reusable yet.
func blockOf(b gpumem.BlockSnapshot, lo, hi uint64) Block {
	out := Block{Addr: lo, Size: hi - lo, Live: b.State != "free"}
	if out.Live {
		// The requested bytes lie at the front of the block.
		if reqEnd := b.Address + b.Requested; reqEnd > lo {
			out.Requested = min(reqEnd, hi) - lo
		}
	}
	return out
}

// Close gives the allocator's memory back to the simulated device.
func (g *gpumemPolicy) Close() error {
	if err := g.a.Close(); err != nil && !errors.Is(err, gpumem.ErrLeak) {
		return err
	}
	return nil
}
