/* paths.c: the contracts of the shim's per-call path, against the stand-in
 * driver (shim/c/fakecuda.c, which counts what reaches it) with gpumem on
 * the simulated device. Run under the shim:
 *
 *   paths capture    no capture in progress: no driver call per allocation;
 *                    a capture begun (through cuGetProcAddress, dlsym, or
 *                    the per-thread-stream form) sends its stream's
 *                    allocations to the driver and no other stream's; an
 *                    end on the wrong stream ends nothing; after the end,
 *                    no driver call again
 *   paths devices    (FAKE_CUDA_DEVICES=2) each thread's current context
 *                    names the device of cuMemAllocAsync, the pool names it
 *                    for cuMemAllocFromPoolAsync, switching contexts
 *                    switches devices
 *   paths single     (one device) the device is 0 without asking the driver
 *   paths fork       a child forked before gpumem started runs gpumem of
 *                    its own; one forked after allocates from the driver
 *                    (and says so once), and the parent is unharmed
 *
 * Prints "ok: ..." lines and exits 0, or says what failed and exits 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);

static getproc_t getproc;
static int (*fake_calls)(const char *);

typedef struct {
	uint64_t allocated, peak_allocated, active, peak_active, reserved, peak_reserved, cached, releasable,
	    largest_free;
	double fragmentation;
	uint64_t live_buffers, allocs, frees, device_calls, ooms, trims, limit;
} gm_stats;
static int (*gm_get_stats)(int, gm_stats *, size_t);

static void *proc_flags(const char *name, unsigned long long flags) {
	void *fn = NULL;
	int status = 0;
	if (getproc(name, &fn, 12000, flags, &status) != 0 || !fn) {
		fprintf(stderr, "paths: cuGetProcAddress(%s) failed\n", name);
		exit(1);
	}
	return fn;
}
static void *proc(const char *name) { return proc_flags(name, 0); }

static CUresult (*init)(unsigned);
static CUresult (*retain)(void **, int);
static CUresult (*set_current)(void *);
static CUresult (*stream_create)(CUstream *, unsigned);
static CUresult (*default_pool)(void **, int);
static CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, void *, CUstream);
static CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*free_async)(CUdeviceptr, CUstream);

static void use_device(int dev) {
	void *ctx;
	CHECK(retain(&ctx, dev) == 0 && set_current(ctx) == 0, "context of device %d", dev);
}

/* gpumem's allocated bytes on dev, from the library the shim loaded
 * (dlopen of the same path is the same library). */
static uint64_t allocated(int dev) {
	if (!gm_get_stats) {
		void *g = dlopen(getenv("GPUMEM_LIBRARY") ? getenv("GPUMEM_LIBRARY") : "", RTLD_NOW);
		gm_get_stats = g ? (int (*)(int, gm_stats *, size_t))dlsym(g, "gpumem_get_stats") : NULL;
		if (!gm_get_stats) {
			fprintf(stderr, "paths: no gpumem_get_stats in $GPUMEM_LIBRARY\n");
			exit(1);
		}
	}
	gm_stats s;
	memset(&s, 0, sizeof s);
	CHECK(gm_get_stats(dev, &s, sizeof s) == 0, "gpumem_get_stats(%d)", dev);
	return s.allocated;
}

/* Whether an allocation of n on s from pool (NULL: cuMemAllocAsync) reached
 * the driver; frees it. */
static int to_driver(void *pool, CUstream s, size_t n) {
	const char *name = pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync";
	int before = fake_calls(name);
	CUdeviceptr p = 0;
	CHECK((pool ? alloc_from_pool(&p, n, pool, s) : alloc_async(&p, n, s)) == 0 && p, "%s", name);
	int driver = fake_calls(name) > before;
	CHECK(free_async(p, s) == 0, "cuMemFreeAsync");
	return driver;
}

static int capture(void) {
	CUresult (*begin)(CUstream, int) = proc("cuStreamBeginCapture");
	CUresult (*end)(CUstream, void **) = proc("cuStreamEndCapture");
	CUresult (*begin_ptsz)(CUstream, int) = proc_flags("cuStreamBeginCapture", 1);
	CUresult (*end_ptsz)(CUstream, void **) = proc_flags("cuStreamEndCapture", 1);
	CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream) = proc_flags("cuMemAllocAsync", 1);
	CUresult (*free_async_ptsz)(CUdeviceptr, CUstream) = proc_flags("cuMemFreeAsync", 1);
	void *libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	CUresult (*begin_dlsym)(CUstream, int) = (CUresult(*)(CUstream, int))dlsym(libcuda, "cuStreamBeginCapture_v2");
	void *pool, *graph;
	CUstream s, c;
	use_device(0);
	CHECK(stream_create(&s, 1) == 0 && stream_create(&c, 1) == 0, "streams");
	CHECK(default_pool(&pool, 0) == 0, "pool");

	int q = fake_calls("cuStreamIsCapturing");
	for (int i = 0; i < 100; i++) CHECK(!to_driver(pool, s, 4096) && !to_driver(NULL, c, 4096), "gpumem serves");
	CHECK(fake_calls("cuStreamIsCapturing") == q, "%d capture checks with no capture in progress, want 0",
	      fake_calls("cuStreamIsCapturing") - q);
	ok("no capture in progress, no capture check in 200 allocations");

	CHECK(begin(c, 0) == 0, "begin capture");
	CHECK(to_driver(pool, c, 1 << 20) && to_driver(NULL, c, 1 << 20), "a captured stream allocates from the driver");
	CHECK(!to_driver(pool, s, 1 << 20), "another stream allocates from gpumem during a capture");
	CHECK(end(s, &graph) != 0, "ending a stream that is not capturing fails");
	CHECK(to_driver(pool, c, 4096), "a failed end on another stream ends nothing");
	CHECK(end(c, &graph) == 0, "end capture");
	CHECK(!to_driver(pool, c, 4096), "after the end the stream allocates from gpumem");
	q = fake_calls("cuStreamIsCapturing");
	for (int i = 0; i < 100; i++) CHECK(!to_driver(pool, s, 4096), "gpumem serves");
	CHECK(fake_calls("cuStreamIsCapturing") == q, "capture checks after the capture ended");
	ok("a capture's stream allocates from the driver until its end, other streams from gpumem");

	CHECK(begin_dlsym && begin_dlsym(c, 0) == 0, "begin capture through dlsym");
	CHECK(to_driver(pool, c, 4096), "captured through dlsym's cuStreamBeginCapture_v2");
	CHECK(end(c, &graph) == 0 && !to_driver(pool, c, 4096), "end");
	ok("a capture begun through dlsym is seen");

	/* The per-thread default stream: stream 0 of the _ptsz forms. */
	CHECK(begin_ptsz(NULL, 0) == 0, "begin capture of the per-thread stream");
	int before = fake_calls("cuMemAllocAsync");
	CUdeviceptr p = 0;
	CHECK(alloc_async_ptsz(&p, 4096, NULL) == 0 && fake_calls("cuMemAllocAsync") == before + 1,
	      "the per-thread stream, captured, allocates from the driver");
	CHECK(free_async_ptsz(p, NULL) == 0, "free");
	CHECK(to_driver(pool, s, 4096) == 0, "another stream, from gpumem");
	CHECK(end_ptsz(NULL, &graph) == 0, "end capture of the per-thread stream");
	before = fake_calls("cuMemAllocAsync");
	CHECK(alloc_async_ptsz(&p, 4096, NULL) == 0 && fake_calls("cuMemAllocAsync") == before, "after the end, gpumem");
	CHECK(free_async_ptsz(p, NULL) == 0, "free");
	ok("the per-thread stream's capture (stream 0 of the _ptsz forms)");
	return failures ? 1 : 0;
}

static void *on_device1(void *arg) {
	CUstream s = arg;
	use_device(1);
	for (int i = 0; i < 10; i++) {
		CUdeviceptr p = 0;
		CHECK(alloc_async(&p, 1 << 20, s) == 0, "alloc on device 1's thread");
	}
	return NULL;
}

static int devices(void) {
	void *pool0, *pool1;
	CUstream s;
	CHECK(stream_create(&s, 1) == 0, "stream");
	use_device(1);
	CUdeviceptr p = 0, q = 0;
	CHECK(alloc_async(&p, 3 << 20, s) == 0, "alloc");
	CHECK(allocated(1) == 3 << 20 && allocated(0) == 0, "context of device 1: %llu on 1, %llu on 0",
	      (unsigned long long)allocated(1), (unsigned long long)allocated(0));
	use_device(0);
	CHECK(alloc_async(&q, 5 << 20, s) == 0, "alloc");
	CHECK(allocated(0) == 5 << 20 && allocated(1) == 3 << 20, "switched to device 0: %llu on 0, %llu on 1",
	      (unsigned long long)allocated(0), (unsigned long long)allocated(1));
	CHECK(free_async(p, s) == 0 && free_async(q, s) == 0, "frees");
	CHECK(allocated(0) == 0 && allocated(1) == 0, "everything freed");
	ok("switching the thread's context switches the device");

	CHECK(default_pool(&pool0, 0) == 0 && default_pool(&pool1, 1) == 0 && pool0 != pool1, "pools");
	CHECK(alloc_from_pool(&p, 2 << 20, pool1, s) == 0 && allocated(1) == 2 << 20 && allocated(0) == 0,
	      "device 1's pool with device 0 current allocates on device 1");
	CHECK(free_async(p, s) == 0 && allocated(1) == 0, "free");
	ok("the pool names the device");

	pthread_t t;
	CHECK(pthread_create(&t, NULL, on_device1, s) == 0 && pthread_join(t, NULL) == 0, "thread");
	CHECK(allocated(1) == 10 << 20 && allocated(0) == 0, "a thread on device 1 while this one is on 0: %llu on 1, %llu on 0",
	      (unsigned long long)allocated(1), (unsigned long long)allocated(0));
	ok("each thread's context");
	return failures ? 1 : 0;
}

static int single(void) {
	CUstream s;
	void *pool;
	use_device(0);
	CHECK(stream_create(&s, 1) == 0 && default_pool(&pool, 0) == 0, "stream, pool");
	CHECK(!to_driver(NULL, s, 4096), "gpumem"); /* gpumem starts here */
	int q = fake_calls("cuCtxGetDevice");
	for (int i = 0; i < 100; i++) CHECK(!to_driver(NULL, s, 4096) && !to_driver(pool, s, 4096), "gpumem serves");
	CHECK(fake_calls("cuCtxGetDevice") == q, "%d context queries with one device, want 0", fake_calls("cuCtxGetDevice") - q);
	CHECK(allocated(0) == 0, "everything freed");
	ok("one device: no context query in 200 allocations");
	return failures ? 1 : 0;
}

/* A child: allocates, and says who served it by its exit status (0 gpumem,
 * 3 the driver, 1 a failure). */
static int child(CUstream s) {
	int before = fake_calls("cuMemAllocAsync");
	CUdeviceptr p = 0;
	if (alloc_async(&p, 4096, s) != 0 || free_async(p, s) != 0) return 1;
	return fake_calls("cuMemAllocAsync") > before ? 3 : 0;
}

static int wait_child(pid_t pid) {
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
	return WEXITSTATUS(st);
}

static int forks(void) {
	CUstream s;
	use_device(0);
	CHECK(stream_create(&s, 1) == 0, "stream");
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) _exit(child(s));
	CHECK(wait_child(pid) == 0, "a child forked before gpumem started is served by a gpumem of its own");
	CHECK(!to_driver(NULL, s, 4096), "the parent: gpumem");
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) _exit(child(s));
	CHECK(wait_child(pid) == 3, "a child forked after gpumem started allocates from the driver");
	CHECK(!to_driver(NULL, s, 4096), "the parent still: gpumem");
	ok("fork before gpumem starts, and after");
	return failures ? 1 : 0;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: paths capture|devices|single|fork\n");
		return 2;
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "paths: %s\n", dlerror());
		return 1;
	}
	getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
	fake_calls = (int (*)(const char *))dlsym(h, "fake_calls");
	if (!getproc || !fake_calls) {
		fprintf(stderr, "paths: needs the stand-in driver (fake_calls)\n");
		return 1;
	}
	init = proc("cuInit");
	retain = proc("cuDevicePrimaryCtxRetain");
	set_current = proc("cuCtxSetCurrent");
	stream_create = proc("cuStreamCreate");
	default_pool = proc("cuDeviceGetDefaultMemPool");
	alloc_from_pool = proc("cuMemAllocFromPoolAsync");
	alloc_async = proc("cuMemAllocAsync");
	free_async = proc("cuMemFreeAsync");
	CHECK(init(0) == 0, "cuInit");
	if (strcmp(argv[1], "capture") == 0) return capture();
	if (strcmp(argv[1], "devices") == 0) return devices();
	if (strcmp(argv[1], "single") == 0) return single();
	if (strcmp(argv[1], "fork") == 0) return forks();
	fprintf(stderr, "paths: unknown case %s\n", argv[1]);
	return 2;
}
