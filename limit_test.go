package gpumem_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
)

// TestSetLimit: lowering the limit below what is held returns the cache;
// below what live buffers hold it is set all the same and reported, and
// nothing more is taken from the device until enough is freed; raising it
// lets growth resume.
func TestSetLimit(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(1 << 30)
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			if got := a.Limit(); got != 1<<30 {
				t.Fatalf("Limit() = %d, want the device's 1 GiB", got)
			}
			keep, err := a.Alloc(64*miB, 0)
			if err != nil {
				t.Fatal(err)
			}
			drop, err := a.Alloc(128*miB, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Free(drop); err != nil {
				t.Fatal(err)
			}
			// Cache (128 MiB) released to fit 100 MiB.
			if err := a.SetLimit(100 * miB); err != nil {
				t.Fatalf("SetLimit(100 MiB) with 64 MiB live: %v", err)
			}
			if r := a.Stats().Reserved; r > 100*miB {
				t.Errorf("reserved %d after SetLimit(100 MiB), want the cache returned", r)
			}
			mustCheck(t, a, "SetLimit below the cache")
			_, err = a.Alloc(64*miB, 0)
			var oom *gpumem.OutOfMemoryError
			if !errors.As(err, &oom) || oom.Cause != gpumem.CauseLimit || oom.Limit != 100*miB {
				t.Fatalf("Alloc(64 MiB) with 64 of 100 MiB live: %v, want CauseLimit with limit 100 MiB", err)
			}
			// Below what is live: set, reported, and no growth.
			err = a.SetLimit(32 * miB)
			if err == nil || !strings.Contains(err.Error(), "live buffers hold") {
				t.Fatalf("SetLimit(32 MiB) with 64 MiB live: %v, want it reported", err)
			}
			if a.Limit() != 32*miB {
				t.Errorf("Limit() = %d after SetLimit(32 MiB)", a.Limit())
			}
			mustCheck(t, a, "SetLimit below what is live")
			if _, err := a.Alloc(16*miB, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
				t.Errorf("Alloc(16 MiB) over a lowered limit: %v, want out of memory", err)
			}
			if err := a.Free(keep); err != nil {
				t.Fatal(err)
			}
			if err := a.SetLimit(0); err != nil {
				t.Fatalf("SetLimit(0): %v", err)
			}
			if a.Limit() != 1<<30 {
				t.Errorf("Limit() = %d after SetLimit(0), want the device's 1 GiB", a.Limit())
			}
			b, err := a.Alloc(512*miB, 0)
			if err != nil {
				t.Fatalf("Alloc(512 MiB) after the limit was raised: %v", err)
			}
			_ = a.Free(b)
			mustCheck(t, a, "growth after raising the limit")
		})
	}
}

// TestOOMWouldFit: the error says what would have fit: a cached block, or
// room left under the limit.
func TestOOMWouldFit(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{Limit: 256 * miB})
	b, err := a.Alloc(200*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(100*miB, 0)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("Alloc(100 MiB) with 200 of 256 MiB live: %v, want an OutOfMemoryError", err)
	}
	if oom.WouldFit < 50*miB || oom.WouldFit > 56*miB {
		t.Errorf("WouldFit = %d, want the 56 MiB left under the limit (to a chunk)", oom.WouldFit)
	}
	if !strings.Contains(oom.Error(), "would have fit") {
		t.Errorf("message %q does not say what would have fit", oom.Error())
	}
	if _, err := a.Alloc(oom.WouldFit, 0); err != nil {
		t.Errorf("Alloc(WouldFit = %d): %v", oom.WouldFit, err)
	}
	_ = a.Free(b)
}

// TestHopelessRequestTakesNothing: a request that could never fit, under
// the limit or on the device, fails without creating a span or raising the
// peak (before, it created spans up to the limit and gave them back).
func TestHopelessRequestTakesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit uint64
		size  uint64
		cause gpumem.Cause
	}{
		{"over the limit", 1 << 30, 1536 * miB, gpumem.CauseLimit},
		{"over the device", 0, 3 << 30, gpumem.CauseDevice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newSim(4 << 30)
			if err := dev.Shrink(2 << 30); err != nil { // another process's memory
				t.Fatal(err)
			}
			a := newAlloc(t, dev, gpumem.Config{Limit: tc.limit})
			live, err := a.Alloc(64*miB, 0)
			if err != nil {
				t.Fatal(err)
			}
			before := a.Stats()
			_, err = a.Alloc(tc.size, 0)
			var oom *gpumem.OutOfMemoryError
			if !errors.As(err, &oom) || oom.Cause != tc.cause {
				t.Fatalf("Alloc(%d): %v, want an out-of-memory error for %v", tc.size, err, tc.cause)
			}
			after := a.Stats()
			if after.Creates != before.Creates || after.PeakReserved != before.PeakReserved {
				t.Errorf("a hopeless request created %d spans and raised the peak from %d to %d",
					after.Creates-before.Creates, before.PeakReserved, after.PeakReserved)
			}
			_ = a.Free(live)
		})
	}
}

// TestRequestOverTheLimitFailsAtOnce: a request larger than the limit (the
// device's whole memory when none is set) fails before anything else: no
// address space reserved for it (a petabyte request used to build books
// for a petabyte arena: minutes and gigabytes of host memory), no retry,
// and the cache not given back for it.
func TestRequestOverTheLimitFailsAtOnce(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		for _, tc := range []struct {
			name  string
			limit uint64
			size  uint64
		}{
			{"a petabyte", 0, 1 << 50},
			{"one byte over the limit", 1 << 30, 1<<30 + 1},
		} {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				dev := newSim(4 << 30)
				a := newAlloc(t, dev, gpumem.Config{Mode: mode, Limit: tc.limit})
				live, err := a.Alloc(64*miB, 0)
				if err != nil {
					t.Fatal(err)
				}
				cached, err := a.Alloc(64*miB, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Free(cached); err != nil {
					t.Fatal(err)
				}
				before := a.Stats()
				_, err = a.Alloc(tc.size, 0)
				var oom *gpumem.OutOfMemoryError
				if !errors.As(err, &oom) || oom.Cause != gpumem.CauseLimit || oom.Requested != tc.size {
					t.Fatalf("Alloc(%d): %v, want an out-of-memory error for the limit", tc.size, err)
				}
				after := a.Stats()
				if after.Reserves != before.Reserves || after.Segments != before.Segments {
					t.Errorf("the request reserved address space: %d -> %d reservations, %d -> %d segments", before.Reserves, after.Reserves, before.Segments, after.Segments)
				}
				if after.Retries != before.Retries || after.Trims != before.Trims || after.Cached != before.Cached || after.Reserved != before.Reserved {
					t.Errorf("the request was retried or gave the cache back: retries %d -> %d, trims %d -> %d, cached %d -> %d, reserved %d -> %d",
						before.Retries, after.Retries, before.Trims, after.Trims, before.Cached, after.Cached, before.Reserved, after.Reserved)
				}
				if after.OOMs != before.OOMs+1 || after.Misses != before.Misses+1 {
					t.Errorf("OOMs %d -> %d, misses %d -> %d: want one more of each", before.OOMs, after.OOMs, before.Misses, after.Misses)
				}
				if err := a.Free(live); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestGrowthToTheLimit: a block that fits exactly under the limit is
// served, in a grown allocator too, whose growth at the frontier otherwise
// maps chunks ahead of the block (found by the Python tests: the error's
// WouldFit was refused).
func TestGrowthToTheLimit(t *testing.T) {
	a := newAlloc(t, newSim(4<<30), gpumem.Config{Limit: 1 << 30})
	keep, err := a.Alloc(700*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(600*miB, 0)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("Alloc over the limit: %v", err)
	}
	b, err := a.Alloc(oom.WouldFit, 0)
	if err != nil {
		t.Fatalf("Alloc(WouldFit = %d) with 700 MiB of 1 GiB live: %v", oom.WouldFit, err)
	}
	if st := a.Stats(); st.Reserved > 1<<30 {
		t.Errorf("reserved %d over the limit", st.Reserved)
	}
	_ = a.Free(b)
	_ = a.Free(keep)
}

// TestIdleReleaseTiming: the idle release comes after the idle time and not
// much later (it was checked every quarter of it, so up to 1.25 times the
// delay passed; gpumem run promises the delay plus 100 ms). The bounds are
// loose for slow CI machines; the check interval is d/100.
func TestIdleReleaseTiming(t *testing.T) {
	const idle = 400 * time.Millisecond
	a := newAlloc(t, newSim(1<<30), gpumem.Config{IdleRelease: idle})
	b, err := a.Alloc(64*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(idle / 2)
	if a.Stats().Reserved == 0 {
		t.Fatalf("released %v after the last operation, before the idle time of %v", time.Since(start), idle)
	}
	for a.Stats().Reserved != 0 {
		if time.Since(start) > idle+300*time.Millisecond {
			t.Fatalf("still holding %d bytes %v after the last operation (idle release %v)", a.Stats().Reserved, time.Since(start), idle)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
