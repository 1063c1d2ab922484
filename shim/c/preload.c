/* preload.c: libgpumem_preload.so, the shim that `gpumem run` preloads
 * (LD_PRELOAD) so that TensorFlow and JAX, which have no pluggable
 * allocator, allocate from gpumem without a change to their programs.
 *
 * Both frameworks can be put in a stream-ordered mode that asks the driver
 * for each buffer (XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async,
 * TF_GPU_ALLOCATOR=cuda_malloc_async), and both find the driver's functions
 * at run time: dlopen("libcuda.so.1") and dlsym, then cuGetProcAddress for
 * the rest (the CUDA runtime does the same). The shim wraps dlsym and
 * cuGetProcAddress, and hands out its own function for each name in the
 * table below; every other name passes through untouched. It also defines
 * those functions under their own names, for a program linked to libcuda.
 *
 * gpumem (libgpumem.so, $GPUMEM_LIBRARY) is loaded at the first wrapped call
 * that needs it, so a process that never allocates device memory (a forked
 * data loader, a subprocess) pays nothing. If it cannot be loaded, or is
 * another version, the shim says so in one line on stderr and every call
 * goes to the driver, as without the shim.
 *
 * Contracts kept (the driver's, for memory from gpumem):
 *   - memory from an async allocation on stream s is valid for work on s;
 *     freed on stream t, it is reused only after t's work up to the free
 *     (gpumem_deallocate_on: a free on another stream waits for an event);
 *   - cuMemFree waits for the device before the memory can be reused, as the
 *     driver's own cuMemFree synchronizes;
 *   - a stream being captured into a CUDA graph gets the driver's own
 *     stream-ordered allocation (graphs need it), and its frees go back to
 *     the driver: a pointer gpumem did not hand out always does. The shim
 *     wraps the calls that begin and end a capture and counts the captures
 *     in progress; only while there is one does an allocation ask the
 *     driver whether its stream is captured (a stream joins a capture only
 *     through one that began it), so that the common path makes no driver
 *     call at all;
 *   - the device is the pool's for cuMemAllocFromPoolAsync (the driver's
 *     meaning), else the current context's, asked of the driver only when
 *     the process sees more than one device;
 *   - a child forked after gpumem started cannot run it (fork does not copy
 *     the Go runtime's threads): its calls go to the driver, said once;
 *   - an out-of-memory returns CUDA_ERROR_OUT_OF_MEMORY, and gpumem's verdict
 *     is printed once on stderr;
 *   - memory pools are gpumem's: the default pool and created pools are
 *     handles the shim recognizes; their attributes read gpumem's numbers,
 *     and trimming one trims gpumem.
 *
 * With GPUMEM_PRELOAD_REPORT=1 the shim counts the calls made to each
 * wrapped entry point (relaxed atomic counters, only then) and the driver
 * calls it makes itself, and prints them at exit with the captures. With
 * GPUMEM_PRELOAD_PASSTHROUGH=1 gpumem is never loaded and every call goes
 * to the driver, counted: the same count under a framework's own allocator
 * (XLA's BFC, the driver's pool), to compare with gpumem's.
 *
 * Lookups made by libgpumem itself (its CUDA backend resolves the driver
 * with dlsym too) get the real functions: the shim tells them apart by the
 * caller's address.
 *
 * Every other driver name a program looks up goes to the launch gate
 * (gate.c): the calls that submit work get thunks that pass the gate, so
 * that gpumem can move live memory with no other thread's work in flight
 * (libgpumem finds the gate by name: gpumem_preload_gate_close and _open,
 * below); a name the gate cannot classify, or an export of gpumem's
 * memory, turns moves off. With GPUMEM_PRELOAD_LOOKUPS=1 each lookup is
 * said on stderr with its class; the report adds the gated calls. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../clib/gpumem.h"
#include "gate.h"

#define EXPORT __attribute__((visibility("default")))

/* The few CUDA driver types the wrapped calls use (cuda.h). */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long cuuint64_t;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_UNKNOWN = 999,
	CU_STREAM_CAPTURE_STATUS_NONE = 0,
	CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1,
};
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* CUmemPool_attribute */
enum {
	CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
	CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
	CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
	CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
	CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
	CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};

/* CUmemPoolProps: only its location is read (type, then id). */
typedef struct {
	int allocType, handleTypes;
	struct { int type, id; } location;
} pool_props_head;

/* --- the real driver ------------------------------------------------------ */

static void *(*real_dlsym)(void *, const char *);
static void *libcuda; /* dlopen(libcuda.so.1, RTLD_NOLOAD) once the program has it */

/* Driver functions the wrappers call besides the one they wrap. */
static CUresult (*drv_ctx_get_device)(CUdevice *);
static CUresult (*drv_device_count)(int *);
static CUresult (*drv_ctx_synchronize)(void);
static CUresult (*drv_stream_is_capturing)(CUstream, int *);
static CUresult (*drv_default_pool)(CUmemoryPool *, CUdevice);

static void resolve_real_dlsym(void) {
	if (real_dlsym) return;
	real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static void *driver_symbol(const char *name) {
	if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	return libcuda ? real_dlsym(libcuda, name) : NULL;
}

static void resolve_driver(void) {
	if (drv_ctx_get_device) return;
	drv_ctx_synchronize = driver_symbol("cuCtxSynchronize");
	drv_stream_is_capturing = driver_symbol("cuStreamIsCapturing");
	drv_default_pool = driver_symbol("cuDeviceGetDefaultMemPool");
	drv_device_count = driver_symbol("cuDeviceGetCount");
	drv_ctx_get_device = driver_symbol("cuCtxGetDevice");
}

/* --- gpumem ---------------------------------------------------------------- */

static struct {
	gpumem_status (*allocate)(void **, size_t, int, void *);
	gpumem_status (*deallocate_on)(void *, int, void *);
	gpumem_status (*mem_info)(int, uint64_t *, uint64_t *);
	gpumem_status (*trim)(int);
	gpumem_status (*reset_peaks)(int);
	gpumem_status (*get_usage)(int, gpumem_usage *, size_t);
	const char *(*last_error)(void);
	void *base; /* load address of libgpumem.so: its own dlsym calls */
} gm;

/* 0: not tried; 1: loaded; -1: failed or passthrough, everything goes to the driver;
 * -2: this process was forked after gpumem started (the same). */
static atomic_int gm_state;
static pthread_once_t gm_once = PTHREAD_ONCE_INIT;

/* 1 when the process sees one device (found when gpumem is loaded): the
 * current context's device is then 0 without asking the driver. */
static int single_device;

/* Stream captures begun through the shim and not yet ended. */
static atomic_int captures;

/* With GPUMEM_PRELOAD_REPORT=1, what the shim saw, on stderr at exit. */
static atomic_long captures_begun, captured_allocs;

/* The wrapped entry points, in the order of the report; each has a
 * counter, and so have the driver calls the shim makes itself. */
#define WRAPPED(X)                                                                                   \
	X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
	X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetInfo_v2)          \
	X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) X(cuMemPoolCreate)          \
	X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuMemPoolTrimTo)            \
	X(cuMemPoolSetAccess) X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz) X(cuStreamBeginCapture_v2) \
	X(cuStreamBeginCapture_v2_ptsz) X(cuStreamBeginCaptureToGraph) X(cuStreamBeginCaptureToGraph_ptsz)   \
	X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz) X(cuGetProcAddress) X(cuGetProcAddress_v2)
#define KIND(name) K_##name,
enum { WRAPPED(KIND) K_OWN_IS_CAPTURING, K_OWN_CTX_GET_DEVICE, K_OWN_DEFAULT_POOL, K_OWN_CTX_SYNCHRONIZE, N_COUNTED };
#undef KIND
#define KIND_NAME(name) #name,
static const char *const counted_names[N_COUNTED] = {
	WRAPPED(KIND_NAME) "cuStreamIsCapturing (the shim's own)", "cuCtxGetDevice (the shim's own)",
	"cuDeviceGetDefaultMemPool (the shim's own)", "cuCtxSynchronize (the shim's own)",
};
#undef KIND_NAME
static atomic_ulong counts[N_COUNTED];

/* Set once, before main, from the environment; read-only after. */
static int counting;    /* GPUMEM_PRELOAD_REPORT=1 */
static int passthrough; /* GPUMEM_PRELOAD_PASSTHROUGH=1 */

#define COUNT(k)                                                                  \
	do {                                                                          \
		if (counting) atomic_fetch_add_explicit(&counts[k], 1, memory_order_relaxed); \
	} while (0)

/* The report: the captures, then each entry point called (and each driver
 * call the shim made) with its count; nothing from a process that made
 * none of those calls. */
static void report(void) {
	unsigned long total = 0;
	for (int i = 0; i < N_COUNTED; i++) total += atomic_load(&counts[i]);
	if (total == 0) {
		gate_report();
		return;
	}
	if (passthrough)
		fprintf(stderr, "gpumem: preload: passthrough (GPUMEM_PRELOAD_PASSTHROUGH=1), every call went to the driver; %ld stream captures begun\n",
		        atomic_load(&captures_begun));
	else
		fprintf(stderr, "gpumem: preload: %ld stream captures begun, %ld allocations passed to the driver while captured\n",
		        atomic_load(&captures_begun), atomic_load(&captured_allocs));
	fprintf(stderr, "gpumem: preload: calls:");
	const char *sep = " ";
	for (int i = 0; i < N_COUNTED; i++) {
		unsigned long n = atomic_load(&counts[i]);
		if (n == 0) continue;
		fprintf(stderr, "%s%s %lu", sep, counted_names[i], n);
		sep = ", ";
	}
	fprintf(stderr, "\n");
	gate_report();
}

/* A child starts its counts over: what its parent counted is the parent's
 * to report. */
static void zero_counts(void) {
	for (int i = 0; i < N_COUNTED; i++) atomic_store(&counts[i], 0);
	atomic_store(&captures_begun, 0);
	atomic_store(&captured_allocs, 0);
}

static int env_is_1(const char *name) {
	const char *v = getenv(name);
	return v && strcmp(v, "1") == 0;
}

static int owns_addr(const void *p);

__attribute__((constructor)) static void read_env(void) {
	counting = env_is_1("GPUMEM_PRELOAD_REPORT");
	passthrough = env_is_1("GPUMEM_PRELOAD_PASSTHROUGH");
	gate_init(counting, env_is_1("GPUMEM_PRELOAD_LOOKUPS"));
	gate_set_owner(owns_addr);
	if (counting) {
		pthread_atfork(NULL, NULL, zero_counts);
		atexit(report);
	}
}

static void forked_child(void) { atomic_store(&gm_state, -2); }

/* Whether gpumem owns address p, for the gate's exports: asked of the
 * library at $GPUMEM_LIBRARY, whoever loaded it (the shim, or PyTorch's
 * pluggable allocator under `gpumem run`, by the same path). Not loaded:
 * gpumem holds nothing in this process. Loaded without gpumem_owns: it
 * cannot say, and the address counts as gpumem's. */
static int owns_addr(const void *p) {
	static int (*_Atomic owns)(const void *);
	int (*o)(const void *) = atomic_load(&owns);
	if (!o) {
		const char *path = getenv("GPUMEM_LIBRARY");
		if (!path || !*path) path = "libgpumem.so";
		void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
		if (!h) return 0;
		resolve_real_dlsym();
		o = (int (*)(const void *))real_dlsym(h, "gpumem_owns");
		dlclose(h); /* NOLOAD took a reference */
		if (!o) return 1;
		atomic_store(&owns, o);
	}
	return o(p);
}

static void load_gpumem(void) {
	resolve_real_dlsym();
	resolve_driver();
	if (passthrough) { /* never loaded: the driver serves every call */
		atomic_store(&gm_state, -1);
		return;
	}
	const char *path = getenv("GPUMEM_LIBRARY");
	if (!path || !*path) path = "libgpumem.so";
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	const char *why = NULL;
	if (!h) {
		why = dlerror();
	} else {
		int (*api)(void) = real_dlsym(h, "gpumem_api_version");
		gm.allocate = real_dlsym(h, "gpumem_allocate");
		gm.deallocate_on = real_dlsym(h, "gpumem_deallocate_on");
		gm.mem_info = real_dlsym(h, "gpumem_mem_info");
		gm.trim = real_dlsym(h, "gpumem_trim");
		gm.reset_peaks = real_dlsym(h, "gpumem_reset_peaks");
		gm.get_usage = real_dlsym(h, "gpumem_get_usage");
		gm.last_error = real_dlsym(h, "gpumem_last_error");
		if (!api || api() != GPUMEM_API_VERSION || !gm.allocate || !gm.deallocate_on || !gm.mem_info ||
		    !gm.trim || !gm.reset_peaks || !gm.get_usage || !gm.last_error)
			why = "not a gpumem library of this version (gpumem_api_version, gpumem_deallocate_on or gpumem_get_usage missing or different)";
		Dl_info info;
		if (!why && dladdr((void *)gm.allocate, &info)) gm.base = info.dli_fbase;
	}
	if (why) {
		fprintf(stderr, "gpumem: preload: cannot use %s: %s; this process allocates from the driver as without gpumem\n", path, why);
		atomic_store(&gm_state, -1);
		return;
	}
	int n = 0;
	single_device = drv_device_count && drv_device_count(&n) == CUDA_SUCCESS && n == 1;
	pthread_atfork(NULL, NULL, forked_child);
	atomic_store(&gm_state, 1);
}

/* Whether gpumem serves this process (loading it on the first call). */
static int gpumem_on(void) {
	int s = atomic_load_explicit(&gm_state, memory_order_acquire);
	if (s == 0) {
		pthread_once(&gm_once, load_gpumem);
		s = atomic_load(&gm_state);
	} else if (s == -2) {
		static atomic_int said;
		if (atomic_exchange(&said, 1) == 0)
			fprintf(stderr, "gpumem: preload: this process was forked after gpumem started, which cannot run in a forked child; it allocates from the driver as without gpumem\n");
	}
	return s > 0;
}

static int current_device(void) {
	CUdevice d = 0;
	if (single_device) return 0;
	COUNT(K_OWN_CTX_GET_DEVICE);
	if (drv_ctx_get_device && drv_ctx_get_device(&d) != CUDA_SUCCESS) d = 0;
	return d;
}

/* The driver's capture status of s; -1 if it cannot say. */
static int capture_status(CUstream s) {
	int st = CU_STREAM_CAPTURE_STATUS_NONE;
	COUNT(K_OWN_IS_CAPTURING);
	if (!drv_stream_is_capturing || drv_stream_is_capturing(s, &st) != CUDA_SUCCESS) return -1;
	return st;
}

/* Whether an allocation on s must go to the driver: a capture is in
 * progress and s is captured, or the driver cannot say (it then gives its
 * own answer to the allocation). The count is raised before a capture
 * begins: an allocation ordered after the begin sees it. */
static int capturing(CUstream s) {
	if (atomic_load_explicit(&captures, memory_order_relaxed) == 0) return 0;
	if (capture_status(s) == CU_STREAM_CAPTURE_STATUS_NONE) return 0;
	atomic_fetch_add_explicit(&captured_allocs, 1, memory_order_relaxed);
	return 1;
}

static CUresult cuda_error(gpumem_status st) {
	switch (st) {
	case GPUMEM_SUCCESS: return CUDA_SUCCESS;
	case GPUMEM_ERROR_OUT_OF_MEMORY: {
		static atomic_int said;
		if (atomic_exchange(&said, 1) == 0)
			fprintf(stderr, "%s (reported once; the program gets CUDA_ERROR_OUT_OF_MEMORY)\n", gm.last_error());
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	case GPUMEM_ERROR_INVALID_VALUE: return CUDA_ERROR_INVALID_VALUE;
	default: {
		static atomic_int said;
		if (atomic_exchange(&said, 1) == 0) fprintf(stderr, "gpumem: preload: %s (reported once)\n", gm.last_error());
		return CUDA_ERROR_UNKNOWN;
	}
	}
}

static CUresult gm_alloc(CUdeviceptr *dptr, size_t size, int device, CUstream s) {
	if (!dptr) return CUDA_ERROR_INVALID_VALUE;
	void *p = NULL;
	gpumem_status st = gm.allocate(&p, size, device, s);
	if (st == GPUMEM_SUCCESS) *dptr = (CUdeviceptr)p;
	return cuda_error(st);
}

/* gpumem's free of ptr on stream s; GPUMEM_ERROR_INVALID_POINTER when gpumem
 * did not hand it out (then the driver did). */
static gpumem_status gm_free(CUdeviceptr ptr, CUstream s) {
	return gm.deallocate_on((void *)ptr, single_device ? 0 : -1, s);
}

/* --- the table of wrapped functions ----------------------------------------
 * Each entry: the name the program asks for, the shim's function, and the
 * slot where the driver's own function is kept (filled from dlsym or
 * cuGetProcAddress, whichever the program used; the shim's own definitions
 * fill it from libcuda). */

#define REAL(name) real_##name
#define DECLARE_REAL(ret, name, args) static ret(*REAL(name)) args

DECLARE_REAL(CUresult, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream));
DECLARE_REAL(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream));
DECLARE_REAL(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream));
DECLARE_REAL(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream));
DECLARE_REAL(CUresult, cuMemFreeAsync, (CUdeviceptr, CUstream));
DECLARE_REAL(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream));
DECLARE_REAL(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t));
DECLARE_REAL(CUresult, cuMemFree_v2, (CUdeviceptr));
DECLARE_REAL(CUresult, cuMemGetInfo_v2, (size_t *, size_t *));
DECLARE_REAL(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice));
DECLARE_REAL(CUresult, cuDeviceGetMemPool, (CUmemoryPool *, CUdevice));
DECLARE_REAL(CUresult, cuDeviceSetMemPool, (CUdevice, CUmemoryPool));
DECLARE_REAL(CUresult, cuMemPoolCreate, (CUmemoryPool *, const void *));
DECLARE_REAL(CUresult, cuMemPoolDestroy, (CUmemoryPool));
DECLARE_REAL(CUresult, cuMemPoolSetAttribute, (CUmemoryPool, int, void *));
DECLARE_REAL(CUresult, cuMemPoolGetAttribute, (CUmemoryPool, int, void *));
DECLARE_REAL(CUresult, cuMemPoolTrimTo, (CUmemoryPool, size_t));
DECLARE_REAL(CUresult, cuMemPoolSetAccess, (CUmemoryPool, const void *, size_t));
DECLARE_REAL(CUresult, cuStreamBeginCapture, (CUstream));
DECLARE_REAL(CUresult, cuStreamBeginCapture_ptsz, (CUstream));
DECLARE_REAL(CUresult, cuStreamBeginCapture_v2, (CUstream, int));
DECLARE_REAL(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream, int));
DECLARE_REAL(CUresult, cuStreamBeginCaptureToGraph, (CUstream, void *, const void *, const void *, size_t, int));
DECLARE_REAL(CUresult, cuStreamBeginCaptureToGraph_ptsz, (CUstream, void *, const void *, const void *, size_t, int));
DECLARE_REAL(CUresult, cuStreamEndCapture, (CUstream, void **));
DECLARE_REAL(CUresult, cuStreamEndCapture_ptsz, (CUstream, void **));
DECLARE_REAL(CUresult, cuGetProcAddress, (const char *, void **, int, cuuint64_t));
DECLARE_REAL(CUresult, cuGetProcAddress_v2, (const char *, void **, int, cuuint64_t, void *));

/* Pools: gpumem has one per device, named by a handle into this array. A
 * created pool is the same memory (gpumem does not partition it). */
#define MAX_DEVICES 64
static struct pool {
	int device;
	uint64_t release_threshold;
} pools[MAX_DEVICES];

static int is_pool(CUmemoryPool p) {
	return (char *)p >= (char *)pools && (char *)p < (char *)(pools + MAX_DEVICES);
}

static CUmemoryPool pool_of(int device) {
	if (device < 0 || device >= MAX_DEVICES) return NULL;
	pools[device].device = device;
	return &pools[device];
}

/* cuMemAllocAsync: size bytes for work on s, from gpumem; a capturing
 * stream, or no gpumem, gets the driver's. */
static CUresult w_cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
	COUNT(K_cuMemAllocAsync);
	if (!gpumem_on() || capturing(s)) return REAL(cuMemAllocAsync)(dptr, size, s);
	return gm_alloc(dptr, size, current_device(), s);
}

/* The per-thread default stream variant: stream 0 means the thread's own. */
static CUresult w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
	COUNT(K_cuMemAllocAsync_ptsz);
	if (!gpumem_on() || capturing(s ? s : CU_STREAM_PER_THREAD)) return REAL(cuMemAllocAsync_ptsz)(dptr, size, s);
	return gm_alloc(dptr, size, current_device(), s ? s : CU_STREAM_PER_THREAD);
}

/* The driver's pool for a real stream-ordered allocation: the one named if
 * it is the driver's, else the device's default. */
static CUmemoryPool driver_pool(CUmemoryPool pool) {
	if (!is_pool(pool)) return pool;
	CUmemoryPool p = NULL;
	COUNT(K_OWN_DEFAULT_POOL);
	if (drv_default_pool) drv_default_pool(&p, ((struct pool *)pool)->device);
	return p;
}

/* cuMemAllocFromPoolAsync: from gpumem when the pool is gpumem's, on the
 * pool's device. */
static CUresult w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
	COUNT(K_cuMemAllocFromPoolAsync);
	if (!gpumem_on() || !is_pool(pool) || capturing(s))
		return REAL(cuMemAllocFromPoolAsync)(dptr, size, driver_pool(pool), s);
	return gm_alloc(dptr, size, ((struct pool *)pool)->device, s);
}

static CUresult w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
	COUNT(K_cuMemAllocFromPoolAsync_ptsz);
	if (!gpumem_on() || !is_pool(pool) || capturing(s ? s : CU_STREAM_PER_THREAD))
		return REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, size, driver_pool(pool), s);
	return gm_alloc(dptr, size, ((struct pool *)pool)->device, s ? s : CU_STREAM_PER_THREAD);
}

/* cuMemFreeAsync: gpumem's memory back to gpumem, reusable after s's work
 * up to now; anything else to the driver. */
static CUresult w_cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
	COUNT(K_cuMemFreeAsync);
	if (gpumem_on()) {
		gpumem_status st = gm_free(ptr, s);
		if (st != GPUMEM_ERROR_INVALID_POINTER) return cuda_error(st);
	}
	return REAL(cuMemFreeAsync)(ptr, s);
}

static CUresult w_cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) {
	COUNT(K_cuMemFreeAsync_ptsz);
	if (gpumem_on()) {
		gpumem_status st = gm_free(ptr, s ? s : CU_STREAM_PER_THREAD);
		if (st != GPUMEM_ERROR_INVALID_POINTER) return cuda_error(st);
	}
	return REAL(cuMemFreeAsync_ptsz)(ptr, s);
}

/* cuMemAlloc: from gpumem, on the legacy default stream. */
static CUresult w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
	COUNT(K_cuMemAlloc_v2);
	if (!gpumem_on()) return REAL(cuMemAlloc_v2)(dptr, size);
	return gm_alloc(dptr, size, current_device(), NULL);
}

/* cuMemFree: as the driver's, it waits for the device first. */
static CUresult w_cuMemFree_v2(CUdeviceptr ptr) {
	COUNT(K_cuMemFree_v2);
	if (gpumem_on() && ptr) {
		COUNT(K_OWN_CTX_SYNCHRONIZE);
		if (drv_ctx_synchronize) drv_ctx_synchronize();
		gpumem_status st = gm_free(ptr, NULL);
		if (st != GPUMEM_ERROR_INVALID_POINTER) return cuda_error(st);
	}
	return REAL(cuMemFree_v2)(ptr);
}

/* cuMemGetInfo: free and total as gpumem sees them, within its limit, so
 * that a framework sizes itself to the limit. */
static CUresult w_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
	COUNT(K_cuMemGetInfo_v2);
	if (!gpumem_on()) return REAL(cuMemGetInfo_v2)(free_bytes, total_bytes);
	uint64_t f = 0, t = 0;
	gpumem_status st = gm.mem_info(current_device(), &f, &t);
	if (st != GPUMEM_SUCCESS) return cuda_error(st);
	if (free_bytes) *free_bytes = f;
	if (total_bytes) *total_bytes = t;
	return CUDA_SUCCESS;
}

/* cuDeviceGetDefaultMemPool, cuDeviceGetMemPool: gpumem's pool. */
static CUresult w_cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
	COUNT(K_cuDeviceGetDefaultMemPool);
	if (!gpumem_on()) return REAL(cuDeviceGetDefaultMemPool)(pool, dev);
	if (!pool || !(*pool = pool_of(dev))) return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

static CUresult w_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
	COUNT(K_cuDeviceGetMemPool);
	if (!gpumem_on()) return REAL(cuDeviceGetMemPool)(pool, dev);
	if (!pool || !(*pool = pool_of(dev))) return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

/* cuDeviceSetMemPool: gpumem's pool is the current one already. */
static CUresult w_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
	COUNT(K_cuDeviceSetMemPool);
	if (!is_pool(pool)) return REAL(cuDeviceSetMemPool)(dev, pool);
	return CUDA_SUCCESS;
}

/* cuMemPoolCreate: a handle to gpumem's pool of the device named. */
static CUresult w_cuMemPoolCreate(CUmemoryPool *pool, const void *props) {
	COUNT(K_cuMemPoolCreate);
	if (!gpumem_on()) return REAL(cuMemPoolCreate)(pool, props);
	if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
	*pool = pool_of(((const pool_props_head *)props)->location.id);
	return *pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult w_cuMemPoolDestroy(CUmemoryPool pool) {
	COUNT(K_cuMemPoolDestroy);
	if (!is_pool(pool)) return REAL(cuMemPoolDestroy)(pool);
	return CUDA_SUCCESS;
}

/* cuMemPoolSetAttribute: the release threshold is kept (gpumem's own
 * release policy, --release-after, decides); resetting a high-water mark
 * resets gpumem's peaks; the reuse flags are gpumem's behaviour already. */
static CUresult w_cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
	COUNT(K_cuMemPoolSetAttribute);
	if (!is_pool(pool)) return REAL(cuMemPoolSetAttribute)(pool, attr, value);
	if (!value) return CUDA_ERROR_INVALID_VALUE;
	struct pool *p = pool;
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *(uint64_t *)value; return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: return cuda_error(gm.reset_peaks(p->device));
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

/* cuMemPoolGetAttribute: gpumem's numbers. The release threshold and the
 * reuse flags are the shim's own and answered at once; the byte counts ask
 * gpumem for its counts (gpumem_get_usage: no walk of its blocks). */
static CUresult w_cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
	COUNT(K_cuMemPoolGetAttribute);
	if (!is_pool(pool)) return REAL(cuMemPoolGetAttribute)(pool, attr, value);
	if (!value) return CUDA_ERROR_INVALID_VALUE;
	struct pool *p = pool;
	uint64_t *v = value;
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = p->release_threshold; return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = 1; return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	gpumem_usage s;
	gpumem_status st = gm.get_usage(p->device, &s, sizeof s);
	if (st != GPUMEM_SUCCESS) return cuda_error(st);
	switch (attr) {
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = s.reserved; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = s.peak_reserved; break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = s.active; break;
	default: *v = s.peak_active; break; /* CU_MEMPOOL_ATTR_USED_MEM_HIGH */
	}
	return CUDA_SUCCESS;
}

/* cuMemPoolTrimTo: gpumem gives back every unused byte. */
static CUresult w_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
	COUNT(K_cuMemPoolTrimTo);
	if (!is_pool(pool)) return REAL(cuMemPoolTrimTo)(pool, keep);
	return cuda_error(gm.trim(((struct pool *)pool)->device));
}

/* cuMemPoolSetAccess: gpumem's memory is for its own device; granting more
 * is refused rather than pretended. */
static CUresult w_cuMemPoolSetAccess(CUmemoryPool pool, const void *map, size_t count) {
	COUNT(K_cuMemPoolSetAccess);
	if (!is_pool(pool)) return REAL(cuMemPoolSetAccess)(pool, map, count);
	for (size_t i = 0; i < count; i++) {
		const struct { struct { int type, id; } location; int flags; } *d = (const void *)((const char *)map + i * 12);
		if (d->location.id != ((struct pool *)pool)->device) return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* cuStreamBeginCapture (all forms): one more capture in progress, counted
 * before the driver begins it (and not, if it refuses). */
#define BEGIN_CAPTURE(name, params, args)                                  \
	static CUresult w_##name params {                                      \
		COUNT(K_##name);                                                   \
		atomic_fetch_add(&captures, 1);                                    \
		CUresult r = REAL(name) args;                                      \
		if (r != CUDA_SUCCESS) atomic_fetch_sub(&captures, 1);             \
		else atomic_fetch_add_explicit(&captures_begun, 1, memory_order_relaxed); \
		return r;                                                          \
	}
BEGIN_CAPTURE(cuStreamBeginCapture, (CUstream s), (s))
BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (CUstream s), (s))
BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream s, int mode), (s, mode))
BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream s, int mode), (s, mode))
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, (CUstream s, void *g, const void *d, const void *e, size_t n, int mode),
              (s, g, d, e, n, mode))
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, (CUstream s, void *g, const void *d, const void *e, size_t n, int mode),
              (s, g, d, e, n, mode))

/* cuStreamEndCapture: one capture fewer if the stream was capturing
 * before the call and is not after it (a call from the wrong thread, or on
 * a stream that was not capturing, ends nothing). */
static CUresult end_capture(CUresult (*real)(CUstream, void **), CUstream s, CUstream q, void **graph) {
	resolve_real_dlsym();
	resolve_driver(); /* a capture may end before gpumem is loaded */
	int before = capture_status(q);
	CUresult r = real(s, graph);
	if (before > CU_STREAM_CAPTURE_STATUS_NONE && capture_status(q) == CU_STREAM_CAPTURE_STATUS_NONE)
		atomic_fetch_sub(&captures, 1);
	return r;
}

static CUresult w_cuStreamEndCapture(CUstream s, void **graph) {
	COUNT(K_cuStreamEndCapture);
	return end_capture(REAL(cuStreamEndCapture), s, s, graph);
}

static CUresult w_cuStreamEndCapture_ptsz(CUstream s, void **graph) {
	COUNT(K_cuStreamEndCapture_ptsz);
	return end_capture(REAL(cuStreamEndCapture_ptsz), s, s ? s : CU_STREAM_PER_THREAD, graph);
}

static void *take_over(const char *name, void *fn, int ptds, int version);

/* cuGetProcAddress (both versions): the driver's answer, with the shim's
 * function for a wrapped name. */
static CUresult w_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, void *status) {
	COUNT(K_cuGetProcAddress_v2);
	CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, version, flags, status);
	if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
		*pfn = take_over(symbol, *pfn, flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, version);
	return r;
}

static CUresult w_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
	COUNT(K_cuGetProcAddress);
	CUresult r = REAL(cuGetProcAddress)(symbol, pfn, version, flags);
	if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
		*pfn = take_over(symbol, *pfn, flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, version);
	return r;
}

/* The table. name: as dlsym sees it; base: as cuGetProcAddress sees it
 * (with min_version, the CUDA version from which base means this entry;
 * entries of one base are listed newest first, and a lookup takes the
 * first that matches). */
static const struct entry {
	const char *name, *base;
	int ptds, min_version;
	void *wrapper;
	void **real;
} table[] = {
#define E(name, base, ptds, v) {#name, base, ptds, v, (void *)w_##name, (void **)&REAL(name)}
	E(cuMemAllocAsync, "cuMemAllocAsync", 0, 0),
	E(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 1, 0),
	E(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0, 0),
	E(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 1, 0),
	E(cuMemFreeAsync, "cuMemFreeAsync", 0, 0),
	E(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 1, 0),
	E(cuMemAlloc_v2, "cuMemAlloc", -1, 3020),
	E(cuMemFree_v2, "cuMemFree", -1, 3020),
	E(cuMemGetInfo_v2, "cuMemGetInfo", -1, 3020),
	E(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", -1, 0),
	E(cuDeviceGetMemPool, "cuDeviceGetMemPool", -1, 0),
	E(cuDeviceSetMemPool, "cuDeviceSetMemPool", -1, 0),
	E(cuMemPoolCreate, "cuMemPoolCreate", -1, 0),
	E(cuMemPoolDestroy, "cuMemPoolDestroy", -1, 0),
	E(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", -1, 0),
	E(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", -1, 0),
	E(cuMemPoolTrimTo, "cuMemPoolTrimTo", -1, 0),
	E(cuMemPoolSetAccess, "cuMemPoolSetAccess", -1, 0),
	E(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 0, 10010), /* before the v1 form: newest first */
	E(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 1, 10010),
	E(cuStreamBeginCapture, "cuStreamBeginCapture", 0, 0),
	E(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 1, 0),
	E(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 0, 12030),
	E(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 1, 12030),
	E(cuStreamEndCapture, "cuStreamEndCapture", 0, 0),
	E(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 1, 0),
	E(cuGetProcAddress, "cuGetProcAddress", -2, 0),
	E(cuGetProcAddress_v2, "cuGetProcAddress", -2, 12000),
#undef E
};
#define NTABLE (sizeof table / sizeof table[0])

/* Whether table entry e is what a program asks for by name: of dlsym
 * (ptds < 0: the exact name), or of cuGetProcAddress (the base name, the
 * per-thread-stream flag, and a version at least the entry's). */
static int matches(const struct entry *e, const char *name, int ptds, int version) {
	if (ptds < 0) return strcmp(name, e->name) == 0;
	return e->ptds != -2 && strcmp(name, e->base) == 0 && (e->ptds < 0 || e->ptds == (ptds != 0)) &&
	       version >= e->min_version;
}

/* Whether fn is the shim's own (a library whose own references to its
 * functions are not bound at link time hands out the preloaded ones). */
static int is_own(void *fn) {
	static void *base;
	Dl_info info;
	if (!base && dladdr((void *)is_own, &info)) base = info.dli_fbase;
	return dladdr(fn, &info) && info.dli_fbase == base;
}

/* What the program gets for name, which the driver answered with fn: the
 * shim's function for the first table entry it matches, after keeping fn
 * as that entry's real one (first answer wins; they are the same
 * function); else fn. */
static void *take_over(const char *name, void *fn, int ptds, int version) {
	for (size_t i = 0; i < NTABLE; i++) {
		const struct entry *e = &table[i];
		if (!matches(e, name, ptds, version)) continue;
		if (!*e->real) {
			/* The shim's own function came back (the library's references
			 * to its functions were interposed): ask libcuda itself. */
			void *real = !is_own(fn) ? fn : driver_symbol(e->name);
			if (real && !is_own(real)) *e->real = real;
		}
		return e->wrapper;
	}
	if (is_own(fn)) { /* an interposed reference to the shim's gated definition (below) */
		fn = driver_symbol(name);
		if (!fn || is_own(fn)) return NULL;
	}
	return gate_lookup(name, fn);
}

/* Fills every slot from libcuda, for a program that calls the shim's
 * functions by their names (linked to libcuda) before any dlsym. */
static void fill_from_driver(void) {
	for (size_t i = 0; i < NTABLE; i++)
		if (!*table[i].real) {
			void *fn = driver_symbol(table[i].name);
			if (fn && !is_own(fn)) *table[i].real = fn;
		}
}

/* --- dlsym ------------------------------------------------------------------ */

/* Whether caller lies in libgpumem: the one the shim loaded (gm.base), or
 * one the program loaded itself (PyTorch's pluggable allocator under
 * `gpumem run` loads it through ctypes, and the shim never does): an
 * object that defines gpumem_api_version. gpumem's own lookups must get
 * the driver's functions: through the shim's wrappers, its cuMemGetInfo
 * would ask gpumem, which asks the driver, without end (a crash on the
 * first out-of-memory of a PyTorch program under `gpumem run`). */
static int from_gpumem(void *caller) {
	static void *_Atomic known; /* the base of a libgpumem the program loaded */
	Dl_info info;
	if (!dladdr(caller, &info) || !info.dli_fbase) return 0;
	if (info.dli_fbase == gm.base || info.dli_fbase == atomic_load(&known)) return 1;
	if (!info.dli_fname || !*info.dli_fname) return 0;
	void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
	if (!h) return 0;
	void *api = real_dlsym(h, "gpumem_api_version");
	dlclose(h);
	Dl_info in;
	if (!api || !dladdr(api, &in) || in.dli_fbase != info.dli_fbase) return 0; /* another object's, found through h's scope */
	atomic_store(&known, info.dli_fbase);
	return 1;
}

/* Whether fn is libcuda's: the gate classifies the driver's names only,
 * not other libraries' that share its prefix (cudnnCreate, cudaMalloc). */
static int in_driver(void *fn) {
	static void *_Atomic base;
	Dl_info info;
	void *b = atomic_load(&base);
	if (!b) {
		void *init = driver_symbol("cuInit");
		if (!init || !dladdr(init, &info)) return 0;
		b = info.dli_fbase;
		atomic_store(&base, b);
	}
	return dladdr(fn, &info) && info.dli_fbase == b;
}

EXPORT void *dlsym(void *handle, const char *name) {
	resolve_real_dlsym();
	void *fn = real_dlsym(handle, name);
	int driver_name = name[0] == 'c' && name[1] == 'u';
	if (!fn || !(driver_name || gate_watches(name)) || from_gpumem(__builtin_return_address(0))) return fn;
	if (driver_name) return in_driver(fn) || is_own(fn) ? take_over(name, fn, -1, 0) : fn;
	return gate_lookup(name, fn); /* RDMA and NCCL registrations */
}

/* --- the shim's functions under the driver's names ---------------------------
 * For a program linked to libcuda.so.1 (the symbols are resolved to the
 * preloaded library first). Each fills the slots once from libcuda; a
 * name this libcuda lacks is CUDA_ERROR_NOT_FOUND, as from the driver. */

#define DEFINE(ret, name, params, args)                                  \
	EXPORT ret name params {                                             \
		if (!REAL(name)) {                                               \
			resolve_real_dlsym();                                        \
			resolve_driver();                                            \
			fill_from_driver();                                          \
			if (!REAL(name)) return CUDA_ERROR_NOT_FOUND;                \
		}                                                                \
		return w_##name args;                                            \
	}

DEFINE(CUresult, cuMemAllocAsync, (CUdeviceptr *d, size_t n, CUstream s), (d, n, s))
DEFINE(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *d, size_t n, CUstream s), (d, n, s))
DEFINE(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s), (d, n, p, s))
DEFINE(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s), (d, n, p, s))
DEFINE(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s))
DEFINE(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), (p, s))
DEFINE(CUresult, cuMemAlloc_v2, (CUdeviceptr *d, size_t n), (d, n))
DEFINE(CUresult, cuMemFree_v2, (CUdeviceptr p), (p))
DEFINE(CUresult, cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
DEFINE(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *p, CUdevice d), (p, d))
DEFINE(CUresult, cuDeviceGetMemPool, (CUmemoryPool *p, CUdevice d), (p, d))
DEFINE(CUresult, cuDeviceSetMemPool, (CUdevice d, CUmemoryPool p), (d, p))
DEFINE(CUresult, cuMemPoolCreate, (CUmemoryPool *p, const void *props), (p, props))
DEFINE(CUresult, cuMemPoolDestroy, (CUmemoryPool p), (p))
DEFINE(CUresult, cuMemPoolSetAttribute, (CUmemoryPool p, int a, void *v), (p, a, v))
DEFINE(CUresult, cuMemPoolGetAttribute, (CUmemoryPool p, int a, void *v), (p, a, v))
DEFINE(CUresult, cuMemPoolTrimTo, (CUmemoryPool p, size_t k), (p, k))
DEFINE(CUresult, cuMemPoolSetAccess, (CUmemoryPool p, const void *m, size_t c), (p, m, c))
DEFINE(CUresult, cuStreamBeginCapture, (CUstream s), (s))
DEFINE(CUresult, cuStreamBeginCapture_ptsz, (CUstream s), (s))
DEFINE(CUresult, cuStreamBeginCapture_v2, (CUstream s, int m), (s, m))
DEFINE(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream s, int m), (s, m))
DEFINE(CUresult, cuStreamBeginCaptureToGraph, (CUstream s, void *g, const void *d, const void *e, size_t n, int m), (s, g, d, e, n, m))
DEFINE(CUresult, cuStreamBeginCaptureToGraph_ptsz, (CUstream s, void *g, const void *d, const void *e, size_t n, int m), (s, g, d, e, n, m))
DEFINE(CUresult, cuStreamEndCapture, (CUstream s, void **g), (s, g))
DEFINE(CUresult, cuStreamEndCapture_ptsz, (CUstream s, void **g), (s, g))
DEFINE(CUresult, cuGetProcAddress, (const char *s, void **f, int v, cuuint64_t fl), (s, f, v, fl))
DEFINE(CUresult, cuGetProcAddress_v2, (const char *s, void **f, int v, cuuint64_t fl, void *st), (s, f, v, fl, st))

/* --- the gate's entry points under the driver's names ------------------------
 * For a program linked to libcuda.so.1: each gated function the driver
 * exports, as a thunk of the launch gate (gate.c) over libcuda's own. The
 * words are passed through as gate.c's thunks pass them. */

typedef uint64_t W;
typedef W (*fn12)(W, W, W, W, W, W, W, W, W, W, W, W);

/* A thunk of the gate over find(name) under name itself, resolved at its
 * first call; missing is the answer when find has none. */
#define THUNKED_EXPORT(name, find, missing)                                                \
	EXPORT W name(W a, W b, W c, W d, W e, W f, W g, W h, W i, W j, W k, W l) {            \
		static void *_Atomic fn;                                                           \
		void *t = atomic_load_explicit(&fn, memory_order_acquire);                         \
		if (!t) {                                                                          \
			resolve_real_dlsym();                                                          \
			void *real = find(#name);                                                      \
			if (!real) return missing;                                                     \
			t = gate_lookup(#name, real);                                                  \
			atomic_store_explicit(&fn, t, memory_order_release);                           \
		}                                                                                  \
		return ((fn12)t)(a, b, c, d, e, f, g, h, i, j, k, l);                              \
	}

/* libcuda's own function of that name (not the shim's). */
static void *driver_own(const char *name) {
	void *fn = driver_symbol(name);
	return fn && !is_own(fn) ? fn : NULL;
}

/* The next object's function of that name (NCCL's, past the shim). */
static void *next_own(const char *name) { return real_dlsym(RTLD_NEXT, name); }

#define GATED_EXPORT(name) THUNKED_EXPORT(name, driver_own, CUDA_ERROR_NOT_FOUND)
#define PT(name) GATED_EXPORT(name) GATED_EXPORT(name##_ptsz)
#define PD(name) GATED_EXPORT(name) GATED_EXPORT(name##_ptds)

PT(cuLaunchKernel) PT(cuLaunchKernelEx) PT(cuLaunchCooperativeKernel) PT(cuLaunchHostFunc)
GATED_EXPORT(cuLaunchCooperativeKernelMultiDevice)
PD(cuMemcpy) PT(cuMemcpyAsync) PD(cuMemcpyPeer) PT(cuMemcpyPeerAsync)
PD(cuMemcpyHtoD_v2) PD(cuMemcpyDtoH_v2) PD(cuMemcpyDtoD_v2)
PT(cuMemcpyHtoDAsync_v2) PT(cuMemcpyDtoHAsync_v2) PT(cuMemcpyDtoDAsync_v2)
PD(cuMemcpy2D_v2) PT(cuMemcpy2DAsync_v2) PD(cuMemcpy2DUnaligned_v2)
PD(cuMemcpy3D_v2) PT(cuMemcpy3DAsync_v2) PD(cuMemcpy3DPeer) PT(cuMemcpy3DPeerAsync)
PT(cuMemcpyBatchAsync) PT(cuMemcpy3DBatchAsync)
PD(cuMemsetD8_v2) PD(cuMemsetD16_v2) PD(cuMemsetD32_v2)
PD(cuMemsetD2D8_v2) PD(cuMemsetD2D16_v2) PD(cuMemsetD2D32_v2)
PT(cuMemsetD8Async) PT(cuMemsetD16Async) PT(cuMemsetD32Async)
PT(cuMemsetD2D8Async) PT(cuMemsetD2D16Async) PT(cuMemsetD2D32Async)
PT(cuGraphLaunch) PT(cuGraphUpload)
PT(cuStreamWaitValue32_v2) PT(cuStreamWaitValue64_v2) PT(cuStreamWriteValue32_v2)
PT(cuStreamWriteValue64_v2) PT(cuStreamBatchMemOp_v2)
PT(cuMemPrefetchAsync) PT(cuMemPrefetchAsync_v2)

/* The gate, for libgpumem: it looks these up (dlsym of the process) when
 * it starts, and moves live memory only where it finds them. */
EXPORT int gpumem_preload_gate_close(void) { return gate_close(); }
EXPORT void gpumem_preload_gate_open(void) { gate_open(); }

/* The gated calls made so far (with GPUMEM_PRELOAD_REPORT=1; 0 without):
 * what a test compares with a profiler's count of kernels launched. */
EXPORT unsigned long gpumem_preload_gated_calls(void) { return gate_calls(); }

/* NCCL's registrations, for a program linked to libnccl (PyTorch): the
 * gate's export thunks over NCCL's own. */
#define NEXT_EXPORT(name) THUNKED_EXPORT(name, next_own, 3) /* ncclInternalError: no NCCL to register with */
NEXT_EXPORT(ncclCommRegister)
NEXT_EXPORT(ncclCommWindowRegister)
