//go:build race

package gpumem_test

// raceDetector: the tests run under the race detector (go test -race),
// which makes them 5-10 times slower; the longest ones do less then (the
// interleavings it checks come from their goroutines, not their length).
const raceDetector = true
