/* internal.h: what the C files of libgpumem share with each other and with
 * the Go side (export.go). Not installed: users include gpumem.h. */
#ifndef GPUMEM_INTERNAL_H
#define GPUMEM_INTERNAL_H

#include "gpumem.h"

/* Records the calling thread's last failure (capi.c): status, message (n
 * bytes, not NUL-terminated, copied) and, for an out-of-memory, the verdict
 * (copied; NULL otherwise). Called by the Go side on every failure. */
void gpumem_set_error(gpumem_status status, const char *msg, size_t n, const gpumem_oom *oom);

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

/* front.c: the front cache (see its overview). gpumem_front_alloc serves
 * gpumem_alloc where the front may (returns -1 where it may not: the
 * caller goes to Go itself); gpumem_front_free frees gpumem_free's buffer,
 * parked or in Go, with the status in *st (1), or leaves it to the caller
 * (0: the front stands aside); gpumem_front_drain gives every
 * parked buffer and reuse count to Go, and every entry point but those
 * two calls it first; gpumem_front_stop and _go bracket whatever the
 * front must stand aside for (recordings, pool routes, captures, the
 * cache off); gpumem_front_moved follows a Go call that may have added a
 * pool (drained before it); gpumem_front_forget drops ptr from the front's books (a free
 * by another entry point); gpumem_front_record marks ptr as used on
 * another stream (its free needs events: never parked). */
int gpumem_front_alloc(uintptr_t *out, size_t size, int device, uintptr_t stream, gpumem_status *st);
int gpumem_front_free(void *ptr, int device, gpumem_status *st);
void gpumem_front_drain(void);
/* gpumem_mem_info through the front: what it parks counted free, no drain. */
gpumem_status gpumem_front_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);
void gpumem_front_stop(void);
void gpumem_front_go(void);
void gpumem_front_moved(void);
void gpumem_front_forget(void *ptr);
void gpumem_front_record(void *ptr);

/* gpumemGo_front_alloc's answer where the front must give back what it
 * parks before the request (gpumem.ErrParked); not a gpumem_status. */
#define GPUMEM_FRONT_DRAIN 1000

/* torch_errors.c: whether PyTorch's profiler records memory now. */
int gpumem_torch_profiling(void);

/* capi.c: a pool's own allocator called (gpumem_pool_options). */
void *gpumem_call_alloc(uintptr_t fn, size_t size, int device, uintptr_t stream);
void gpumem_call_free(uintptr_t fn, uintptr_t ptr, size_t size, int device, uintptr_t stream);

#endif
