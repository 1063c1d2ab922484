//go:build !race

package gpumem_test

const raceDetector = false // see race_on_test.go
