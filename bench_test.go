package gpumem_test

import (
	"fmt"
	"math/rand"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

func benchAllocator(b *testing.B, mode gpumem.Mode) *gpumem.Allocator {
	b.Helper()
	dev, err := sim.New(sim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	a, err := gpumem.New(dev, gpumem.Config{Mode: mode})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

// BenchmarkAllocFree is the cache-hit path: one alloc and one free of the
// same size, with the cache warm, on one goroutine.
func BenchmarkAllocFree(b *testing.B) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		for _, size := range []uint64{4 << 10, 1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("%s/%s", mode, sizeName(size)), func(b *testing.B) {
				a := benchAllocator(b, mode)
				// Keep a neighbour live so the pair does not empty the
				// whole arena (the common case in a real program).
				keep, err := a.Alloc(size, 0)
				if err != nil {
					b.Fatal(err)
				}
				defer a.Free(keep)
				warm, _ := a.Alloc(size, 0)
				a.Free(warm)
				before := a.Stats()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					buf, err := a.Alloc(size, 0)
					if err != nil {
						b.Fatal(err)
					}
					if err := a.Free(buf); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if d := a.Stats().DeviceCalls() - before.DeviceCalls(); d != 0 {
					b.Fatalf("cache-hit path made %d device calls", d)
				}
			})
		}
	}
}

// BenchmarkFreeBatch frees n same-size blocks that do not coalesce (a live
// block between each two) with no allocation between the frees, in random
// order, as a program drops a list of tensors, then allocates once: the
// most blocks one batch puts in one bin of the free index, which that
// allocation sorts (pool.batch). ns/op is per free.
func BenchmarkFreeBatch(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			a := benchAllocator(b, gpumem.ModeVirtual)
			rng := rand.New(rand.NewSource(1))
			keep := make([]gpumem.Buffer, 0, n)
			drop := make([]gpumem.Buffer, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += n {
				b.StopTimer()
				for j := range drop {
					var err error
					if drop[j], err = a.Alloc(4<<10, 0); err != nil {
						b.Fatal(err)
					}
					k, err := a.Alloc(4<<10, 0)
					if err != nil {
						b.Fatal(err)
					}
					keep = append(keep, k)
				}
				rng.Shuffle(n, func(x, y int) { drop[x], drop[y] = drop[y], drop[x] })
				b.StartTimer()
				for _, d := range drop {
					if err := a.Free(d); err != nil {
						b.Fatal(err)
					}
				}
				// The next allocation puts the batch in order.
				next, err := a.Alloc(4<<10, 0)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				a.Free(next)
				for _, k := range keep {
					a.Free(k)
				}
				keep = keep[:0]
				b.StartTimer()
			}
		})
	}
}

// BenchmarkLockFloor is what the cache-hit pair spends on locking alone:
// two uncontended Lock and Unlock pairs of a sync.Mutex (Alloc's and
// Free's), four locked instructions. It calibrates BenchmarkAllocFree
// across hosts, whose locked instructions differ in cost more than the
// rest of the pair's code does.
func BenchmarkLockFloor(b *testing.B) {
	var mu sync.Mutex
	n := 0
	for i := 0; i < b.N; i++ {
		mu.Lock()
		n++
		mu.Unlock()
		mu.Lock()
		n--
		mu.Unlock()
	}
	if n != 0 {
		b.Fatal("unbalanced")
	}
}

// BenchmarkAllocFreeParallel runs the cache-hit pair on as many goroutines
// as GOMAXPROCS, each on its own stream.
func BenchmarkAllocFreeParallel(b *testing.B) {
	a := benchAllocator(b, gpumem.ModeVirtual)
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s := device.Stream(next.Add(1))
		keep, err := a.Alloc(1<<20, s)
		if err != nil {
			b.Error(err)
			return
		}
		defer a.Free(keep)
		for pb.Next() {
			buf, err := a.Alloc(1<<20, s)
			if err != nil {
				b.Error(err)
				return
			}
			a.Free(buf)
		}
	})
}

// BenchmarkReplay replays each shipped trace (parsed beforehand) on the
// simulated device in the default configuration and reports events/s.
func BenchmarkReplay(b *testing.B) {
	files, _ := filepath.Glob("testdata/traces/*.trace.gz")
	if len(files) == 0 {
		b.Skip("no traces in testdata/traces")
	}
	for _, f := range files {
		tr, err := trace.Load(f)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tr.Name, func(b *testing.B) {
			// The replay's loop is timed by replay itself, apart from making
			// the device and the allocator and from parsing.
			var ratio, ns float64
			for i := 0; i < b.N; i++ {
				dev := sim.MustNew(sim.Config{})
				r, err := replay.Run(tr, dev, gpumem.Config{}, replay.Options{})
				if err != nil {
					b.Fatal(err)
				}
				ratio = r.Ratio
				ns += r.NsPerOp
			}
			ns /= float64(b.N)
			b.ReportMetric(ns, "ns/event")
			b.ReportMetric(1e9/ns, "events/s")
			b.ReportMetric(ratio, "ratio")
		})
	}
}

func sizeName(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkStats is what cuMemGetInfo and the pool attributes cost under
// gpumem run (the shim answers them from Stats): an 80 GiB device, one live
// 1 GiB buffer and a cached 256 MiB one, so that the arena's free tail spans
// nearly all of its chunks.
// manyBlocks fills a with 40,000 buffers of 64 KiB to 1 MiB and frees
// every other one: 20,000 live blocks between 20,000 free ones, the
// shape of a large model's parameters and activations.
func manyBlocks(b *testing.B, a *gpumem.Allocator) {
	b.Helper()
	rng := rand.New(rand.NewSource(1))
	bufs := make([]gpumem.Buffer, 40000)
	for i := range bufs {
		var err error
		if bufs[i], err = a.Alloc(uint64(64<<10+rng.Intn(960<<10)), 0); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < len(bufs); i += 2 {
		if err := a.Free(bufs[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkManyBlocks: what torch.cuda.memory_stats (Stats) and
// torch.cuda.memory_allocated (Usage) cost under gpumem on a pool of
// 20,000 live and 20,000 free blocks.
func BenchmarkManyBlocks(b *testing.B) {
	a := benchAllocator(b, gpumem.ModeVirtual)
	manyBlocks(b, a)
	b.Run("Stats", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if s := a.Stats(); s.Active == 0 {
				b.Fatal("nothing active")
			}
		}
	})
	b.Run("Usage", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if u := a.Usage(); u.Active == 0 {
				b.Fatal("nothing active")
			}
		}
	})
}

func BenchmarkStats(b *testing.B) {
	a := benchAllocator(b, gpumem.ModeVirtual)
	keep, err := a.Alloc(1<<30, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Free(keep)
	cached, err := a.Alloc(256<<20, 0)
	if err != nil {
		b.Fatal(err)
	}
	a.Free(cached)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if s := a.Stats(); s.Cached == 0 {
			b.Fatal("no cached memory")
		}
	}
}
