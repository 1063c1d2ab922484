package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

func (d *Device) checkGranular(what string, v uint64) error {
	if v&(d.gran-1) != 0 {
		return errf(device.ErrInvalid, "%s %#x is not a multiple of the granularity %#x", what, v, d.gran)
	}
	return nil
}

func (d *Device) checkSize(size uint64) error {
	if size == 0 {
		return errf(device.ErrInvalid, "size is 0")
	}
	return d.checkGranular("size", size)
}

// checkRange checks a granular range [p, p+size) and returns its end.
func (d *Device) checkRange(p, size uint64) (uint64, error) {
	if err := d.checkSize(size); err != nil {
		return 0, err
	}
	if err := d.checkGranular("address", p); err != nil {
		return 0, err
	}
	end, ok := rangeEnd(p, size)
	if !ok {
		return 0, errf(device.ErrInvalid, "range [%#x, +%#x) overflows the address space", p, size)
	}
	return end, nil
}

// Reserve reserves size bytes of address space aligned to align. align 0
// means the granularity; otherwise it must be a power of two, and alignments
// below the granularity are raised to it.
func (d *Device) Reserve(size, align uint64) (device.Ptr, error) {
	d.mu.Lock()
	p, err := d.reserve(size, align)
	d.mu.Unlock()
	if err != nil {
		return 0, &device.OpError{Op: "sim.Reserve", Args: fmt.Sprintf("size=%d, align=%d", size, align), Err: err}
	}
	return p, nil
}

func (d *Device) reserve(size, align uint64) (device.Ptr, error) {
	if err := d.fault(opReserve); err != nil {
		return 0, err
	}
	if err := d.checkSize(size); err != nil {
		return 0, err
	}
	if align&(align-1) != 0 {
		return 0, errf(device.ErrInvalid, "alignment %#x is not a power of two", align)
	}
	if align < d.gran {
		align = d.gran
	}
	if align > vaPart || size > vaPart {
		return 0, errf(device.ErrOutOfMemory, "simulated virtual address space too small for size %#x, alignment %#x", size, align)
	}
	p := roundUp(d.nextVA, align) // nextVA < 1<<63, align <= vaPart: no overflow
	if p > d.vaEnd || size+d.gran > d.vaEnd-p {
		return 0, errf(device.ErrOutOfMemory, "simulated virtual address space exhausted")
	}
	d.nextVA = p + size + d.gran
	d.resv.insert(p, resvRec{size: size})
	d.st.Reserves++
	d.st.ReservedAddress += size
	return device.Ptr(p), nil
}

// ReleaseAddress gives back the whole reservation [p, p+size); nothing may
// be mapped in it.
func (d *Device) ReleaseAddress(p device.Ptr, size uint64) error {
	d.mu.Lock()
	err := d.releaseAddress(uint64(p), size)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.ReleaseAddress", Args: fmt.Sprintf("p=%#x, size=%d", uint64(p), size), Err: err}
	}
	return nil
}

func (d *Device) releaseAddress(p, size uint64) error {
	if err := d.fault(opReleaseAddress); err != nil {
		return err
	}
	if _, err := d.checkRange(p, size); err != nil {
		return err
	}
	i := d.resv.find(p)
	if i == 0 {
		if j := d.resv.floor(p); j != 0 && p < d.resv.key(j)+d.resv.val(j).size {
			return errf(device.ErrInvalid, "%#x is inside the reservation [%#x, %#x), not its start",
				p, d.resv.key(j), d.resv.key(j)+d.resv.val(j).size)
		}
		return errf(device.ErrInvalid, "no reservation starts at %#x (never reserved, or already released)", p)
	}
	r := d.resv.val(i)
	if r.size != size {
		return errf(device.ErrInvalid, "the reservation at %#x has size %#x, not %#x: release whole reservations", p, r.size, size)
	}
	if r.mappings != 0 {
		return errf(device.ErrInvalid, "releasing the address range [%#x, %#x) with %d mapping(s) still in it", p, p+size, r.mappings)
	}
	d.resv.remove(p)
	d.st.AddressReleases++
	d.st.ReservedAddress -= size
	return nil
}

// Create creates a physical chunk of size bytes, charging size.
func (d *Device) Create(size uint64) (device.Handle, error) {
	d.mu.Lock()
	h, err := d.create(size)
	d.mu.Unlock()
	if err != nil {
		return 0, &device.OpError{Op: "sim.Create", Args: fmt.Sprintf("size=%d", size), Err: err}
	}
	return h, nil
}

func (d *Device) create(size uint64) (device.Handle, error) {
	if err := d.fault(opCreate); err != nil {
		return 0, err
	}
	if err := d.checkSize(size); err != nil {
		return 0, err
	}
	if err := d.charge(size); err != nil {
		return 0, err
	}
	d.nextH++
	d.handles[d.nextH] = handleRec{size: size}
	d.st.Creates++
	return d.nextH, nil
}

// Release gives back chunk h. Its memory is freed now if it is not mapped,
// or at its last Unmap otherwise. Releasing a handle twice is an error.
func (d *Device) Release(h device.Handle) error {
	d.mu.Lock()
	err := d.release(h)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Release", Args: fmt.Sprintf("h=%d", h), Err: err}
	}
	return nil
}

func (d *Device) handleErr(h device.Handle) error {
	if h != 0 && h <= d.nextH {
		return errf(device.ErrInvalid, "handle %d was already released", h)
	}
	return errf(device.ErrInvalid, "unknown handle %d", h)
}

func (d *Device) release(h device.Handle) error {
	if err := d.fault(opRelease); err != nil {
		return err
	}
	r, ok := d.handles[h]
	if !ok {
		return d.handleErr(h)
	}
	if r.released {
		return errf(device.ErrInvalid, "handle %d was already released (its memory is freed when its %d mapping(s) are unmapped)", h, r.mapCount)
	}
	if r.mapCount == 0 {
		delete(d.handles, h)
		d.used -= r.size
	} else {
		r.released = true
		d.handles[h] = r
	}
	d.st.Releases++
	return nil
}

// Map maps the whole chunk h at [p, p+size), which must lie inside one
// reservation and overlap no mapping. A chunk may be mapped at several
// addresses.
func (d *Device) Map(p device.Ptr, size uint64, h device.Handle) error {
	d.mu.Lock()
	err := d.mapChunk(uint64(p), size, h)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Map", Args: fmt.Sprintf("p=%#x, size=%d, h=%d", uint64(p), size, h), Err: err}
	}
	return nil
}

func (d *Device) mapChunk(p, size uint64, h device.Handle) error {
	if err := d.fault(opMap); err != nil {
		return err
	}
	end, err := d.checkRange(p, size)
	if err != nil {
		return err
	}
	hr, ok := d.handles[h]
	if !ok {
		return d.handleErr(h)
	}
	if hr.released {
		return errf(device.ErrInvalid, "handle %d has been released and may not be mapped again", h)
	}
	if hr.size != size {
		return errf(device.ErrInvalid, "size %#x is not the size %#x of chunk %d (Map maps whole chunks)", size, hr.size, h)
	}
	ri := d.resv.floor(p)
	if ri == 0 || p >= d.resv.key(ri)+d.resv.val(ri).size {
		return errf(device.ErrInvalid, "mapping [%#x, %#x) outside any reservation", p, end)
	}
	rs := d.resv.key(ri)
	if re := rs + d.resv.val(ri).size; end > re {
		return errf(device.ErrInvalid, "mapping [%#x, %#x) runs past the end of the reservation [%#x, %#x)", p, end, rs, re)
	}
	if mi := d.maps.floor(end - 1); mi != 0 {
		ms := d.maps.key(mi)
		if me := ms + d.maps.val(mi).size; me > p {
			return errf(device.ErrInvalid, "mapping [%#x, %#x) over the mapped range [%#x, %#x) (handle %d)",
				p, end, ms, me, d.maps.val(mi).h)
		}
	}
	d.resv.val(ri).mappings++
	hr.mapCount++
	d.handles[h] = hr
	d.maps.insert(p, mapRec{size: size, h: h, resv: rs})
	d.st.Maps++
	d.st.Mapped += size
	return nil
}

// SetAccess enables read-write access to [p, p+size), which must consist of
// whole, contiguous mappings.
func (d *Device) SetAccess(p device.Ptr, size uint64) error {
	d.mu.Lock()
	err := d.setAccess(uint64(p), size)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.SetAccess", Args: fmt.Sprintf("p=%#x, size=%d", uint64(p), size), Err: err}
	}
	return nil
}

func (d *Device) setAccess(p, size uint64) error {
	if err := d.fault(opSetAccess); err != nil {
		return err
	}
	end, err := d.checkRange(p, size)
	if err != nil {
		return err
	}
	// Check the whole range before changing anything.
	for cur := p; cur < end; {
		mi := d.maps.find(cur)
		if mi == 0 {
			if j := d.maps.floor(cur); j != 0 && cur < d.maps.key(j)+d.maps.val(j).size {
				return errf(device.ErrInvalid, "range [%#x, %#x) starts inside the mapping [%#x, %#x): SetAccess covers whole mappings",
					p, end, d.maps.key(j), d.maps.key(j)+d.maps.val(j).size)
			}
			return errf(device.ErrInvalid, "range [%#x, %#x) covers unmapped memory at %#x", p, end, cur)
		}
		next := cur + d.maps.val(mi).size
		if next > end {
			return errf(device.ErrInvalid, "range [%#x, %#x) ends inside the mapping [%#x, %#x): SetAccess covers whole mappings",
				p, end, cur, next)
		}
		cur = next
	}
	for cur := p; cur < end; {
		m := d.maps.val(d.maps.find(cur))
		m.access = true
		cur += m.size
	}
	d.st.SetAccessCalls++
	return nil
}

// Unmap unmaps [p, p+size), which must be exactly one earlier Map, and which
// no pending Touch work may use. If the chunk was released and this was its
// last mapping, its memory is freed.
func (d *Device) Unmap(p device.Ptr, size uint64) error {
	d.mu.Lock()
	err := d.unmap(uint64(p), size)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Unmap", Args: fmt.Sprintf("p=%#x, size=%d", uint64(p), size), Err: err}
	}
	return nil
}

func (d *Device) unmap(p, size uint64) error {
	if err := d.fault(opUnmap); err != nil {
		return err
	}
	end, err := d.checkRange(p, size)
	if err != nil {
		return err
	}
	mi := d.maps.find(p)
	if mi == 0 {
		if j := d.maps.floor(p); j != 0 && p < d.maps.key(j)+d.maps.val(j).size {
			return errf(device.ErrInvalid, "unmapping [%#x, %#x), which is not exactly one mapping: it starts inside the mapping [%#x, %#x)",
				p, end, d.maps.key(j), d.maps.key(j)+d.maps.val(j).size)
		}
		return errf(device.ErrInvalid, "unmapping [%#x, %#x), which is not exactly one mapping: nothing is mapped at %#x", p, end, p)
	}
	m := *d.maps.val(mi)
	if m.size != size {
		return errf(device.ErrInvalid, "unmapping [%#x, %#x), which is not exactly one mapping: the mapping at %#x is [%#x, %#x)",
			p, end, p, p, p+m.size)
	}
	if err := d.checkIdle(p, size); err != nil {
		return err
	}
	d.maps.remove(p)
	d.resv.val(d.resv.find(m.resv)).mappings--
	hr := d.handles[m.h]
	hr.mapCount--
	if hr.released && hr.mapCount == 0 {
		delete(d.handles, m.h)
		d.used -= hr.size
	} else {
		d.handles[m.h] = hr
	}
	d.st.Unmaps++
	d.st.Mapped -= size
	return nil
}

// Accessible reports whether every byte of [p, p+size) is either mapped
// with access enabled by SetAccess, or inside a live plain allocation (its
// requested size, not the rounded charge). It is false for size 0.
func (d *Device) Accessible(p device.Ptr, size uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.inaccessible(uint64(p), size)
	return ok
}

// inaccessible returns (0, true) if [p, p+size) is accessible, or the first
// inaccessible address and false.
func (d *Device) inaccessible(p, size uint64) (uint64, bool) {
	end, ok := rangeEnd(p, size)
	if !ok || size == 0 {
		return p, false
	}
	if i := d.allocs.floor(p); i != 0 {
		if ae := d.allocs.key(i) + d.allocs.val(i).size; p < ae {
			if end <= ae {
				return 0, true
			}
			return ae, false // allocations are never adjacent
		}
	}
	mi := d.maps.floor(p)
	if mi == 0 || p >= d.maps.key(mi)+d.maps.val(mi).size {
		return p, false
	}
	cur := d.maps.key(mi)
	for {
		m := d.maps.val(mi)
		if !m.access {
			if cur < p {
				cur = p
			}
			return cur, false
		}
		cur += m.size
		if cur >= end {
			return 0, true
		}
		if mi = d.maps.find(cur); mi == 0 {
			return cur, false
		}
	}
}
