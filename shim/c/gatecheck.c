/* gatecheck.c: the launch gate's contracts (shim/c/gate.c), against the
 * stand-in driver (fakecuda.c: its cuLaunchKernel checks its arguments and
 * counts itself) with gpumem on the simulated device. Run under the shim:
 *
 *   gatecheck gate     a launch found through cuGetProcAddress (both stream
 *                      flags) or dlsym passes its eleven arguments intact;
 *                      while the gate is closed no launch reaches the
 *                      driver, and one waiting at the gate goes on once it
 *                      opens; closing waits for a launch inside the driver;
 *                      eight threads launching while the gate closes and
 *                      opens 200 times: none reaches the driver while it
 *                      is closed, all of them do in the end
 *   gatecheck unknown  a lookup of a driver function the shim cannot
 *                      classify turns moves off: the gate refuses to close
 *   gatecheck opaque   a lookup of cuGetExportTable (the CUDA runtime's way
 *                      to the driver, which the gate cannot see) turns
 *                      moves off
 *   gatecheck export   the physical handle of an address that is not
 *                      gpumem's leaves moves on; of one of gpumem's, off
 *   gatecheck bench    the gate's cost per launch (see bench, below)
 *   gatecheck gather   (GPUMEM_CONFIG with a limit and 16 MiB spans) a
 *                      request that fits only if live chunks move: prints
 *                      "served" or "out of memory" and the splits; run
 *                      with and without the shim
 *
 * Prints "ok: ..." lines and exits 0, or says what failed and exits 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#include "../../clib/gpumem.h"

typedef int CUresult;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                             void **, void **);

static int (*fake_launches)(void), (*fake_launch_args)(void);
static int (*gate_close)(void);
static void (*gate_open)(void);

static void sleep_ms(int ms) {
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&t, NULL);
}

static CUresult launch(launch_t f, unsigned command) {
	return f((void *)0x100, command, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, (void *)0x108, (void **)0x109,
	         (void **)0x10a);
}

static void *libcuda;
static getproc_t getproc;

static void setup(void) {
	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!libcuda) {
		fprintf(stderr, "FAIL: no libcuda.so.1: %s\n", dlerror());
		exit(1);
	}
	getproc = (getproc_t)dlsym(libcuda, "cuGetProcAddress_v2");
	fake_launches = (int (*)(void))dlsym(libcuda, "fake_launches");
	fake_launch_args = (int (*)(void))dlsym(libcuda, "fake_launch_args");
	gate_close = (int (*)(void))dlsym(RTLD_DEFAULT, "gpumem_preload_gate_close");
	gate_open = (void (*)(void))dlsym(RTLD_DEFAULT, "gpumem_preload_gate_open");
	if (!getproc || !fake_launches || !fake_launch_args || !gate_close || !gate_open) {
		fprintf(stderr, "FAIL: run under the shim, with the stand-in driver\n");
		exit(1);
	}
}

static launch_t lookup_launch(int flags) {
	void *f = NULL;
	int st = 0;
	if (getproc("cuLaunchKernel", &f, 13000, flags, &st) != 0) return NULL;
	return (launch_t)f;
}

static atomic_int entered, done;

static void *one_launch(void *arg) {
	atomic_store(&entered, 1);
	launch((launch_t)arg, (unsigned)(uintptr_t)0);
	atomic_store(&done, 1);
	return NULL;
}

static void *slow_launch(void *arg) {
	atomic_store(&entered, 1);
	launch((launch_t)arg, 2); /* 200 ms inside the driver */
	atomic_store(&done, 1);
	return NULL;
}

enum { THREADS = 8, PER_THREAD = 20000 };

static void *launcher(void *arg) {
	for (int i = 0; i < PER_THREAD; i++) launch((launch_t)arg, 0);
	return NULL;
}

static void gate(void) {
	launch_t f0 = lookup_launch(0), f1 = lookup_launch(1);
	launch_t fd = (launch_t)dlsym(libcuda, "cuLaunchKernel");
	CHECK(f0 && f1 && fd, "cuLaunchKernel not found");
	if (!f0 || !f1 || !fd) return;
	int n0 = fake_launches();
	launch(f0, 0), launch(f1, 0), launch(fd, 0);
	CHECK(fake_launches() == n0 + 3 && fake_launch_args() == 0, "%d launches arrived, %d with other arguments; want 3, none",
	      fake_launches() - n0, fake_launch_args());
	ok("launches through cuGetProcAddress (both flags) and dlsym arrive with their eleven arguments");

	CHECK(gate_close() == 0, "the gate did not close");
	int before = fake_launches();
	pthread_t t;
	atomic_store(&entered, 0), atomic_store(&done, 0);
	pthread_create(&t, NULL, one_launch, (void *)f0);
	while (!atomic_load(&entered)) sleep_ms(1);
	sleep_ms(100);
	CHECK(fake_launches() == before && !atomic_load(&done), "a launch reached the driver while the gate was closed");
	gate_open();
	pthread_join(t, NULL);
	CHECK(fake_launches() == before + 1, "the launch waiting at the gate did not go on once it opened");
	ok("a launch waits at the closed gate and goes on once it opens");

	atomic_store(&entered, 0), atomic_store(&done, 0);
	pthread_create(&t, NULL, slow_launch, (void *)f1);
	while (!atomic_load(&entered)) sleep_ms(1);
	sleep_ms(50); /* inside the driver's 200 ms */
	CHECK(gate_close() == 0, "the gate did not close");
	CHECK(atomic_load(&done) || fake_launches() == before + 2, "the gate closed while a launch was inside the driver");
	gate_open();
	pthread_join(t, NULL);
	ok("closing waits for a launch inside the driver");

	pthread_t ts[THREADS];
	int start = fake_launches();
	for (int i = 0; i < THREADS; i++) pthread_create(&ts[i], NULL, launcher, (void *)(i % 2 ? f0 : f1));
	int moves = 0, leaked = 0;
	for (int k = 0; k < 200; k++) {
		if (gate_close() != 0) {
			failures++;
			break;
		}
		int n = fake_launches();
		for (int spin = 0; spin < 2000; spin++) __asm__ volatile("" ::: "memory");
		sched_yield();
		if (fake_launches() != n) leaked++;
		gate_open();
		moves++;
		sleep_ms(0);
	}
	for (int i = 0; i < THREADS; i++) pthread_join(ts[i], NULL);
	CHECK(leaked == 0, "%d of %d closings saw a launch reach the driver", leaked, moves);
	CHECK(fake_launches() - start == THREADS * PER_THREAD && fake_launch_args() == 0,
	      "%d launches arrived of %d, %d with other arguments", fake_launches() - start, THREADS * PER_THREAD,
	      fake_launch_args());
	ok("eight threads launching across 200 closings: none while closed, all in the end");
}

static void unknown(void) {
	CHECK(gate_close() == 0, "the gate did not close before the unknown lookup");
	gate_open();
	void *f = NULL;
	int st = 0;
	getproc("cuBrandNewCall", &f, 13000, 0, &st);
	CHECK(f != NULL, "cuBrandNewCall not found");
	CHECK(gate_close() != 0, "the gate closed after a lookup it cannot classify");
	ok("an unclassified lookup turns moves off");
}

static void opaque(void) {
	CHECK(gate_close() == 0, "the gate did not close before cuGetExportTable");
	gate_open();
	void *f = NULL;
	int st = 0;
	getproc("cuGetExportTable", &f, 13000, 0, &st);
	CHECK(f != NULL, "cuGetExportTable not found");
	CHECK(gate_close() != 0, "the gate closed after cuGetExportTable, whose launches it cannot see");
	ok("a lookup of cuGetExportTable turns moves off");
}

static void export(void) {
	void *f = NULL;
	int st = 0;
	getproc("cuMemRetainAllocationHandle", &f, 13000, 0, &st);
	CUresult (*retain)(unsigned long long *, void *) = (CUresult(*)(unsigned long long *, void *))f;
	const char *path = getenv("GPUMEM_LIBRARY");
	void *gm = path ? dlopen(path, RTLD_NOW) : NULL;
	gpumem_status (*alloc)(void **, size_t, int, void *) = gm ? dlsym(gm, "gpumem_allocate") : NULL;
	CHECK(retain && alloc, "cuMemRetainAllocationHandle or gpumem_allocate not found");
	if (!retain || !alloc) return;
	void *p = NULL;
	CHECK(alloc(&p, 1 << 20, 0, NULL) == GPUMEM_SUCCESS, "gpumem_allocate failed");
	unsigned long long h;
	char host[64];
	retain(&h, host);
	CHECK(gate_close() == 0, "an export of host memory turned moves off");
	gate_open();
	retain(&h, (char *)p + 4096);
	CHECK(gate_close() != 0, "an export of gpumem's memory left moves on");
	ok("an export of gpumem's memory turns moves off, of another's does not");
}

/* Eight empty 16 MiB spans filled with 64 buffers of 2 MiB, then 7 of
 * each 8 freed (as defrag_test.go's strand): every span
 * keeps one live buffer and 14 MiB idle; 100 MiB more fits under a 128 MiB
 * limit only if live chunks move. */
static int gather(void) {
	const char *path = getenv("GPUMEM_LIBRARY");
	void *gm = path ? dlopen(path, RTLD_NOW) : NULL;
	gpumem_status (*alloc)(void **, size_t, int, void *) = gm ? dlsym(gm, "gpumem_allocate") : NULL;
	gpumem_status (*dealloc)(void *, int) = gm ? dlsym(gm, "gpumem_deallocate") : NULL;
	gpumem_status (*stats)(int, gpumem_stats *, size_t) = gm ? dlsym(gm, "gpumem_get_stats") : NULL;
	if (!alloc || !dealloc || !stats) {
		fprintf(stderr, "FAIL: no gpumem library at GPUMEM_LIBRARY\n");
		return 1;
	}
	void *b[64];
	for (int i = 0; i < 8; i++) /* eight 16 MiB spans, mapped and empty */
		if (alloc(&b[i], 16 << 20, 0, NULL) != GPUMEM_SUCCESS) {
			fprintf(stderr, "FAIL: span %d\n", i);
			return 1;
		}
	for (int i = 0; i < 8; i++) dealloc(b[i], 0);
	for (int i = 0; i < 64; i++)
		if (alloc(&b[i], 2 << 20, 0, NULL) != GPUMEM_SUCCESS) {
			fprintf(stderr, "FAIL: allocation %d of the strand\n", i);
			return 1;
		}
	for (int i = 0; i < 64; i++)
		if (i % 8 != 3) dealloc(b[i], 0);
	void *big = NULL;
	gpumem_status st = alloc(&big, 100 << 20, 0, NULL);
	gpumem_stats s;
	memset(&s, 0, sizeof s);
	stats(0, &s, sizeof s);
	printf("%s, %llu splits\n", st == GPUMEM_SUCCESS ? "served" : "out of memory", (unsigned long long)s.splits);
	return 0;
}

/* The gate's cost on the launch path: ns per cuLaunchKernel that returns
 * at once in the stand-in, called directly and through the shim's thunk,
 * by 1, 2, 4 and 8 threads at once (each its own calls; the gate keeps a
 * count per thread's shard, so the figure should not grow with threads).
 * One line per thread count: threads, direct ns, gated ns (medians of 5). */
enum { BENCH_CALLS = 2000000 };
static atomic_int bench_go;

struct bench_arg {
	launch_t f;
	double ns;
};

static double seconds(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *bench_thread(void *p) {
	struct bench_arg *a = p;
	while (!atomic_load(&bench_go)) {
	}
	double t0 = seconds();
	for (int i = 0; i < BENCH_CALLS; i++) launch(a->f, 3);
	a->ns = (seconds() - t0) * 1e9 / BENCH_CALLS;
	return NULL;
}

/* The slowest thread's ns per call, k threads calling f at once. */
static double bench_once(launch_t f, int k) {
	pthread_t ts[8];
	struct bench_arg args[8];
	atomic_store(&bench_go, 0);
	for (int i = 0; i < k; i++) {
		args[i].f = f;
		pthread_create(&ts[i], NULL, bench_thread, &args[i]);
	}
	atomic_store(&bench_go, 1);
	double worst = 0;
	for (int i = 0; i < k; i++) {
		pthread_join(ts[i], NULL);
		if (args[i].ns > worst) worst = args[i].ns;
	}
	return worst;
}

static int cmp_double(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median5(launch_t f, int k) {
	double v[5];
	for (int r = 0; r < 5; r++) v[r] = bench_once(f, k);
	qsort(v, 5, sizeof v[0], cmp_double);
	return v[2];
}

static void bench(void) {
	void *(*direct_fn)(void) = (void *(*)(void))dlsym(libcuda, "fake_launch_fn");
	launch_t direct = direct_fn ? (launch_t)direct_fn() : NULL, gated = lookup_launch(0);
	if (!direct || !gated || (void *)direct == (void *)gated) {
		fprintf(stderr, "FAIL: no stand-in launch, or no thunk over it\n");
		failures++;
		return;
	}
	for (int k = 1; k <= 8; k *= 2) printf("%d threads: direct %.1f ns, gated %.1f ns\n", k, median5(direct, k), median5(gated, k));
}

int main(int argc, char **argv) {
	const char *what = argc > 1 ? argv[1] : "";
	if (strcmp(what, "gather") == 0) return gather();
	setup();
	if (strcmp(what, "gate") == 0)
		gate();
	else if (strcmp(what, "unknown") == 0)
		unknown();
	else if (strcmp(what, "export") == 0)
		export();
	else if (strcmp(what, "opaque") == 0)
		opaque();
	else if (strcmp(what, "bench") == 0)
		bench();
	else {
		fprintf(stderr, "usage: gatecheck gate|unknown|opaque|export|gather|bench\n");
		return 2;
	}
	return failures ? 1 : 0;
}
