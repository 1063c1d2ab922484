package torchsnapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/trace"
)

// Written is one trace that Import wrote.
type Written struct {
	Path    string
	Device  int
	Summary Summary
}

// ErrNoHistory: the snapshot holds no allocation history on any device.
var ErrNoHistory = errors.New("no allocation history (was torch.cuda.memory._record_memory_history() called before the program allocated?)")

// Import reads the snapshot at in and writes one trace per device with an
// allocation history: device 0's (or the only one's) to out, device N's to
// DevicePath(out, N). It stops at the first error, removing the file it
// could not complete; the traces written before it stay and are returned.
// The command `gpumem import` and the C library's gpumem_import_snapshot
// both call it. The traces are in v1, the exchange format (ImportFormat
// for v2).
func Import(in, out string) ([]Written, error) { return ImportFormat(in, out, trace.V1) }

// ImportFormat is Import writing traces of format f.
func ImportFormat(in, out string, f trace.Format) ([]Written, error) {
	s, err := Load(in)
	if err != nil {
		if errors.Is(err, ErrFormat) {
			err = fmt.Errorf("%s: %w", in, err)
		}
		return nil, err
	}
	devs := s.Devices()
	if len(devs) == 0 {
		return nil, fmt.Errorf("%s: %w", in, ErrNoHistory)
	}
	var done []Written
	for _, dev := range devs {
		path := out
		if len(devs) > 1 {
			path = DevicePath(out, dev)
		}
		if sameFile(path, in) {
			return done, fmt.Errorf("%s: the trace would overwrite the snapshot", path)
		}
		sum, err := writeFile(s, dev, path, f)
		if err != nil {
			return done, err
		}
		done = append(done, Written{Path: path, Device: dev, Summary: sum})
	}
	return done, nil
}

// writeFile writes the trace of device dev to the file at path; it
// removes the file if it cannot complete it. Its errors name the path.
func writeFile(s *Snapshot, dev int, path string, f trace.Format) (Summary, error) {
	w, err := trace.CreateFormat(path, f)
	if err != nil {
		return Summary{}, err
	}
	sum, err := s.WriteTrace(dev, w.Writer)
	if e := w.Close(); err == nil {
		err = e
	}
	if err != nil {
		os.Remove(path)
		if _, ok := errors.AsType[*os.PathError](err); !ok {
			err = fmt.Errorf("%s: %w", path, err)
		}
	}
	return sum, err
}

// DevicePath returns where the trace of device dev goes when a snapshot
// has several: path itself for device 0, else path with ".devN" before
// ".trace" (with or without ".gz" after it), else before ".gz", else at the
// end.
func DevicePath(path string, dev int) string {
	if dev == 0 {
		return path
	}
	tag := ".dev" + strconv.Itoa(dev)
	dir, base := filepath.Split(path)
	for _, ext := range []string{".trace.gz", ".trace", ".gz"} {
		if stem, ok := strings.CutSuffix(base, ext); ok && stem != "" {
			return dir + stem + tag + ext
		}
	}
	return path + tag
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
