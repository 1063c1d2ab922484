package sim

// tree is an ordered map from uint64 keys to values of type V.
//
// It is a treap whose nodes live in one slice, linked by index rather than by
// pointer, and are recycled through a free list: once the slice has grown to
// the high-water mark, inserts and deletes allocate nothing and give the
// garbage collector nothing to scan. Every operation is expected O(log n).
// Priorities come from a fixed-seed generator, so the shape of the tree (and
// thus everything about it) is deterministic.
//
// The zero tree is ready to use. Index 0 is the nil node. An index returned
// by find, floor or ceil stays valid until the next insert or remove.
type tree[V any] struct {
	nodes []tnode[V] // nodes[0] is the nil sentinel
	root  int32
	free  int32 // head of the free list, linked through left
	n     int
	rng   uint64
}

type tnode[V any] struct {
	key         uint64
	prio        uint64
	left, right int32
	val         V
}

func (t *tree[V]) len() int { return t.n }

// key and val access node i (i != 0).
func (t *tree[V]) key(i int32) uint64 { return t.nodes[i].key }
func (t *tree[V]) val(i int32) *V     { return &t.nodes[i].val }

func (t *tree[V]) newNode(key uint64, v V) int32 {
	if t.nodes == nil {
		t.nodes = make([]tnode[V], 1, 64)
		t.rng = 0x9E3779B97F4A7C15
	}
	// xorshift64*: cheap, deterministic priorities.
	t.rng ^= t.rng >> 12
	t.rng ^= t.rng << 25
	t.rng ^= t.rng >> 27
	prio := t.rng * 2685821657736338717
	var i int32
	if t.free != 0 {
		i = t.free
		t.free = t.nodes[i].left
	} else {
		t.nodes = append(t.nodes, tnode[V]{})
		i = int32(len(t.nodes) - 1)
	}
	t.nodes[i] = tnode[V]{key: key, prio: prio, val: v}
	return i
}

// insert adds key with value v. The key must not be present.
func (t *tree[V]) insert(key uint64, v V) {
	x := t.newNode(key, v)
	t.root = t.ins(t.root, x)
	t.n++
}

func (t *tree[V]) ins(r, x int32) int32 {
	if r == 0 {
		return x
	}
	nx, nr := &t.nodes[x], &t.nodes[r]
	if nx.prio > nr.prio {
		nx.left, nx.right = t.split(r, nx.key)
		return x
	}
	if nx.key < nr.key {
		l := t.ins(nr.left, x)
		t.nodes[r].left = l
	} else {
		rr := t.ins(nr.right, x)
		t.nodes[r].right = rr
	}
	return r
}

// split splits the subtree r into the keys < key and the keys >= key.
func (t *tree[V]) split(r int32, key uint64) (int32, int32) {
	if r == 0 {
		return 0, 0
	}
	if t.nodes[r].key < key {
		l, rr := t.split(t.nodes[r].right, key)
		t.nodes[r].right = l
		return r, rr
	}
	l, rr := t.split(t.nodes[r].left, key)
	t.nodes[r].left = rr
	return l, r
}

// merge joins subtrees a and b, every key of a being less than every key of b.
func (t *tree[V]) merge(a, b int32) int32 {
	if a == 0 {
		return b
	}
	if b == 0 {
		return a
	}
	if t.nodes[a].prio > t.nodes[b].prio {
		m := t.merge(t.nodes[a].right, b)
		t.nodes[a].right = m
		return a
	}
	m := t.merge(a, t.nodes[b].left)
	t.nodes[b].left = m
	return b
}

// remove deletes key and reports whether it was present.
func (t *tree[V]) remove(key uint64) bool {
	var parent int32
	left := false
	r := t.root
	for r != 0 && t.nodes[r].key != key {
		parent = r
		if key < t.nodes[r].key {
			left, r = true, t.nodes[r].left
		} else {
			left, r = false, t.nodes[r].right
		}
	}
	if r == 0 {
		return false
	}
	m := t.merge(t.nodes[r].left, t.nodes[r].right)
	switch {
	case parent == 0:
		t.root = m
	case left:
		t.nodes[parent].left = m
	default:
		t.nodes[parent].right = m
	}
	t.nodes[r] = tnode[V]{left: t.free}
	t.free = r
	t.n--
	return true
}

// find returns the node with exactly key, or 0.
func (t *tree[V]) find(key uint64) int32 {
	r := t.root
	for r != 0 {
		k := t.nodes[r].key
		switch {
		case key < k:
			r = t.nodes[r].left
		case key > k:
			r = t.nodes[r].right
		default:
			return r
		}
	}
	return 0
}

// floor returns the node with the greatest key <= key, or 0.
func (t *tree[V]) floor(key uint64) int32 {
	var best int32
	r := t.root
	for r != 0 {
		if t.nodes[r].key <= key {
			best, r = r, t.nodes[r].right
		} else {
			r = t.nodes[r].left
		}
	}
	return best
}

// ceil returns the node with the least key >= key, or 0.
func (t *tree[V]) ceil(key uint64) int32 {
	var best int32
	r := t.root
	for r != 0 {
		if t.nodes[r].key >= key {
			best, r = r, t.nodes[r].left
		} else {
			r = t.nodes[r].right
		}
	}
	return best
}

// each calls fn for every node in key order until fn returns false.
func (t *tree[V]) each(fn func(key uint64, v *V) bool) {
	t.walk(t.root, fn)
}

func (t *tree[V]) walk(r int32, fn func(key uint64, v *V) bool) bool {
	if r == 0 {
		return true
	}
	return t.walk(t.nodes[r].left, fn) &&
		fn(t.nodes[r].key, &t.nodes[r].val) &&
		t.walk(t.nodes[r].right, fn)
}
