package gpumem_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

// The library in a few lines, on the simulated device (cuda.Open(0) gives
// the real GPU the same way).
func Example() {
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := gpumem.New(dev, gpumem.Config{Limit: 256 << 20})
	if err != nil {
		panic(err)
	}
	defer a.Close()

	buf, err := a.Alloc(64<<20, 0) // valid for work on stream 0
	if err != nil {
		panic(err)
	}
	fmt.Println("got", buf.Size()>>20, "MiB")
	a.Free(buf) // reusable on stream 0 at once

	// Over the limit: the error says why, with the numbers.
	_, err = a.Alloc(512<<20, 0)
	var oom *gpumem.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Println("out of memory:", oom.Cause)
	}

	// A scope owns what it allocates; Close frees it and reports leaks.
	s := a.NewScope("session", 128<<20)
	if _, err := s.Alloc(1<<20, 0); err != nil {
		panic(err)
	}
	err = s.Close()
	fmt.Println("leak reported:", errors.Is(err, gpumem.ErrLeak))

	a.Trim() // give every unused byte back now
	fmt.Println("held after Trim:", a.Stats().Reserved)
	// Output:
	// got 64 MiB
	// out of memory: allocator limit
	// leak reported: true
	// held after Trim: 0
}

// A private pool (a CUDA graph's memory, or PyTorch's MemPool): its
// buffers come from memory nothing else uses, counted against the root's
// limit. With NoSplit each buffer has a segment of its own (memory to
// register whole, with NCCL say); with Segments those segments come from
// another allocator.
func ExampleAllocator_NewPrivateWith() {
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := gpumem.New(dev, gpumem.Config{Limit: 256 << 20})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	pool, err := a.NewPrivateWith(gpumem.PrivateConfig{NoSplit: true})
	if err != nil {
		panic(err)
	}
	x, _ := pool.Alloc(4<<20, 0)
	y, _ := pool.Alloc(4<<20, 0)
	fmt.Println("segments:", len(pool.Snapshot().Segments))
	pool.Free(x)
	pool.Free(y)
	pool.Close() // its memory goes back
	// Output:
	// segments: 2
}
