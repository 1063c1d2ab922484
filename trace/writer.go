package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Format is a version of the trace format a Writer writes (see the package
// documentation).
type Format int

const (
	V1 Format = 1 // IDs and times written out: the exchange format
	V2 Format = 2 // IDs implicit, times as deltas: a third to a quarter of V1's size gzipped
)

// ParseFormat returns the format named "v1" or "v2", and false for any
// other name.
func ParseFormat(name string) (Format, bool) {
	switch name {
	case "v1":
		return V1, true
	case "v2":
		return V2, true
	}
	return 0, false
}

// Writer writes a trace in the gpumem-trace v1 or v2 format. Its output is
// buffered: call Flush when done. A Writer is not safe for concurrent use.
type Writer struct {
	w      *bufio.Writer
	buf    []byte
	lastT  uint64
	sites  map[uint32]bool // the sites written
	v2     bool
	allocs uint64 // v2: Alloc events written, the next request's ID
}

// NewWriter returns a Writer of v1 to w, after writing the header line.
func NewWriter(w io.Writer) (*Writer, error) { return NewWriterFormat(w, V1) }

// NewWriterFormat returns a Writer of format f to w, after writing the
// header line. A V2 Writer takes requests numbered in order from 0, as
// every recorder numbers them: an Alloc of another ID is an error.
func NewWriterFormat(w io.Writer, f Format) (*Writer, error) {
	if f != V1 && f != V2 {
		return nil, fmt.Errorf("trace: unknown format %d", f)
	}
	tw := &Writer{w: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 96), v2: f == V2}
	line := headerLine
	if tw.v2 {
		line = headerLineV2
	}
	if _, err := tw.w.WriteString(line); err != nil {
		return nil, err
	}
	return tw, nil
}

// Alloc writes the event "a id size stream tUS". It returns an error, and
// writes nothing, if size is 0 or above MaxSize or if tUS is before the time
// of the previous event.
func (w *Writer) Alloc(id, size, stream, tUS uint64) error {
	return w.AllocSite(id, size, stream, tUS, 0)
}

// AllocSite writes the event "a id size stream tUS site", or, for site 0,
// the same without a site, as Alloc does. It returns an error, and writes
// nothing, where Alloc would and if site is not 0 and was not written
// before with Site.
func (w *Writer) AllocSite(id, size, stream, tUS uint64, site uint32) error {
	switch {
	case size == 0:
		return fmt.Errorf("trace: Alloc %d: size is 0", id)
	case size > MaxSize:
		return fmt.Errorf("trace: Alloc %d: size %d is larger than 1 PiB", id, size)
	case site != 0 && !w.sites[site]:
		return fmt.Errorf("trace: Alloc %d: site %d is not defined (write it with Site first)", id, site)
	case w.v2 && id != w.allocs:
		return fmt.Errorf("trace: Alloc %d: a v2 trace numbers requests in order; want %d", id, w.allocs)
	}
	return w.write(Event{Kind: Alloc, ID: id, Size: size, Stream: stream, TimeUS: tUS, Site: site})
}

// Site writes the line "s site text", which defines site for the Alloc
// events after it. It returns an error, and writes nothing, if site is 0 or
// was written before, or if text is empty, longer than MaxSiteText, not
// valid UTF-8, holds a newline or a carriage return, or starts or ends with
// a space or a tab (a Reader would not read it back the same).
func (w *Writer) Site(site uint32, text string) error {
	var fault string
	switch {
	case site == 0:
		fault = "sites are numbered from 1"
	case w.sites[site]:
		fault = "already written"
	case text == "":
		fault = "the text is empty"
	case len(text) > MaxSiteText:
		fault = fmt.Sprintf("the text of %d bytes is longer than %d", len(text), MaxSiteText)
	case strings.ContainsAny(text, "\n\r"):
		fault = "the text holds a line break"
	case isBlank(text[0]) || isBlank(text[len(text)-1]):
		fault = "the text starts or ends with a space or a tab"
	case !utf8.ValidString(text):
		fault = "the text is not valid UTF-8"
	}
	if fault != "" {
		return fmt.Errorf("trace: Site %d: %s", site, fault)
	}
	w.buf = append(appendSite(w.buf[:0], site, text), '\n')
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	if w.sites == nil {
		w.sites = make(map[uint32]bool)
	}
	w.sites[site] = true
	return nil
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

// Free writes the event "f id tUS". It returns an error, and writes nothing,
// if tUS is before the time of the previous event, or in v2 if id was not
// allocated.
func (w *Writer) Free(id, tUS uint64) error {
	if w.v2 && id >= w.allocs {
		return fmt.Errorf("trace: Free %d: request %d was never allocated", id, id)
	}
	return w.write(Event{Kind: Free, ID: id, TimeUS: tUS})
}

// Trim writes the line "t tUS": the program emptied the allocator's cache
// here. It returns an error, and writes nothing, if tUS is before the time
// of the previous event.
func (w *Writer) Trim(tUS uint64) error {
	if tUS < w.lastT {
		return fmt.Errorf("trace: t: time %d us is before the previous event's %d us", tUS, w.lastT)
	}
	t := tUS
	if w.v2 {
		t -= w.lastT
	}
	w.buf = strconv.AppendUint(append(w.buf[:0], 't', ' '), t, 10)
	w.buf = append(w.buf, '\n')
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	w.lastT = tUS
	return nil
}

func (w *Writer) write(e Event) error {
	if e.TimeUS < w.lastT {
		return fmt.Errorf("trace: %s %d: time %d us is before the previous event's %d us", e.Kind, e.ID, e.TimeUS, w.lastT)
	}
	if w.v2 {
		w.buf = append(appendEventV2(w.buf[:0], e, w.allocs, w.lastT), '\n')
	} else {
		w.buf = append(appendEvent(w.buf[:0], e), '\n')
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	w.lastT = e.TimeUS
	if e.Kind == Alloc {
		w.allocs++
	}
	return nil
}

// appendEventV2 appends e as a v2 line, without the newline: allocs Alloc
// events and an event at lastT came before it.
func appendEventV2(b []byte, e Event, allocs, lastT uint64) []byte {
	b = append(b, byte(e.Kind), ' ')
	if e.Kind == Alloc {
		b = strconv.AppendUint(b, e.Size, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.Stream, 10)
	} else {
		b = strconv.AppendUint(b, allocs-1-e.ID, 10)
	}
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.TimeUS-lastT, 10)
	if e.Kind == Alloc && e.Site != 0 {
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Site), 10)
	}
	return b
}

// Flush writes any buffered data to the underlying io.Writer.
func (w *Writer) Flush() error { return w.w.Flush() }

// FileWriter is a Writer to a file, returned by Create.
type FileWriter struct {
	*Writer
	f      *os.File
	gz     *gzip.Writer // nil for a plain file
	closed bool
}

// Create creates (or truncates) the file at path and returns a Writer of v1
// to it that has written the header line. The file is gzip-compressed when
// path ends in ".gz". Close must be called to complete the file.
func Create(path string) (*FileWriter, error) { return CreateFormat(path, V1) }

// CreateFormat is Create for a trace of format f.
func CreateFormat(path string, format Format) (*FileWriter, error) {
	if format != V1 && format != V2 {
		return nil, fmt.Errorf("trace: unknown format %d", format)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	fw := &FileWriter{f: f}
	var dst io.Writer = f
	if strings.HasSuffix(path, ".gz") {
		fw.gz = gzip.NewWriter(f)
		dst = fw.gz
	}
	// NewWriterFormat only buffers the header, so it cannot fail here.
	fw.Writer, _ = NewWriterFormat(dst, format)
	return fw, nil
}

// Close flushes the Writer, ends the gzip stream if any and closes the file.
// It returns the first error among them.
func (fw *FileWriter) Close() error {
	if fw.closed {
		return errors.New("trace: FileWriter already closed")
	}
	fw.closed = true
	err := fw.Flush()
	if fw.gz != nil {
		if e := fw.gz.Close(); err == nil {
			err = e
		}
	}
	if e := fw.f.Close(); err == nil {
		err = e
	}
	return err
}
