package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// Graph capture, simulated. BeginCapture puts a stream in capture mode,
// JoinCapture adds another stream to the same capture (as an event recorded
// on a capturing stream and waited on by another does on a GPU), EndCapture
// ends it. While a stream captures, the operations the driver refuses there
// fail with device.ErrCapturing and break the capture, as the driver's do:
// an event recorded on the stream, the stream made to wait for an event,
// a synchronize of the stream, a synchronize of the device (which breaks
// every capture). EndCapture then reports the capture broken, so that a
// test sees an allocator that did any of these. Memory calls are allowed:
// the allocator makes them in relaxed capture mode (device/cuda).

// capture is one capture sequence.
type capture struct {
	streams int   // streams in it
	broken  error // the first operation that broke it
}

// BeginCapture starts a capture on stream s and returns its id. It panics if
// s does not exist or already captures (a test's mistake).
func (d *Device) BeginCapture(s device.Stream) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	if err != nil || st.capture != 0 {
		panic(fmt.Sprintf("sim: BeginCapture(%d): stream missing or already capturing", s))
	}
	if d.captures == nil {
		d.captures = make(map[uint64]*capture)
	}
	d.nextCapture++
	st.capture = d.nextCapture
	d.captures[st.capture] = &capture{streams: 1}
	return st.capture
}

// JoinCapture makes stream s part of the capture of stream of. It panics if
// of does not capture or s already does.
func (d *Device) JoinCapture(s, of device.Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	o, oerr := d.live(of)
	if err != nil || oerr != nil || st.capture != 0 || o.capture == 0 {
		panic(fmt.Sprintf("sim: JoinCapture(%d, %d): not a capturing stream, or already capturing", s, of))
	}
	st.capture = o.capture
	d.captures[o.capture].streams++
}

// EndCapture takes stream s out of its capture; when s was the last stream
// in it, the capture ends. It returns the error that broke the capture, if
// an operation did (the driver's cuStreamEndCapture fails then).
func (d *Device) EndCapture(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	if err != nil || st.capture == 0 {
		panic(fmt.Sprintf("sim: EndCapture(%d): not capturing", s))
	}
	c := d.captures[st.capture]
	c.streams--
	if c.streams == 0 {
		delete(d.captures, st.capture)
	}
	st.capture = 0
	return c.broken
}

// CaptureInfo reports whether s captures, and the id of its capture.
// device.Capture.
func (d *Device) CaptureInfo(s device.Stream) (bool, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	if err != nil {
		return false, 0, &device.OpError{Op: "sim.CaptureInfo", Args: fmt.Sprintf("s=%d", s), Err: err}
	}
	return st.capture != 0, st.capture, nil
}

// refuseCaptured fails op if st captures, breaking the capture. Called with
// d.mu held.
func (d *Device) refuseCaptured(st *stream, op string) error {
	if st == nil || st.capture == 0 {
		return nil
	}
	err := &device.OpError{Op: op, Args: fmt.Sprintf("s=%d", st.id), Err: device.ErrCapturing}
	if c := d.captures[st.capture]; c.broken == nil {
		c.broken = err
	}
	d.st.CaptureViolations++
	return err
}

// refuseAnyCapture fails op if any stream captures, breaking every capture.
// Called with d.mu held.
func (d *Device) refuseAnyCapture(op string) error {
	if len(d.captures) == 0 {
		return nil
	}
	err := &device.OpError{Op: op, Err: device.ErrCapturing}
	for _, c := range d.captures {
		if c.broken == nil {
			c.broken = err
		}
	}
	d.st.CaptureViolations++
	return err
}
