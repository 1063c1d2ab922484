// marker_probe: can the host learn how far a stream has run by reading a
// word the GPU writes (cuStreamWriteValue64 into pinned host memory)
// instead of asking the driver (cuEventQuery)? The allocator's miss path
// spends half its host time in event calls at about 3 us each under FSDP2
// (docs/BENCHMARKS.md, "FSDP2 on two H200s: what a steady step's misses
// cost"); docs/EXPERIMENTS.md, "Host-visible markers instead of event
// queries", is the design this checks.
//
//     gcc -O2 -o marker_probe bench/core/marker_probe.c -I$CUDA_HOME/include -lcuda
//     ./marker_probe [ROUNDS]
//
// Prints whether the device takes 64-bit stream memory operations; the
// host cost of cuEventRecord, cuStreamWriteValue64, cuEventQuery and of
// reading the word, on an idle stream and on one with about 20 ms of
// memsets queued; then, ROUNDS times, memsets queued and an event recorded
// beside a write of the round's number (in both orders, alternately): the
// host polls both and prints when each was first seen done, microseconds
// after the queue was filled, and counts the rounds where the word broke
// stream order: seen while the event recorded before it was not done, or
// not yet written when the event recorded after it was. Last, what a write
// costs the GPU's stream: small memsets alone, with a write after each,
// and with an event recorded after each.
#include "probe.h"

#define BUSY (1u << 28)
#define N 20000

static CUcontext ctx;
static CUmemAllocationProp prop;
static CUmemAccessDesc desc;
static CUdeviceptr busy, wordDev;
static volatile unsigned long long *word;
static CUstream s;
static CUevent ev;

static void queue(int memsets) {
	for (int i = 0; i < memsets; i++) {
		CK(cuMemsetD32Async(busy, (unsigned)i, BUSY / 4, s));
	}
}

// costs times each call N times (the queries and loads of an event and a
// word already written); with memsets > 0 the stream is busy meanwhile.
static void costs(const char *what, int memsets) {
	CK(cuStreamSynchronize(s));
	queue(memsets);
	double t0 = now_us();
	for (int i = 0; i < N; i++) {
		CK(cuEventRecord(ev, s));
	}
	double rec = (now_us() - t0) / N;
	t0 = now_us();
	for (int i = 0; i < N; i++) {
		CK(cuStreamWriteValue64(s, wordDev, (unsigned long long)i, 0));
	}
	double wr = (now_us() - t0) / N;
	int pending = 0;
	t0 = now_us();
	for (int i = 0; i < N; i++) {
		CUresult r = cuEventQuery(ev);
		if (r == CUDA_ERROR_NOT_READY) {
			pending++;
		} else {
			CK(r);
		}
	}
	double q = (now_us() - t0) / N;
	unsigned long long sum = 0;
	t0 = now_us();
	for (int i = 0; i < N; i++) {
		sum += *word;
	}
	double ld = (now_us() - t0) / N;
	CK(cuStreamSynchronize(s));
	printf("%s: cuEventRecord %.2f us, cuStreamWriteValue64 %.2f us, cuEventQuery %.2f us (%d of %d not ready), a load of the word %.3f us (sum %llu)\n",
	       what, rec, wr, q, pending, N, ld, sum);
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	CUdevice dev = probe_open(&ctx, &prop, &desc);
	int ops64 = 0;
	CK(cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
	printf("64-bit stream memory operations: %d\n", ops64);
	if (!ops64) {
		printf("not supported here: the allocator keeps its events\n");
		return 0;
	}
	void *host;
	CK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
	word = host;
	*word = 0;
	CK(cuMemHostGetDevicePointer(&wordDev, host, 0));
	CK(cuMemAlloc(&busy, BUSY));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

	// How many memsets make about 20 ms.
	CK(cuStreamSynchronize(s));
	double t0 = now_us();
	queue(16);
	CK(cuStreamSynchronize(s));
	double each = (now_us() - t0) / 16;
	int memsets = (int)(20000 / each) + 1;
	printf("memsets of %u MiB: %.1f us each; %d make the busy queue\n", BUSY >> 20, each, memsets);

	costs("idle stream", 0);
	costs("busy stream", memsets);

	int ahead = 0, behind = 0;
	for (int r = 1; r <= rounds; r++) {
		CK(cuStreamSynchronize(s));
		queue(memsets);
		int eventFirst = r % 2;
		if (eventFirst) {
			CK(cuEventRecord(ev, s));
			CK(cuStreamWriteValue64(s, wordDev, (unsigned long long)r, 0));
		} else {
			CK(cuStreamWriteValue64(s, wordDev, (unsigned long long)r, 0));
			CK(cuEventRecord(ev, s));
		}
		double tEv = -1, tWord = -1;
		long polls = 0;
		t0 = now_us();
		while (tEv < 0 || tWord < 0) {
			polls++;
			if (tWord < 0 && *word == (unsigned long long)r) {
				tWord = now_us();
				if (tEv < 0 && eventFirst) {
					// The event was recorded before the write: it must
					// be complete by now.
					CUresult q = cuEventQuery(ev);
					if (q == CUDA_ERROR_NOT_READY) {
						ahead++;
					} else {
						CK(q);
					}
				}
			}
			if (tEv < 0) {
				CUresult q = cuEventQuery(ev);
				if (q == CUDA_SUCCESS) {
					tEv = now_us();
					if (!eventFirst && *word != (unsigned long long)r) {
						// The write came before the event in the
						// stream: it must be visible by now.
						behind++;
					}
				} else if (q != CUDA_ERROR_NOT_READY) {
					CK(q);
				}
			}
			if (now_us() - t0 > 5e6) {
				printf("round %d: not done after 5 s (event %s, word %llu)\n", r, tEv < 0 ? "pending" : "done", *word);
				return 1;
			}
		}
		printf("round %d (%s first): event seen %.1f us after the queue began, word %.1f us; word - event %+.1f us; %ld polls\n",
		       r, eventFirst ? "event" : "write", tEv - t0, tWord - t0, tWord - tEv, polls);
	}
	printf("rounds where the word ran ahead of an event recorded before it: %d; where a write before an event was seen after it: %d (of %d)\n",
	       ahead, behind, rounds / 2);

	// What a write costs the GPU: small memsets alone, with a write after
	// each, and with an event recorded after each, queued behind the busy
	// memsets (so the host has queued them all before the GPU gets there),
	// timed on the GPU by timing events around them.
	const int small = 2000;
	CUevent g0, g1;
	CK(cuEventCreate(&g0, 0));
	CK(cuEventCreate(&g1, 0));
	for (int rep = 0; rep < 3; rep++) {
		for (int mode = 0; mode < 3; mode++) {
			CK(cuStreamSynchronize(s));
			queue(memsets);
			CK(cuEventRecord(g0, s));
			for (int i = 0; i < small; i++) {
				CK(cuMemsetD32Async(busy, (unsigned)i, 1024, s));
				if (mode == 1) {
					CK(cuStreamWriteValue64(s, wordDev, (unsigned long long)i, 0));
				} else if (mode == 2) {
					CK(cuEventRecord(ev, s));
				}
			}
			CK(cuEventRecord(g1, s));
			double queued = now_us();
			CK(cuStreamSynchronize(s));
			float ms = 0;
			CK(cuEventElapsedTime(&ms, g0, g1));
			printf("round %d: %d memsets of 4 KiB%s: %.3f us each on the GPU (the host waited %.0f us after queueing them)\n", rep + 1, small,
			       mode == 0 ? " alone" : mode == 1 ? ", a write after each" : ", an event recorded after each", ms * 1000 / small, now_us() - queued);
		}
	}
	CK(cuEventDestroy(g0));
	CK(cuEventDestroy(g1));
	CK(cuEventDestroy(ev));
	CK(cuStreamDestroy(s));
	CK(cuMemFree(busy));
	CK(cuMemFreeHost(host));
	printf("done\n");
	return 0;
}
