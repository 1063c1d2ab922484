package cuda

import (
	"strings"
	"testing"
)

func TestPTXSource(t *testing.T) {
	for _, vt := range spinTargets {
		src := ptxSource(vt[0], vt[1])
		for _, want := range []string{
			"\n.version " + vt[0] + "\n",
			"\n.target " + vt[1] + "\n",
			"\n.address_size 64\n",
			".visible .entry " + spinKernelName + "(",
			"%clock64",
			"st.global.u32",
			"ret;",
		} {
			if !strings.Contains(src, want) {
				t.Errorf("%s: PTX lacks %q", vt[1], want)
			}
		}
		if strings.Contains(src, "@VERSION@") || strings.Contains(src, "@TARGET@") {
			t.Errorf("%s: placeholder left in PTX", vt[1])
		}
		if strings.Count(src, "{") != strings.Count(src, "}") || strings.Count(src, "(") != strings.Count(src, ")") {
			t.Errorf("%s: unbalanced braces or parentheses", vt[1])
		}
		if strings.ContainsRune(src, 0) {
			t.Errorf("%s: NUL inside the PTX text", vt[1])
		}
		for i, c := range src {
			if c > 126 || (c < 32 && c != '\n' && c != '\t') {
				t.Fatalf("%s: non-ASCII or control character %q at %d", vt[1], c, i)
			}
		}
		// Three parameters, declared in the order Spin passes them.
		iC := strings.Index(src, ".param .u64 gpumem_spin_param_cycles")
		iF := strings.Index(src, ".param .u64 gpumem_spin_param_flag")
		iV := strings.Index(src, ".param .u32 gpumem_spin_param_value")
		if iC < 0 || iF < iC || iV < iF {
			t.Errorf("%s: parameters missing or out of order", vt[1])
		}
		// The hold kernel: flag then cycles, and a volatile read of the flag.
		iHF := strings.Index(src, ".param .u64 gpumem_hold_param_flag")
		iHC := strings.Index(src, ".param .u64 gpumem_hold_param_cycles")
		if !strings.Contains(src, ".visible .entry "+holdKernelName+"(") || iHF < 0 || iHC < iHF {
			t.Errorf("%s: hold kernel or its parameters missing or out of order", vt[1])
		}
		if !strings.Contains(src, "ld.volatile.global.u32") {
			t.Errorf("%s: the hold kernel's read of its flag is not volatile", vt[1])
		}
		// Every register used is declared: %rd1..%rd6, %r1, %p1..%p2.
		if !strings.Contains(src, "%rd<7>") || !strings.Contains(src, "%p<3>") || !strings.Contains(src, "%r<2>") {
			t.Errorf("%s: register declarations changed", vt[1])
		}
		if strings.Contains(src, "%rd7") || strings.Contains(src, "%p3") || strings.Contains(src, "%r2") {
			t.Errorf("%s: register used beyond its declaration", vt[1])
		}
	}
	if spinTargets[0][1] != "sm_50" {
		t.Errorf("first target %s, want sm_50", spinTargets[0][1])
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x6e, 0x0d, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7}
	if got, want := formatUUID(u), "GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7"; got != want {
		t.Errorf("formatUUID = %s, want %s", got, want)
	}
}
