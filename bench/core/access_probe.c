// access_probe: does a mapping inherit the access of the address range it
// replaces, and what do cuMemGetAccess and cuMemSetAccess cost?
//
//     gcc -O2 -o access_probe bench/core/access_probe.c -I$CUDA_HOME/include -lcuda
//     ./access_probe            # queries only
//     ./access_probe touch      # also writes through a remapped range
//                               # without a new grant (may poison the context;
//                               # run it in its own process)
//
// Prints one line per question. The allocator grants access (cuMemSetAccess,
// about 39 us on an H100) after every map; if the driver kept the grant of
// the range across cuMemUnmap, a remap could skip it.
#include "probe.h"

static unsigned long long access_of(CUdeviceptr p, CUmemLocation *loc, CUresult *rc) {
	unsigned long long f = 0xdead;
	*rc = cuMemGetAccess(&f, loc, p);
	return f;
}

int main(int argc, char **argv) {
	int touch = argc > 1 && strcmp(argv[1], "touch") == 0;
	CUcontext ctx;
	CUmemAllocationProp prop;
	CUmemAccessDesc desc;
	probe_open(&ctx, &prop, &desc);
	size_t g;
	CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CUmemLocation loc = prop.location;

	enum { N = 64 };
	CUdeviceptr va;
	CK(cuMemAddressReserve(&va, N * g, 0, 0, 0));
	CUmemGenericAllocationHandle h[N];
	for (int i = 0; i < N; i++)
		CK(cuMemCreate(&h[i], g, &prop, 0));

	CUresult rc;
	unsigned long long f;

	// 1. A fresh mapping, never granted.
	CK(cuMemMap(va, g, 0, h[0], 0));
	f = access_of(va, &loc, &rc);
	printf("fresh mapping, no grant: cuMemGetAccess rc=%d flags=%llu\n", rc, f);
	CK(cuMemSetAccess(va, g, &desc, 1));
	f = access_of(va, &loc, &rc);
	printf("after grant: rc=%d flags=%llu\n", rc, f);

	// 2. Unmapped, then another handle mapped at the same address.
	CK(cuMemUnmap(va, g));
	f = access_of(va, &loc, &rc);
	printf("after unmap (reserved, unmapped): rc=%d flags=%llu\n", rc, f);
	CK(cuMemMap(va, g, 0, h[1], 0));
	f = access_of(va, &loc, &rc);
	printf("other handle mapped where a granted mapping was: rc=%d flags=%llu\n", rc, f);

	// 3. The first handle, granted at one address, mapped at another.
	CK(cuMemMap(va + g, g, 0, h[0], 0));
	f = access_of(va + g, &loc, &rc);
	printf("granted handle mapped at a new address: rc=%d flags=%llu\n", rc, f);

	if (touch) {
		// Write through the remapped range with no new grant.
		CUresult w = cuMemsetD8(va, 0x5a, g);
		CUresult s = cuCtxSynchronize();
		printf("memset through the ungranted remap: rc=%d, sync rc=%d\n", w, s);
		return 0;
	}
	CK(cuMemUnmap(va, g));
	CK(cuMemUnmap(va + g, g));

	// 4. Costs: cuMemGetAccess on a granted mapping; a map+grant+unmap
	// cycle of one chunk; cuMemSetAccess of 1, 4, 16, 64 mappings at once.
	CK(cuMemMap(va, g, 0, h[0], 0));
	CK(cuMemSetAccess(va, g, &desc, 1));
	double t0 = now_us();
	for (int i = 0; i < 1000; i++)
		access_of(va, &loc, &rc);
	printf("cuMemGetAccess: %.2f us\n", (now_us() - t0) / 1000);
	CK(cuMemUnmap(va, g));
	for (int n = 1; n <= N; n *= 4) {
		double tm = 0, ts = 0, tu = 0;
		int reps = 20;
		for (int r = 0; r < reps; r++) {
			double a = now_us();
			for (int i = 0; i < n; i++)
				CK(cuMemMap(va + i * g, g, 0, h[i], 0));
			double b = now_us();
			CK(cuMemSetAccess(va, n * g, &desc, 1));
			double c = now_us();
			for (int i = 0; i < n; i++)
				CK(cuMemUnmap(va + i * g, g));
			double d = now_us();
			tm += b - a, ts += c - b, tu += d - c;
		}
		printf("%d mappings: map %.1f us each, one grant over all %.1f us (%.1f each), unmap %.1f us each\n",
		       n, tm / reps / n, ts / reps, ts / reps / n, tu / reps / n);
	}
	// 5. One cuMemUnmap over a run of several mappings.
	for (int i = 0; i < 4; i++)
		CK(cuMemMap(va + i * g, g, 0, h[i], 0));
	CK(cuMemSetAccess(va, 4 * g, &desc, 1));
	rc = cuMemUnmap(va, 4 * g);
	printf("one cuMemUnmap over 4 mappings: rc=%d\n", rc);
	if (rc != CUDA_SUCCESS)
		for (int i = 0; i < 4; i++)
			CK(cuMemUnmap(va + i * g, g));
	return 0;
}
