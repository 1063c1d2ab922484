// Package invariants reports whether expensive invariant checks are on:
// built with the gpumem_invariants tag. (Not with -race alone: the
// checker walks every chunk, which would make race runs of whole traces crawl;
// the race tests turn Config.CheckInvariants on themselves.)
package invariants
