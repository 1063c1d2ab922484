// Package units reads and writes byte sizes as people write them: "80GiB",
// "512MiB", "1.5GB". It serves the command line and the GPUMEM_CONFIG
// string of the C library alike.
package units

import (
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
)

// sizeUnits maps a unit, lower-cased, to its multiplier. The decimal units
// (KB, MB, ...) are powers of 1000, the binary ones (KiB, MiB, ...) powers
// of 1024. Single letters (K, M, G, ...) are refused as ambiguous.
var sizeUnits = map[string]uint64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"pb":  1e15,
	"eb":  1e18,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
	"pib": 1 << 50,
	"eib": 1 << 60,
}

// maxSizeLen bounds the text Parse looks at, so that a long string of
// digits costs nothing.
const maxSizeLen = 64

const sizeSyntax = "want a number of bytes with an optional unit, e.g. 80GiB, 512MiB, 1.5GB or 1024"

// Parse parses a size in bytes: a decimal number, optionally with a
// fraction, optionally followed by a unit: "1024", "80GiB", "512MiB",
// "1.5GB", "2 MiB". Units are B, the decimal KB, MB, GB, TB, PB, EB
// (powers of 1000) and the binary KiB, MiB, GiB, TiB, PiB, EiB (powers of
// 1024), in any letter case; single letters such as "G" are refused as
// ambiguous. A fraction of a byte is dropped ("1.5KiB" is 1536, "0.1KiB" is
// 102). Negative numbers, exponents, garbage and sizes above 2^64-1 bytes
// are errors.
func Parse(s string) (uint64, error) {
	n, err := ParseBare(s)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, err)
	}
	return n, nil
}

// parseSize is Parse with an error that does not repeat the input (the
// flag package quotes the value itself).
func ParseBare(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, errors.New("empty; " + sizeSyntax)
	case len(t) > maxSizeLen:
		return 0, errors.New("too long")
	case t[0] == '-':
		return 0, errors.New("negative")
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	whole, frac, dot := strings.Cut(num, ".")
	if whole == "" || dot && frac == "" || strings.Contains(frac, ".") {
		return 0, errors.New(sizeSyntax)
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		if len(unit) == 1 && strings.ContainsRune("kmgtpeKMGTPE", rune(unit[0])) {
			u := strings.ToUpper(unit)
			return 0, fmt.Errorf("ambiguous unit %q: write %siB (powers of 1024) or %sB (powers of 1000)", unit, u, u)
		}
		return 0, fmt.Errorf("unknown unit %q (want B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or EiB)", unit)
	}
	if frac == "" {
		v, err := strconv.ParseUint(whole, 10, 64)
		if err == nil {
			hi, lo := bits.Mul64(v, mult)
			if hi == 0 {
				return lo, nil
			}
		} else if !errors.Is(err, strconv.ErrRange) {
			return 0, errors.New(sizeSyntax)
		}
		return 0, errTooLarge
	}
	// Exact decimal arithmetic: (whole.frac * mult) rounded down.
	n, _ := new(big.Int).SetString(whole+frac, 10)
	n.Mul(n, new(big.Int).SetUint64(mult))
	n.Quo(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil))
	if n.BitLen() > 64 {
		return 0, errTooLarge
	}
	return n.Uint64(), nil
}

var errTooLarge = errors.New("too large (the most is 2^64-1 bytes, about 16 EiB)")

// FormatUp is Format rounded up to its last digit: Parse(FormatUp(n)) >= n,
// for a figure that must be at least n when typed back (a capacity that
// fits, given as a limit).
func FormatUp(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	const units = "KMGTPE"
	i, div := 0, uint64(1024)
	for i+1 < len(units) && n/div >= 1024 {
		i++
		div <<= 10
	}
	// hundredths of the unit, rounded up, in exact arithmetic.
	h := new(big.Int).Mul(new(big.Int).SetUint64(n), big.NewInt(100))
	d := new(big.Int).SetUint64(div)
	h.Add(h, new(big.Int).Sub(d, big.NewInt(1)))
	h.Quo(h, d)
	if h.Cmp(big.NewInt(102400)) >= 0 && i+1 < len(units) { // would print as 1024.00
		i++
		d.Lsh(d, 10)
		h = new(big.Int).Mul(new(big.Int).SetUint64(n), big.NewInt(100))
		h.Add(h, new(big.Int).Sub(d, big.NewInt(1)))
		h.Quo(h, d)
	}
	q, r := new(big.Int).QuoRem(h, big.NewInt(100), new(big.Int))
	return fmt.Sprintf("%s.%02d %ciB", q.String(), r.Int64(), units[i])
}

// Format writes n bytes in binary units with two decimals: "512 B",
// "2.00 MiB", "12.17 GiB". Parse reads it back (to within the
// rounding).
func Format(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	i, div := 0, uint64(1024)
	for i+1 < len(units) && n/div >= 1024 {
		i++
		div <<= 10
	}
	v := float64(n) / float64(div)
	if v >= 1023.995 && i+1 < len(units) { // would print as 1024.00
		i++
		v /= 1024
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " " + units[i:i+1] + "iB"
}
