/* internal.h: what the C files of libgpumem share with each other and with
 * the Go side (export.go). Not installed: users include gpumem.h.
 *
 * The layers, each calling only those below it (never back up):
 *
 *   capi.c            gpumem.h's functions (the top)
 *     -> torch_errors.c, torch_allocator.c   PyTorch's glue
 *       -> errors.c   the thread's last error and out-of-memory verdict
 *       -> Go         gpumemGo_* (export.go, declared in _cgo_export.h),
 *                     which calls only errors.c and callout.c
 *
 * errors.c and callout.c call nothing of libgpumem's own. So torch_*.c ask
 * the Go side (gpumemGo_mem_info), not gpumem_mem_info, and read the
 * verdict through gpumem_last_verdict, not gpumem_last_oom. */
#ifndef GPUMEM_INTERNAL_H
#define GPUMEM_INTERNAL_H

#include "gpumem.h"

/* errors.c: records the calling thread's last failure: status, message (n
 * bytes, not NUL-terminated, copied) and, for an out-of-memory, the verdict
 * (copied; NULL otherwise). Called by the Go side on every failure. */
void gpumem_set_error(gpumem_status status, const char *msg, size_t n, const gpumem_oom *oom);

/* errors.c: the calling thread's last out-of-memory verdict, copied whole
 * into out (all zero if its last failure was none, or not one). Hidden:
 * not one of the library's symbols. */
__attribute__((visibility("hidden"))) void gpumem_last_verdict(gpumem_oom *out);

/* callout.c: a pool's own allocator called (gpumem_pool_options), for the
 * Go side. */
void *gpumem_call_alloc(uintptr_t fn, size_t size, int device, uintptr_t stream);
void gpumem_call_free(uintptr_t fn, uintptr_t ptr, size_t size, int device, uintptr_t stream);

/* callout.c: the preload shim's launch gate, if it is in the process (0
 * otherwise): its close (open 0) or open (open 1), and their calls. */
uintptr_t gpumem_shim_gate(int open);
int gpumem_call_gate_close(uintptr_t fn);
void gpumem_call_gate_open(uintptr_t fn);

/* torch_errors.c: whether PyTorch's exceptions were enabled, and the raise
 * itself, which does not return. */
int gpumem_torch_enabled(void);
/* The raise, for an allocation of size bytes on device that failed with
 * status: out-of-memory (and an absurd size, as PyTorch's allocator) as
 * c10::OutOfMemoryError with PyTorch's words first, anything else as
 * c10::Error. */
void gpumem_torch_raise(gpumem_status status, const char *msg, size_t size, int device);

/* Throws c10::Error with msg when PyTorch's exceptions are enabled (does
 * not return then); returns at once otherwise. */
void gpumem_torch_fail(const char *where, const char *msg);

/* torch_errors.c: an allocation (size > 0) or free (size < 0) told to
 * PyTorch's profiler while it profiles memory; nothing otherwise. */
void gpumem_torch_report(void *ptr, int64_t size, int device);

#endif
