package cuda

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func TestMissingLibrary(t *testing.T) {
	const name = "libgpumem-no-such-driver.so.1"
	_, err := openDriver(name)
	if err == nil {
		t.Fatal("openDriver of a missing library succeeded")
	}
	if !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("error %v does not match device.ErrNoDriver", err)
	}
	if !IsDriverMissing(err) {
		t.Errorf("IsDriverMissing(%v) = false", err)
	}
	if got, want := err.Error(), name+" not found: no NVIDIA driver on this machine"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error has several lines: %q", err)
	}
}

// The one-line message of a failed dlopen is tested in internal/dl.

// TestOpenWithoutDriver runs where libcuda.so.1 is absent: Open must fail
// with the one-line ErrNoDriver error.
func TestOpenWithoutDriver(t *testing.T) {
	d, err := Open(0)
	if err == nil {
		d.Close()
		t.Skip("a driver is present; covered by the GPU tests")
	}
	if !IsDriverMissing(err) {
		t.Skipf("the driver loaded but Open failed: %v", err)
	}
	if !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("Open: %v does not match device.ErrNoDriver", err)
	}
	if _, statErr := os.Stat("/dev/nvidiactl"); statErr != nil && err.Error() != "libcuda.so.1 not found: no NVIDIA driver on this machine" {
		t.Errorf("Open: %q", err)
	}
	if _, err := DeviceCount(); !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("DeviceCount: %v does not match device.ErrNoDriver", err)
	}
}
