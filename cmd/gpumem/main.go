// Command gpumem is the gpumem command line; see package cli.
package main

import (
	"os"

	"github.com/gpumem/gpumem/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
