package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"maps"
	"os"
	"slices"
	"testing"
)

func FuzzRead(f *testing.F) {
	seeds := []string{
		"",
		hdr,
		hdr + "a 0 154389504 0 4\na 1 3145728 0 31442\nf 1 31502\n",
		hdr + "a 0 1 0 0\nf 0 1\nf 0 2\n",
		hdr + "a 5 1 7 0\n# c\n\na 18446744073709551615 1125899906842624 3 9\nf 5 10",
		hdr + "a 0 1 0 0\r\nf 1 1\r\n",
		hdr + "a 0 0 0 0\n",
		hdr + "a 0 -1 0 0\n",
		"# gpumem-trace v2\n",
		"# gpumem-trace v3\n",
		hdr2 + "s 3 f x.py:1\na 4096 0 5\na 512 7 2 3\nf 1 0\nt 4\na 8 0 1\nf 1 10\nf 0 0\n",
		hdr2 + "a 1 0 18446744073709551615\nt 3\nf 5 0\n",
		hdr + "s 1 forward model.py:10 < <module> train.py:3\na 0 10 0 0 1\ns 7 g\ta.py:2  \na 1 2 0 1 7\nf 0 2\na 2 3 0 2\n",
		hdr + "s 4294967295 x\na 0 1 0 0 4294967295\ns 1 \xc3\xa9\n",
		hdr + "s 1 f\ns 1 g\n",
		hdr + "a 0 1 0 0 3\n",
		hdr + "s 0 f\ns 2\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Add(gzipBytes(f, []byte(seeds[2])))
	// The start of a real trace, plain and compressed.
	if file, err := os.Open(traceDir + "/sweep_create_dispose.trace.gz"); err == nil {
		if zr, err := gzip.NewReader(file); err == nil {
			var head bytes.Buffer
			sc := bufio.NewScanner(zr)
			for i := 0; i < 60 && sc.Scan(); i++ {
				head.Write(sc.Bytes())
				head.WriteByte('\n')
			}
			f.Add(head.Bytes())
			f.Add(gzipBytes(f, head.Bytes()))
		}
		file.Close()
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Read(bytes.NewReader(data), "fuzz")
		if err != nil {
			// In-memory input cannot fail to read: every error is a
			// syntax error.
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("error %v does not match ErrSyntax", err)
			}
			var se *SyntaxError
			if !errors.As(err, &se) || se.Line < 1 {
				t.Fatalf("error %v: no line number", err)
			}
			return
		}
		if len(tr.Slot) != len(tr.Events) {
			t.Fatalf("%d slots for %d events", len(tr.Slot), len(tr.Events))
		}
		var buf bytes.Buffer
		w, err := NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, site := range slices.Sorted(maps.Keys(tr.Sites)) {
			if err := w.Site(site, tr.Sites[site]); err != nil {
				t.Fatalf("writing a site the reader accepted: %v", err)
			}
		}
		writeEvents(t, w, tr.Events)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		tr2, err := Read(&buf, "fuzz")
		if err != nil {
			t.Fatalf("reading back what Writer wrote: %v", err)
		}
		if !slices.Equal(tr.Events, tr2.Events) {
			t.Fatalf("round trip changed the events\n%v\n%v", tr.Events, tr2.Events)
		}
		if !slices.Equal(tr.Slot, tr2.Slot) || tr.Requests != tr2.Requests ||
			tr.PeakLiveBytes != tr2.PeakLiveBytes || !slices.Equal(tr.Streams, tr2.Streams) ||
			!maps.Equal(tr.Sites, tr2.Sites) {
			t.Fatal("round trip changed the summary")
		}
	})
}
