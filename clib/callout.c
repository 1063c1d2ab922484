/* callout.c: the calls the Go side (export.go) makes into C: a pool's own
 * allocator (gpumem_pool_options) and the preload shim's launch gate,
 * whose function pointers Go cannot call itself. A bottom-layer file: it
 * calls nothing of libgpumem's own, so Go calls no file above it (capi.c,
 * torch_*.c). */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "internal.h"

void *gpumem_call_alloc(uintptr_t fn, size_t size, int device, uintptr_t stream) {
	return ((void *(*)(size_t, int, void *))fn)(size, device, (void *)stream);
}

void gpumem_call_free(uintptr_t fn, uintptr_t ptr, size_t size, int device, uintptr_t stream) {
	((void (*)(void *, size_t, int, void *))fn)((void *)ptr, size, device, (void *)stream);
}

/* The launch gate of `gpumem run`'s preload shim (shim/c/gate.c), found
 * in the process by name: 0 when the shim is not loaded. */
uintptr_t gpumem_shim_gate(int open) {
	return (uintptr_t)dlsym(RTLD_DEFAULT, open ? "gpumem_preload_gate_open" : "gpumem_preload_gate_close");
}

int gpumem_call_gate_close(uintptr_t fn) { return ((int (*)(void))fn)(); }

void gpumem_call_gate_open(uintptr_t fn) { ((void (*)(void))fn)(); }
