// overlap_probe: does a cuMemUnmap (or cuMemRelease) on one host thread
// slow down the cuMemMap and cuMemSetAccess another thread makes at the
// same time? If not, an allocator could unmap off its callers' path.
//
//     gcc -O2 -pthread -o overlap_probe bench/core/overlap_probe.c -I$CUDA_HOME/include -lcuda
//     ./overlap_probe [N]
//
// The foreground thread maps N fresh 16 MiB handles one at a time (create,
// map, grant) and times the map and the grant of each. It runs alone, then
// while a second thread unmaps N other mappings one by one, then while the
// second thread unmaps and releases them. Prints per case the foreground's
// mean map+grant time (also over the maps started while the background
// ran) and create time (us), and the background's mean
// unmap (and release) time (us), with the wall time of each side. Three
// rounds of the three cases, alternating.
#include <pthread.h>

#include "probe.h"

#define SZ (16u << 20)
#define MAXN 512

static CUcontext ctx;
static CUmemAllocationProp prop;
static CUmemAccessDesc desc;
static int n;
static CUdeviceptr fgBase, bgBase;
static CUmemGenericAllocationHandle fgH[MAXN], bgH[MAXN];
static volatile int go;
static volatile double bgEnd; // when the background finished (0: running)
static double fgStart[MAXN], fgMG[MAXN];

struct bgResult {
	int release;
	double unmap, rel, wall;
};

static void *background(void *arg) {
	struct bgResult *r = arg;
	CK(cuCtxSetCurrent(ctx));
	while (!go) {
	}
	double t0 = now_us(), tu = 0, tr = 0;
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemUnmap(bgBase + (CUdeviceptr)i * SZ, SZ));
		double b = now_us();
		tu += b - a;
		if (r->release) {
			CK(cuMemRelease(bgH[i]));
			tr += now_us() - b;
		}
	}
	bgEnd = now_us();
	r->wall = bgEnd - t0;
	r->unmap = tu / n;
	r->rel = tr / n;
	return NULL;
}

// prepare maps the background's n handles (granted), so it has work.
static void prepare(void) {
	for (int i = 0; i < n; i++) {
		CK(cuMemCreate(&bgH[i], SZ, &prop, 0));
		CK(cuMemMap(bgBase + (CUdeviceptr)i * SZ, SZ, 0, bgH[i], 0));
	}
	CK(cuMemSetAccess(bgBase, (size_t)n * SZ, &desc, 1));
}

// one case: 0 alone, 1 with background unmaps, 2 with unmaps and releases.
static void run(int mode) {
	struct bgResult r = {mode == 2, 0, 0, 0};
	pthread_t th;
	if (mode > 0) {
		prepare();
		go = 0;
		pthread_create(&th, NULL, background, &r);
	}
	double tc = 0, tm = 0;
	bgEnd = 0;
	go = 1;
	double t0 = now_us();
	for (int i = 0; i < n; i++) {
		double a = now_us();
		CK(cuMemCreate(&fgH[i], SZ, &prop, 0));
		double b = now_us();
		CK(cuMemMap(fgBase + (CUdeviceptr)i * SZ, SZ, 0, fgH[i], 0));
		CK(cuMemSetAccess(fgBase + (CUdeviceptr)i * SZ, SZ, &desc, 1));
		double c = now_us();
		tc += b - a;
		tm += c - b;
		fgStart[i] = a;
		fgMG[i] = c - b;
	}
	double wall = now_us() - t0;
	if (mode > 0) {
		pthread_join(th, NULL);
		if (mode == 1) {
			for (int i = 0; i < n; i++) {
				CK(cuMemRelease(bgH[i]));
			}
		}
	}
	// the foreground's map+grant while the background ran
	double ov = 0;
	int nov = 0;
	for (int i = 0; i < n; i++) {
		if (mode == 0 || fgStart[i] < bgEnd) {
			ov += fgMG[i];
			nov++;
		}
	}
	const char *name[] = {"alone", "bg-unmap", "bg-unmap+release"};
	printf("%-17s fg: map+grant %.1f us (%.1f over the %d started while bg ran), create %.1f us, wall %.0f us | bg: unmap %.1f us, release %.1f us, wall %.0f us\n",
	       name[mode], tm / n, nov ? ov / nov : 0, nov, tc / n, wall, r.unmap, r.rel, r.wall);
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		CK(cuMemUnmap(fgBase + (CUdeviceptr)i * SZ, SZ));
		CK(cuMemRelease(fgH[i]));
	}
}

int main(int argc, char **argv) {
	n = argc > 1 ? atoi(argv[1]) : 200;
	if (n < 1 || n > MAXN) {
		n = 200;
	}
	probe_open(&ctx, &prop, &desc);
	CK(cuMemAddressReserve(&fgBase, (size_t)MAXN * SZ, 0, 0, 0));
	CK(cuMemAddressReserve(&bgBase, (size_t)MAXN * SZ, 0, 0, 0));
	printf("n=%d mappings of 16 MiB a side\n", n);
	for (int round = 0; round < 3; round++) {
		for (int mode = 0; mode < 3; mode++) {
			run(mode);
		}
	}
	return 0;
}
