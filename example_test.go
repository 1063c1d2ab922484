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
