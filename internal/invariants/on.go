//go:build gpumem_invariants

package invariants

// Enabled is true: every allocator operation runs the whole-structure checker.
const Enabled = true
