// Package httpdebug serves a process's gpumem allocators over HTTP, in the
// style of net/http/pprof, for the tools that watch a process from outside
// (gpumem top and serve, Prometheus, curl):
//
//	/debug/gpumem/           an index
//	/debug/gpumem/stats      every allocator's statistics (JSON, by device)
//	/debug/gpumem/snapshot   one allocator's segments, spans and blocks
//	                         (JSON; ?device=N, default the first)
//	/debug/gpumem/profile    allocations by call site, a pprof profile
//	                         with the heap profile's four sample types
//	                         (go tool pprof URL)
//	/metrics                 the Prometheus metrics (package metrics)
//
// A Go program mounts Handler; a program that loads the C library sets
// serve=ADDR in GPUMEM_CONFIG (or calls gpumem_serve) and the library
// serves it on that address.
package httpdebug

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/metrics"
)

// Handler serves the allocators that list returns at each request.
func Handler(list func() []metrics.Source) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(list))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/gpumem/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "gpumem\n\n/debug/gpumem/stats     statistics of every allocator (JSON)\n/debug/gpumem/snapshot  segments, spans and blocks (JSON; ?device=N)\n/debug/gpumem/profile   allocations by call site: live and since the start (pprof)\n/metrics                Prometheus metrics\n\nallocators:\n")
		for _, s := range list() {
			fmt.Fprintf(w, "  device %s, pool %s\n", s.Device, s.Pool)
		}
	})
	mux.HandleFunc("GET /debug/gpumem/stats", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{}
		for _, s := range list() {
			d := map[string]any{"pool": s.Pool, "limit": s.Allocator.Limit(), "stats": s.AllStats()}
			if s.OutsideKnown {
				d["outside"] = s.Outside
			}
			out[s.Device] = d
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /debug/gpumem/profile", func(w http.ResponseWriter, r *http.Request) {
		var as []*gpumem.Allocator
		for _, s := range list() {
			as = append(append(as, s.Allocator), s.Private...)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="gpumem.pprof"`)
		if err := Profile(as).Write(w); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("GET /debug/gpumem/snapshot", func(w http.ResponseWriter, r *http.Request) {
		want := r.URL.Query().Get("device")
		srcs := list()
		for _, s := range srcs {
			if want == "" || s.Device == want {
				writeJSON(w, s.AllSnapshot())
				return
			}
		}
		if want != "" {
			if _, err := strconv.Atoi(want); err != nil {
				http.Error(w, fmt.Sprintf("device %q: want a device number", want), http.StatusBadRequest)
				return
			}
		}
		http.Error(w, fmt.Sprintf("no allocator on device %q (%d in use)", want, len(srcs)), http.StatusNotFound)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
