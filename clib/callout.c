/* callout.c: the calls the Go side (export.go) makes into C: a pool's own
 * allocator (gpumem_pool_options), whose function pointers Go cannot call
 * itself. A bottom-layer file: it calls nothing of libgpumem's own, so Go
 * calls no file above it (capi.c, torch_*.c). */
#include "internal.h"

void *gpumem_call_alloc(uintptr_t fn, size_t size, int device, uintptr_t stream) {
	return ((void *(*)(size_t, int, void *))fn)(size, device, (void *)stream);
}

void gpumem_call_free(uintptr_t fn, uintptr_t ptr, size_t size, int device, uintptr_t stream) {
	((void (*)(void *, size_t, int, void *))fn)((void *)ptr, size, device, (void *)stream);
}
