package cuda

import (
	"testing"
	"unsafe"
)

// The expected values are those of cuda.h (CUDA 12.x and 13.x) on 64-bit
// Linux; see types.go for the C declarations.
func TestStructLayouts(t *testing.T) {
	type field struct {
		name      string
		got, want uintptr
	}
	var loc memLocation
	var prop memAllocationProp
	var acc memAccessDesc
	checks := []field{
		{"sizeof(CUmemLocation)", unsafe.Sizeof(loc), 8},
		{"CUmemLocation.type", unsafe.Offsetof(loc.Type), 0},
		{"CUmemLocation.id", unsafe.Offsetof(loc.ID), 4},

		{"sizeof(CUmemAllocationProp)", unsafe.Sizeof(prop), 32},
		{"alignof(CUmemAllocationProp)", unsafe.Alignof(prop), 8},
		{"CUmemAllocationProp.type", unsafe.Offsetof(prop.Type), 0},
		{"CUmemAllocationProp.requestedHandleTypes", unsafe.Offsetof(prop.RequestedHandleTypes), 4},
		{"CUmemAllocationProp.location", unsafe.Offsetof(prop.Location), 8},
		{"CUmemAllocationProp.location.type", unsafe.Offsetof(prop.Location) + unsafe.Offsetof(prop.Location.Type), 8},
		{"CUmemAllocationProp.location.id", unsafe.Offsetof(prop.Location) + unsafe.Offsetof(prop.Location.ID), 12},
		{"CUmemAllocationProp.win32HandleMetaData", unsafe.Offsetof(prop.Win32HandleMetaData), 16},
		{"CUmemAllocationProp.allocFlags", unsafe.Offsetof(prop.AllocFlags), 24},
		{"sizeof(allocFlags)", unsafe.Sizeof(prop.AllocFlags), 8},
		{"allocFlags.compressionType", unsafe.Offsetof(prop.AllocFlags) + unsafe.Offsetof(prop.AllocFlags.CompressionType), 24},
		{"allocFlags.gpuDirectRDMACapable", unsafe.Offsetof(prop.AllocFlags) + unsafe.Offsetof(prop.AllocFlags.GPUDirectRDMACapable), 25},
		{"allocFlags.usage", unsafe.Offsetof(prop.AllocFlags) + unsafe.Offsetof(prop.AllocFlags.Usage), 26},
		{"allocFlags.reserved", unsafe.Offsetof(prop.AllocFlags) + unsafe.Offsetof(prop.AllocFlags.Reserved), 28},

		{"sizeof(CUmemAccessDesc)", unsafe.Sizeof(acc), 12},
		{"CUmemAccessDesc.location.type", unsafe.Offsetof(acc.Location) + unsafe.Offsetof(acc.Location.Type), 0},
		{"CUmemAccessDesc.location.id", unsafe.Offsetof(acc.Location) + unsafe.Offsetof(acc.Location.ID), 4},
		{"CUmemAccessDesc.flags", unsafe.Offsetof(acc.Flags), 8},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestPropValues(t *testing.T) {
	p := devicePinnedProp(3, false)
	if p.Type != 1 || p.RequestedHandleTypes != 0 || p.Location.Type != 1 || p.Location.ID != 3 ||
		p.Win32HandleMetaData != 0 || p.AllocFlags != (memAllocFlags{}) {
		t.Errorf("devicePinnedProp(3, false) = %+v", p)
	}
	if s := devicePinnedProp(3, true); s.RequestedHandleTypes != 1 || s.Type != 1 || s.Location.ID != 3 {
		t.Errorf("devicePinnedProp(3, true) = %+v, want POSIX file descriptor handles (1)", s)
	}
	a := deviceReadWrite(2)
	if a.Location.Type != 1 || a.Location.ID != 2 || a.Flags != 3 {
		t.Errorf("deviceReadWrite(2) = %+v", a)
	}
	// The raw bytes the driver sees.
	b := unsafe.Slice((*byte)(unsafe.Pointer(&p)), unsafe.Sizeof(p))
	want := []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0}
	for i, w := range want {
		if b[i] != w {
			t.Fatalf("CUmemAllocationProp bytes = % x, want prefix % x", b, want)
		}
	}
	for i := 16; i < 32; i++ {
		if b[i] != 0 {
			t.Fatalf("CUmemAllocationProp bytes = % x, want zeros from 16", b)
		}
	}
}
