/* capi.c: the functions of gpumem.h, the top layer. Each forwards to its
 * Go side in export.go (gpumemGo_*), keeping gpumem.h's exact signature;
 * gpumem_alloc and gpumem_free also call the PyTorch glue (torch_errors.c)
 * and read the thread's last error (errors.c). Nothing below calls back
 * into this file (internal.h: the layers). A few of gpumem.h's functions
 * live with what they serve: gpumem_last_error, gpumem_last_status and
 * gpumem_last_oom in errors.c, gpumem_torch_errors in torch_errors.c,
 * gpumem_torch_cache_info and gpumem_torch_cpp_history in
 * torch_allocator.c. See main.go for the overview. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "internal.h"

#define EXPORT __attribute__((visibility("default")))

/* Call sites while recording: the callback, and how many recordings run
 * (so that gpumem_alloc reads one atomic when none does). */
static uint32_t (*_Atomic site_fn)(int);
static atomic_int recordings;
static atomic_int free_sites; /* gpumem_set_free_sites */

/* Open pool routes: while there are, allocations say which thread made
 * them (pthread_self), for GPUMEM_POOL_THREAD. */
static atomic_int pool_routes;

static uint64_t route_thread(void) {
	return atomic_load_explicit(&pool_routes, memory_order_relaxed) > 0 ? (uint64_t)pthread_self() : 0;
}

/* The out-of-memory observer (PyTorch's attachOutOfMemoryObserver). */
static void (*_Atomic oom_fn)(int, uint64_t, uint64_t, uint64_t);

EXPORT gpumem_status gpumem_set_oom_callback(void (*fn)(int device, uint64_t size, uint64_t limit, uint64_t device_free)) {
	atomic_store(&oom_fn, fn);
	return GPUMEM_SUCCESS;
}

EXPORT void *gpumem_alloc(size_t size, int device, void *stream) {
	uintptr_t p = 0;
	uint32_t site = 0;
	if (atomic_load_explicit(&recordings, memory_order_relaxed) > 0) {
		uint32_t (*fn)(int) = atomic_load(&site_fn);
		if (fn) site = fn(device);
	}
	gpumem_status st = gpumemGo_alloc(&p, size, device, (uintptr_t)stream, site, route_thread());
	if (st == GPUMEM_ERROR_OUT_OF_MEMORY) {
		void (*fn)(int, uint64_t, uint64_t, uint64_t) = atomic_load(&oom_fn);
		if (fn) {
			/* PyTorch's arguments: the limit where one is set, else the
			 * device's memory, and the driver's free memory. The verdict
			 * is copied first: the observer may allocate. */
			gpumem_oom v;
			gpumem_last_oom(&v, sizeof v);
			char msg[1024];
			snprintf(msg, sizeof msg, "%s", gpumem_last_error());
			fn(device, size, v.limit && v.limit < v.total ? v.limit : v.total, v.device_free);
			gpumem_set_error(st, msg, strlen(msg), &v);
		}
	}
	if (st != GPUMEM_SUCCESS && gpumem_torch_enabled())
		gpumem_torch_raise(st, gpumem_last_error(), size, device); /* does not return */
	if (st == GPUMEM_SUCCESS) gpumem_torch_report((void *)p, (int64_t)size, device);
	return (void *)p;
}

EXPORT void gpumem_free(void *ptr, size_t size, int device, void *stream) {
	(void)stream;
	if (!ptr) return;
	uint32_t site = 0;
	if (atomic_load_explicit(&free_sites, memory_order_relaxed)) {
		uint32_t (*fn)(int) = atomic_load(&site_fn);
		if (fn) site = fn(device);
	}
	gpumem_status st = site ? gpumemGo_free_site((uintptr_t)ptr, device, site) : gpumemGo_free((uintptr_t)ptr, device);
	if (st == GPUMEM_SUCCESS) gpumem_torch_report(ptr, -(int64_t)size, device);
	if (st != GPUMEM_SUCCESS) {
		/* PyTorch frees from destructors: nothing may be thrown here. */
		static atomic_int said;
		if (atomic_exchange(&said, 1) == 0)
			fprintf(stderr, "gpumem: %s (reported once)\n", gpumem_last_error());
	}
}

EXPORT gpumem_status gpumem_allocate(void **ptr, size_t size, int device, void *stream) {
	if (!ptr) return GPUMEM_ERROR_INVALID_VALUE;
	uintptr_t p = 0;
	gpumem_status st = gpumemGo_alloc(&p, size, device, (uintptr_t)stream, 0, route_thread());
	*ptr = (void *)p;
	return st;
}

EXPORT gpumem_status gpumem_deallocate(void *ptr, int device) {
	return gpumemGo_free((uintptr_t)ptr, device);
}

EXPORT gpumem_status gpumem_deallocate_on(void *ptr, int device, void *stream) {
	return gpumemGo_free_on((uintptr_t)ptr, device, (uintptr_t)stream);
}

EXPORT gpumem_status gpumem_record_stream(void *ptr, int device, void *stream) {
	return gpumemGo_record_stream((uintptr_t)ptr, device, (uintptr_t)stream);
}

EXPORT gpumem_status gpumem_share(void *ptr, int device, uint64_t *base, int *fds, uint64_t *sizes, size_t cap, size_t *n) {
	if (!base || !n || (cap > 0 && (!fds || !sizes))) return GPUMEM_ERROR_INVALID_VALUE;
	return gpumemGo_share((uintptr_t)ptr, device, base, fds, sizes, cap, n);
}

EXPORT gpumem_status gpumem_unshare(void *ptr, int device) {
	return gpumemGo_unshare((uintptr_t)ptr, device);
}

EXPORT gpumem_status gpumem_pool_begin(int device, uint64_t hi, uint64_t lo, void *stream, int route) {
	gpumem_status st = gpumemGo_pool_begin(device, hi, lo, (uintptr_t)stream, route, (uint64_t)pthread_self());
	if (st == GPUMEM_SUCCESS) atomic_fetch_add(&pool_routes, 1);
	return st;
}

EXPORT gpumem_status gpumem_pool_end(int device, uint64_t hi, uint64_t lo) {
	gpumem_status st = gpumemGo_pool_end(device, hi, lo);
	if (st == GPUMEM_SUCCESS) atomic_fetch_sub(&pool_routes, 1);
	return st;
}

EXPORT gpumem_status gpumem_pool_retain(int device, uint64_t hi, uint64_t lo) {
	return gpumemGo_pool_retain(device, hi, lo);
}

EXPORT gpumem_status gpumem_pool_create(int device, uint64_t hi, uint64_t lo, const gpumem_pool_options *opts) {
	if (!opts || !opts->alloc != !opts->free) return GPUMEM_ERROR_INVALID_VALUE;
	if (opts->alloc == gpumem_alloc || opts->free == gpumem_free) {
		/* gpumem's own functions as the pool's allocator: the pool's
		 * growth would come back into the pool (a deadlock); such a pool
		 * is a plain gpumem pool. */
		static const char msg[] = "gpumem_pool_create: the pool's allocator is gpumem's own gpumem_alloc/gpumem_free; make the pool without one";
		gpumem_set_error(GPUMEM_ERROR_INVALID_VALUE, msg, sizeof msg - 1, NULL);
		return GPUMEM_ERROR_INVALID_VALUE;
	}
	return gpumemGo_pool_create(device, hi, lo, (uintptr_t)opts->alloc, (uintptr_t)opts->free, opts->no_split != 0,
	                            opts->use_on_oom != 0);
}

EXPORT gpumem_status gpumem_pool_uses(int device, uint64_t hi, uint64_t lo, uint64_t *uses) {
	if (!uses) return GPUMEM_ERROR_INVALID_VALUE;
	return gpumemGo_pool_uses(device, hi, lo, uses);
}

EXPORT gpumem_status gpumem_pool_release(int device, uint64_t hi, uint64_t lo) {
	return gpumemGo_pool_release(device, hi, lo);
}

EXPORT gpumem_status gpumem_pool_drop(int device, uint64_t hi, uint64_t lo) {
	return gpumemGo_pool_drop(device, hi, lo);
}

EXPORT gpumem_status gpumem_pool_live(int device, uint64_t hi, uint64_t lo, uint64_t *ptrs, size_t cap, size_t *n) {
	if (!n || (cap > 0 && !ptrs)) return GPUMEM_ERROR_INVALID_VALUE;
	return gpumemGo_pool_live(device, hi, lo, ptrs, cap, n);
}

EXPORT gpumem_status gpumem_capture_hold(int device) { return gpumemGo_capture_hold(device); }

EXPORT gpumem_status gpumem_capture_release(int device) { return gpumemGo_capture_release(device); }

EXPORT gpumem_status gpumem_pool_checkpoint(int device, uint64_t hi, uint64_t lo, gpumem_pool_buffer *bufs, size_t cap, size_t *n) {
	if (!n || (cap > 0 && !bufs)) return GPUMEM_ERROR_INVALID_VALUE;
	return gpumemGo_pool_checkpoint(device, hi, lo, (uint64_t *)bufs, cap, n);
}

EXPORT gpumem_status gpumem_pool_restore(int device, uint64_t hi, uint64_t lo, const gpumem_pool_buffer *bufs, size_t n) {
	if (n > 0 && !bufs) return GPUMEM_ERROR_INVALID_VALUE;
	return gpumemGo_pool_restore(device, hi, lo, (uint64_t *)bufs, n);
}

EXPORT void gpumem_torch_delete(void *ctx) {
	gpumem_free(ctx, 0, -1, NULL);
}

EXPORT gpumem_status gpumem_configure(const char *config) {
	return gpumemGo_configure((char *)config);
}

EXPORT gpumem_status gpumem_set_limit(int device, uint64_t bytes) {
	return gpumemGo_set_limit(device, bytes);
}

EXPORT gpumem_status gpumem_set_memory_fraction(int device, double fraction) {
	return gpumemGo_set_memory_fraction(device, fraction);
}

EXPORT gpumem_status gpumem_trim(int device) { return gpumemGo_trim(device); }
EXPORT gpumem_status gpumem_reset_peaks(int device) { return gpumemGo_reset_peaks(device); }

EXPORT gpumem_status gpumem_get_stats(int device, gpumem_stats *out, size_t size) {
	if (!out) return GPUMEM_ERROR_INVALID_VALUE;
	gpumem_stats s;
	memset(&s, 0, sizeof s);
	gpumem_status st = gpumemGo_get_stats(device, &s);
	memcpy(out, &s, size < sizeof s ? size : sizeof s);
	return st;
}

EXPORT gpumem_status gpumem_get_usage(int device, gpumem_usage *out, size_t size) {
	if (!out) return GPUMEM_ERROR_INVALID_VALUE;
	gpumem_usage u;
	memset(&u, 0, sizeof u);
	gpumem_status st = gpumemGo_get_usage(device, &u);
	memcpy(out, &u, size < sizeof u ? size : sizeof u);
	return st;
}

EXPORT gpumem_status gpumem_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
	uint64_t f = 0, t = 0;
	gpumem_status st = gpumemGo_mem_info(device, &f, &t);
	if (free_bytes) *free_bytes = f;
	if (total_bytes) *total_bytes = t;
	return st;
}

EXPORT char *gpumem_snapshot_json(int device) { return gpumemGo_json(device, 0); }
EXPORT char *gpumem_stats_json(int device) { return gpumemGo_json(device, 1); }
EXPORT void gpumem_string_free(char *s) { free(s); }
EXPORT char *gpumem_serve(const char *addr) { return gpumemGo_serve((char *)addr); }

EXPORT gpumem_status gpumem_record_start(int device, const char *path) {
	gpumem_status st = gpumemGo_record_start(device, (char *)path);
	if (st == GPUMEM_SUCCESS) atomic_fetch_add(&recordings, 1);
	return st;
}

EXPORT gpumem_status gpumem_record_stop(int device) {
	gpumem_status st = gpumemGo_record_stop(device);
	/* A recording that ended with a write error has still ended. */
	if (st == GPUMEM_SUCCESS || st == GPUMEM_ERROR_IO) atomic_fetch_sub(&recordings, 1);
	return st;
}

EXPORT gpumem_status gpumem_record_site(int device, uint32_t id, const char *text) {
	return gpumemGo_record_site(device, id, (char *)text);
}

EXPORT gpumem_status gpumem_import_snapshot(const char *snapshot, const char *trace) {
	return gpumemGo_import_snapshot((char *)snapshot, (char *)trace);
}

/* Devices whose history is on: each counts as a recording, so that
 * gpumem_alloc asks for call sites. */
static atomic_int history_on[64];

EXPORT gpumem_status gpumem_history(int device, int enabled, size_t max_entries) {
	gpumem_status st = gpumemGo_history(device, enabled, max_entries);
	if (st != GPUMEM_SUCCESS || device < 0 || device >= 64) return st;
	if (atomic_exchange(&history_on[device], enabled != 0) != (enabled != 0))
		atomic_fetch_add(&recordings, enabled ? 1 : -1);
	return st;
}

EXPORT char *gpumem_torch_snapshot_json(int device) { return gpumemGo_json(device, 2); }

EXPORT gpumem_status gpumem_set_site_callback(uint32_t (*fn)(int device)) {
	atomic_store(&site_fn, fn);
	return GPUMEM_SUCCESS;
}

EXPORT gpumem_status gpumem_set_caching(int on) { return gpumemGo_set_caching(on); }

EXPORT gpumem_status gpumem_set_capture_reuse(int on) { return gpumemGo_set_capture_reuse(on); }

EXPORT gpumem_status gpumem_set_free_sites(int on) {
	atomic_store(&free_sites, on != 0);
	return GPUMEM_SUCCESS;
}

EXPORT const char *gpumem_status_name(gpumem_status s) {
	static const char *names[] = {
		"GPUMEM_SUCCESS", "GPUMEM_ERROR_OUT_OF_MEMORY", "GPUMEM_ERROR_INVALID_VALUE",
		"GPUMEM_ERROR_INVALID_POINTER", "GPUMEM_ERROR_NO_DRIVER", "GPUMEM_ERROR_DEVICE",
		"GPUMEM_ERROR_CONFIG", "GPUMEM_ERROR_CLOSED", "GPUMEM_ERROR_BUFFER_TOO_SMALL",
		"GPUMEM_ERROR_INTERNAL", "GPUMEM_ERROR_IO", "GPUMEM_ERROR_FORMAT",
		"GPUMEM_ERROR_NOT_SHAREABLE",
	};
	if (s < 0 || (size_t)s >= sizeof names / sizeof names[0]) return "GPUMEM_ERROR_UNKNOWN";
	return names[s];
}

EXPORT int gpumem_owns(const void *ptr) { return gpumemGo_owns((uintptr_t)ptr); }

EXPORT const char *gpumem_version(void) { return gpumemGo_version(); }
EXPORT int gpumem_api_version(void) { return GPUMEM_API_VERSION; }
