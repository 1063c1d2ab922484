/* gaps.c: what an alloc+free pair costs a C caller of libgpumem when the
 * caller does other work between pairs (a PyTorch program runs Python and
 * launches kernels between allocations), for BENCHMARKS.md.
 *
 *   cc -O2 -I clib -o build/gaps clib/cbench/gaps.c build/libgpumem.so -Wl,-rpath,$PWD/build
 *   GPUMEM_CONFIG=device=sim build/gaps      # or on a GPU: build/gaps
 *
 * For each gap (microseconds of busy waiting between pairs, which leave
 * the caches warm) prints the mean ns of a 4 KiB gpumem_alloc +
 * gpumem_free pair over N pairs, and then the same with CACHE KiB of
 * memory written between pairs (the caches evicted, as a program's own
 * work evicts them). The pair alone is pairs.c's figure. Then, for gaps
 * around where the cost jumps, the first call after the gap (an alloc) and
 * the call after it (a free) apart: which crossing pays. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpumem.h"

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

/* mean ns per pair, with gap_us of busy waiting and touch bytes written
 * before each. */
static double run(double gap_us, char *buf, size_t touch, int n) {
	double total = 0;
	for (int i = 0; i < n; i++) {
		double w = now();
		while (now() - w < gap_us * 1000) {
		}
		for (size_t k = 0; k < touch; k += 64) buf[k]++;
		double t0 = now();
		void *p = gpumem_alloc(4096, 0, 0);
		gpumem_free(p, 4096, 0, 0);
		total += now() - t0;
	}
	return total / n;
}

int main(void) {
	const double gaps[] = {0, 5, 20, 50, 200, 1000};
	const size_t sizes_kib[] = {0, 1024, 4096};
	const size_t most = 4096 << 10;
	char *buf = calloc(1, most);
	if (!buf) return 1;
	for (int i = 0; i < 1000; i++) gpumem_free(gpumem_alloc(4096, 0, 0), 4096, 0, 0);
	printf("gap us   touched KiB   ns/pair\n");
	for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
		for (size_t s = 0; s < sizeof sizes_kib / sizeof sizes_kib[0]; s++) {
			int n = gaps[g] >= 200 ? 2000 : 20000;
			printf("%6.0f   %11zu   %7.0f\n", gaps[g], sizes_kib[s], run(gaps[g], buf, sizes_kib[s] << 10, n));
		}
	}
	const double near[] = {50, 80, 100, 120, 150, 200, 1000};
	printf("\ngap us   first call ns   next call ns\n");
	for (size_t g = 0; g < sizeof near / sizeof near[0]; g++) {
		int n = near[g] >= 1000 ? 500 : 3000;
		double first = 0, next = 0;
		for (int i = 0; i < n; i++) {
			double w = now();
			while (now() - w < near[g] * 1000) {
			}
			double t0 = now();
			void *p = gpumem_alloc(4096, 0, 0);
			double t1 = now();
			gpumem_free(p, 4096, 0, 0);
			first += t1 - t0;
			next += now() - t1;
		}
		printf("%6.0f   %13.0f   %12.0f\n", near[g], first / n, next / n);
	}
	free(buf);
	return 0;
}
