package faults

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func TestInjector(t *testing.T) {
	f := New(DeviceOps...)
	if err := f.Hit("Alloc"); err != nil {
		t.Fatalf("nothing armed: %v", err)
	}
	f.FailNth("Alloc", 2)
	f.FailOOM("", 3) // the third call of any operation
	if err := f.Hit("Alloc"); err != nil {
		t.Fatalf("first Alloc: %v", err)
	}
	err := f.Hit("Alloc")
	if !errors.Is(err, device.ErrInjected) || errors.Is(err, device.ErrOutOfMemory) || !strings.Contains(err.Error(), `FailNth("Alloc", 2)`) {
		t.Fatalf("second Alloc: %v, want the FailNth fault", err)
	}
	err = f.Hit("Map")
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, device.ErrInjected) {
		t.Fatalf("third call: %v, want the FailOOM fault", err)
	}
	if err := f.Hit("Map"); err != nil || f.Fired() != 2 {
		t.Fatalf("after both fired: %v, %d fired", err, f.Fired())
	}
	f.FailNth("Free", 1)
	f.Clear()
	if err := f.Hit("Free"); err != nil {
		t.Fatalf("after Clear: %v", err)
	}
	for _, bad := range []func(){func() { f.FailNth("Malloc", 1) }, func() { f.FailNth("Free", 0) }} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("an unknown operation or call 0 did not panic")
				}
			}()
			bad()
		}()
	}
}
