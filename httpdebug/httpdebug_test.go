package httpdebug

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/metrics"
)

func TestHandler(t *testing.T) {
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _ := a.Alloc(5<<20, 0)
	srv := httptest.NewServer(Handler(func() []metrics.Source { return []metrics.Source{{Device: "0", Pool: "gpumem", Allocator: a}} }))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	code, body := get("/debug/gpumem/stats")
	var stats map[string]struct {
		Stats gpumem.Stats
		Limit uint64
	}
	if err := json.Unmarshal([]byte(body), &stats); code != 200 || err != nil || stats["0"].Stats.Allocated != 5<<20 {
		t.Errorf("stats: %d %v %s", code, err, body)
	}
	code, body = get("/debug/gpumem/snapshot?device=0")
	var snap gpumem.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); code != 200 || err != nil || len(snap.Segments) == 0 {
		t.Errorf("snapshot: %d %v", code, err)
	}
	if code, _ := get("/debug/gpumem/snapshot?device=3"); code != 404 {
		t.Errorf("snapshot of a device without an allocator: %d", code)
	}
	if code, _ := get("/debug/gpumem/snapshot?device=x"); code != 400 {
		t.Errorf("snapshot of device x: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `gpumem_allocated_bytes{device="0",pool="gpumem"} 5.24288e+06`) {
		t.Errorf("metrics: %d\n%s", code, body)
	}
	if code, body := get("/debug/gpumem/"); code != 200 || !strings.Contains(body, "device 0, pool gpumem") {
		t.Errorf("index: %d %s", code, body)
	}
	_ = a.Free(b)
}
