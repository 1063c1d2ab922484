package replay_test

import (
	"os"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// BenchmarkCorpusPasses replays a tune program of the corpus (GPUMEM_TRACE,
// ckpt_grad_accum by default) ten passes on the simulated device, for CPU
// profiles of the later passes (issue 11, speed bars): `go test ./replay
// -run X -bench CorpusPasses -cpuprofile cpu.out`. It reports the time per
// event of the first pass and of the later ones, the maps and creates of the
// first pass, and the maps, creates and releases per later pass. Never point it at a holdout trace.
func BenchmarkCorpusPasses(b *testing.B) {
	name := os.Getenv("GPUMEM_TRACE")
	if name == "" {
		name = "ckpt_grad_accum"
	}
	tr, err := trace.Load(corpusTraces + "/" + name + ".trace.gz")
	if err != nil {
		b.Skip(err)
	}
	var first, later float64
	var res replay.Result
	for i := 0; i < b.N; i++ {
		dev, err := sim.New(sim.Config{})
		if err != nil {
			b.Fatal(err)
		}
		res, err = replay.Run(tr, dev, gpumem.Config{}, replay.Options{Passes: 10})
		if err != nil {
			b.Fatal(err)
		}
		first += res.NsPerOp
		later += res.Passes.NsPerOpLater
	}
	b.ReportMetric(first/float64(b.N), "ns/event-first")
	b.ReportMetric(later/float64(b.N), "ns/event-later")
	b.ReportMetric(float64(res.Maps), "maps/first-pass")
	b.ReportMetric(float64(res.Creates), "creates/first-pass")
	b.ReportMetric(float64(res.Passes.MapsLater)/9, "maps/later-pass")
	b.ReportMetric(float64(res.Passes.CreatesLater)/9, "creates/later-pass")
	b.ReportMetric(float64(res.Passes.ReleasesLater)/9, "releases/later-pass")
}
