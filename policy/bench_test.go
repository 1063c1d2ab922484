package policy

import (
	"testing"
)

// BenchmarkReplay replays each shipped trace under each policy: ns/op is
// one whole replay.
func BenchmarkReplay(b *testing.B) {
	for _, tr := range shipped(b) {
		for _, name := range Names() {
			b.Run(tr.Name+"/"+name, func(b *testing.B) {
				for b.Loop() {
					if _, err := Run(tr, name, anchorCapacity, false, Options{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
