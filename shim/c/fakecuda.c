/* fakecuda.c: a stand-in libcuda.so.1 for testing the preload shim on a
 * machine without a GPU. It implements only the calls the shim and
 * tfalloc.c make; its "device memory" is host memory from malloc, and it
 * counts the calls it gets (fake_calls), so a test can tell what reached
 * the driver from what gpumem served. Stream 0x5 and after are streams;
 * cuStreamBeginCapture marks one as capturing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

static int capturing[64];
static int next_stream = 5;

static struct { const char *name; int n; } counts[] = {
	{"cuMemAllocAsync", 0}, {"cuMemAllocFromPoolAsync", 0}, {"cuMemFreeAsync", 0},
	{"cuMemAlloc_v2", 0}, {"cuMemFree_v2", 0}, {"cuMemGetInfo_v2", 0}, {"cuCtxSynchronize", 0},
	{"cuDeviceGetDefaultMemPool", 0},
};

static void count(const char *name) {
	for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
		if (strcmp(counts[i].name, name) == 0) counts[i].n++;
}

int fake_calls(const char *name) {
	for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
		if (strcmp(counts[i].name, name) == 0) return counts[i].n;
	return -1;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = (void *)0xC0; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { count("cuCtxSynchronize"); return 0; }
CUresult cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; *s = (CUstream)(uintptr_t)next_stream++; return 0; }
CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return 0; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return 0; }
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { (void)mode; capturing[(uintptr_t)s % 64] = 1; return 0; }
CUresult cuStreamEndCapture(CUstream s, void **graph) { capturing[(uintptr_t)s % 64] = 0; *graph = (void *)0x6; return 0; }
CUresult cuGraphDestroy(void *g) { (void)g; return 0; }
CUresult cuStreamIsCapturing(CUstream s, int *status) { *status = capturing[(uintptr_t)s % 64]; return 0; }

static CUresult host_alloc(CUdeviceptr *d, size_t n) {
	void *p = malloc(n ? n : 1);
	if (!p) return 2;
	*d = (CUdeviceptr)(uintptr_t)p;
	return 0;
}

CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; count("cuMemAllocAsync"); return host_alloc(d, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, void *pool, CUstream s) {
	(void)pool; (void)s; count("cuMemAllocFromPoolAsync"); return host_alloc(d, n);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; count("cuMemFreeAsync"); free((void *)(uintptr_t)p); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { count("cuMemAlloc_v2"); return host_alloc(d, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { count("cuMemFree_v2"); free((void *)(uintptr_t)p); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { count("cuMemGetInfo_v2"); *f = 1000; *t = 2000; return 0; }
CUresult cuDeviceGetDefaultMemPool(void **pool, int dev) { (void)dev; count("cuDeviceGetDefaultMemPool"); *pool = (void *)0xD00D; return 0; }
CUresult cuDeviceGetMemPool(void **pool, int dev) { return cuDeviceGetDefaultMemPool(pool, dev); }
CUresult cuDeviceSetMemPool(int dev, void *pool) { (void)dev; (void)pool; return 0; }
CUresult cuMemPoolCreate(void **pool, const void *props) { (void)props; *pool = (void *)0xD00E; return 0; }
CUresult cuMemPoolDestroy(void *pool) { (void)pool; return 0; }
CUresult cuMemPoolSetAttribute(void *pool, int a, void *v) { (void)pool; (void)a; (void)v; return 0; }
CUresult cuMemPoolGetAttribute(void *pool, int a, void *v) { (void)pool; (void)a; *(uint64_t *)v = 0; return 0; }
CUresult cuMemPoolTrimTo(void *pool, size_t k) { (void)pool; (void)k; return 0; }
CUresult cuMemPoolSetAccess(void *pool, const void *m, size_t c) { (void)pool; (void)m; (void)c; return 0; }

/* cuGetProcAddress from a fixed table: not through dlsym, which the shim
 * wraps. */
#define F(name) {#name, (void *)name}
static const struct { const char *name; void *fn; } procs[] = {
	F(cuInit), F(cuDriverGetVersion), F(cuDeviceGet), F(cuDevicePrimaryCtxRetain), F(cuCtxSetCurrent),
	F(cuCtxGetDevice), F(cuCtxSynchronize), F(cuStreamCreate), F(cuStreamSynchronize),
	F(cuStreamIsCapturing), F(cuGraphDestroy), F(cuStreamEndCapture),
	F(cuMemAllocAsync), F(cuMemAllocFromPoolAsync), F(cuMemFreeAsync), F(cuDeviceGetDefaultMemPool),
	F(cuDeviceGetMemPool), F(cuDeviceSetMemPool), F(cuMemPoolCreate), F(cuMemPoolDestroy),
	F(cuMemPoolSetAttribute), F(cuMemPoolGetAttribute), F(cuMemPoolTrimTo), F(cuMemPoolSetAccess),
	{"cuMemAlloc", (void *)cuMemAlloc_v2}, {"cuMemFree", (void *)cuMemFree_v2},
	{"cuMemGetInfo", (void *)cuMemGetInfo_v2}, {"cuStreamDestroy", (void *)cuStreamDestroy_v2},
	{"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2},
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status) {
	(void)version; (void)flags;
	for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
		if (strcmp(procs[i].name, sym) == 0) {
			*pfn = procs[i].fn;
			if (status) *status = 0;
			return 0;
		}
	*pfn = NULL;
	if (status) *status = 1;
	return 500; /* CUDA_ERROR_NOT_FOUND */
}
