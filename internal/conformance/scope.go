package conformance

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// leakError unwraps err as a *LeakError, failing the test if it is not one.
func leakError(t *testing.T, err error) *gpumem.LeakError {
	t.Helper()
	if !errors.Is(err, gpumem.ErrLeak) {
		t.Fatalf("want an error matching ErrLeak, got %v", err)
	}
	var le *gpumem.LeakError
	if !errors.As(err, &le) {
		t.Fatalf("want a *LeakError, got %T: %v", err, err)
	}
	return le
}

// testScopeClose: closing a scope frees what it still owns and reports it,
// with allocation sites when RecordSites is set; the scope is closed after.
func testScopeClose(t *testing.T, s *suite) {
	e := s.newEnv(t, func(c *gpumem.Config) { c.RecordSites = true })
	sc := e.a.NewScope("job", 0)
	if sc.Name() != "job" {
		t.Errorf("Name %q, want job", sc.Name())
	}
	b1 := e.scopeAlloc(sc, 1000, 0)
	b2 := e.scopeAlloc(sc, 4*kiB, 0)
	b3 := e.scopeAlloc(sc, 3*miB, 0)
	other := e.alloc(8*kiB, 0) // not in the scope
	if err := sc.Free(b2); err != nil {
		t.Fatal(err)
	}
	delete(e.live, b2.Ptr())
	e.verify("Scope.Free")
	if u := sc.Used(); u != 1000+3*miB {
		t.Errorf("Used %d, want %d", u, 1000+3*miB)
	}
	le := leakError(t, e.closeScope(sc))
	if len(le.Buffers) != 2 || !strings.Contains(le.Owner, "job") {
		t.Fatalf("LeakError %+v, want 2 buffers of scope job", le)
	}
	want := map[device.Ptr]uint64{b1.Ptr(): b1.Size(), b3.Ptr(): b3.Size()}
	for _, l := range le.Buffers {
		if want[device.Ptr(l.Ptr)] != l.Size || l.Scope != "job" || l.Stream != 0 {
			t.Errorf("leaked buffer %+v does not match what the scope owned", l)
		}
		if l.Site == "" || !strings.Contains(l.Site, "conformance") || l.Age < 0 {
			t.Errorf("leaked buffer 0x%x: site %q, age %v; want the site in this suite", l.Ptr, l.Site, l.Age)
		}
	}
	if !strings.Contains(le.Error(), "job") || !strings.Contains(le.Error(), "2 buffers") {
		t.Errorf("leak report: %q", le.Error())
	}
	if u := sc.Used(); u != 0 {
		t.Errorf("Used after Close: %d", u)
	}
	// The scope is closed: its buffers are gone, it allocates nothing.
	expectBufferError(t, e.a.Free(b1), gpumem.ErrDoubleFree)
	before := e.stats()
	if _, err := sc.Alloc(4*kiB, 0); !errors.Is(err, gpumem.ErrClosed) {
		t.Errorf("Alloc on a closed scope: %v, want ErrClosed", err)
	}
	after := e.stats()
	if after.LiveBuffers != before.LiveBuffers || after.Allocated != before.Allocated || sc.Used() != 0 {
		t.Errorf("Alloc on a closed scope left a buffer or a charge: %+v, used %d", after, sc.Used())
	}
	e.verify("Alloc on a closed scope")
	if _, err := sc.NewScope("child", 0); !errors.Is(err, gpumem.ErrClosed) {
		t.Errorf("NewScope on a closed scope: %v, want ErrClosed", err)
	}
	if err := sc.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// A scope with nothing left closes without error.
	sc2 := e.a.NewScope("tidy", 0)
	x := e.scopeAlloc(sc2, 4*kiB, 0)
	if err := sc2.Free(x); err != nil {
		t.Fatal(err)
	}
	delete(e.live, x.Ptr())
	if err := e.closeScope(sc2); err != nil {
		t.Errorf("Close of an empty scope: %v", err)
	}
	e.free(other)
	e.finish()
}

// testScopeQuota: a scope's quota refuses requests with CauseQuota and the
// numbers, and counts an OOM; a request that fits exactly is served.
func testScopeQuota(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	sc := e.a.NewScope("q", miB)
	b1 := e.scopeAlloc(sc, 600*kiB, 0)
	before := e.stats()
	_, err := e.tryScopeAlloc(sc, 600*kiB, 0)
	oe := oomError(t, err)
	after := e.stats()
	if oe.Cause != gpumem.CauseQuota || oe.Scope != "q" || oe.Limit != miB || oe.Requested != 600*kiB || oe.Allocated != 600*kiB {
		t.Errorf("quota error: %+v", oe)
	}
	if !strings.Contains(err.Error(), "q") || !strings.Contains(err.Error(), "quota") {
		t.Errorf("quota error message: %q", err)
	}
	if after.OOMs != before.OOMs+1 || after.Allocs != before.Allocs || after.Reserved != before.Reserved {
		t.Errorf("quota refusal: stats %+v → %+v", before, after)
	}
	if u := sc.Used(); u != 600*kiB {
		t.Errorf("Used after a refusal: %d, want %d", u, 600*kiB)
	}
	b2 := e.scopeAlloc(sc, miB-600*kiB, 0) // exactly to the quota
	if u := sc.Used(); u != miB {
		t.Errorf("Used %d, want %d", u, miB)
	}
	e.free(b1)
	if u := sc.Used(); u != miB-600*kiB {
		t.Errorf("Used after Free %d, want %d", u, miB-600*kiB)
	}
	e.free(b2)
	if err := e.closeScope(sc); err != nil {
		t.Errorf("Close: %v", err)
	}
	e.finish()
}

// testScopeNested: a child's buffers count against every ancestor's quota;
// the scope that refuses is named; a refusal charges nothing anywhere.
func testScopeNested(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	parent := e.a.NewScope("parent", miB)
	child, err := parent.NewScope("child", 2*miB) // looser than its parent
	if err != nil {
		t.Fatal(err)
	}
	tight, err := parent.NewScope("tight", 100*kiB)
	if err != nil {
		t.Fatal(err)
	}
	if child.Name() != "parent/child" {
		t.Errorf("Name %q, want parent/child", child.Name())
	}
	c1 := e.scopeAlloc(child, 800*kiB, 0)
	if parent.Used() != 800*kiB || child.Used() != 800*kiB {
		t.Errorf("Used: parent %d, child %d; want %d each", parent.Used(), child.Used(), 800*kiB)
	}
	for _, sc := range []*gpumem.Scope{child, parent} {
		_, err := e.tryScopeAlloc(sc, 300*kiB, 0)
		oe := oomError(t, err)
		if oe.Cause != gpumem.CauseQuota || oe.Scope != "parent" || oe.Limit != miB {
			t.Errorf("Alloc in %s over the parent's quota: %+v, want the parent named", sc.Name(), oe)
		}
	}
	_, err = e.tryScopeAlloc(tight, 150*kiB, 0)
	if oe := oomError(t, err); oe.Scope != "parent/tight" || oe.Limit != 100*kiB {
		t.Errorf("Alloc over the child's own quota: %+v", oe)
	}
	if parent.Used() != 800*kiB || child.Used() != 800*kiB || tight.Used() != 0 {
		t.Errorf("refusals charged: parent %d, child %d, tight %d", parent.Used(), child.Used(), tight.Used())
	}
	t1 := e.scopeAlloc(tight, 100*kiB, 0)
	if parent.Used() != 900*kiB {
		t.Errorf("parent Used %d, want %d", parent.Used(), 900*kiB)
	}
	e.free(c1)
	e.free(t1)
	if parent.Used() != 0 || child.Used() != 0 || tight.Used() != 0 {
		t.Errorf("after freeing all: parent %d, child %d, tight %d", parent.Used(), child.Used(), tight.Used())
	}
	if err := e.closeScope(parent); err != nil {
		t.Errorf("Close: %v", err)
	}
	e.finish()
}

// testScopeParentClosesChildren: closing a scope closes its descendants
// first and reports their buffers too.
func testScopeParentClosesChildren(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	p := e.a.NewScope("p", 0)
	c, err := p.NewScope("c", 0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.NewScope("g", 0)
	if err != nil {
		t.Fatal(err)
	}
	e.scopeAlloc(p, 1*kiB, 0)
	e.scopeAlloc(c, 2*kiB, 0)
	e.scopeAlloc(g, 3*miB, 0)
	e.scopeAlloc(g, 5*kiB, 0)
	keep := e.alloc(4*kiB, 0)
	le := leakError(t, e.closeScope(p))
	scopes := map[string]int{}
	for _, l := range le.Buffers {
		scopes[l.Scope]++
	}
	if len(le.Buffers) != 4 || scopes["p"] != 1 || scopes["p/c"] != 1 || scopes["p/c/g"] != 2 {
		t.Errorf("closing the parent reported %v, want 1 in p, 1 in p/c, 2 in p/c/g", scopes)
	}
	for _, sc := range []*gpumem.Scope{p, c, g} {
		if _, err := sc.Alloc(4*kiB, 0); !errors.Is(err, gpumem.ErrClosed) {
			t.Errorf("Alloc in %s after the parent closed: %v, want ErrClosed", sc.Name(), err)
		}
		if sc.Used() != 0 {
			t.Errorf("%s Used %d after Close", sc.Name(), sc.Used())
		}
		if err := sc.Close(); err != nil {
			t.Errorf("Close of %s again: %v", sc.Name(), err)
		}
	}
	e.verify("closing the scopes")
	e.free(keep)
	e.finish()
}

// testScopeFreeThroughAllocator: freeing a scope's buffer through the
// allocator detaches it from the scope.
func testScopeFreeThroughAllocator(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	sc := e.a.NewScope("detach", 2*miB)
	b1 := e.scopeAlloc(sc, miB, 0)
	b2 := e.scopeAlloc(sc, 512*kiB, 0)
	e.free(b1)
	if u := sc.Used(); u != 512*kiB {
		t.Errorf("Used %d after Allocator.Free, want %d", u, 512*kiB)
	}
	b3 := e.scopeAlloc(sc, 1536*kiB, 0) // fits only if b1 was uncharged
	e.free(b2)
	e.free(b3)
	if err := e.closeScope(sc); err != nil {
		t.Errorf("Close after every buffer was freed through the allocator: %v", err)
	}
	e.finish()
}

// testScopeInvalidSize: a scope refuses a size of 0 or an absurd size as
// ErrInvalidSize, even when the size would also break its quota, and
// charges nothing.
func testScopeInvalidSize(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	sc := e.a.NewScope("inv", miB)
	before := e.stats()
	for _, n := range []uint64{0, 1 << 60} {
		_, err := sc.Alloc(n, 0)
		if !errors.Is(err, gpumem.ErrInvalidSize) {
			t.Errorf("Scope.Alloc(%d): %v, want ErrInvalidSize", n, err)
		}
		if sc.Used() != 0 {
			t.Errorf("Scope.Alloc(%d) left %d charged", n, sc.Used())
		}
	}
	if after := e.stats(); after.OOMs != before.OOMs {
		t.Errorf("invalid sizes counted %d OOMs", after.OOMs-before.OOMs)
	}
	e.verify("invalid sizes")
	if err := e.closeScope(sc); err != nil {
		t.Error(err)
	}
	e.finish()
}
