//go:build !race

package longtest

const raceEnabled = false
