package main

// treap is an ordered set of (size, addr) keys: the free blocks of a space,
// for best fit (ceil). A randomized binary search tree in one slice, nodes
// recycled through a free list.
type treap struct {
	nodes []node
	root  int32 // -1 for empty once used; 0 before (see init)
	spare []int32
	seed  uint64
	ready bool
}

type node struct {
	size, addr  uint64
	prio        uint64
	left, right int32
}

func less(s1, a1, s2, a2 uint64) bool { return s1 < s2 || (s1 == s2 && a1 < a2) }

func (t *treap) init() {
	if !t.ready {
		t.root, t.seed, t.ready = -1, 0x9e3779b97f4a7c15, true
	}
}

func (t *treap) rand() uint64 {
	t.seed ^= t.seed << 13
	t.seed ^= t.seed >> 7
	t.seed ^= t.seed << 17
	return t.seed
}

// split cuts the tree at n into keys < (size, addr) and keys >= it.
func (t *treap) split(n int32, size, addr uint64) (int32, int32) {
	if n < 0 {
		return -1, -1
	}
	x := &t.nodes[n]
	if less(x.size, x.addr, size, addr) {
		l, r := t.split(x.right, size, addr)
		t.nodes[n].right = l
		return n, r
	}
	l, r := t.split(x.left, size, addr)
	t.nodes[n].left = r
	return l, n
}

// merge joins two trees whose keys are all ordered l < r.
func (t *treap) merge(l, r int32) int32 {
	if l < 0 {
		return r
	}
	if r < 0 {
		return l
	}
	if t.nodes[l].prio > t.nodes[r].prio {
		t.nodes[l].right = t.merge(t.nodes[l].right, r)
		return l
	}
	t.nodes[r].left = t.merge(l, t.nodes[r].left)
	return r
}

func (t *treap) insert(size, addr uint64) {
	t.init()
	var i int32
	if n := len(t.spare); n > 0 {
		i = t.spare[n-1]
		t.spare = t.spare[:n-1]
	} else {
		t.nodes = append(t.nodes, node{})
		i = int32(len(t.nodes) - 1)
	}
	t.nodes[i] = node{size: size, addr: addr, prio: t.rand(), left: -1, right: -1}
	l, r := t.split(t.root, size, addr)
	t.root = t.merge(t.merge(l, i), r)
}

func (t *treap) delete(size, addr uint64) {
	t.init()
	l, r := t.split(t.root, size, addr)
	// r's smallest key is (size, addr): cut it off.
	m, rest := t.split(r, size, addr+1)
	if m >= 0 {
		t.spare = append(t.spare, m)
	}
	t.root = t.merge(l, rest)
}

// ceil returns the smallest key with size >= size.
func (t *treap) ceil(size uint64) (addr, bsize uint64, ok bool) {
	t.init()
	for n := t.root; n >= 0; {
		x := &t.nodes[n]
		if x.size >= size {
			addr, bsize, ok = x.addr, x.size, true
			n = x.left
		} else {
			n = x.right
		}
	}
	return
}
