package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/metrics"
)

const serveAbout = `Serve exports a host's GPU memory to Prometheus: NVML's figures for every
GPU and every process on it (gpumem_gpu_*), and the pools of the processes
that run on gpumem and serve its handler (gpumem run --serve, serve= in
GPUMEM_CONFIG, gpumem.serve() in Python), scraped from each and labelled
with its pid. One Prometheus scraping every host's gpumem serve watches a
fleet.

	/metrics                    everything, in Prometheus's text format
	/debug/gpumem/processes     the gpumem processes found (JSON)

gpumem processes are found through their announcements in $GPUMEM_RUN_DIR
(default: gpumem-UID in the temporary directory).`

func (e *env) serve(args []string) int {
	fs := e.flagSet("serve", "", serveAbout)
	listen := fs.String("listen", "127.0.0.1:9464", "serve on `ADDR`")
	rest, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if len(rest) > 0 {
		return e.usageError(fs, "serve takes no arguments")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem serve: %v\n", err)
		return ExitFail
	}
	fmt.Fprintf(e.stderr, "gpumem serve: serving on http://%s/metrics\n", ln.Addr())
	err = http.Serve(ln, e.serveHandler())
	fmt.Fprintf(e.stderr, "gpumem serve: %v\n", err)
	return ExitFail
}

// serveHandler is what gpumem serve serves.
func (e *env) serveHandler() http.Handler {
	reg := prometheus.NewRegistry()
	procs := metrics.NewProcessCollector(announce.List)
	reg.MustRegister(metrics.NewGPUCollector(e.listGPUs), procs, procs.Errors)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/gpumem/processes", func(w http.ResponseWriter, r *http.Request) {
		ps, err := announce.List()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		type proc struct {
			PID  int    `json:"pid"`
			Addr string `json:"addr"`
		}
		out := []proc{}
		for _, p := range ps {
			out = append(out, proc{p.PID, p.Addr})
		}
		json.NewEncoder(w).Encode(out)
	})
	return mux
}
