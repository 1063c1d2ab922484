package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func TestResultNames(t *testing.T) {
	seen := map[string]result{}
	for r, n := range resultNames {
		if r == 0 {
			if n != "CUDA_SUCCESS" {
				t.Errorf("0 = %s", n)
			}
			continue
		}
		if !strings.HasPrefix(n, "CUDA_ERROR_") {
			t.Errorf("%d = %q, want a CUDA_ERROR_ name", r, n)
		}
		if o, dup := seen[n]; dup {
			t.Errorf("%s is both %d and %d", n, o, r)
		}
		seen[n] = r
	}
	for r, want := range map[result]string{
		1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 100: "CUDA_ERROR_NO_DEVICE",
		201: "CUDA_ERROR_INVALID_CONTEXT", 211: "CUDA_ERROR_NOT_MAPPED", 400: "CUDA_ERROR_INVALID_HANDLE",
		600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 801: "CUDA_ERROR_NOT_SUPPORTED",
		999: "CUDA_ERROR_UNKNOWN",
	} {
		if got := resultName(r); got != want {
			t.Errorf("resultName(%d) = %s, want %s", r, got, want)
		}
	}
	if got := resultName(4242); got != "CUDA_ERROR_4242" {
		t.Errorf("resultName(4242) = %s", got)
	}
}

func TestErrorMapping(t *testing.T) {
	sentinels := []error{device.ErrOutOfMemory, device.ErrInvalid, device.ErrUnsupported, device.ErrNoDriver, device.ErrInjected}
	cases := []struct {
		code result
		want error // nil: matches no sentinel
	}{
		{2, device.ErrOutOfMemory},
		{1, device.ErrInvalid},
		{101, device.ErrInvalid},
		{201, device.ErrInvalid},
		{208, device.ErrInvalid},
		{211, device.ErrInvalid},
		{400, device.ErrInvalid},
		{401, device.ErrInvalid},
		{500, device.ErrInvalid},
		{709, device.ErrInvalid},
		{801, device.ErrUnsupported},
		{3, device.ErrNoDriver},
		{34, device.ErrNoDriver},
		{100, device.ErrNoDriver},
		{803, device.ErrNoDriver},
		{600, nil},
		{700, nil},
		{719, nil},
		{999, nil},
		{4242, nil},
	}
	for _, c := range cases {
		err := opError(nil, "cuMemCreate", c.code, "size=2097152")
		var op *device.OpError
		if !errors.As(err, &op) || op.Op != "cuMemCreate" || op.Args != "size=2097152" {
			t.Fatalf("opError = %#v, want *device.OpError for cuMemCreate", err)
		}
		var de *DriverError
		if !errors.As(err, &de) || de.Code != int(c.code) || de.Name != resultName(c.code) {
			t.Fatalf("%d: no DriverError with the code in %v", c.code, err)
		}
		for _, s := range sentinels {
			if got := errors.Is(err, s); got != (s == c.want) {
				t.Errorf("%s: errors.Is(%v) = %v", resultName(c.code), s, got)
			}
		}
	}
	err := opError(nil, "cuMemAlloc", 2, "size=1099511627776")
	if got, want := err.Error(), "cuMemAlloc(size=1099511627776): CUDA_ERROR_OUT_OF_MEMORY (2)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	de := &DriverError{Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Description: "out of memory"}
	if got, want := de.Error(), "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	closed := opError(nil, "cuMemFree", resultClosed, "ptr=0x1")
	if !errors.Is(closed, ErrClosed) || !errors.Is(closed, device.ErrInvalid) {
		t.Errorf("closed error %v does not match ErrClosed and ErrInvalid", closed)
	}
}

// TestEveryResultMapsToAnError: every CUresult cuda.h defines yields an
// *device.OpError with a named DriverError (none is silently ignored).
func TestEveryResultMapsToAnError(t *testing.T) {
	for r := range resultNames {
		if r == cudaSuccess {
			continue
		}
		err := opError(nil, "cuX", r, "")
		if err == nil || !strings.Contains(err.Error(), resultNames[r]) {
			t.Errorf("%d: %v", r, err)
		}
	}
}
