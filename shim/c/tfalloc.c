/* tfalloc.c: the driver calls of TensorFlow's cuda_malloc_async allocator
 * (GpuCudaMallocAsyncAllocator), made the way frameworks make them: libcuda
 * opened with dlopen, cuGetProcAddress found with dlsym, every other entry
 * point through cuGetProcAddress. Run under the preload shim (gpumem run,
 * or LD_PRELOAD by hand), it checks that the allocations come from gpumem
 * with their stream-ordered meaning, that a capturing stream gets the
 * driver's own allocation, that out-of-memory is the driver's error, and
 * that the pool's attributes and cuMemGetInfo answer gpumem's numbers.
 * With the real driver and a GPU, or with shim/c/fakecuda.c.
 *
 *   tfalloc LIMIT_BYTES      (gpumem's limit, as configured)
 *
 * Prints "ok: ..." lines and exits 0, or says what failed and exits 1. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);

static getproc_t getproc;

static void *proc(const char *name) {
	void *fn = NULL;
	int status = 0;
	if (getproc(name, &fn, 12000, 0, &status) != 0 || !fn) {
		fprintf(stderr, "tfalloc: cuGetProcAddress(%s) failed\n", name);
		exit(1);
	}
	return fn;
}

int main(int argc, char **argv) {
	unsigned long long limit = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "tfalloc: %s\n", dlerror());
		return 1;
	}
	getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
	int (*fake_calls)(const char *) = (int (*)(const char *))dlsym(h, "fake_calls");

	CUresult (*init)(unsigned) = proc("cuInit");
	CUresult (*device_get)(int *, int) = proc("cuDeviceGet");
	CUresult (*retain)(void **, int) = proc("cuDevicePrimaryCtxRetain");
	CUresult (*set_current)(void *) = proc("cuCtxSetCurrent");
	CUresult (*stream_create)(CUstream *, unsigned) = proc("cuStreamCreate");
	CUresult (*stream_sync)(CUstream) = proc("cuStreamSynchronize");
	CUresult (*begin_capture)(CUstream, int) = proc("cuStreamBeginCapture");
	CUresult (*end_capture)(CUstream, void **) = proc("cuStreamEndCapture");
	CUresult (*graph_destroy)(void *) = proc("cuGraphDestroy");
	CUresult (*default_pool)(void **, int) = proc("cuDeviceGetDefaultMemPool");
	CUresult (*pool_set)(void *, int, void *) = proc("cuMemPoolSetAttribute");
	CUresult (*pool_get)(void *, int, void *) = proc("cuMemPoolGetAttribute");
	CUresult (*pool_trim)(void *, size_t) = proc("cuMemPoolTrimTo");
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, void *, CUstream) = proc("cuMemAllocFromPoolAsync");
	CUresult (*free_async)(CUdeviceptr, CUstream) = proc("cuMemFreeAsync");
	CUresult (*mem_info)(size_t *, size_t *) = proc("cuMemGetInfo");

	int dev;
	void *ctx, *pool;
	CUstream s, other, cap;
	CHECK(init(0) == 0 && device_get(&dev, 0) == 0 && retain(&ctx, dev) == 0 && set_current(ctx) == 0, "context");
	CHECK(stream_create(&s, 1) == 0 && stream_create(&other, 1) == 0 && stream_create(&cap, 1) == 0, "streams");

	/* What the allocator does at construction. */
	CHECK(default_pool(&pool, dev) == 0 && pool, "cuDeviceGetDefaultMemPool");
	uint64_t threshold = UINT64_MAX;
	CHECK(pool_set(pool, 4 /* RELEASE_THRESHOLD */, &threshold) == 0, "set release threshold");
	int zero = 0;
	CHECK(pool_set(pool, 2 /* REUSE_ALLOW_OPPORTUNISTIC */, &zero) == 0, "set reuse flag");

	/* AllocateRaw / DeallocateRaw. */
	CUdeviceptr p[16];
	size_t total = 0;
	for (int i = 0; i < 16; i++) {
		size_t n = (size_t)(i + 1) << 20;
		CHECK(alloc_from_pool(&p[i], n, pool, s) == 0 && p[i], "alloc %zu", n);
		total += n;
	}
	uint64_t used = 0, reserved = 0;
	CHECK(pool_get(pool, 7 /* USED_MEM_CURRENT */, &used) == 0 && used >= total, "used %llu < %zu", (unsigned long long)used, total);
	CHECK(pool_get(pool, 5 /* RESERVED_MEM_CURRENT */, &reserved) == 0 && reserved >= used, "reserved %llu", (unsigned long long)reserved);
	for (int i = 0; i < 16; i++) CHECK(free_async(p[i], i % 2 ? other : s) == 0, "free %d", i);
	CHECK(pool_get(pool, 7, &used) == 0 && used == 0, "used %llu after every free", (unsigned long long)used);
	if (fake_calls) CHECK(fake_calls("cuMemAllocFromPoolAsync") == 0 && fake_calls("cuMemFreeAsync") == 0,
	                      "the driver got allocations: gpumem did not serve them");
	printf("ok: 16 allocations from gpumem's pool, freed on two streams\n");

	/* cuMemGetInfo answers within the limit. */
	size_t f = 0, t = 0;
	CHECK(mem_info(&f, &t) == 0, "cuMemGetInfo");
	if (limit) CHECK(t == limit && f <= t, "cuMemGetInfo total %zu, want the limit %llu", t, limit);
	printf("ok: cuMemGetInfo free %zu of %zu\n", f, t);

	/* Out of memory is the driver's error, and nothing breaks. */
	if (limit) {
		CUdeviceptr big = 0;
		CHECK(alloc_from_pool(&big, limit + (1 << 20), pool, s) == 2 /* CUDA_ERROR_OUT_OF_MEMORY */, "over the limit");
		CUdeviceptr small = 0;
		CHECK(alloc_from_pool(&small, 4096, pool, s) == 0 && free_async(small, s) == 0, "after an out-of-memory");
		printf("ok: over the limit is CUDA_ERROR_OUT_OF_MEMORY\n");
	}

	/* A capturing stream gets the driver's own allocation; its free goes
	 * back to the driver. */
	CUdeviceptr c = 0;
	void *graph = NULL;
	CHECK(begin_capture(cap, 0) == 0, "begin capture");
	CHECK(alloc_from_pool(&c, 1 << 20, pool, cap) == 0 && c, "alloc while capturing");
	CHECK(free_async(c, cap) == 0, "free while capturing");
	CHECK(end_capture(cap, &graph) == 0, "end capture");
	if (graph) graph_destroy(graph);
	if (fake_calls) CHECK(fake_calls("cuMemAllocFromPoolAsync") == 1 && fake_calls("cuMemFreeAsync") == 1,
	                      "the capturing stream's allocation did not reach the driver");
	printf("ok: a capturing stream allocates from the driver\n");

	/* Trim gives the cache back. */
	CHECK(stream_sync(s) == 0 && stream_sync(other) == 0, "sync");
	CHECK(pool_trim(pool, 0) == 0 && pool_get(pool, 5, &reserved) == 0, "trim");
	CHECK(reserved <= (32u << 20), "reserved %llu after trimming with nothing live", (unsigned long long)reserved);
	printf("ok: trimmed to %llu bytes\n", (unsigned long long)reserved);
	return failures ? 1 : 0;
}
