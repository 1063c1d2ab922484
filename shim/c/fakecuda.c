/* fakecuda.c: a stand-in libcuda.so.1 for testing the preload shim on a
 * machine without a GPU. It implements only the calls the shim and its test
 * programs (tfalloc.c, paths.c, shimbench.c) make; its "device memory" is
 * host memory from malloc, and it counts the calls it gets (fake_calls), so
 * a test can tell what reached the driver from what gpumem served.
 *
 * Devices: $FAKE_CUDA_DEVICES of them (default 1), each with a primary
 * context (0xC0 + ordinal) that a thread makes current with cuCtxSetCurrent;
 * cuCtxGetDevice answers the calling thread's. Streams: 0x5 and after;
 * 0x2 is the per-thread default stream (what a _ptsz call's stream 0 means).
 * cuStreamBeginCapture marks a stream as capturing and cuStreamEndCapture
 * ends it; ending a stream that is not capturing is CUDA_ERROR_ILLEGAL_STATE,
 * as the driver's. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

enum { CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_ILLEGAL_STATE = 401 };

static int capturing[64];
static int next_stream = 5;
static __thread void *current; /* the thread's context; NULL: none */

/* The counted calls, by index, so that counting costs the benchmark little. */
enum { N_ALLOC_ASYNC, N_ALLOC_FROM_POOL, N_FREE_ASYNC, N_ALLOC, N_FREE, N_GET_INFO, N_CTX_SYNC,
       N_DEFAULT_POOL, N_IS_CAPTURING, N_CTX_GET_DEVICE, N_COUNTED };
static const char *const counted[N_COUNTED] = {
	"cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemAlloc_v2", "cuMemFree_v2",
	"cuMemGetInfo_v2", "cuCtxSynchronize", "cuDeviceGetDefaultMemPool", "cuStreamIsCapturing", "cuCtxGetDevice",
};
static int counts[N_COUNTED];

int fake_calls(const char *name) {
	for (int i = 0; i < N_COUNTED; i++)
		if (strcmp(counted[i], name) == 0) return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
	return -1;
}

static void count(int i) { __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED); }

static int devices(void) {
	const char *n = getenv("FAKE_CUDA_DEVICES");
	return n && atoi(n) > 0 ? atoi(n) : 1;
}

static int slot(CUstream s) { return (int)((uintptr_t)s % 64); }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = devices(); return 0; }
CUresult cuDeviceGet(int *d, int ordinal) {
	if (ordinal < 0 || ordinal >= devices()) return CUDA_ERROR_INVALID_VALUE;
	*d = ordinal;
	return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(uintptr_t)(0xC0 + dev); return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
CUresult cuCtxGetDevice(int *d) {
	count(N_CTX_GET_DEVICE);
	if (!current) return CUDA_ERROR_INVALID_CONTEXT;
	*d = (int)((uintptr_t)current - 0xC0);
	return 0;
}
CUresult cuCtxSynchronize(void) { count(N_CTX_SYNC); return 0; }
CUresult cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; *s = (CUstream)(uintptr_t)__atomic_fetch_add(&next_stream, 1, __ATOMIC_RELAXED); return 0; }
CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return 0; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return 0; }
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { (void)mode; capturing[slot(s)] = 1; return 0; }
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { return cuStreamBeginCapture_v2(s ? s : (CUstream)0x2, mode); }
CUresult cuStreamEndCapture(CUstream s, void **graph) {
	if (!capturing[slot(s)]) return CUDA_ERROR_ILLEGAL_STATE;
	capturing[slot(s)] = 0;
	*graph = (void *)0x6;
	return 0;
}
CUresult cuStreamEndCapture_ptsz(CUstream s, void **graph) { return cuStreamEndCapture(s ? s : (CUstream)0x2, graph); }
CUresult cuGraphDestroy(void *g) { (void)g; return 0; }
CUresult cuStreamIsCapturing(CUstream s, int *status) { count(N_IS_CAPTURING); *status = capturing[slot(s)]; return 0; }

static CUresult host_alloc(CUdeviceptr *d, size_t n) {
	void *p = malloc(n ? n : 1);
	if (!p) return 2;
	*d = (CUdeviceptr)(uintptr_t)p;
	return 0;
}

CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; count(N_ALLOC_ASYNC); return host_alloc(d, n); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return cuMemAllocAsync(d, n, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, void *pool, CUstream s) {
	(void)pool; (void)s; count(N_ALLOC_FROM_POOL); return host_alloc(d, n);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; count(N_FREE_ASYNC); free((void *)(uintptr_t)p); return 0; }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { count(N_ALLOC); return host_alloc(d, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { count(N_FREE); free((void *)(uintptr_t)p); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { count(N_GET_INFO); *f = 1000; *t = 2000; return 0; }
CUresult cuDeviceGetDefaultMemPool(void **pool, int dev) { (void)dev; count(N_DEFAULT_POOL); *pool = (void *)0xD00D; return 0; }
CUresult cuDeviceGetMemPool(void **pool, int dev) { return cuDeviceGetDefaultMemPool(pool, dev); }
CUresult cuDeviceSetMemPool(int dev, void *pool) { (void)dev; (void)pool; return 0; }
CUresult cuMemPoolCreate(void **pool, const void *props) { (void)props; *pool = (void *)0xD00E; return 0; }
CUresult cuMemPoolDestroy(void *pool) { (void)pool; return 0; }
CUresult cuMemPoolSetAttribute(void *pool, int a, void *v) { (void)pool; (void)a; (void)v; return 0; }
CUresult cuMemPoolGetAttribute(void *pool, int a, void *v) { (void)pool; (void)a; *(uint64_t *)v = 0; return 0; }
CUresult cuMemPoolTrimTo(void *pool, size_t k) { (void)pool; (void)k; return 0; }
CUresult cuMemPoolSetAccess(void *pool, const void *m, size_t c) { (void)pool; (void)m; (void)c; return 0; }

/* Launches, for the launch gate's tests (gatecheck.c): each checks that
 * its eleven arguments arrived as the caller passed them (argument k is
 * 0x100 + k, except gridDimX, which is a command), counts itself, and with
 * gridDimX 2 sleeps 200 ms inside the "driver" first. fake_launch_args
 * reports the launches whose arguments did not arrive intact. gridDimX 3
 * returns at once (gatecheck's benchmark). */
static atomic_int launches, bad_args;
int fake_launches(void) { return atomic_load(&launches); }
int fake_launch_args(void) { return atomic_load(&bad_args); }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void **params, void **extra) {
	if (gx == 3) return 0; /* the benchmark's: nothing shared between threads */
	uintptr_t want[11] = {0x100, 0, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a};
	uintptr_t got[11] = {(uintptr_t)f, gx, gy, gz, bx, by, bz, shared, (uintptr_t)s, (uintptr_t)params, (uintptr_t)extra};
	for (int k = 0; k < 11; k++)
		if (k != 1 && got[k] != want[k]) {
			atomic_fetch_add(&bad_args, 1);
			break;
		}
	if (gx == 2) {
		struct timespec t = {0, 200 * 1000 * 1000};
		nanosleep(&t, NULL);
	}
	atomic_fetch_add(&launches, 1);
	return 0;
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned shared, CUstream s, void **params, void **extra) {
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
/* The stand-in's own cuLaunchKernel, past any shim: the benchmark's
 * baseline. */
void *fake_launch_fn(void) { return (void *)cuLaunchKernel; }
/* The driver's private tables (the CUDA runtime's way in). */
CUresult cuGetExportTable(const void **table, const void *id) {
	(void)id;
	*table = NULL;
	return 500;
}
/* A driver function the shim has never heard of (a newer driver's). */
CUresult cuBrandNewCall(int x) { return x; }
/* An export: the physical memory behind an address. */
CUresult cuMemRetainAllocationHandle(unsigned long long *h, void *addr) {
	*h = (unsigned long long)(uintptr_t)addr;
	return 0;
}

/* cuGetProcAddress from a fixed table: not through dlsym, which the shim
 * wraps. The per-thread-stream flag picks the _ptsz variant where there is
 * one. */
#define F(name) {#name, (void *)name, NULL}
#define P(name) {#name, (void *)name, (void *)name##_ptsz}
static const struct { const char *name; void *fn, *ptsz; } procs[] = {
	F(cuInit), F(cuDriverGetVersion), F(cuDeviceGetCount), F(cuDeviceGet), F(cuDevicePrimaryCtxRetain),
	F(cuCtxSetCurrent), F(cuCtxGetCurrent), F(cuCtxGetDevice), F(cuCtxSynchronize), F(cuStreamCreate),
	F(cuStreamSynchronize), F(cuStreamIsCapturing), F(cuGraphDestroy), P(cuStreamEndCapture),
	P(cuMemAllocAsync), F(cuMemAllocFromPoolAsync), P(cuMemFreeAsync), F(cuDeviceGetDefaultMemPool),
	F(cuDeviceGetMemPool), F(cuDeviceSetMemPool), F(cuMemPoolCreate), F(cuMemPoolDestroy),
	F(cuMemPoolSetAttribute), F(cuMemPoolGetAttribute), F(cuMemPoolTrimTo), F(cuMemPoolSetAccess),
	{"cuMemAlloc", (void *)cuMemAlloc_v2, NULL}, {"cuMemFree", (void *)cuMemFree_v2, NULL},
	{"cuMemGetInfo", (void *)cuMemGetInfo_v2, NULL}, {"cuStreamDestroy", (void *)cuStreamDestroy_v2, NULL},
	{"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2, (void *)cuStreamBeginCapture_v2_ptsz},
	P(cuLaunchKernel), F(cuBrandNewCall), F(cuMemRetainAllocationHandle), F(cuGetExportTable),
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status) {
	(void)version;
	for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
		if (strcmp(procs[i].name, sym) == 0) {
			*pfn = (flags & 1) && procs[i].ptsz ? procs[i].ptsz : procs[i].fn;
			if (status) *status = 0;
			return 0;
		}
	*pfn = NULL;
	if (status) *status = 1;
	return 500; /* CUDA_ERROR_NOT_FOUND */
}
