package gpumem

// CheckSearch makes a compare every answer of its search for backed memory
// (findBacked) with the one-scan search's (findFewest), and panic on a
// difference, as Config.CheckInvariants does, without the whole-structure
// checker (which walks every chunk after every operation: too slow for
// whole traces).
func CheckSearch(a *Allocator) { a.checkSearch = true }

// SearchCounts sums the search counters of a's pools (pool.search).
func SearchCounts(a *Allocator) (finds, fewest, placements, cached uint64) {
	for _, p := range a.allPools() {
		p.mu.Lock()
		finds += p.search.finds
		fewest += p.search.fewest
		placements += p.search.placements
		cached += p.search.cached
		p.mu.Unlock()
	}
	return
}

// SizeDown is sizeDown, for its test.
var SizeDown = sizeDown
