// Command clib is libgpumem, gpumem's C library, built with
//
//	go build -buildmode=c-shared -o libgpumem.so ./clib
//
// Its interface is gpumem.h, written for C users: read it first. This
// package is the only place where cgo is used. It is thin on purpose: the
// C functions in capi.c keep the exact signatures of gpumem.h and call the
// Go functions exported in export.go, which convert their arguments, call
// the process's host (internal/host: one allocator per device, buffers
// found by address) and convert back; errors.c keeps the per-thread last
// error. No Go pointer crosses to C, and C pointers are not kept. The C
// files call in one direction, capi.c -> torch_*.c -> errors.c and Go
// (internal.h says more).
//
// torch_errors.c raises PyTorch's own exceptions from gpumem_alloc, so that
// an out-of-memory reaches Python as torch.cuda.OutOfMemoryError.
package main

func main() {}
