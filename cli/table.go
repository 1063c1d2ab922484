package cli

import (
	"bufio"
	"io"
	"strings"
	"unicode/utf8"
)

// table is a text table: the first column left-aligned, the others
// right-aligned, columns two spaces apart, no trailing spaces.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) write(w io.Writer) error {
	all := append([][]string{t.header}, t.rows...)
	var width []int
	for _, row := range all {
		for i, cell := range row {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	bw := bufio.NewWriter(w)
	for _, row := range all {
		var b strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			switch {
			case i == 0 && i == len(row)-1:
				b.WriteString(cell)
			case i == 0:
				b.WriteString(cell + pad)
			default:
				b.WriteString("  " + pad + cell)
			}
		}
		bw.WriteString(b.String() + "\n")
	}
	return bw.Flush()
}
