package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/device"
)

// A Scope owns the buffers allocated through it. Close frees everything it
// still owns and reports what leaked: the deterministic "close the session
// and the memory is gone". Scopes nest: a child's buffers count against
// every ancestor's quota, and closing a scope closes its children first.
//
// Invariant: used == Σ requested bytes of the buffers of this scope and its
// open children; used <= quota when quota > 0.
type Scope struct {
	a      *Allocator
	parent *Scope
	name   string
	quota  uint64 // 0: none
	used   atomic.Uint64

	mu       sync.Mutex // guards the fields below and the sprev/snext links of owned blocks
	head     *block
	n        int
	children []*Scope
	closed   bool
}

// NewScope makes a top-level scope. quota caps the bytes its buffers (and its
// children's) may hold at once; 0 means no quota.
func (a *Allocator) NewScope(name string, quota uint64) *Scope {
	return &Scope{a: a, name: name, quota: quota}
}

// NewScope makes a child scope.
func (s *Scope) NewScope(name string, quota uint64) (*Scope, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: scope %s", ErrClosed, s.Name())
	}
	c := &Scope{a: s.a, parent: s, name: name, quota: quota}
	s.children = append(s.children, c)
	return c, nil
}

// Name is the scope's path from the top-level scope, "outer/inner".
func (s *Scope) Name() string {
	if s.parent == nil {
		return s.name
	}
	return s.parent.Name() + "/" + s.name
}

// Used is the bytes requested by the buffers the scope (and its children)
// hold now.
func (s *Scope) Used() uint64 { return s.used.Load() }

// Alloc allocates a buffer owned by the scope.
func (s *Scope) Alloc(size uint64, st device.Stream) (Buffer, error) {
	if size == 0 || size > maxRequest {
		return Buffer{}, fmt.Errorf("%w: Scope.Alloc(%d) in scope %s: want 1 to %d bytes", ErrInvalidSize, size, s.Name(), uint64(maxRequest))
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return Buffer{}, fmt.Errorf("%w: Alloc(%d) in closed scope %s", ErrClosed, size, s.Name())
	}
	if err := s.charge(size); err != nil {
		return Buffer{}, err
	}
	buf, err := s.a.alloc(size, st, s)
	if err != nil {
		s.uncharge(size)
		return Buffer{}, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = s.a.free(buf, "Alloc", s)
		return Buffer{}, fmt.Errorf("%w: scope %s closed during Alloc", ErrClosed, s.Name())
	}
	b := buf.b
	b.sprev, b.snext = nil, s.head
	if s.head != nil {
		s.head.sprev = b
	}
	s.head = b
	s.n++
	s.mu.Unlock()
	return buf, nil
}

// Free frees a buffer of the scope (Allocator.Free does the same).
func (s *Scope) Free(buf Buffer) error { return s.a.free(buf, "Free", nil) }

// charge takes size from the quota of s and every ancestor, or fails with
// an OutOfMemoryError of cause CauseQuota naming the scope that refused.
func (s *Scope) charge(size uint64) error {
	for x := s; x != nil; x = x.parent {
		for {
			u := x.used.Load()
			if x.quota > 0 && u+size > x.quota {
				for y := s; y != x; y = y.parent {
					y.used.Add(-size)
				}
				a := s.a
				a.c.ooms.Add(1)
				return a.quotaError(size, x, u)
			}
			if x.used.CompareAndSwap(u, u+size) {
				break
			}
		}
	}
	return nil
}

func (s *Scope) uncharge(size uint64) {
	for x := s; x != nil; x = x.parent {
		x.used.Add(-size)
	}
}

// unlink removes b from the scope's list (called with b's pool locked).
// When the scope itself is closing (closing == s) the list is already
// detached.
func (s *Scope) unlink(b *block, closing *Scope) {
	s.uncharge(b.req)
	if closing == s {
		return
	}
	s.mu.Lock()
	if !s.closed {
		if b.sprev != nil {
			b.sprev.snext = b.snext
		} else {
			s.head = b.snext
		}
		if b.snext != nil {
			b.snext.sprev = b.sprev
		}
		s.n--
	}
	b.sprev, b.snext = nil, nil
	s.mu.Unlock()
}

// Close closes the children, then frees every buffer the scope still owns.
// If any were left, it returns a *LeakError (matching ErrLeak) that lists
// them, with their allocation sites when Config.RecordSites is set. Closing
// twice is a no-op.
func (s *Scope) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	children := s.children
	s.children = nil
	s.mu.Unlock()
	var leaks []LeakedBuffer
	var errs []error
	for _, c := range children {
		if err := c.Close(); err != nil {
			var le *LeakError
			if errors.As(err, &le) {
				leaks = append(leaks, le.Buffers...)
			} else {
				errs = append(errs, err)
			}
		}
	}
	// Detach the list under the scope's lock; read and free the blocks
	// outside it (Free locks pool then scope, so Close must never hold the
	// scope's lock while taking a pool's).
	s.mu.Lock()
	s.closed = true
	blocks := make([]*block, 0, s.n)
	for b := s.head; b != nil; b = b.snext {
		blocks = append(blocks, b)
	}
	s.head, s.n = nil, 0
	s.mu.Unlock()
	type owned struct {
		buf  Buffer
		leak LeakedBuffer
	}
	list := make([]owned, 0, len(blocks))
	for _, b := range blocks {
		p := b.pool
		p.mu.Lock() // a concurrent Free may have taken it already
		if b.state == blockAllocated && b.scope == s {
			list = append(list, owned{Buffer{ptr: device.Ptr(b.addr), size: b.req, b: b, gen: b.gen}, p.leakOf(b)})
		}
		p.mu.Unlock()
	}
	for _, o := range list {
		if err := s.a.free(o.buf, "Scope.Close", s); err == nil {
			leaks = append(leaks, o.leak)
		}
	}
	if s.parent != nil {
		s.parent.forget(s)
	}
	if len(leaks) > 0 {
		errs = append([]error{&LeakError{Owner: "scope " + s.Name(), Buffers: leaks}}, errs...)
	}
	return errors.Join(errs...)
}

func (s *Scope) forget(c *Scope) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.children {
		if x == c {
			s.children = append(s.children[:i], s.children[i+1:]...)
			return
		}
	}
}

// LeakedBuffer describes a buffer still allocated when its owner closed.
type LeakedBuffer struct {
	Ptr    uint64
	Size   uint64 // requested
	Stream uint64
	Scope  string
	Age    time.Duration // since allocation, when sites are recorded
	Site   string        // "func file:line" frames, when sites are recorded
	buf    Buffer
}

// LeakError lists the buffers an owner (a scope or the allocator) still held
// when it closed. They have been freed. It matches ErrLeak.
type LeakError struct {
	Owner   string
	Buffers []LeakedBuffer
}

func (e *LeakError) Is(target error) bool { return target == ErrLeak }

func (e *LeakError) Error() string {
	var total uint64
	for _, b := range e.Buffers {
		total += b.Size
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "gpumem: %s closed with %d buffers (%s) still allocated; freed them", e.Owner, len(e.Buffers), fmtBytes(total))
	for i, b := range e.Buffers {
		if i == 10 {
			fmt.Fprintf(&sb, "\n\t... and %d more", len(e.Buffers)-10)
			break
		}
		fmt.Fprintf(&sb, "\n\t0x%x %d bytes stream %d", b.Ptr, b.Size, b.Stream)
		if b.Scope != "" {
			fmt.Fprintf(&sb, " scope %s", b.Scope)
		}
		if b.Site != "" {
			fmt.Fprintf(&sb, " allocated %s ago at %s", b.Age.Round(time.Millisecond), b.Site)
		}
	}
	return sb.String()
}

func (p *pool) leakOf(b *block) LeakedBuffer {
	l := LeakedBuffer{Ptr: b.addr, Size: b.req, Stream: uint64(b.stream()),
		buf: Buffer{ptr: device.Ptr(b.addr), size: b.req, b: b, gen: b.gen}}
	if b.scope != nil {
		l.Scope = b.scope.Name()
	}
	if site := b.site(); site != nil {
		l.Site = formatSite(site)
		l.Age = time.Duration(time.Now().UnixNano() - b.x.created)
	}
	return l
}

// callers records the caller of the public Alloc (skipping gpumem frames).
func callers() []uintptr {
	pcs := make([]uintptr, 16)
	n := runtime.Callers(3, pcs)
	return pcs[:n]
}

func formatSite(pcs []uintptr) string {
	frames := runtime.CallersFrames(pcs)
	var parts []string
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "github.com/gpumem/gpumem.") || strings.HasSuffix(f.File, "_test.go") {
			parts = append(parts, fmt.Sprintf("%s %s:%d", f.Function, shortFile(f.File), f.Line))
			if len(parts) == 3 {
				break
			}
		}
		if !more {
			break
		}
	}
	return strings.Join(parts, " ← ")
}

func shortFile(f string) string {
	if i := strings.LastIndex(f, "/"); i >= 0 {
		if j := strings.LastIndex(f[:i], "/"); j >= 0 {
			return f[j+1:]
		}
	}
	return f
}
