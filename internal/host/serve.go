package host

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"

	"github.com/gpumem/gpumem/httpdebug"
	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/metrics"
)

// Sources lists the host's allocators for the metrics and the HTTP handler.
func (h *Host) Sources() []metrics.Source {
	var out []metrics.Source
	for _, d := range h.Devices() {
		// The device's figures hold its private pools' (CUDA graphs,
		// MemPools), as Host.Stats and Host.Snapshot do.
		src := metrics.Source{Device: strconv.Itoa(d.Ordinal), Pool: "gpumem", Allocator: d.Alloc,
			Private: d.privates(), Stats: d.stats, Snapshot: d.snapshot}
		src.Outside, src.OutsideKnown = d.Outside()
		out = append(out, src)
	}
	return out
}

// Serve serves the host's allocators over HTTP on addr (package httpdebug)
// and returns the address bound (port 0 picks a free one). One server per
// host: a second call returns the first one's address.
func (h *Host) Serve(addr string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.serveLocked(addr)
}

func (h *Host) serveLocked(addr string) (string, error) {
	if h.served != "" {
		return h.served, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%w: serving on %s: %v", ErrIO, addr, err)
	}
	for _, d := range h.Devices() {
		d.measureOutside()
	}
	srv := &http.Server{Handler: httpdebug.Handler(h.Sources)}
	go srv.Serve(ln)
	h.served = ln.Addr().String()
	// Tools find the process through its announcement; without one they
	// can still be pointed at the address.
	_ = announce.Announce(h.served)
	return h.served, nil
}

// serveFromConfig starts the server that serve= names, at the host's first
// use; a failure is said once on stderr and changes nothing else (the
// program's allocations must not fail for want of a port). Called with mu.
func (h *Host) serveFromConfig() {
	if h.cfg.Serve == "" || h.served != "" || h.serveTried {
		return
	}
	h.serveTried = true
	addr, err := h.serveLocked(h.cfg.Serve)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpumem: %v (the program runs on, unserved)\n", err)
		return
	}
	if _, port, _ := net.SplitHostPort(h.cfg.Serve); port == "0" {
		fmt.Fprintf(os.Stderr, "gpumem: serving stats and metrics on http://%s/debug/gpumem/ (pid %d)\n", addr, os.Getpid())
	}
}
