// Package longtest marks the long checks of the test suite: replays of
// whole traces under the invariant checker, which verify the allocator's
// placement and books after every operation. They run in one goroutine, so
// the race detector finds nothing in them and only makes them five to ten
// times slower (two minutes for one of them on a 2-core machine). They run
// whenever the race detector is off: `go test ./...`, and .ci/run's step
// of long checks after the race run; `go test -race ./...` skips them,
// saying so, and stays within a few minutes.
package longtest

import "testing"

// Skip skips t, naming what it checks, when the race detector is on.
func Skip(t testing.TB, what string) {
	t.Helper()
	if raceEnabled {
		t.Skipf("long check (%s): single-threaded, so it runs without -race (go test ./..., or .ci/run's long step)", what)
	}
}

// Enabled reports whether the long checks run in this build.
func Enabled() bool { return !raceEnabled }
