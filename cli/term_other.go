//go:build !linux

package cli

// isTerminal: off this platform's ioctl, no progress bar is drawn.
func isTerminal(fd uintptr) bool { return false }
