//go:build race

package longtest

const raceEnabled = true
