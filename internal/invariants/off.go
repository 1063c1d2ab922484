//go:build !gpumem_invariants

package invariants

// Enabled is false: checks run only where Config.CheckInvariants asks.
const Enabled = false
