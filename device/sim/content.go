package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// The content model. A simulated device holds no bytes, but it keeps the
// words that Poke writes into mapped physical chunks, by chunk and offset,
// so that tests can check that memory moved from one chunk to another
// (Copy) still reads back what was written through its address. Only
// mapped chunks with access can be written, read or copied, as on a GPU.

// Poke writes the word v at address p, which must lie in a mapping with
// access; the word belongs to the chunk mapped there, at p's offset in it.
func (d *Device) Poke(p device.Ptr, v uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, off, err := d.translate(uint64(p), 1)
	if err != nil {
		return &device.OpError{Op: "sim.Poke", Args: fmt.Sprintf("p=%#x", uint64(p)), Err: err}
	}
	hr := d.handles[h]
	if hr.words == nil {
		hr.words = make(map[uint64]uint64)
		d.handles[h] = hr
	}
	hr.words[off] = v
	return nil
}

// Peek reads the word at address p (see Poke): ok is false if none was
// written there.
func (d *Device) Peek(p device.Ptr) (v uint64, ok bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, off, err := d.translate(uint64(p), 1)
	if err != nil {
		return 0, false, &device.OpError{Op: "sim.Peek", Args: fmt.Sprintf("p=%#x", uint64(p)), Err: err}
	}
	v, ok = d.handles[h].words[off]
	return v, ok, nil
}

// Copy copies n bytes from src to dst: the words written in [src, src+n)
// replace those in [dst, dst+n). Each range must lie inside one mapping
// with access, the two must not overlap, and no pending Touch work may use
// either.
func (d *Device) Copy(dst, src device.Ptr, n uint64) error {
	d.mu.Lock()
	err := d.copyRange(uint64(dst), uint64(src), n)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Copy", Args: fmt.Sprintf("dst=%#x, src=%#x, n=%d", uint64(dst), uint64(src), n), Err: err}
	}
	return nil
}

func (d *Device) copyRange(dst, src, n uint64) error {
	if err := d.fault(opCopy); err != nil {
		return err
	}
	if n == 0 {
		return errf(device.ErrInvalid, "size is 0")
	}
	if dst < src+n && src < dst+n {
		return errf(device.ErrInvalid, "the ranges overlap")
	}
	sh, soff, err := d.translate(src, n)
	if err != nil {
		return err
	}
	dh, doff, err := d.translate(dst, n)
	if err != nil {
		return err
	}
	for _, r := range [2]uint64{src, dst} {
		if err := d.checkIdle(r, n); err != nil {
			return err
		}
	}
	dr := d.handles[dh]
	for off := range dr.words {
		if off >= doff && off < doff+n {
			delete(dr.words, off)
		}
	}
	for off, v := range d.handles[sh].words {
		if off >= soff && off < soff+n {
			if dr.words == nil {
				dr.words = make(map[uint64]uint64)
				d.handles[dh] = dr
			}
			dr.words[off-soff+doff] = v
		}
	}
	d.st.Copies++
	d.st.CopiedBytes += n
	return nil
}

// translate finds the chunk and offset behind [p, p+n), which must lie
// inside one mapping with access.
func (d *Device) translate(p, n uint64) (device.Handle, uint64, error) {
	mi := d.maps.floor(p)
	if mi == 0 || p >= d.maps.key(mi)+d.maps.val(mi).size {
		return 0, 0, errf(device.ErrInvalid, "nothing is mapped at %#x", p)
	}
	ms, m := d.maps.key(mi), d.maps.val(mi)
	if p+n > ms+m.size || p+n < p {
		return 0, 0, errf(device.ErrInvalid, "[%#x, %#x) runs past the mapping [%#x, %#x)", p, p+n, ms, ms+m.size)
	}
	if !m.access {
		return 0, 0, errf(device.ErrInvalid, "the mapping [%#x, %#x) has no access", ms, ms+m.size)
	}
	return m.h, p - ms, nil
}
