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
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	if strings.Join(types, " ") != "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes" || p.DefaultSampleType != "inuse_space" {
		t.Fatalf("sample types %v, default %q; want the heap profile's four, inuse_space by default", types, p.DefaultSampleType)
	}
	bySite := map[string][4]int64{}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				for _, name := range []string{"allocateWeights", "allocateActivations"} {
					if strings.HasSuffix(l.Function.Name, "."+name) {
						v := bySite[name]
						for i := range v {
							v[i] += s.Value[i]
						}
						bySite[name] = v
					}
				}
			}
		}
	}
	if got, want := bySite["allocateWeights"], [4]int64{1, 48 << 20, 1, 48 << 20}; got != want {
		t.Errorf("weights: %v, want %v (alloc objects, space, inuse objects, space)", got, want)
	}
	if got, want := bySite["allocateActivations"], [4]int64{3, 48 << 20, 2, 32 << 20}; got != want {
		t.Errorf("activations: %v, want %v: three allocated, one of them freed", got, want)
	}
	if goTool, err := exec.LookPath("go"); err == nil {
		path := filepath.Join(t.TempDir(), "gpumem.pprof")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, index := range []string{"inuse_space", "alloc_space"} {
			out, err := exec.Command(goTool, "tool", "pprof", "-top", "-sample_index="+index, path).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "allocateWeights") {
				t.Errorf("go tool pprof -top -sample_index=%s: %v\n%s", index, err, out)
			}
		}
	}
	for _, b := range []gpumem.Buffer{w, x1, x2} {
		_ = a.Free(b)
	}
}
