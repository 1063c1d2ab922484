/* gate.c: the launch gate. gpumem may move live memory (Config.Gather, the
 * default's last step before an out-of-memory under `gpumem run`) only
 * where it can prove that nothing else submits work to the device
 * meanwhile: a kernel another thread launches on moved memory would write
 * where the memory was, and its writes would be lost with no error. The
 * proof is that the shim sees every submission.
 *
 * Classification. Every driver function a program looks up (dlsym on
 * libcuda, cuGetProcAddress: how the CUDA runtime, PyTorch, Triton, NCCL,
 * XLA and TensorFlow all reach the driver) is one of:
 *   - gated: it submits work or touches device memory (launches in all
 *     their forms, copies and sets sync and async, graph launches and
 *     uploads, stream memory operations, prefetches and discards, batch
 *     decompression, external semaphores). The program gets a thunk that
 *     passes the gate;
 *   - an export: it hands an address of gpumem's to someone the shim
 *     cannot follow (its physical handle, a dma-buf, a multicast binding,
 *     an RDMA or NCCL registration). The program gets a thunk that, when
 *     called on an address gpumem owns, turns moves off for the process;
 *   - plain: it does neither (contexts, devices, modules, events, memory
 *     management, graph building, ...). The program gets the driver's;
 *   - opaque: cuGetExportTable, the driver's private tables of functions,
 *     through which the CUDA runtime reaches the driver (CUDA 13's
 *     libcudart looks up a dozen names and launches through those tables,
 *     and so do cuBLAS, cuDNN and NCCL with their static runtimes: on an
 *     H200, 200 of 1,300 kernels and copies of a PyTorch program passed
 *     named entry points, all of them Triton's, and none of 21 NCCL
 *     collectives; bench/gate/probe.py, docs/BENCHMARKS.md). Their
 *     entries are unnamed and undocumented, so the gate cannot see the
 *     launches made through them: a lookup turns moves off;
 *   - unknown (a newer driver's): moves are off for the process.
 * Moves off is said once, in one line, with the name: fail safe, always.
 * So the gate is complete only in programs that reach the driver by name
 * alone (XLA's own kernels do; its cuBLAS and cuDNN do not).
 *
 * Thunks. A gated or export name gets a thunk from a fixed table, one per
 * distinct driver function, which passes twelve integer-class words
 * through. That is exact for every such entry point of cuda.h 13.0, of
 * libibverbs and of NCCL: each takes at most eleven arguments, none
 * floating point nor a struct of more than 16 bytes by value (CUmemLocation,
 * 8 bytes, travels in one register), and returns an integer or a pointer.
 * Words its caller did not pass are read from the caller's frame above the
 * return address, which is mapped, and ignored by the callee.
 *
 * The gate. A thread keeps one of SHARDS counts (its own cache line, so
 * that threads launching at once share none): a gated call adds one to it,
 * checks that the gate is open, calls the driver and takes the one off
 * again. A mover closes the gate, waits until every count is zero, and
 * then no gated call is running and none can start until it opens the
 * gate: gpumem then synchronizes the device, moves, and opens it. A call
 * that finds the gate closed takes its one back off and sleeps until it
 * opens. Invariant: while closed is set and every count has been seen zero,
 * no thread is between its add and its sub without having seen closed set
 * (the add and the load are sequentially consistent), so none is inside
 * the driver. gpumem's own driver calls resolve to the driver's functions
 * (preload.c's dlsym tells them apart), not to thunks.
 *
 * A mover that waits more than gateDrainLimit for a thread inside a gated
 * call (a synchronous copy behind a long kernel, a launch blocked on a
 * full queue) gives up: the gate opens, the move is not made, the request
 * fails as it would have without moves. */
#define _GNU_SOURCE
#include "gate.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* --- classification ------------------------------------------------------- */

enum { CLASS_PLAIN, CLASS_GATED, CLASS_EXPORT, CLASS_OPAQUE, CLASS_UNKNOWN };

/* Names by prefix, tried in this order: the first list that has a prefix
 * of the name decides (gated before plain: cuMemMapArrayAsync is gated,
 * cuMemMap plain). */
static const char *const gated[] = {
	"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch", "cuGraphUpload", "cuStreamWaitValue",
	"cuStreamWriteValue", "cuStreamBatchMemOp", "cuMemPrefetch", "cuMemDiscard", "cuMemBatchDecompress",
	"cuMemMapArrayAsync", "cuSignalExternalSemaphoresAsync", "cuWaitExternalSemaphoresAsync",
	"cuGraphicsMapResources", "cuGraphicsUnmapResources", "cuStreamAddCallback",
};

/* Exports, with the argument (from 0) that holds the address. */
static const struct export_name {
	const char *name;
	int arg;
} exports[] = {
	{"cuMemRetainAllocationHandle", 1}, /* (handle*, addr): the physical memory behind an address */
	{"cuMemGetHandleForAddressRange", 1}, /* (handle*, dptr, size, type, flags): a dma-buf */
	{"cuMulticastBindAddr", 2},         /* (mcHandle, mcOffset, memptr, size, flags) */
	{"cuMemPoolExportPointer", 1},      /* (shareData*, ptr) */
	{"ibv_reg_mr", 1},                  /* (pd, addr, length, access): RDMA */
	{"ibv_reg_mr_iova", 1},
	{"ibv_reg_mr_iova2", 1},
	{"ncclCommRegister", 1},            /* (comm, buff, size, handle*) */
	{"ncclCommWindowRegister", 1},      /* (comm, buff, size, win*, flags) */
};

static const char *const plain[] = {
	"cuInit", "cuDriverGetVersion", "cuGetErrorString", "cuGetErrorName", "cuGetProcAddress",
	"cuThreadExchangeStreamCaptureMode", "cuDevice", "cuDevResource", "cuDevSmResource", "cuCtx", "cuGreenCtx", "cuModule",
	"cuLibrary", "cuKernel", "cuFunc", "cuLink", "cuOccupancy", "cuParam", "cuMemAlloc", "cuMemFree",
	"cuMemGetInfo", "cuMemGetAddressRange", "cuMemHost", "cuMemAddressReserve", "cuMemAddressFree",
	"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAccess",
	"cuMemGetAllocation", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemPool",
	"cuMemRange", "cuMemAdvise", "cuMemGetDefaultMemPool", "cuMemGetMemPool", "cuMemSetMemPool",
	"cuMulticast", "cuIpc", "cuPointer", "cuStream", "cuEvent", "cuGraph", "cuUserObject", "cuTexObject",
	"cuSurfObject", "cuTexRef", "cuSurfRef", "cuArray", "cuMipmappedArray", "cuProfiler", "cuGraphics",
	"cuImportExternal", "cuExternalMemory", "cuDestroyExternal", "cuCoredump", "cuCheckpoint", "cuLogs",
	"cuTensorMap", "cuFlushGPUDirectRDMAWrites", "cuEGL", "cuGL", "cuVDPAU", "cuD3D", "cuWGL",
};

static int has_prefix(const char *name, const char *const *list, size_t n) {
	for (size_t i = 0; i < n; i++)
		if (strncmp(name, list[i], strlen(list[i])) == 0) return 1;
	return 0;
}

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The export entry of name (exact, or with a _v2-style version suffix),
 * or NULL. */
static const struct export_name *export_of(const char *name) {
	for (size_t i = 0; i < LEN(exports); i++) {
		size_t n = strlen(exports[i].name);
		if (strncmp(name, exports[i].name, n) == 0 && (name[n] == 0 || (name[n] == '_' && name[n + 1] == 'v')))
			return &exports[i];
	}
	return NULL;
}

static int classify(const char *name) {
	if (export_of(name)) return CLASS_EXPORT;
	if (name[0] != 'c' || name[1] != 'u') return -1; /* not the driver's: not the gate's business */
	if (strcmp(name, "cuGetExportTable") == 0) return CLASS_OPAQUE;
	if (has_prefix(name, gated, LEN(gated))) return CLASS_GATED;
	if (has_prefix(name, plain, LEN(plain))) return CLASS_PLAIN;
	return CLASS_UNKNOWN;
}

int gate_watches(const char *name) { return export_of(name) != NULL; }

/* --- moves off -------------------------------------------------------------- */

static _Atomic(const char *) off_reason;
static char off_buf[256];
static atomic_int off_claimed;

/* Turns moves off for the process, said once with why. */
static void moves_off(const char *what, const char *name) {
	if (atomic_exchange(&off_claimed, 1)) return;
	snprintf(off_buf, sizeof off_buf, "%s %s", what, name);
	atomic_store(&off_reason, off_buf);
	fprintf(stderr, "gpumem: preload: %s %s: gpumem will not move live memory in this process (an out-of-memory stays one)\n",
	        what, name);
}

const char *gate_off_reason(void) { return atomic_load(&off_reason); }

/* --- the gate ------------------------------------------------------------------ */

#define SHARDS 64
static struct {
	atomic_long n;
	char pad[64 - sizeof(atomic_long)];
} shards[SHARDS] __attribute__((aligned(64)));
static atomic_int closed;
static atomic_uint next_shard;
static __thread int my_shard __attribute__((tls_model("initial-exec"))); /* shard + 1; 0: none yet */
static __thread int depth __attribute__((tls_model("initial-exec")));    /* gated calls this thread is inside */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;      /* closed's changes, for the sleepers */
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t movers = PTHREAD_MUTEX_INITIALIZER; /* one mover at a time */

/* gateDrainLimit: how long a mover waits for the gated calls in progress. */
static const double gateDrainLimit = 10.0; /* seconds */

static atomic_long *shard(void) {
	int i = my_shard - 1;
	if (i < 0) {
		i = (int)(atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % SHARDS);
		my_shard = i + 1;
	}
	return &shards[i].n;
}

static void wait_open(atomic_long *n) {
	do {
		atomic_fetch_sub_explicit(n, 1, memory_order_release);
		pthread_mutex_lock(&mu);
		while (atomic_load(&closed)) pthread_cond_wait(&opened, &mu);
		pthread_mutex_unlock(&mu);
		atomic_fetch_add_explicit(n, 1, memory_order_seq_cst);
	} while (atomic_load_explicit(&closed, memory_order_seq_cst));
}

/* A gated call made inside another (a driver function that calls back
 * into a thunk) is already counted: it must not wait for the gate its
 * outer call holds open, or the mover would wait for it forever. */
static inline atomic_long *enter(void) {
	if (depth++ > 0) return NULL;
	atomic_long *n = shard();
	atomic_fetch_add_explicit(n, 1, memory_order_seq_cst);
	if (__builtin_expect(atomic_load_explicit(&closed, memory_order_seq_cst), 0)) wait_open(n);
	return n;
}

static inline void leave(atomic_long *n) {
	if (n) atomic_fetch_sub_explicit(n, 1, memory_order_release);
	depth--;
}

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int gate_close(void) {
	if (gate_off_reason()) return -1;
	pthread_mutex_lock(&movers);
	pthread_mutex_lock(&mu);
	atomic_store(&closed, 1);
	pthread_mutex_unlock(&mu);
	/* The mover's own thread may be inside a gated call only if gpumem
	 * was called from one, which none of the wrapped calls does. */
	double t0 = now();
	for (int i = 0; i < SHARDS; i++) {
		for (int k = 0; atomic_load(&shards[i].n) > 0; k++) {
			if (k > 64) sched_yield();
			if ((k & 1023) == 1023 && now() - t0 > gateDrainLimit) {
				fprintf(stderr, "gpumem: preload: a driver call did not return within %.0f s of a move's request: the move is not made\n",
				        gateDrainLimit);
				gate_open();
				return -1;
			}
		}
	}
	if (gate_off_reason()) { /* a lookup or an export meanwhile */
		gate_open();
		return -1;
	}
	return 0;
}

void gate_open(void) {
	pthread_mutex_lock(&mu);
	atomic_store(&closed, 0);
	pthread_cond_broadcast(&opened);
	pthread_mutex_unlock(&mu);
	pthread_mutex_unlock(&movers);
}

/* --- thunks ---------------------------------------------------------------------- */

typedef uint64_t W;
typedef W (*fn12)(W, W, W, W, W, W, W, W, W, W, W, W);

#define SLOTS 512
static struct slot {
	void *_Atomic real; /* set once, before the thunk is handed out */
	char name[48];      /* the first name it was looked up by */
	int export_arg;     /* -1: gated; else the export's address argument */
	atomic_ulong calls; /* with counting */
} slots[SLOTS];
static int nslots; /* under slots_mu */
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;

static int counting, lookups;
static int (*_Atomic owns)(const void *);

void gate_init(int c, int l) {
	counting = c;
	lookups = l;
}

void gate_set_owner(int (*o)(const void *)) { atomic_store(&owns, o); }

/* An export of the address w: moves off if gpumem owns it (or gpumem is
 * not loaded yet, when it cannot say). */
static void exported(struct slot *s, W w) {
	if (gate_off_reason()) return;
	int (*o)(const void *) = atomic_load(&owns);
	if (o && !o((const void *)(uintptr_t)w)) return;
	moves_off("an export of gpumem's memory by", s->name);
}

static inline W call(int i, W a, W b, W c, W d, W e, W f, W g, W h, W j, W k, W l, W m) {
	struct slot *s = &slots[i];
	if (counting) atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
	fn12 real = (fn12)atomic_load_explicit(&s->real, memory_order_relaxed);
	if (s->export_arg >= 0) {
		W args[12] = {a, b, c, d, e, f, g, h, j, k, l, m};
		exported(s, args[s->export_arg]);
		return real(a, b, c, d, e, f, g, h, j, k, l, m);
	}
	atomic_long *n = enter();
	W r = real(a, b, c, d, e, f, g, h, j, k, l, m);
	leave(n);
	return r;
}

#define THUNK(i)                                                                              \
	static W thunk_##i(W a, W b, W c, W d, W e, W f, W g, W h, W j, W k, W l, W m) {          \
		return call(i, a, b, c, d, e, f, g, h, j, k, l, m);                                     \
	}
#define T8(i) THUNK(i##0) THUNK(i##1) THUNK(i##2) THUNK(i##3) THUNK(i##4) THUNK(i##5) THUNK(i##6) THUNK(i##7)
#define T64(i) T8(i##0) T8(i##1) T8(i##2) T8(i##3) T8(i##4) T8(i##5) T8(i##6) T8(i##7)
/* Octal digits: thunk_0000 ... thunk_0777 are slots 0 ... 511. */
T64(00) T64(01) T64(02) T64(03) T64(04) T64(05) T64(06) T64(07)
#define A8(i) thunk_##i##0, thunk_##i##1, thunk_##i##2, thunk_##i##3, thunk_##i##4, thunk_##i##5, thunk_##i##6, thunk_##i##7,
#define A64(i) A8(i##0) A8(i##1) A8(i##2) A8(i##3) A8(i##4) A8(i##5) A8(i##6) A8(i##7)
static fn12 const thunks[SLOTS] = {A64(00) A64(01) A64(02) A64(03) A64(04) A64(05) A64(06) A64(07)};

/* The thunk for driver function fn (one slot per distinct function). */
static void *thunk_for(const char *name, void *fn, int export_arg) {
	pthread_mutex_lock(&slots_mu);
	for (int i = 0; i < nslots; i++)
		if (atomic_load(&slots[i].real) == fn) {
			pthread_mutex_unlock(&slots_mu);
			return (void *)thunks[i];
		}
	if (nslots == SLOTS) {
		pthread_mutex_unlock(&slots_mu);
		moves_off("no thunk left (raise SLOTS in shim/c/gate.c) for", name);
		return fn;
	}
	int i = nslots++;
	snprintf(slots[i].name, sizeof slots[i].name, "%s", name);
	slots[i].export_arg = export_arg;
	atomic_store(&slots[i].real, fn);
	pthread_mutex_unlock(&slots_mu);
	return (void *)thunks[i];
}

static const char *const class_names[] = {"plain", "gated", "export", "opaque", "unknown"};

void *gate_lookup(const char *name, void *fn) {
	if (!name || !fn) return fn;
	int c = classify(name);
	if (c < 0) return fn;
	if (lookups) fprintf(stderr, "gpumem: preload: lookup %s: %s\n", name, class_names[c]);
	switch (c) {
	case CLASS_GATED: return thunk_for(name, fn, -1);
	case CLASS_EXPORT: return thunk_for(name, fn, export_of(name)->arg);
	case CLASS_OPAQUE: moves_off("launches the gate cannot see, through", name); return fn;
	case CLASS_UNKNOWN: moves_off("an unclassified driver entry point,", name); return fn;
	}
	return fn;
}

unsigned long gate_calls(void) {
	unsigned long total = 0;
	pthread_mutex_lock(&slots_mu);
	for (int i = 0; i < nslots; i++) total += atomic_load(&slots[i].calls);
	pthread_mutex_unlock(&slots_mu);
	return total;
}

void gate_report(void) {
	int n;
	pthread_mutex_lock(&slots_mu);
	n = nslots;
	pthread_mutex_unlock(&slots_mu);
	const char *sep = " ";
	int any = 0;
	for (int i = 0; i < n; i++) {
		unsigned long c = atomic_load(&slots[i].calls);
		if (c == 0) continue;
		if (!any) fprintf(stderr, "gpumem: preload: gated calls:");
		fprintf(stderr, "%s%s %lu", sep, slots[i].name, c);
		sep = ", ";
		any = 1;
	}
	if (any) fprintf(stderr, "\n");
	const char *why = gate_off_reason();
	if (any || why) fprintf(stderr, "gpumem: preload: moves %s%s\n", why ? "off: " : "gated", why ? why : "");
}
