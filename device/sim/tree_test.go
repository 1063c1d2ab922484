package sim

import (
	"math/rand"
	"sort"
	"testing"
)

// TestTreeAgainstReference checks the treap against a sorted slice under a
// long random sequence of inserts, removes and lookups.
func TestTreeAgainstReference(t *testing.T) {
	var tr tree[int]
	ref := map[uint64]int{}
	rng := rand.New(rand.NewSource(1))
	keys := func() []uint64 {
		ks := make([]uint64, 0, len(ref))
		for k := range ref {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
		return ks
	}
	for step := 0; step < 20000; step++ {
		k := uint64(rng.Intn(2000)) * 8
		switch rng.Intn(3) {
		case 0:
			if _, ok := ref[k]; !ok {
				tr.insert(k, step)
				ref[k] = step
			}
		case 1:
			_, ok := ref[k]
			if got := tr.remove(k); got != ok {
				t.Fatalf("step %d: remove(%d) = %v, want %v", step, k, got, ok)
			}
			delete(ref, k)
		case 2:
			q := k + uint64(rng.Intn(16))
			ks := keys()
			i := sort.Search(len(ks), func(i int) bool { return ks[i] > q })
			var wantFloor uint64
			hasFloor := i > 0
			if hasFloor {
				wantFloor = ks[i-1]
			}
			f := tr.floor(q)
			if (f != 0) != hasFloor || (hasFloor && (tr.key(f) != wantFloor || *tr.val(f) != ref[wantFloor])) {
				t.Fatalf("step %d: floor(%d) wrong", step, q)
			}
			j := sort.Search(len(ks), func(i int) bool { return ks[i] >= q })
			c := tr.ceil(q)
			if (c != 0) != (j < len(ks)) || (c != 0 && tr.key(c) != ks[j]) {
				t.Fatalf("step %d: ceil(%d) wrong", step, q)
			}
			_, ok := ref[q]
			if (tr.find(q) != 0) != ok {
				t.Fatalf("step %d: find(%d) wrong", step, q)
			}
		}
		if tr.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, tr.len(), len(ref))
		}
	}
	var got []uint64
	tr.each(func(k uint64, v *int) bool {
		if *v != ref[k] {
			t.Fatalf("value of %d is %d, want %d", k, *v, ref[k])
		}
		got = append(got, k)
		return true
	})
	want := keys()
	if len(got) != len(want) {
		t.Fatalf("each visited %d keys, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("each order: got[%d]=%d, want %d", i, got[i], want[i])
		}
	}
	// The arena recycles nodes: its size is bounded by the high-water mark.
	if len(tr.nodes) > 2001 {
		t.Fatalf("arena grew to %d nodes for at most 2000 live keys", len(tr.nodes))
	}
}
