// vmm_cost: what a span's driver calls cost (cuMemCreate, cuMemMap,
// cuMemSetAccess; then cuMemUnmap, cuMemRelease) on one device, alone, next
// to other processes doing the same on the other devices, and with peer
// access enabled between this device and the others (as a multi-GPU job's
// communication library may). Found on four H200s: FSDP2's four ranks spent
// 7.6-8.9 ms of driver time per span created, against 0.15-0.25 ms on two
// H200s (docs/BENCHMARKS.md, "FSDP2 and the ranks on four H200s").
//
//     gcc -O2 -o vmm_cost bench/core/vmm_cost.c -I$CUDA_HOME/include -lcuda
//     ./vmm_cost DEVICE [N] [SIZE_MIB] [peer|-] [busy]
//
// Makes N spans of SIZE_MIB (32) on DEVICE, timing each call, then unmaps
// and releases them; prints the median and the 90th percentile of each
// call in microseconds. "peer": first retains every device's primary
// context and enables peer access both ways between DEVICE and each other.
// "busy": the device has about 200 ms of memsets queued on a stream of
// this process while the calls are made (a training job's kernels in
// flight; whether a call waits for them shows as its time). Then the same
// N allocations of SIZE_MIB by cuMemAlloc and cuMemFree (what PyTorch's
// native allocator calls), timed the same way.
#include "probe.h"

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *name, double *t, int n) {
	qsort(t, n, sizeof *t, cmp);
	printf("  %-15s median %8.1f us  p90 %8.1f us  max %8.1f us\n", name, t[n / 2], t[n * 9 / 10], t[n - 1]);
}

int main(int argc, char **argv) {
	int devIdx = argc > 1 ? atoi(argv[1]) : 0;
	int n = argc > 2 ? atoi(argv[2]) : 200;
	size_t size = (size_t)(argc > 3 ? atoi(argv[3]) : 32) << 20;
	int peer = argc > 4 && strcmp(argv[4], "peer") == 0;
	int busy = argc > 5 && strcmp(argv[5], "busy") == 0;
	CK(cuInit(0));
	int count;
	CK(cuDeviceGetCount(&count));
	CUdevice dev;
	CK(cuDeviceGet(&dev, devIdx));
	CUcontext ctx;
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	if (peer) {
		for (int i = 0; i < count; i++) {
			if (i == devIdx) {
				continue;
			}
			CUdevice d;
			CUcontext c;
			CK(cuDeviceGet(&d, i));
			CK(cuDevicePrimaryCtxRetain(&c, d));
			int can = 0;
			CK(cuDeviceCanAccessPeer(&can, dev, d));
			if (can) {
				CK(cuCtxSetCurrent(ctx));
				CK(cuCtxEnablePeerAccess(c, 0));
				CK(cuCtxSetCurrent(c));
				CK(cuCtxEnablePeerAccess(ctx, 0));
			}
		}
	}
	CK(cuCtxSetCurrent(ctx));
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	CUmemAccessDesc desc;
	desc.location = prop.location;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CUdeviceptr va;
	CK(cuMemAddressReserve(&va, size * n, 0, 0, 0));
	CUstream s = NULL;
	CUdeviceptr work = 0;
	if (busy) {
		// about 200 ms of memsets (256 MiB each, ~60 us on an H200),
		// queued before the calls and still running during them
		CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		CK(cuMemAlloc(&work, 256u << 20));
		for (int i = 0; i < 3200; i++) {
			CK(cuMemsetD32Async(work, (unsigned)i, (256u << 20) / 4, s));
		}
	}
	CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
	double *tc = calloc(n, sizeof(double)), *tm = calloc(n, sizeof(double)), *ta = calloc(n, sizeof(double));
	double *tu = calloc(n, sizeof(double)), *tr = calloc(n, sizeof(double));
	double t0 = now_us();
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemCreate(&h[i], size, &prop, 0));
		double b = now_us();
		CK(cuMemMap(va + i * size, size, 0, h[i], 0));
		double c = now_us();
		CK(cuMemSetAccess(va + i * size, size, &desc, 1));
		double d = now_us();
		tc[i] = b - a, tm[i] = c - b, ta[i] = d - c;
	}
	double t1 = now_us();
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemUnmap(va + i * size, size));
		double b = now_us();
		CK(cuMemRelease(h[i]));
		double c = now_us();
		tu[i] = b - a, tr[i] = c - b;
	}
	double t2 = now_us();
	int pending = 0;
	if (busy) {
		pending = cuStreamQuery(s) == CUDA_ERROR_NOT_READY; // still busy when the calls ended
		CK(cuStreamSynchronize(s));
		CK(cuMemFree(work));
		CK(cuStreamDestroy(s));
	}
	printf("device %d of %d, %d spans of %zu MiB%s%s: make %.1f ms, unmake %.1f ms\n", devIdx, count, n, size >> 20,
		   peer ? ", peer access enabled both ways" : "",
		   busy ? (pending ? ", memsets queued throughout" : ", memsets queued (done before the calls ended)") : "",
		   (t1 - t0) / 1e3, (t2 - t1) / 1e3);
	report("cuMemCreate", tc, n);
	report("cuMemMap", tm, n);
	report("cuMemSetAccess", ta, n);
	report("cuMemUnmap", tu, n);
	report("cuMemRelease", tr, n);
	CUdeviceptr *pl = calloc(n, sizeof *pl);
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemAlloc(&pl[i], size));
		tc[i] = now_us() - a;
	}
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemFree(pl[i]));
		tr[i] = now_us() - a;
	}
	report("cuMemAlloc", tc, n);
	report("cuMemFree", tr, n);
	free(pl);
	CK(cuMemAddressFree(va, size * n));
	return 0;
}
