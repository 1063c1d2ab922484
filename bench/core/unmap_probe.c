// unmap_probe: does one cuMemUnmap over several adjacent mappings cost less
// than one call per mapping, and how do the grant and the unmap scale with
// a mapping's size?
//
//     gcc -O2 -o unmap_probe bench/core/unmap_probe.c -I$CUDA_HOME/include -lcuda
//     ./unmap_probe [ROUNDS]
//
// For mappings of 2, 16 and 64 MiB and runs of 1, 4, 16 and 64 adjacent
// mappings: create the handles, map them side by side, grant the run in one
// cuMemSetAccess, write it (cuMemsetD8, synchronized), then unmap it either
// one cuMemUnmap per mapping or one over the whole run, and release. Prints
// one line per case: the median over ROUNDS (default 7) of the time per
// mapping of the grant and of each way of unmapping, in microseconds. The
// allocator unmaps span by span (about 31 us a call on an H100 in
// `replay --driver-times`); if one call over a run costs much less per
// mapping, the moves and releases of a request could be batched.
#include "probe.h"

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n) {
	qsort(v, n, sizeof *v, cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static CUmemAllocationProp prop;
static CUmemAccessDesc desc;

// one round: n mappings of size sz at base; batched unmaps the run in one
// call. Returns the grant's and the unmap's time, per mapping.
static void round1(CUdeviceptr base, size_t sz, int n, int batched, double *grant, double *unmap) {
	CUmemGenericAllocationHandle h[64];
	for (int i = 0; i < n; i++) {
		CK(cuMemCreate(&h[i], sz, &prop, 0));
		CK(cuMemMap(base + i * sz, sz, 0, h[i], 0));
	}
	double t0 = now_us();
	CK(cuMemSetAccess(base, n * sz, &desc, 1));
	double t1 = now_us();
	CK(cuMemsetD8(base, 1, n * sz));
	CK(cuCtxSynchronize());
	double t2 = now_us();
	if (batched) {
		CK(cuMemUnmap(base, n * sz));
	} else {
		for (int i = 0; i < n; i++) {
			CK(cuMemUnmap(base + i * sz, sz));
		}
	}
	double t3 = now_us();
	for (int i = 0; i < n; i++) {
		CK(cuMemRelease(h[i]));
	}
	*grant = (t1 - t0) / n;
	*unmap = (t3 - t2) / n;
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 7;
	if (rounds < 1 || rounds > 99) {
		rounds = 7;
	}
	CUcontext ctx;
	probe_open(&ctx, &prop, &desc);

	const size_t mib = 1 << 20;
	size_t sizes[] = {2 * mib, 16 * mib, 64 * mib};
	int counts[] = {1, 4, 16, 64};
	CUdeviceptr base;
	CK(cuMemAddressReserve(&base, 64 * 64 * mib, 0, 0, 0));
	printf("mapping_mib run grant_us_per_mapping unmap_each_us_per_mapping unmap_one_call_us_per_mapping (medians of %d rounds)\n", rounds);
	for (int si = 0; si < 3; si++) {
		for (int ci = 0; ci < 4; ci++) {
			size_t sz = sizes[si];
			int n = counts[ci];
			double g[2][99], u[2][99];
			for (int r = 0; r < rounds; r++) {
				for (int b = 0; b < 2; b++) { // alternate the two ways
					round1(base, sz, n, b, &g[b][r], &u[b][r]);
				}
			}
			double gall[198];
			for (int r = 0; r < rounds; r++) {
				gall[2 * r] = g[0][r];
				gall[2 * r + 1] = g[1][r];
			}
			printf("%zu %d %.1f %.1f %.1f\n", sz / mib, n, median(gall, 2 * rounds), median(u[0], rounds), median(u[1], rounds));
			fflush(stdout);
		}
	}
	CK(cuMemAddressFree(base, 64 * 64 * mib));
	return 0;
}
