package httpdebug

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

//go:noinline
func allocateWeights(a *gpumem.Allocator) gpumem.Buffer {
	b, _ := a.Alloc(48<<20, 0)
	return b
}

//go:noinline
func allocateActivations(a *gpumem.Allocator) gpumem.Buffer {
	b, _ := a.Alloc(16<<20, 0)
	return b
}

// TestProfile: the live allocations as a pprof profile that parses back,
// with the sites' sizes, and that `go tool pprof` reads.
func TestProfile(t *testing.T) {
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{RecordSites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	w := allocateWeights(a)
	x1, x2 := allocateActivations(a), allocateActivations(a)
	gone := allocateActivations(a)
	_ = a.Free(gone)
	var buf bytes.Buffer
	if err := Profile([]*gpumem.Allocator{a}).Write(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("the profile does not parse: %v", err)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	bySite := map[string][2]int64{}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				for _, name := range []string{"allocateWeights", "allocateActivations"} {
					if strings.HasSuffix(l.Function.Name, "."+name) {
						v := bySite[name]
						bySite[name] = [2]int64{v[0] + s.Value[0], v[1] + s.Value[1]}
					}
				}
			}
		}
	}
	if bySite["allocateWeights"] != [2]int64{1, 48 << 20} || bySite["allocateActivations"] != [2]int64{2, 32 << 20} {
		t.Errorf("by site: %v; want weights 1 x 48 MiB and activations 2 x 16 MiB (one freed)", bySite)
	}
	if p.DefaultSampleType != "inuse_space" || p.SampleType[1].Unit != "bytes" {
		t.Errorf("sample types %v, default %q", p.SampleType, p.DefaultSampleType)
	}
	if goTool, err := exec.LookPath("go"); err == nil {
		path := filepath.Join(t.TempDir(), "gpumem.pprof")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(goTool, "tool", "pprof", "-top", "-sample_index=inuse_space", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "allocateWeights") {
			t.Errorf("go tool pprof -top: %v\n%s", err, out)
		}
	}
	for _, b := range []gpumem.Buffer{w, x1, x2} {
		_ = a.Free(b)
	}
}
