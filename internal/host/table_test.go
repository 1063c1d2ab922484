package host

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem"
)

// TestTableAgainstMap drives the table and a Go map with the same random
// puts and takes, over few addresses so that probe runs collide and
// backward-shift deletion is exercised, and checks they always agree and
// that every shard keeps its invariants.
func TestTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab table
	model := map[uint64]uint64{}
	const keys = 5000
	for step := range 400_000 {
		key := (rng.Uint64N(keys) + 1) << 9
		if rng.IntN(2) == 0 {
			v := uint64(step)
			ok := tab.put(key, entry{rec: v})
			_, had := model[key]
			if ok == had {
				t.Fatalf("step %d: put(%#x) = %v, but the key was there: %v", step, key, ok, had)
			}
			if ok {
				model[key] = v
			}
		} else {
			e, ok := tab.take(key)
			v, had := model[key]
			if ok != had || ok && e.rec != v {
				t.Fatalf("step %d: take(%#x) = %d, %v; want %d, %v", step, key, e.rec, ok, v, had)
			}
			delete(model, key)
		}
		if step%50_000 == 0 {
			checkTable(t, &tab, model)
		}
	}
	checkTable(t, &tab, model)
	for k := range model {
		if _, ok := tab.take(k); !ok {
			t.Fatalf("take(%#x) of a live key failed", k)
		}
	}
	if n := tab.len(); n != 0 {
		t.Fatalf("%d entries left after taking every key", n)
	}
}

func checkTable(t *testing.T, tab *table, model map[uint64]uint64) {
	t.Helper()
	if n := tab.len(); n != len(model) {
		t.Fatalf("len %d, model %d", n, len(model))
	}
	for k, v := range model {
		if e, ok := tab.get(k); !ok || e.rec != v {
			t.Fatalf("get(%#x) = %d, %v; want %d", k, e.rec, ok, v)
		}
	}
	for i := range tab.shards {
		s := &tab.shards[i]
		if len(s.slots) == 0 {
			continue
		}
		mask := uint64(len(s.slots) - 1)
		n := 0
		for j, sl := range s.slots {
			if sl.key == 0 {
				continue
			}
			n++
			// No empty slot between the key's home and where it sits.
			for h := (hash(sl.key) / tableShards) & mask; h != uint64(j); h = (h + 1) & mask {
				if s.slots[h].key == 0 {
					t.Fatalf("shard %d: key %#x at slot %d is cut off from its home by an empty slot %d", i, sl.key, j, h)
				}
			}
		}
		if n != s.n || n*4 > len(s.slots)*3 || len(s.slots)&(len(s.slots)-1) != 0 {
			t.Fatalf("shard %d: %d keys counted, n=%d, %d slots", i, n, s.n, len(s.slots))
		}
	}
}

// BenchmarkTablePutTake is the table's share of a C alloc+free pair.
func BenchmarkTablePutTake(b *testing.B) {
	var tab table
	live := make([]uint64, 1024)
	for i := range live {
		live[i] = uint64(i+1) << 21
		tab.put(live[i], entry{buf: gpumem.Buffer{}})
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := uint64(i%4096+2048) << 12
		tab.put(k, entry{})
		tab.take(k)
	}
}
