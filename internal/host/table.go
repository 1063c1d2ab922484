package host

import (
	"cmp"
	"github.com/gpumem/gpumem/device"
	"slices"
	"sync"

	"github.com/gpumem/gpumem"
)

// A table finds the Buffer behind a device address: a C caller frees by
// pointer alone. It is a hash table of its own rather than a Go map so that
// its cost is known and fixed: open addressing with linear probing and
// backward-shift deletion (no tombstones, so a long run of allocs and frees
// never degrades it), in shards with a lock each, so threads working on
// different buffers rarely meet. It allocates only when a shard grows.
//
// Invariants (per shard, under its lock):
//
//	len(slots) is a power of two, at least minSlots
//	n == the number of slots with key != 0, and n <= len(slots)*3/4
//	every key sits at or after its home slot with no empty slot between
type table struct {
	shards [tableShards]shard
}

const (
	tableShards = 64
	minSlots    = 64
)

type shard struct {
	mu    sync.Mutex
	slots []slot
	n     int
	_     [24]byte // one shard per cache line (8 + 24 + 8 + 24)
}

type slot struct {
	key uint64 // the device address; 0 marks an empty slot
	val entry
}

// entry is what the host keeps per live buffer.
type entry struct {
	buf    gpumem.Buffer
	pool   *privatePool // the private pool it came from (pools.go), nil for the device's allocator
	site   uint32       // the call site the host program gave (0: none), for the history (history.go)
	stream uint64       // the stream it was allocated on, for the history's free entries
	// rec is the buffer's request ID in the recording of generation
	// recGen, plus one; 0 when it was not recorded.
	rec    uint64
	recGen uint32
	// direct is a buffer the driver gave while the cache was off
	// (SetCaching): buf is zero then, and the free goes to the driver.
	direct *directBuffer
}

// directBuffer is an uncached buffer: a driver allocation of its own.
type directBuffer struct {
	ptr  device.Ptr
	size uint64
}

// hash mixes an address (512-aligned, so its low bits are zero) into 64
// well-spread bits: the low ones pick the shard, the rest the slot.
func hash(key uint64) uint64 {
	h := key >> 9
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

func (t *table) shardOf(key uint64) (*shard, uint64) {
	h := hash(key)
	return &t.shards[h%tableShards], h / tableShards
}

// put adds key; false if key is there already (the allocator handed out an
// address that is still live: a bug, which the caller reports).
func (t *table) put(key uint64, v entry) bool {
	s, h := t.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.n+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case 0:
			s.slots[i] = slot{key: key, val: v}
			s.n++
			return true
		case key:
			return false
		}
	}
}

// get returns key's entry.
func (t *table) get(key uint64) (entry, bool) {
	s, h := t.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.find(key, h); ok {
		return s.slots[i].val, true
	}
	return entry{}, false
}

// take removes key and returns its entry.
func (t *table) take(key uint64) (entry, bool) {
	s, h := t.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.find(key, h)
	if !ok {
		return entry{}, false
	}
	v := s.slots[i].val
	s.remove(i)
	return v, true
}

// len counts the entries (for tests and stats).
func (t *table) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

func (s *shard) find(key, h uint64) (uint64, bool) {
	if s.n == 0 || key == 0 {
		return 0, false
	}
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case 0:
			return 0, false
		case key:
			return i, true
		}
	}
}

// remove empties slot i and shifts back the keys after it that would
// otherwise be cut off from their home slots.
func (s *shard) remove(i uint64) {
	mask := uint64(len(s.slots) - 1)
	for j := (i + 1) & mask; s.slots[j].key != 0; j = (j + 1) & mask {
		home := (hash(s.slots[j].key) / tableShards) & mask
		// The key at j may move to i unless its home lies cyclically in
		// (i, j]: then i is before its home.
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = slot{}
	s.n--
}

func (s *shard) grow() {
	old := s.slots
	s.slots = make([]slot, max(minSlots, 2*len(old)))
	s.n = 0
	mask := uint64(len(s.slots) - 1)
	for _, sl := range old {
		if sl.key == 0 {
			continue
		}
		i := (hash(sl.key) / tableShards) & mask
		for s.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = sl
		s.n++
	}
}

// addrsOf returns the addresses of p's live buffers.
func (t *table) addrsOf(p *privatePool) []uint64 {
	var out []uint64
	t.eachOf(p, func(key uint64, _ *entry) { out = append(out, key) })
	return out
}

// entriesOf returns the entries of p's live buffers, in address order.
func (t *table) entriesOf(p *privatePool) []entry {
	var out []entry
	t.eachOf(p, func(_ uint64, e *entry) { out = append(out, *e) })
	slices.SortFunc(out, func(x, y entry) int { return cmp.Compare(x.buf.Ptr(), y.buf.Ptr()) })
	return out
}

// eachOf calls fn for each live buffer of p, shard by shard, under the
// shard's lock (fn must not call back into the table).
func (t *table) eachOf(p *privatePool, fn func(key uint64, e *entry)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if sl := &sh.slots[j]; sl.key != 0 && sl.val.pool == p {
				fn(sl.key, &sl.val)
			}
		}
		sh.mu.Unlock()
	}
}

// sites maps the address of every buffer that has a call site to it.
func (t *table) sites() map[uint64]uint32 {
	out := make(map[uint64]uint32)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, sl := range sh.slots {
			if sl.key != 0 && sl.val.site != 0 {
				out[sl.key] = sl.val.site
			}
		}
		sh.mu.Unlock()
	}
	return out
}
