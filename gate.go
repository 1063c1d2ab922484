package gpumem

// A Gate keeps every other thread's work off the device while the
// allocator moves live memory (issue 41). Moving a live buffer copies its
// bytes to new physical memory and maps that at the same address; a kernel
// another thread launches meanwhile on the old memory would have its
// writes lost with no error. `gpumem run`'s preload shim hands out every
// driver entry point that submits work through a gate (shim/c/gate.c) and
// gives gpumem that gate. It refuses to close in a process that reaches
// the driver other than by name: the CUDA runtime (so PyTorch, cuBLAS,
// cuDNN, NCCL) launches through cuGetExportTable's private tables, which
// it cannot see into, so there no move is ever made.
//
// With a gate the allocator gathers on the way to an out-of-memory as
// Config.Gather does, each split with the gate closed, without being asked
// to: a request that would fail is the only one that moves memory, and
// everywhere else the default stays move-free. Config.Gather and
// Config.Defrag close a gate too where there is one.
type Gate interface {
	// Close returns nil once no other thread is inside a call that submits
	// work to the device and none can enter one; an error means moves are
	// off (a call the gate cannot see, memory exported, a call that did not
	// return in time), the gate stays open and Open is not called.
	Close() error
	// Open lets work be submitted again.
	Open()
}

// SetGate gives the allocator a gate (nil: none). It applies in
// ModeVirtual on a device that can copy (device.Copier); elsewhere it
// changes nothing.
func (a *Allocator) SetGate(g Gate) {
	if g == nil {
		a.gate.Store(nil)
		return
	}
	a.gate.Store(&g)
}

// gated reports whether moves on the way to an out-of-memory are the
// allocator's to make: a gate, a copier, virtual memory, not Compact.
func (a *Allocator) gated() bool {
	return a.gate.Load() != nil && a.canMove()
}

// gathers reports whether the allocator gathers on the way to an
// out-of-memory: Config.Gather, or a gate.
func (a *Allocator) gathers() bool { return a.gather || a.gated() }

// canMove: the allocator could split spans at all (defrag.go).
func (a *Allocator) canMove() bool {
	return a.copier != nil && a.mode == ModeVirtual && !a.compact
}

// closeGate closes the allocator's gate, if it has one, and returns what
// reopens it; ok is false when the gate refused (no move then).
func (a *Allocator) closeGate() (open func(), ok bool) {
	g := a.gate.Load()
	if g == nil {
		return func() {}, true
	}
	if err := (*g).Close(); err != nil {
		a.c.gateRefusals.Add(1)
		a.gateErr.Store(&err)
		return nil, false
	}
	return (*g).Open, true
}
