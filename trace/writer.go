package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Writer writes a trace in the gpumem-trace v1 format. Its output is
// buffered: call Flush when done. A Writer is not safe for concurrent use.
type Writer struct {
	w     *bufio.Writer
	buf   []byte
	lastT uint64
}

// NewWriter returns a Writer to w, after writing the header line.
func NewWriter(w io.Writer) (*Writer, error) {
	tw := &Writer{w: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 96)}
	if _, err := tw.w.WriteString(headerLine); err != nil {
		return nil, err
	}
	return tw, nil
}

// Alloc writes the event "a id size stream tUS". It returns an error, and
// writes nothing, if size is 0 or above MaxSize or if tUS is before the time
// of the previous event.
func (w *Writer) Alloc(id, size, stream, tUS uint64) error {
	switch {
	case size == 0:
		return fmt.Errorf("trace: Alloc %d: size is 0", id)
	case size > MaxSize:
		return fmt.Errorf("trace: Alloc %d: size %d is larger than 1 PiB", id, size)
	}
	return w.write(Event{Kind: Alloc, ID: id, Size: size, Stream: stream, TimeUS: tUS})
}

// Free writes the event "f id tUS". It returns an error, and writes nothing,
// if tUS is before the time of the previous event.
func (w *Writer) Free(id, tUS uint64) error {
	return w.write(Event{Kind: Free, ID: id, TimeUS: tUS})
}

func (w *Writer) write(e Event) error {
	if e.TimeUS < w.lastT {
		return fmt.Errorf("trace: %s %d: time %d us is before the previous event's %d us", e.Kind, e.ID, e.TimeUS, w.lastT)
	}
	w.buf = append(appendEvent(w.buf[:0], e), '\n')
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	w.lastT = e.TimeUS
	return nil
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

// Create creates (or truncates) the file at path and returns a Writer to it
// that has written the header line. The file is gzip-compressed when path
// ends in ".gz". Close must be called to complete the file.
func Create(path string) (*FileWriter, error) {
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
	// NewWriter only buffers the header, so it cannot fail here.
	fw.Writer, _ = NewWriter(dst)
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
