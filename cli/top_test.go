package cli

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/httpdebug"
	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/metrics"
	"github.com/gpumem/gpumem/nvml"
)

// servedPool starts a simulated allocator holding 7 MiB live, serves it and
// announces this process in a fresh GPUMEM_RUN_DIR.
func servedPool(t *testing.T) *gpumem.Allocator {
	t.Helper()
	t.Setenv("GPUMEM_RUN_DIR", t.TempDir())
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{Limit: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, err := a.Alloc(7<<20, 0); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpdebug.Handler(func() []metrics.Source {
		return []metrics.Source{{Device: "0", Pool: "gpumem", Allocator: a, Outside: 480 << 20, OutsideKnown: true}}
	}))
	t.Cleanup(srv.Close)
	if err := announce.Announce(strings.TrimPrefix(srv.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTopOnce: one frame reconciles NVML's figure for a gpumem process with
// its reserved bytes, and lists its pool.
func TestTopOnce(t *testing.T) {
	a := servedPool(t)
	pid := os.Getpid()
	e := fakeEnv()
	res := a.Stats().Reserved
	e.listGPUs = func() ([]nvml.GPUReport, error) {
		return []nvml.GPUReport{{GPU: nvml.GPU{Index: 0, Name: "NVIDIA H100 80GB HBM3", Memory: nvml.Memory{Total: 80 << 30, Used: 2 << 30}},
			Processes: []nvml.Process{{PID: pid, UsedMemory: res + 500<<20, MemoryKnown: true}, {PID: 1, UsedMemory: 1 << 30, MemoryKnown: true}}}}, nil
	}
	code, out, _ := run(t, e, "top", "--once")
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	calls := a.Stats().DeviceCalls() // the 7 MiB's span: a reservation, creates, maps, a grant
	if calls == 0 {
		t.Fatal("the served pool made no driver call")
	}
	for _, want := range []string{"GPU 0  NVIDIA H100 80GB HBM3", strconv.Itoa(pid), "480.00 MiB", "20.00 MiB (+", "gpumem pools", "7.00 MiB", "512.00 MiB",
		"unexplained: device memory the process took outside gpumem", "driver calls", strconv.FormatUint(calls, 10) + ", ",
		"misses", strconv.FormatUint(a.Stats().Misses, 10) + ", "} {
		if !strings.Contains(out, want) {
			t.Errorf("the frame lacks %q:\n%s", want, out)
		}
	}
	// The other process, not on gpumem, has no reserved column.
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "1" && !strings.Contains(line, " - ") {
			t.Errorf("a process not on gpumem shows a pool: %q", line)
		}
	}
}

// TestTopInTmux: gpumem top in a real terminal (tmux) refreshes, shows the
// pool of a process on the simulated device, and ends on an interrupt.
func TestTopInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed (apt-get install tmux)")
	}
	servedPool(t)
	bin := filepath.Join(t.TempDir(), "gpumem")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gpumem").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	session := "gpumem-top-" + strconv.Itoa(os.Getpid())
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := tm("new-session", "-d", "-s", session, "-x", "160", "-y", "40",
		"env", "GPUMEM_RUN_DIR="+os.Getenv("GPUMEM_RUN_DIR"), bin, "top", "--interval", "100ms"); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	defer tm("kill-server")
	var screen string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		screen, _ = tm("capture-pane", "-p", "-t", session)
		if strings.Contains(screen, "gpumem pools") && strings.Contains(screen, "7.00 MiB") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(screen, "gpumem pools") || !strings.Contains(screen, strconv.Itoa(os.Getpid())) || !strings.Contains(screen, "7.00 MiB") {
		t.Fatalf("the terminal shows:\n%s", screen)
	}
	first := screen
	time.Sleep(1100 * time.Millisecond)
	if again, _ := tm("capture-pane", "-p", "-t", session); again == first {
		t.Error("the view did not refresh in 1.1 s with a 100 ms interval (its clock line stayed)")
	}
	tm("send-keys", "-t", session, "C-c")
	for time.Now().Before(deadline) {
		if _, err := tm("has-session", "-t", session); err != nil {
			return // top ended, and its session with it
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Error("gpumem top did not end on an interrupt")
}

// TestMisses: the misses column's count, mean and the event calls' share.
func TestMisses(t *testing.T) {
	for _, c := range []struct {
		st   gpumem.Stats
		want string
	}{
		{gpumem.Stats{}, "none"},
		{gpumem.Stats{Misses: 4, MissNanos: 8000}, "4, 2.0 us each"},
		{gpumem.Stats{Misses: 1521, MissNanos: 5_510_000, EventCalls: 1012, EventNanos: 2_970_000}, "1521, 3.6 us each (events 54%)"},
		{gpumem.Stats{Misses: 1, MissNanos: 1000, EventNanos: 5000}, "1, 1.0 us each (events 100%)"}, // events on frees too: capped
	} {
		if got := misses(c.st); got != c.want {
			t.Errorf("misses(%+v) = %q, want %q", c.st, got, c.want)
		}
	}
}

// TestDriverCalls: the driver column's count and mean, in units a reader
// takes in at a glance.
func TestDriverCalls(t *testing.T) {
	for _, c := range []struct {
		st   gpumem.Stats
		want string
	}{
		{gpumem.Stats{}, "none"},
		{gpumem.Stats{Creates: 1, Maps: 1, SetAccess: 1, Reserves: 1, DriverNanos: 2000}, "4, 500 ns each"},
		{gpumem.Stats{Creates: 2, DriverNanos: 150_000}, "2, 75.0 us each"},
		{gpumem.Stats{Maps: 1204, SetAccess: 363, Creates: 1088, DriverNanos: 7_179_000_000}, "2655, 2.7 ms each"},
		{gpumem.Stats{Releases: 1, DriverNanos: 3_500_000_000}, "1, 3.50 s each"},
	} {
		if got := driverCalls(c.st); got != c.want {
			t.Errorf("driverCalls(%+v) = %q, want %q", c.st, got, c.want)
		}
	}
}
