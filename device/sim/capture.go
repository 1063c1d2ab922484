package sim

import (
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Graph capture, simulated. BeginCapture puts a stream in capture mode,
// JoinCapture adds another stream to the same capture, or joins one of its
// streams to another (as an event recorded on a capturing stream and waited
// on by another does on a GPU), EndCapture ends it.
//
// The capture builds a graph as the driver's does: each Touch on a
// capturing stream adds a node that depends on the stream's terminals (the
// nodes its next work will depend on), and becomes its only terminal; a
// stream that joins another takes the other's terminals too.
// device.CaptureGraph reads it (CaptureTerminals, NodeParents). While a stream captures, the operations the driver refuses there
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

// Graph nodes of every capture, by number (from 1): each node's parents.
// Kept after the capture ends, as a graph's nodes outlive its capture.
type graphNodes struct {
	parents [][]device.Node // [n-1]: the parents of node n
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
	st.terminals = st.terminals[:0]
	d.captures[st.capture] = &capture{streams: 1}
	return st.capture
}

// JoinCapture makes stream s wait for the work captured so far on stream
// of: a stream outside any capture becomes part of of's (a fork: its
// terminals are of's), a stream of the same capture adds of's terminals
// to its own (a join). It panics if of does not capture, or s captures
// something else.
func (d *Device) JoinCapture(s, of device.Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	o, oerr := d.live(of)
	if err != nil || oerr != nil || o.capture == 0 || st.capture != 0 && st.capture != o.capture {
		panic(fmt.Sprintf("sim: JoinCapture(%d, %d): not a capturing stream, or capturing another", s, of))
	}
	if st.capture == 0 {
		st.capture = o.capture
		d.captures[o.capture].streams++
		st.terminals = append(st.terminals[:0], o.terminals...)
		return
	}
	for _, n := range o.terminals {
		if !slices.Contains(st.terminals, n) {
			st.terminals = append(st.terminals, n)
		}
	}
}

// addNode adds a node to st's capture graph after st's terminals, and
// makes it st's only terminal. Called with d.mu held, st capturing.
func (d *Device) addNode(st *stream) {
	d.graph.parents = append(d.graph.parents, slices.Clone(st.terminals))
	st.terminals = append(st.terminals[:0], device.Node(len(d.graph.parents)))
}

// CaptureTerminals returns the nodes the next work captured on s will
// depend on, appended to buf, the id of its capture and whether s
// captures. device.CaptureGraph.
func (d *Device) CaptureTerminals(s device.Stream, buf []device.Node) ([]device.Node, uint64, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	if err != nil {
		return buf, 0, false, &device.OpError{Op: "sim.CaptureTerminals", Args: fmt.Sprintf("s=%d", s), Err: err}
	}
	if st.capture == 0 {
		return buf, 0, false, nil
	}
	d.st.GraphQueries++
	return append(buf, st.terminals...), st.capture, true, nil
}

// NodeParents appends the nodes n depends on to buf. device.CaptureGraph.
func (d *Device) NodeParents(n device.Node, buf []device.Node) ([]device.Node, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n == 0 || uint64(n) > uint64(len(d.graph.parents)) {
		return buf, &device.OpError{Op: "sim.NodeParents", Args: fmt.Sprintf("n=%d", n), Err: errf(device.ErrInvalid, "no such graph node")}
	}
	d.st.GraphQueries++
	return append(buf, d.graph.parents[n-1]...), nil
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
	st.terminals = st.terminals[:0]
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
