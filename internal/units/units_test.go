package units

import (
	"math"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"1024", 1024},
		{"1024B", 1024},
		{"80GiB", 80 << 30},
		{"80gib", 80 << 30},
		{"80 GiB", 80 << 30},
		{" 2MiB ", 2 << 20},
		{"512MiB", 512 << 20},
		{"4KiB", 4096},
		{"1.5GB", 1_500_000_000},
		{"1.5GiB", 3 << 29},
		{"1.5KiB", 1536},
		{"0.1KiB", 102}, // 102.4: the fraction of a byte is dropped
		{"2.25MB", 2_250_000},
		{"3TB", 3e12},
		{"1TiB", 1 << 40},
		{"1PiB", 1 << 50},
		{"1EiB", 1 << 60},
		{"15EiB", 15 << 60},
		{"18446744073709551615", math.MaxUint64},
		{"18446744073709551615B", math.MaxUint64},
		{"18.446744073709551615EB", math.MaxUint64},
		{"12.17 GiB", 13067437998}, // Format's output reads back
		{"007", 7},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, msg string }{
		{"", "empty"},
		{"   ", "empty"},
		{"abc", "want a number"},
		{"GiB", "want a number"},
		{"-1", "negative"},
		{"-1GiB", "negative"},
		{"+1", "want a number"},
		{"1.", "want a number"},
		{".5GiB", "want a number"},
		{"1.2.3", "want a number"},
		{"1e9", `unknown unit "e9"`},
		{"0x100", `unknown unit "x100"`},
		{"12XB", `unknown unit "XB"`},
		{"1 2", `unknown unit "2"`},
		{"80G", `ambiguous unit "G": write GiB (powers of 1024) or GB (powers of 1000)`},
		{"4k", `ambiguous unit "k": write KiB`},
		{"18446744073709551616", "too large"},
		{"99999999999999999999999", "too large"},
		{"16EiB", "too large"},
		{"17179869184GiB", "too large"},
		{"18.446744073709551616EB", "too large"},
		{"1.5EiB0", `unknown unit`},
		{strings.Repeat("9", 100), "too long"},
	} {
		got, err := Parse(tc.in)
		if err == nil {
			t.Errorf("Parse(%q) = %d, want an error", tc.in, got)
			continue
		}
		if !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "invalid size ") {
			t.Errorf("Parse(%q): error %q, want it to contain %q", tc.in, err, tc.msg)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{2 << 20, "2.00 MiB"},
		{13_064_770_840, "12.17 GiB"},
		{80 << 30, "80.00 GiB"},
		{1<<30 - 1, "1.00 GiB"}, // not "1024.00 MiB"
		{1 << 50, "1.00 PiB"},
		{math.MaxUint64, "16.00 EiB"},
	} {
		if got := Format(tc.in); got != tc.want {
			t.Errorf("Format(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFormatReadsBack(t *testing.T) {
	for _, n := range []uint64{0, 1, 1000, 4096, 123456789, 13_064_770_840, 80 << 30, 1 << 62} {
		s := Format(n)
		got, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(Format(%d) = %q): %v", n, s, err)
		}
		if d := math.Abs(float64(got) - float64(n)); d > 0.005*float64(n) {
			t.Errorf("Parse(Format(%d) = %q) = %d: off by %.0f", n, s, got, d)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"80GiB", "1.5GB", "1024", "0.1KiB", "18446744073709551615", "-1", "1e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n2, err := Parse(s + " "); err != nil || n2 != n {
			t.Errorf("Parse(%q) = %d but Parse(%q) = %d, %v", s, n, s+" ", n2, err)
		}
	})
}

// TestFormatUp: the figure typed back is never below n, and at most one
// unit of its last digit above; the sizes of a fit that Format rounds
// down (10.144 GiB shown as 10.14 GiB) come out one digit up.
func TestFormatUp(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{512, "512 B"},
		{2 << 20, "2.00 MiB"},
		{10388 << 20, "10.15 GiB"}, // 10.1445 GiB; Format says 10.14
		{10240 << 20, "10.00 GiB"},
		{(1 << 30) - 1, "1.00 GiB"}, // 1023.99... MiB: up to 1024.00 MiB, shown in GiB
		{928 << 20, "928.00 MiB"},
	} {
		if got := FormatUp(tc.in); got != tc.want {
			t.Errorf("FormatUp(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for n := uint64(1000); n < 1<<62; n += n/3 + 12345 {
		s := FormatUp(n)
		got, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(FormatUp(%d) = %q): %v", n, s, err)
		}
		if got < n || float64(got-n) > 0.0101*float64(n) {
			t.Errorf("Parse(FormatUp(%d) = %q) = %d: want at least n, within a digit", n, s, got)
		}
	}
}
