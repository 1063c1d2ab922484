package gpumem_test

// The out-of-memory verdict (oom.go): each test constructs one case on the
// simulated device and checks the cause, the numbers and what would have
// fit, then checks the claims themselves where it can (the smaller request
// fits; a trim, or virtual-memory spans, do or do not make room).

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// mustOOM allocates size and wants an *OutOfMemoryError whose identities
// hold.
func mustOOM(t *testing.T, a *gpumem.Allocator, size uint64) *gpumem.OutOfMemoryError {
	t.Helper()
	b, err := a.Alloc(size, 0)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		if err == nil {
			_ = a.Free(b)
		}
		t.Fatalf("Alloc(%d): %v, want an *OutOfMemoryError", size, err)
	}
	if oom.Cached != oom.Releasable+oom.Pinned || oom.Reserved != oom.Active+oom.Cached || oom.PinnedInChunks > oom.Pinned {
		t.Errorf("identities broken: reserved %d, active %d, cached %d, releasable %d, pinned %d (in chunks %d)",
			oom.Reserved, oom.Active, oom.Cached, oom.Releasable, oom.Pinned, oom.PinnedInChunks)
	}
	if oom.Total != 0 && oom.Others != oom.Total-min(oom.Total, oom.DeviceFree+oom.Reserved) {
		t.Errorf("others %d, want total %d - free %d - reserved %d", oom.Others, oom.Total, oom.DeviceFree, oom.Reserved)
	}
	t.Log(oom.Error())
	return oom
}

func wantIn(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("message lacks %q:\n%s", p, msg)
		}
	}
}

func mustAlloc(t *testing.T, a *gpumem.Allocator, size uint64) gpumem.Buffer {
	t.Helper()
	return mustAllocOn(t, a, size, 0)
}

// TestOOMVerdictLimit: live buffers and the request pass the limit. No trim
// helps; virtual-memory spans would not either (plain); the largest request
// that fits is the room left under the limit, and it fits, one granule more
// does not.
func TestOOMVerdictLimit(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			a := newAlloc(t, newSim(1<<30), gpumem.Config{Mode: mode, Limit: 256 * miB})
			mustAlloc(t, a, 200*miB)
			oom := mustOOM(t, a, 100*miB)
			if oom.Cause != gpumem.CauseLimit || oom.Limit != 256*miB || oom.Allocated != 200*miB || oom.Requested != 100*miB {
				t.Fatalf("cause %v, limit %d, allocated %d, requested %d: want the limit of 256 MiB with 200 MiB live",
					oom.Cause, oom.Limit, oom.Allocated, oom.Requested)
			}
			if oom.AfterTrim != gpumem.AnswerNo {
				t.Errorf("after trim: %v, want no", oom.AfterTrim)
			}
			want := map[gpumem.Mode]gpumem.Answer{gpumem.ModeVirtual: gpumem.AnswerNotApplicable, gpumem.ModePlain: gpumem.AnswerNo}[mode]
			if oom.WithVirtual != want {
				t.Errorf("with virtual memory: %v, want %v", oom.WithVirtual, want)
			}
			if oom.WouldFit != 56*miB || oom.FreeTotal != 56*miB || oom.Growth != 100*miB {
				t.Errorf("would fit %d, free in all %d, growth %d: want 56, 56 and 100 MiB", oom.WouldFit, oom.FreeTotal, oom.Growth)
			}
			wantIn(t, oom.Error(), "out of memory (allocator limit): requested 100.00 MiB (104857600)",
				"live buffers hold 200.00 MiB of the limit of 256.00 MiB", "after a trim", ": no",
				"largest request that would have fit: 56.00 MiB")
			mustAlloc(t, a, oom.WouldFit)
			if _, err := a.Alloc(2*miB, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
				t.Errorf("a granule more than WouldFit: %v, want out of memory", err)
			}
		})
	}
}

// TestOOMVerdictDevice: another process holds half the device; the device
// refuses what gpumem's cache cannot cover. The verdict names what the
// others hold, and no trim helps.
func TestOOMVerdictDevice(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(1 << 30)
			if err := dev.Shrink(512 * miB); err != nil { // another process
				t.Fatal(err)
			}
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			mustAlloc(t, a, 300*miB)
			oom := mustOOM(t, a, 300*miB)
			if oom.Cause != gpumem.CauseDevice || oom.Others != 512*miB || oom.Total != 1<<30 {
				t.Fatalf("cause %v, others %d, total %d: want the device, with 512 MiB of 1 GiB held by others", oom.Cause, oom.Others, oom.Total)
			}
			if oom.DeviceFree != 1<<30-512*miB-oom.Reserved {
				t.Errorf("device free %d with %d reserved", oom.DeviceFree, oom.Reserved)
			}
			if oom.AfterTrim != gpumem.AnswerNo {
				t.Errorf("after trim: %v, want no", oom.AfterTrim)
			}
			if mode == gpumem.ModePlain && oom.WithVirtual != gpumem.AnswerNo {
				t.Errorf("with virtual memory: %v, want no (600 MiB live and asked, 512 MiB usable)", oom.WithVirtual)
			}
			wantIn(t, oom.Error(), "out of memory (device exhausted)", "other users 512.00 MiB",
				"the 512.00 MiB other users hold is not gpumem's to give back")
			if oom.WouldFit == 0 || oom.WouldFit > oom.DeviceFree {
				t.Errorf("would fit %d with %d free on the device", oom.WouldFit, oom.DeviceFree)
			}
			mustAlloc(t, a, oom.WouldFit)
		})
	}
}

// TestOOMVerdictTrimHelps: ModePlain with 64 MiB preallocated under a limit
// of 100 MiB: an 80 MiB request does not fit in the preallocated segment,
// and growing would pass the limit. The reclaim before the failure keeps
// preallocated memory; Trim gives it back, and then the request fits.
func TestOOMVerdictTrimHelps(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{Mode: gpumem.ModePlain, Limit: 100 * miB, Preallocate: 64 * miB})
	oom := mustOOM(t, a, 80*miB)
	if oom.Cause != gpumem.CauseFragmentation || oom.Releasable != 64*miB || oom.Pinned != 0 {
		t.Fatalf("cause %v, releasable %d, pinned %d: want fragmentation with the 64 MiB preallocated releasable",
			oom.Cause, oom.Releasable, oom.Pinned)
	}
	if oom.AfterTrim != gpumem.AnswerYes {
		t.Errorf("after trim: %v, want yes", oom.AfterTrim)
	}
	wantIn(t, oom.Error(), "growing by 80.00 MiB beyond the 64.00 MiB reserved would pass the limit of 100.00 MiB",
		"torch.cuda.empty_cache): yes, it gives back 64.00 MiB")
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, a, 80*miB)
}

// fragmentPlain leaves five 20 MiB segments under a limit of 100 MiB, each
// with a live 9 MiB buffer and 11 MiB free: 55 MiB cached, no piece over
// 11 MiB, nothing wholly free.
func fragmentPlain(t *testing.T, a *gpumem.Allocator) {
	t.Helper()
	fragment(t, a)
	if st := a.Stats(); st.Reserved != 100*miB || st.Cached != 55*miB || st.Releasable != 0 {
		t.Fatalf("setup: reserved %d, cached %d, releasable %d; want 100, 55 and 0 MiB", st.Reserved, st.Cached, st.Releasable)
	}
}

// fragment allocates five pairs of 9 MiB buffers and frees the second of
// each pair.
func fragment(t *testing.T, a *gpumem.Allocator) {
	t.Helper()
	var second []gpumem.Buffer
	for range 5 {
		mustAlloc(t, a, 9*miB)
		second = append(second, mustAlloc(t, a, 9*miB))
	}
	for _, b := range second {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOOMVerdictVirtualHelps: ModePlain fragmentation that no trim undoes
// (every segment holds a live buffer) but virtual-memory spans would: the
// same program in ModeVirtual gets the request. The smaller-request figures
// hold: WouldFit fits, 512 bytes more does not.
func TestOOMVerdictVirtualHelps(t *testing.T) {
	cfg := gpumem.Config{Mode: gpumem.ModePlain, Limit: 100 * miB}
	a := newAlloc(t, newSim(1<<30), cfg)
	fragmentPlain(t, a)
	oom := mustOOM(t, a, 30*miB)
	if oom.Cause != gpumem.CauseFragmentation || oom.Pinned != 55*miB || oom.Releasable != 0 || oom.LargestFree != 11*miB {
		t.Fatalf("cause %v, pinned %d, releasable %d, largest free %d: want fragmentation, 55 MiB pinned in pieces of 11 MiB",
			oom.Cause, oom.Pinned, oom.Releasable, oom.LargestFree)
	}
	if oom.AfterTrim != gpumem.AnswerNo || oom.WithVirtual != gpumem.AnswerYes {
		t.Errorf("after trim %v, with virtual memory %v: want no and yes", oom.AfterTrim, oom.WithVirtual)
	}
	if oom.WouldFit != 11*miB || oom.FreeTotal != 55*miB {
		t.Errorf("would fit %d, free in all %d: want 11 and 55 MiB", oom.WouldFit, oom.FreeTotal)
	}
	wantIn(t, oom.Error(), "out of memory (fragmentation): requested 30.00 MiB (31457280)",
		"55.00 MiB is free in all", "1.8 times the request", "the largest free piece is 11.00 MiB",
		"empty_cache): no, the 55.00 MiB cached lies in segments that hold live buffers",
		"With virtual-memory spans: yes")

	// The claims: a trim does not help; the largest piece fits, 512 B more not.
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(30*miB, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Errorf("after Trim: %v, want out of memory still", err)
	}
	if _, err := a.Alloc(oom.WouldFit+512, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Errorf("WouldFit + 512 B: %v, want out of memory", err)
	}
	mustAlloc(t, a, oom.WouldFit)

	// ModeVirtual, the same program: the request is placed.
	cfg.Mode = gpumem.ModeVirtual
	v := newAlloc(t, newSim(1<<30), cfg)
	fragment(t, v)
	mustAlloc(t, v, 30*miB)
}

// TestOOMVerdictNoVirtualMemory: the same fragmentation on a device
// without virtual memory: spans are no way out, and the verdict says why.
func TestOOMVerdictNoVirtualMemory(t *testing.T) {
	a := newAlloc(t, newPlain(newSim(1<<30).Device), gpumem.Config{Limit: 100 * miB})
	fragmentPlain(t, a)
	oom := mustOOM(t, a, 30*miB)
	if oom.Cause != gpumem.CauseFragmentation || oom.WithVirtual != gpumem.AnswerNo {
		t.Fatalf("cause %v, with virtual memory %v: want fragmentation and no", oom.Cause, oom.WithVirtual)
	}
	wantIn(t, oom.Error(), "With virtual-memory spans: no, the device has no virtual memory")
}

// halfFreed makes 64 buffers of 1 MiB under a limit of 64 MiB in
// ModeVirtual and frees every other one: 32 MiB free in 1 MiB pieces
// inside chunks that hold live buffers. It returns the out-of-memory of a
// 4 MiB request.
func halfFreed(t *testing.T, cfg gpumem.Config) (*gpumem.Allocator, *gpumem.OutOfMemoryError) {
	t.Helper()
	cfg.Mode, cfg.Limit = gpumem.ModeVirtual, 64*miB
	a := newAlloc(t, newSim(1<<30), cfg)
	var bufs []gpumem.Buffer
	for range 64 {
		bufs = append(bufs, mustAlloc(t, a, miB))
	}
	for i := 1; i < len(bufs); i += 2 {
		if err := a.Free(bufs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return a, mustOOM(t, a, 4*miB)
}

// TestOOMVerdictVirtualBlocked: in ModeVirtual, what blocks a request is
// memory pinned by live buffers: free halves of 2 MiB chunks that hold a
// live 1 MiB buffer, and idle chunks of a 16 MiB span one of whose chunks
// is live.
func TestOOMVerdictVirtualBlocked(t *testing.T) {
	t.Run("chunks", func(t *testing.T) {
		a, oom := halfFreed(t, gpumem.Config{})
		if oom.Cause != gpumem.CauseFragmentation || oom.WithVirtual != gpumem.AnswerNotApplicable ||
			oom.Pinned != 32*miB || oom.PinnedInChunks != 32*miB {
			t.Fatalf("cause %v, with virtual memory %v, pinned %d (in chunks %d): want fragmentation, n/a, 32 MiB all in chunks",
				oom.Cause, oom.WithVirtual, oom.Pinned, oom.PinnedInChunks)
		}
		wantIn(t, oom.Error(), "With virtual-memory spans: in use; blocked by 0 B idle in spans that also hold live buffers and 32.00 MiB free inside partly used chunks")
		mustAlloc(t, a, oom.WouldFit)
	})
	t.Run("chunks, compact", func(t *testing.T) {
		// Under Config.Compact the verdict does not suggest it.
		_, oom := halfFreed(t, gpumem.Config{Compact: true})
		if oom.Cause != gpumem.CauseFragmentation {
			t.Fatalf("cause %v, want fragmentation", oom.Cause)
		}
		if strings.Contains(oom.Error(), "Config.Compact") {
			t.Errorf("under Compact the verdict suggests Compact: %s", oom.Error())
		}
	})
	t.Run("spans", func(t *testing.T) {
		a := newAlloc(t, newSim(1<<30), gpumem.Config{SpanSize: strandSpan, Mode: gpumem.ModeVirtual, Limit: 40 * miB})
		x := mustAlloc(t, a, 16*miB) // one 16 MiB span
		mustAlloc(t, a, 16*miB)
		if err := a.Free(x); err != nil {
			t.Fatal(err)
		}
		mustAlloc(t, a, 2*miB) // one chunk of x's span: the other 7 stay idle
		oom := mustOOM(t, a, 16*miB)
		if oom.Cause != gpumem.CauseFragmentation || oom.Pinned != 14*miB || oom.PinnedInChunks != 0 {
			t.Fatalf("cause %v, pinned %d (in chunks %d): want fragmentation, 14 MiB idle in a live span",
				oom.Cause, oom.Pinned, oom.PinnedInChunks)
		}
		wantIn(t, oom.Error(), "blocked by 14.00 MiB idle in spans that also hold live buffers and 0 B free inside partly used chunks")
		wantIn(t, oom.Error(), "(Config.Compact, GPUMEM_CONFIG=compact=true, leaves less of both")
		if oom.WouldFit != 14*miB {
			t.Errorf("would fit %d, want the 14 MiB idle run", oom.WouldFit)
		}
		mustAlloc(t, a, oom.WouldFit)
	})
}

// TestOOMVerdictGatherRisk: a fragmentation out-of-memory in ModeVirtual
// with idle chunks in spans that hold live buffers, Gather off: the
// verdict names gather=true and, in the same clause, its risk: another
// host thread's writes to moved memory are lost with no error, so only
// programs whose GPU work (their libraries' too) is launched from one
// thread at a time may turn it on. The JSON message says the same. Where
// nothing idle lies in live spans (free space inside chunks only), a
// gather would move nothing, and the verdict does not name it.
func TestOOMVerdictGatherRisk(t *testing.T) {
	t.Run("idle spans", func(t *testing.T) {
		a := newAlloc(t, newSim(1<<30), gpumem.Config{SpanSize: strandSpan, Mode: gpumem.ModeVirtual, Limit: 40 * miB})
		x := mustAlloc(t, a, 16*miB)
		mustAlloc(t, a, 16*miB)
		if err := a.Free(x); err != nil {
			t.Fatal(err)
		}
		mustAlloc(t, a, 2*miB) // 14 MiB idle in x's span
		oom := mustOOM(t, a, 16*miB)
		if oom.Cause != gpumem.CauseFragmentation || oom.Pinned <= oom.PinnedInChunks {
			t.Fatalf("cause %v, pinned %d (in chunks %d): want fragmentation with idle chunks in live spans", oom.Cause, oom.Pinned, oom.PinnedInChunks)
		}
		risk := []string{
			"GPUMEM_CONFIG=gather=true",
			"gpumem fit --policy gpumem-gather",
			"another host thread launches work meanwhile",
			"writes to the moved memory are lost with no error (wrong results)",
			"only where all GPU work, libraries' included, is launched from one thread at a time",
			"PyTorch's autograd engine, NCCL, DataLoader pin threads and serving frameworks launch from threads of their own",
		}
		msg := oom.Error()
		wantIn(t, msg, risk...)
		if strings.Contains(msg, "\n") {
			t.Errorf("the verdict is more than one line:\n%s", msg)
		}
		raw, err := json.Marshal(oom)
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Message string }
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		wantIn(t, got.Message, risk...)
	})
	t.Run("chunks only", func(t *testing.T) {
		_, oom := halfFreed(t, gpumem.Config{})
		if oom.Cause != gpumem.CauseFragmentation || oom.Pinned != oom.PinnedInChunks {
			t.Fatalf("cause %v, pinned %d (in chunks %d): want fragmentation inside chunks only", oom.Cause, oom.Pinned, oom.PinnedInChunks)
		}
		if strings.Contains(oom.Error(), "gather=true") {
			t.Errorf("nothing idle in live spans, yet the verdict names gather=true: %s", oom.Error())
		}
	})
}

// TestOOMVerdictQuota: a scope's quota refuses before any memory is looked
// at; the verdict says the scope, its use and what would have fit in it.
func TestOOMVerdictQuota(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{})
	sc := a.NewScope("session", 10*miB)
	if _, err := sc.Alloc(8*miB, 0); err != nil {
		t.Fatal(err)
	}
	_, err := sc.Alloc(4*miB, 0)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("Alloc over the quota: %v", err)
	}
	if oom.Cause != gpumem.CauseQuota || oom.Scope != "session" || oom.WouldFit != 2*miB ||
		oom.AfterTrim != gpumem.AnswerNotApplicable || oom.WithVirtual != gpumem.AnswerNotApplicable {
		t.Fatalf("verdict %+v: want the quota of session, 2 MiB would fit, n/a", oom)
	}
	wantIn(t, oom.Error(), "out of memory (scope quota): requested 4.00 MiB (4194304): scope session holds 8.00 MiB of its quota of 10.00 MiB",
		"largest request that would have fit: 2.00 MiB")
	if _, err := sc.Alloc(oom.WouldFit, 0); err != nil {
		t.Errorf("Alloc(WouldFit) in the scope: %v", err)
	}
	_ = sc.Close()
}

// TestOOMVerdictJSON: the verdict as JSON carries the fields under
// gpumem.h's names, the cause and answers as words, and the message.
func TestOOMVerdictJSON(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{Mode: gpumem.ModePlain, Limit: 100 * miB})
	fragmentPlain(t, a)
	oom := mustOOM(t, a, 30*miB)
	raw, err := json.Marshal(oom)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"cause": "fragmentation", "requested": float64(30 * miB), "pinned": float64(55 * miB),
		"after_trim": "no", "with_virtual": "yes", "mode": "plain", "would_fit": float64(11 * miB), "message": oom.Error()} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (JSON %s)", k, got[k], v, raw)
		}
	}
}

// TestOOMVerdictUnknownAnswer: a hand-made error (no verdict decided) says
// "unknown", not a false no.
func TestOOMVerdictUnknownAnswer(t *testing.T) {
	e := &gpumem.OutOfMemoryError{Cause: gpumem.CauseDevice, Requested: miB, Err: device.ErrOutOfMemory}
	wantIn(t, e.Error(), "after a trim (Trim, gpumem_trim, torch.cuda.empty_cache): unknown", "With virtual-memory spans: unknown")
}
