package torchsnapshot

import (
	"bytes"
	"errors"
	"io"
	"math/big"
	"os"
	"runtime"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// FuzzRead reads anything as a snapshot: no input may panic, allocate far
// more than its size, or give a trace that does not read back as the
// summary says.
func FuzzRead(f *testing.F) {
	fwd := frame("forward", "model.py", 10)
	seeds := [][]byte{
		nil,
		[]byte("\x80\x04."),
		pickleOf(f, snapshot(nil)),
		pickleOf(f, snapshot([]any{list(
			ev("free_requested", 1<<20, 50, 0, fwd),
			ev("alloc", 3<<20, 60, 5, fwd),
			ev("alloc", 3<<20, 70, 3, fwd, frame("<module>", "train.py", 3)),
			ev("free_requested", 3<<20, 70, 9),
			dict("action", "alloc", "addr", 2, "size", 2, "stream", new(big.Int).SetUint64(1<<63), "time_us", 1),
		), list(ev("segment_alloc", 1, 1, 0)), list(ev("alloc", 1, 1, 0))},
			segment(0, blk(5<<20, 1000, "active_allocated", fwd), blk(6<<20, 10, "inactive")))),
		[]byte("\x80\x02(K\x01d."),
		[]byte("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94u."),
	}
	if data, err := os.ReadFile(fixture); err == nil {
		seeds = append(seeds, data)
		for _, n := range []int{2, 20, 200, 2000, len(data) / 3, len(data) - 1} {
			seeds = append(seeds, data[:n])
		}
	}
	for _, s := range seeds {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, err := Read(bytes.NewReader(data))
		if err != nil {
			// In-memory input cannot fail to read: every error is
			// about the input.
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			return
		}
		var traces [][]byte
		var sums []Summary
		for _, dev := range s.Devices() {
			var buf bytes.Buffer
			w, _ := trace.NewWriter(&buf)
			sum, err := s.WriteTrace(dev, w)
			if err != nil {
				t.Fatalf("device %d: %v", dev, err)
			}
			w.Flush()
			traces = append(traces, buf.Bytes())
			sums = append(sums, sum)
		}
		runtime.ReadMemStats(&after)
		// gopickle allocates up to a few hundred bytes per byte of
		// input (a MARK is a new 16-slot stack), and a trace line per
		// entry: anything far beyond is a length taken on trust.
		if n := after.TotalAlloc - before.TotalAlloc; n > 1024*uint64(len(data))+(16<<20) {
			t.Fatalf("%d bytes of input allocated %d bytes", len(data), n)
		}
		for i, b := range traces {
			tr, err := trace.Read(bytes.NewReader(b), "fuzz")
			if err != nil {
				t.Fatalf("the trace written does not read back: %v", err)
			}
			sum := sums[i]
			if tr.Requests != sum.Requests || len(tr.Events) != sum.Events || tr.PeakLiveBytes != sum.PeakLiveBytes || len(tr.Sites) != sum.Sites {
				t.Fatalf("summary %+v; the trace has %d requests, %d events, peak %d, %d sites",
					sum, tr.Requests, len(tr.Events), tr.PeakLiveBytes, len(tr.Sites))
			}
		}
	})
}

func BenchmarkReadFixture(b *testing.B) {
	data, err := os.ReadFile(fixture)
	if err != nil {
		b.Skip(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		s, err := Read(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		w, _ := trace.NewWriter(io.Discard)
		if _, err := s.WriteTrace(0, w); err != nil {
			b.Fatal(err)
		}
	}
}
