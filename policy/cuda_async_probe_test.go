package policy

import (
	"archive/zip"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"testing"
)

// probeRecord is one trace as bench/peers/async_probe.py recorded CUDA's
// default pool replaying it on the H100: per event, allocation (1) or
// free (0), the request's size, the address the pool gave (or freed), the
// pool's RESERVED_MEM_CURRENT after the event, and the pass.
type probeRecord struct {
	kind     []uint64
	size     []uint64
	addr     []uint64
	reserved []uint64
	pass     []uint64
}

// loadProbe reads NAME.npz of async_probe.py: a zip of .npy arrays, one
// dimension, little-endian unsigned integers.
func loadProbe(path string) (*probeRecord, error) {
	z, err := zip.OpenReader(path)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	arrays := map[string][]uint64{}
	for _, f := range z.File {
		r, err := f.Open()
		if err != nil {
			return nil, err
		}
		a, err := readNpy(r)
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, f.Name, err)
		}
		arrays[f.Name] = a
	}
	p := &probeRecord{arrays["kind.npy"], arrays["size.npy"], arrays["addr.npy"], arrays["reserved.npy"], arrays["pass_.npy"]}
	n := len(p.kind)
	if n == 0 || len(p.size) != n || len(p.addr) != n || len(p.reserved) != n || len(p.pass) != n {
		return nil, fmt.Errorf("%s: want the arrays kind, size, addr, reserved and pass_ of one length", path)
	}
	return p, nil
}

var npyHeader = regexp.MustCompile(`'descr':\s*'([<|])u(\d)'.*'shape':\s*\((\d+),?\)`)

func readNpy(r io.Reader) ([]uint64, error) {
	var pre [10]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, err
	}
	if string(pre[1:6]) != "NUMPY" {
		return nil, fmt.Errorf("not an .npy array")
	}
	hlen := int(binary.LittleEndian.Uint16(pre[8:10]))
	if pre[6] >= 2 {
		var more [2]byte
		if _, err := io.ReadFull(r, more[:]); err != nil {
			return nil, err
		}
		hlen = int(binary.LittleEndian.Uint32(append(pre[8:10:10], more[:]...)))
	}
	h := make([]byte, hlen)
	if _, err := io.ReadFull(r, h); err != nil {
		return nil, err
	}
	m := npyHeader.FindSubmatch(h)
	if m == nil {
		return nil, fmt.Errorf("header %q: want a one-dimensional array of unsigned integers", h)
	}
	width, _ := strconv.Atoi(string(m[2]))
	n, _ := strconv.Atoi(string(m[3]))
	raw := make([]byte, width*n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		b := raw[i*width : (i+1)*width]
		switch width {
		case 1:
			out[i] = uint64(b[0])
		case 2:
			out[i] = uint64(binary.LittleEndian.Uint16(b))
		case 4:
			out[i] = uint64(binary.LittleEndian.Uint32(b))
		case 8:
			out[i] = binary.LittleEndian.Uint64(b)
		default:
			return nil, fmt.Errorf("unsigned integers of %d bytes", width)
		}
	}
	return out, nil
}

// probeScore is how close the model comes to a probe record: the share of
// allocations placed at the real pool's address, and the reserved bytes
// after every event, against the pool's (mean absolute error over the
// pool's peak, and the peaks of each pass).
type probeScore struct {
	allocs, same int
	meanErr      float64
	model, real  []uint64 // peak reserved per pass
}

// replayProbe drives the cuda-async model with the probe's own events (the
// requests the pool saw, in its order; a free names the real address,
// mapped to the model's) and scores it.
func replayProbe(p *probeRecord) (probeScore, error) {
	c := newCudaAsync(anchorCapacity)
	var s probeScore
	toModel := map[uint64]uint64{}
	var sumErr float64
	var peak uint64
	pass := uint64(0)
	for i := range p.kind {
		if p.pass[i] != pass {
			// async_probe.py frees the leftovers of a pass after it and
			// synchronizes the context: every free completes. The model
			// frees them too (by address: the record does not keep the
			// harness's order, and after the completion only the stamps of
			// the merged blocks can depend on it).
			left := slices.Sorted(maps.Keys(toModel))
			for _, r := range left {
				if err := c.Free(toModel[r]); err != nil {
					return s, err
				}
				delete(toModel, r)
			}
			c.completeAll()
			pass = p.pass[i]
		}
		for uint64(len(s.real)) <= pass {
			s.real, s.model = append(s.real, 0), append(s.model, 0)
		}
		if p.kind[i] == 1 {
			m, err := c.Alloc(p.size[i], 0)
			if err != nil {
				return s, fmt.Errorf("event %d: %w", i, err)
			}
			s.allocs++
			if m == p.addr[i] {
				s.same++
			}
			toModel[p.addr[i]] = m
		} else {
			m, ok := toModel[p.addr[i]]
			if !ok {
				return s, fmt.Errorf("event %d: free of %#x, not live in the record", i, p.addr[i])
			}
			if err := c.Free(m); err != nil {
				return s, err
			}
			delete(toModel, p.addr[i])
		}
		got := c.Reserved()
		s.model[pass] = max(s.model[pass], got)
		s.real[pass] = max(s.real[pass], p.reserved[i])
		peak = max(peak, p.reserved[i])
		sumErr += math.Abs(float64(got) - float64(p.reserved[i]))
	}
	s.meanErr = sumErr / float64(len(p.kind)) / float64(peak)
	return s, nil
}

// TestCudaAsyncProbe scores the model against the probe's event-by-event
// records when GPUMEM_PROBE_DIR names a directory of them (NAME.npz; 32 MB
// in all, not in the repository: bench/peers/gpu_async_probe.sh makes
// them). It asserts only that the model replays every record; the scores
// are logged, for docs/EXPERIMENTS.md.
func TestCudaAsyncProbe(t *testing.T) {
	for _, path := range probePaths(t) {
		p, err := loadProbe(path)
		if err != nil {
			t.Fatal(err)
		}
		s, err := replayProbe(p)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		line := fmt.Sprintf("%-22s addresses %6.2f%% of %7d, reserved error %5.2f%% of peak, peaks", filepath.Base(path), 100*float64(s.same)/float64(s.allocs), s.allocs, 100*s.meanErr)
		for k := range s.real {
			line += fmt.Sprintf(" %+.2f%%", 100*(float64(s.model[k])/float64(s.real[k])-1))
		}
		t.Log(line)
	}
}

// probePaths returns the probe's records (NAME.npz) in GPUMEM_PROBE_DIR,
// in name order, skipping the test when it is unset.
func probePaths(t *testing.T) []string {
	t.Helper()
	dir := os.Getenv("GPUMEM_PROBE_DIR")
	if dir == "" {
		t.Skip("GPUMEM_PROBE_DIR unset")
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.npz"))
	sort.Strings(paths)
	if len(paths) == 0 {
		t.Fatalf("no .npz in %s", dir)
	}
	return paths
}

// TestCudaAsyncBacking checks the model's backing rule on the probe's
// records with the pool's own addresses: a 32 MiB granule is mapped while a
// live block (rounded to 512 bytes) touches it, and the pool's reserved
// bytes are the high-water mark of the granules mapped. It must equal
// RESERVED_MEM_CURRENT after every event of every record.
func TestCudaAsyncBacking(t *testing.T) {
	for _, path := range probePaths(t) {
		p, err := loadProbe(path)
		if err != nil {
			t.Fatal(err)
		}
		use := map[uint64]int{}
		sizes := map[uint64]uint64{}
		var mapped, high uint64
		bad := 0
		for i := range p.kind {
			a := p.addr[i]
			n, ok := sizes[a]
			if p.kind[i] == 1 {
				n = roundTo(max(p.size[i], 1), asyncRound)
				sizes[a] = n
			} else if !ok {
				t.Fatalf("%s event %d: free of %#x, not live", path, i, a)
			} else {
				delete(sizes, a)
			}
			for g := (a - asyncHeap) / asyncGranule; g <= (a-asyncHeap+n-1)/asyncGranule; g++ {
				if p.kind[i] == 1 {
					if use[g]++; use[g] == 1 {
						mapped++
					}
				} else if use[g]--; use[g] == 0 {
					mapped--
				}
			}
			high = max(high, mapped)
			if high*asyncGranule != p.reserved[i] {
				if bad++; bad <= 3 {
					t.Errorf("%s event %d: the rule gives %d bytes, the pool held %d", filepath.Base(path), i, high*asyncGranule, p.reserved[i])
				}
			}
		}
		t.Logf("%-26s %7d events, %d where the rule and the pool differ", filepath.Base(path), len(p.kind), bad)
	}
}
