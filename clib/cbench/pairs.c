/* pairs.c: what an alloc+free pair costs a C caller of libgpumem (the
 * cache-hit path, C-to-Go crossing included), for BENCHMARKS.md.
 *
 *   cc -O2 -I clib -o build/pairs clib/cbench/pairs.c build/libgpumem.so -Wl,-rpath,$PWD/build
 *   GPUMEM_CONFIG=device=sim build/pairs      # or on a GPU: build/pairs
 *
 * Prints one line per size: the median over 5 runs of N pairs of
 * gpumem_alloc + gpumem_free (PyTorch's entry points) and of
 * gpumem_allocate + gpumem_deallocate, in ns per pair. Compare with the Go
 * side alone (go test -bench HostAllocFree ./internal/host). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpumem.h"

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(void) {
	const size_t sizes[] = {512, 64 << 10, 1 << 20, 64 << 20};
	const int n = 1000000, runs = 5;
	/* Warm the cache: one of each size, freed. */
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		void *p = gpumem_alloc(sizes[i], 0, 0);
		if (!p) {
			fprintf(stderr, "pairs: %s\n", gpumem_last_error());
			return 1;
		}
		gpumem_free(p, sizes[i], 0, 0);
	}
	printf("%-10s %14s %14s\n", "size", "alloc/free ns", "allocate ns");
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		double a[5], b[5];
		for (int r = 0; r < runs; r++) {
			double t0 = now();
			for (int k = 0; k < n; k++) gpumem_free(gpumem_alloc(sizes[i], 0, 0), sizes[i], 0, 0);
			double t1 = now();
			for (int k = 0; k < n; k++) {
				void *p;
				if (gpumem_allocate(&p, sizes[i], 0, 0) != GPUMEM_SUCCESS || gpumem_deallocate(p, 0) != GPUMEM_SUCCESS) {
					fprintf(stderr, "pairs: %s\n", gpumem_last_error());
					return 1;
				}
			}
			double t2 = now();
			a[r] = (t1 - t0) / n;
			b[r] = (t2 - t1) / n;
		}
		qsort(a, runs, sizeof a[0], cmp);
		qsort(b, runs, sizeof b[0], cmp);
		printf("%-10zu %14.1f %14.1f\n", sizes[i], a[runs / 2], b[runs / 2]);
	}
	return 0;
}
