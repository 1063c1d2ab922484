/* shimbench.c: what the preload shim's per-call path costs, for
 * BENCHMARKS.md. It makes JAX's cuda_async calls (cuMemAllocFromPoolAsync
 * from the device's default pool and cuMemFreeAsync on one stream, a warm
 * cache) the way XLA finds them (dlopen libcuda.so.1, cuGetProcAddress),
 * and times the parts of the path one by one:
 *
 *   pair          cuMemAllocFromPoolAsync + cuMemFreeAsync as the program
 *                 makes them: through the shim when it is preloaded, else
 *                 the driver's own (the cuda_async mode without gpumem)
 *   pair, capture the same while another stream is being captured (the
 *                 shim then asks the driver whether the stream is)
 *   async pair    cuMemAllocAsync + cuMemFreeAsync (no pool named)
 *   capture check cuStreamIsCapturing, once
 *   ctx device    cuCtxGetDevice, once; ctx current: cuCtxGetCurrent, once
 *   pool used     cuMemPoolGetAttribute(USED_MEM_CURRENT) of the default
 *                 pool, once (through the shim: gpumem_get_usage)
 *   pool thresh.  cuMemPoolGetAttribute(RELEASE_THRESHOLD), once
 *   mem info      cuMemGetInfo, once
 *   gpumem pair   gpumem_allocate + gpumem_deallocate_on called directly
 *                 (two C-to-Go crossings and gpumem's own path), with the
 *                 free's device unknown (-1, as the shim had it) and known
 *   crossings     two C-to-Go calls that do nothing (gpumem_deallocate of
 *                 NULL): the crossing's share of a pair
 *
 *   shimbench [PAIRS]     (default 200000 per run; median of 5 runs)
 *
 * With the stand-in driver (shim/c/fakecuda.c, GPUMEM_CONFIG=device=sim)
 * or the real one. Needs GPUMEM_LIBRARY (libgpumem.so) for the gpumem
 * rows; LD_PRELOAD=libgpumem_preload.so for the shim. Prints one line per
 * row: name, ns per call or pair at 4 KiB and at 1 MiB. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);

static getproc_t getproc;

static void *proc(const char *name) {
	void *fn = NULL;
	int status = 0;
	if (getproc(name, &fn, 12000, 0, &status) != 0 || !fn) {
		fprintf(stderr, "shimbench: cuGetProcAddress(%s) failed\n", name);
		exit(1);
	}
	return fn;
}

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

#define RUNS 5
static int pairs = 200000;

/* The median over RUNS runs of n iterations of the loop body, in ns per
 * iteration. */
#define TIME_N(result, n, body)                                     \
	do {                                                            \
		double t_[RUNS];                                            \
		for (int r_ = 0; r_ < RUNS; r_++) {                         \
			double t0_ = now();                                     \
			for (int k_ = 0; k_ < (n); k_++) { body; }              \
			t_[r_] = (now() - t0_) / (n);                           \
		}                                                           \
		qsort(t_, RUNS, sizeof t_[0], cmp);                         \
		result = t_[RUNS / 2];                                      \
	} while (0)
#define TIME(result, body) TIME_N(result, pairs, body)
/* Queries that may reach the driver or walk gpumem's pools (microseconds
 * each on a real GPU) run a hundredth as often. */
#define QUERIES (pairs / 100 > 100 ? pairs / 100 : 100)

#define MUST(call)                                                                  \
	do {                                                                            \
		int rc_ = (call);                                                           \
		if (rc_ != 0) {                                                             \
			fprintf(stderr, "shimbench: %s failed (%d) at line %d\n", #call, rc_, __LINE__); \
			exit(1);                                                                \
		}                                                                           \
	} while (0)

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut short by timeout keeps its rows */
	if (argc > 1 && (pairs = atoi(argv[1])) <= 0) {
		fprintf(stderr, "shimbench: PAIRS must be a positive number, got %s\n", argv[1]);
		return 2;
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "shimbench: %s\n", dlerror());
		return 1;
	}
	getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
	if (!getproc) {
		fprintf(stderr, "shimbench: no cuGetProcAddress_v2 in libcuda.so.1\n");
		return 1;
	}
	CUresult (*init)(unsigned) = proc("cuInit");
	CUresult (*device_get)(int *, int) = proc("cuDeviceGet");
	CUresult (*retain)(void **, int) = proc("cuDevicePrimaryCtxRetain");
	CUresult (*set_current)(void *) = proc("cuCtxSetCurrent");
	CUresult (*get_current)(void **) = proc("cuCtxGetCurrent");
	CUresult (*ctx_device)(int *) = proc("cuCtxGetDevice");
	CUresult (*stream_create)(CUstream *, unsigned) = proc("cuStreamCreate");
	CUresult (*stream_sync)(CUstream) = proc("cuStreamSynchronize");
	CUresult (*is_capturing)(CUstream, int *) = proc("cuStreamIsCapturing");
	CUresult (*begin_capture)(CUstream, int) = proc("cuStreamBeginCapture");
	CUresult (*end_capture)(CUstream, void **) = proc("cuStreamEndCapture");
	CUresult (*graph_destroy)(void *) = proc("cuGraphDestroy");
	CUresult (*default_pool)(void **, int) = proc("cuDeviceGetDefaultMemPool");
	CUresult (*pool_set)(void *, int, void *) = proc("cuMemPoolSetAttribute");
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, void *, CUstream) = proc("cuMemAllocFromPoolAsync");
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = proc("cuMemAllocAsync");
	CUresult (*free_async)(CUdeviceptr, CUstream) = proc("cuMemFreeAsync");
	CUresult (*pool_get)(void *, int, void *) = proc("cuMemPoolGetAttribute");
	CUresult (*mem_info)(size_t *, size_t *) = proc("cuMemGetInfo");

	int dev;
	void *ctx, *pool, *graph;
	CUstream s, cap;
	MUST(init(0));
	MUST(device_get(&dev, 0));
	MUST(retain(&ctx, dev));
	MUST(set_current(ctx));
	MUST(stream_create(&s, 1));
	MUST(stream_create(&cap, 1));
	MUST(default_pool(&pool, dev));
	uint64_t keep = UINT64_MAX; /* the driver's pool keeps its cache, as XLA sets it */
	MUST(pool_set(pool, 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */, &keep));

	Dl_info info;
	const char *path = dladdr((void *)alloc_from_pool, &info) && strstr(info.dli_fname, "preload") ? "shim" : "driver";
	printf("# shimbench: %d pairs per run, median of %d runs; the program's calls go to the %s\n", pairs, RUNS, path);
	printf("%-34s %10s %10s\n", "row", "4 KiB ns", "1 MiB ns");

	const size_t sizes[2] = {4096, 1 << 20};
	double t[2];
	CUdeviceptr p;
	int st;
	for (int i = 0; i < 2; i++) TIME(t[i], MUST(alloc_from_pool(&p, sizes[i], pool, s)); MUST(free_async(p, s)));
	printf("%-34s %10.1f %10.1f\n", "pair (FromPool + FreeAsync)", t[0], t[1]);
	MUST(begin_capture(cap, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */));
	for (int i = 0; i < 2; i++) TIME(t[i], MUST(alloc_from_pool(&p, sizes[i], pool, s)); MUST(free_async(p, s)));
	MUST(end_capture(cap, &graph));
	if (graph) graph_destroy(graph);
	printf("%-34s %10.1f %10.1f\n", "pair, another stream capturing", t[0], t[1]);
	for (int i = 0; i < 2; i++) TIME(t[i], MUST(alloc_async(&p, sizes[i], s)); MUST(free_async(p, s)));
	printf("%-34s %10.1f %10.1f\n", "async pair (AllocAsync + FreeAsync)", t[0], t[1]);
	MUST(stream_sync(s));

	TIME(t[0], MUST(is_capturing(s, &st)));
	printf("%-34s %10.1f %10s\n", "capture check (cuStreamIsCapturing)", t[0], "-");
	int d;
	TIME(t[0], MUST(ctx_device(&d)));
	printf("%-34s %10.1f %10s\n", "ctx device (cuCtxGetDevice)", t[0], "-");
	void *c;
	TIME(t[0], MUST(get_current(&c)));
	printf("%-34s %10.1f %10s\n", "ctx current (cuCtxGetCurrent)", t[0], "-");
	uint64_t attr;
	TIME_N(t[0], QUERIES, MUST(pool_get(pool, 7 /* CU_MEMPOOL_ATTR_USED_MEM_CURRENT */, &attr)));
	printf("%-34s %10.1f %10s\n", "pool used (cuMemPoolGetAttribute)", t[0], "-");
	TIME(t[0], MUST(pool_get(pool, 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */, &attr)));
	printf("%-34s %10.1f %10s\n", "pool threshold (GetAttribute)", t[0], "-");
	size_t mfree, mtotal;
	TIME_N(t[0], QUERIES, MUST(mem_info(&mfree, &mtotal)));
	printf("%-34s %10.1f %10s\n", "mem info (cuMemGetInfo)", t[0], "-");

	const char *lib = getenv("GPUMEM_LIBRARY");
	void *g = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
	if (!g) {
		printf("# no gpumem rows: GPUMEM_LIBRARY %s\n", lib && *lib ? dlerror() : "is not set");
		return 0;
	}
	int (*gm_allocate)(void **, size_t, int, void *) = (int (*)(void **, size_t, int, void *))dlsym(g, "gpumem_allocate");
	int (*gm_free_on)(void *, int, void *) = (int (*)(void *, int, void *))dlsym(g, "gpumem_deallocate_on");
	int (*gm_free)(void *, int) = (int (*)(void *, int))dlsym(g, "gpumem_deallocate");
	if (!gm_allocate || !gm_free_on || !gm_free) {
		fprintf(stderr, "shimbench: %s is not a gpumem library\n", lib);
		return 1;
	}
	void *q;
	for (int i = 0; i < 2; i++) TIME(t[i], MUST(gm_allocate(&q, sizes[i], dev, s)); MUST(gm_free_on(q, -1, s)));
	printf("%-34s %10.1f %10.1f\n", "gpumem pair, free's device -1", t[0], t[1]);
	for (int i = 0; i < 2; i++) TIME(t[i], MUST(gm_allocate(&q, sizes[i], dev, s)); MUST(gm_free_on(q, dev, s)));
	printf("%-34s %10.1f %10.1f\n", "gpumem pair, free's device known", t[0], t[1]);
	TIME(t[0], MUST(gm_free(NULL, dev)); MUST(gm_free(NULL, dev)));
	printf("%-34s %10.1f %10s\n", "crossings (2 empty C-to-Go calls)", t[0], "-");
	return 0;
}
