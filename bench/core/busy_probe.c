// busy_probe: does a virtual-memory call of the driver wait for the work
// the GPU has queued? If cuMemUnmap (say) waits until the GPU has run what
// the host queued before it, an unmap in the middle of a training step
// drains the step's run-ahead: the GPU then idles while the host launches
// the next kernels, and every such call costs a step some of that time,
// whatever the call's own cost on an idle GPU (issue 40: the tightening's
// step time).
//
//     gcc -O2 -o busy_probe bench/core/busy_probe.c -I$CUDA_HOME/include -lcuda
//     ./busy_probe [MS]
//
// For each call, three rounds: queue about MS milliseconds of memsets (on
// the legacy default stream, as PyTorch's default stream is, and on a
// non-blocking stream), time the call on the host, then time the
// synchronize that follows. A call that waits for the GPU takes about MS
// and leaves the synchronize nothing; one that does not takes its usual
// microseconds and the synchronize takes the rest. The memory the calls
// work on is never touched by the queued work. Prints one line per call,
// stream and round: the call's time and the synchronize's, in us.
#include "probe.h"

#define CHUNK (2u << 20)
#define BUSY (1u << 30)

static CUcontext ctx;
static CUmemAllocationProp prop;
static CUmemAccessDesc desc;
static CUdeviceptr busy, va;
static int memsets;

// queue puts about the asked milliseconds of memsets on s.
static void queue(CUstream s) {
	for (int i = 0; i < memsets; i++) {
		CK(cuMemsetD32Async(busy, (unsigned)i, BUSY / 4, s));
	}
}

enum { C_NONE, C_CREATE, C_MAP, C_ACCESS, C_UNMAP, C_RELEASE, C_EVENT, C_N };
static const char *names[C_N] = {"nothing", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuEventRecord+Query"};

// one times call c after queued work on s; the handle and mapping it
// needs are made before the work is queued, outside the timing.
static void one(int c, CUstream s, const char *sname, int round) {
	CUmemGenericAllocationHandle h = 0;
	CUevent ev = NULL;
	if (c >= C_MAP && c <= C_RELEASE) {
		CK(cuMemCreate(&h, CHUNK, &prop, 0));
	}
	if (c >= C_ACCESS && c <= C_UNMAP) {
		CK(cuMemMap(va, CHUNK, 0, h, 0));
	}
	if (c == C_UNMAP) {
		CK(cuMemSetAccess(va, CHUNK, &desc, 1));
	}
	if (c == C_EVENT) {
		CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	}
	CK(cuCtxSynchronize());
	queue(s);
	double t0 = now_us();
	switch (c) {
	case C_CREATE:
		CK(cuMemCreate(&h, CHUNK, &prop, 0));
		break;
	case C_MAP:
		CK(cuMemMap(va, CHUNK, 0, h, 0));
		break;
	case C_ACCESS:
		CK(cuMemSetAccess(va, CHUNK, &desc, 1));
		break;
	case C_UNMAP:
		CK(cuMemUnmap(va, CHUNK));
		break;
	case C_RELEASE:
		CK(cuMemRelease(h));
		h = 0;
		break;
	case C_EVENT:
		CK(cuEventRecord(ev, s));
		(void)cuEventQuery(ev);
		break;
	}
	double t1 = now_us();
	CK(cuCtxSynchronize());
	double t2 = now_us();
	printf("%-20s %-12s round %d: call %10.1f us, then synchronize %10.1f us\n", names[c], sname, round, t1 - t0, t2 - t1);
	// Undo what the case left.
	if (c == C_MAP || c == C_ACCESS) {
		CK(cuMemUnmap(va, CHUNK));
	}
	if (h) {
		CK(cuMemRelease(h));
	}
	if (ev) {
		CK(cuEventDestroy(ev));
	}
}

int main(int argc, char **argv) {
	double ms = argc > 1 ? atof(argv[1]) : 30;
	probe_open(&ctx, &prop, &desc);
	CK(cuMemAlloc(&busy, BUSY));
	CK(cuMemAddressReserve(&va, CHUNK, 0, 0, 0));
	CUstream side;
	CK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
	// How many memsets make ms milliseconds.
	memsets = 4;
	CK(cuCtxSynchronize());
	double t0 = now_us();
	queue(0);
	CK(cuCtxSynchronize());
	double per = (now_us() - t0) / memsets;
	memsets = (int)(ms * 1000 / per) + 1;
	printf("one 1 GiB memset: %.1f us; %d of them queued per case (about %.1f ms)\n", per, memsets, memsets * per / 1000);
	for (int round = 1; round <= 3; round++) {
		for (int c = 0; c < C_N; c++) {
			one(c, 0, "legacy", round);
			one(c, side, "nonblocking", round);
		}
	}
	return 0;
}
