/* front.c: the front cache. A request served here does not enter Go.
 *
 * Why: inside PyTorch every tensor's alloc and free is a call into the
 * library, and entering Go costs more than the allocation itself: 0.5-0.8
 * us a pair on the GPU machines, 5 us with the caches evicted by the
 * program's own work (docs/BENCHMARKS.md, "The front cache": 0.07-0.1 and
 * 0.5 us through the front). Generation and serving programs make tens of
 * thousands of small requests a step, most of them for a size and stream
 * just freed (docs/EXPERIMENTS.md, "A front cache on the C side of the
 * library").
 *
 * What: gpumem_free parks a buffer here instead of freeing it in Go, up to
 * FRONT_SLOTS buffers and FRONT_BYTES of blocks, each at most
 * FRONT_MAX_REQUEST bytes requested; the oldest goes to Go when it is full.
 * gpumem_alloc takes the newest parked buffer of its exact requested size,
 * device and stream (a hit), else asks Go (a miss). Reusing a buffer on
 * the stream it was freed on is what Go's own cache would do: the stream
 * orders the old work before the new.
 *
 * The figures stay the program's. Go counts parked buffers as live, so:
 *   - every other entry point of the library drains first (all parked
 *     buffers freed in Go, with the reuse counts: gpumemGo_front_drain),
 *     so whatever it reads or changes sees the program's state; but
 *     gpumem_mem_info, which cuDNN's attention asks at every call through
 *     cacheInfo, adds the parked bytes to Go's free figure instead;
 *   - the reuses (a free and an allocation Go never saw) are added to Go's
 *     cumulative counts at the drain (gpumem.Allocator.Reused);
 *   - a miss tells Go what is parked, and Go keeps its peaks net of it
 *     (gpumem.Parked), or answers GPUMEM_FRONT_DRAIN where it cannot (more
 *     than one pool, or where the pool would grow: growth and
 *     out-of-memory see every free buffer, as without the front).
 *
 * Go says when a buffer may be parked: not under a limit below the device
 * (the user's word that memory counts: parking moves where later requests
 * land, by up to 2% of the pool, and a program that fits a limit exactly
 * could run out under it; internal/host's AllocParked).
 *
 * Parking needs the device's allocator to have one pool (lone[device]), for only
 * then does Go keep its peaks under one lock: with more, a free's flush
 * may publish a peak counting what is parked. Every entry point that may
 * add a pool brackets its Go call with gpumem_front_stop and _go, or, for
 * a single call, drains first and calls gpumem_front_moved after; both
 * bump gen, which forgets lone until the next miss's answer (read from gen
 * as it was before that miss called Go).
 *
 * Never a buffer twice: the front keeps its own set of the buffers Go
 * handed out that it may park (live: a hash of addresses). A free of an
 * address not in it goes to Go, which knows foreign addresses and double
 * frees; if the address is parked (a double free), everything is drained
 * first, so that Go sees the first free and reports the second.
 *
 * It stands aside (gpumem_front_stop) while anything must see every
 * request: a recording or memory history, free call sites, pool routes
 * (CUDA graphs, MemPool), a capture, the cache off, PyTorch's profiler,
 * and for good with GPUMEM_FRONT=0. The HTTP server, which reads Go's
 * figures with no entry point, drains first through the host's
 * SetBeforeRead. A buffer named by record_stream is never
 * parked: its free needs events.
 *
 * Peaks: Go keeps its peaks net of what is parked at each miss; a hit
 * that would take the program past them (a buffer parked while the
 * program's holdings grew by other requests) is served by Go instead. The
 * front checks that against Go's gauges as the last miss answered them,
 * less its own frees in Go since; frees that bypass the front only make
 * that figure high, which refuses more hits, never too many.
 *
 * Invariants (front_check, under the lock): n <= FRONT_SLOTS; bytes is the
 * sum of the parked blocks and <= FRONT_BYTES, parked[d] the sums of
 * device d's; no parked address is in
 * live; pending is nonzero while anything is parked or counted.
 *
 * internal/front models all of this in Go for replays and fits (gpumem
 * replay --front, gpumem fit --policy gpumem-front); a change here is a
 * change there, which test_replay_front_models_the_library checks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "internal.h"

enum {
	FRONT_SLOTS = 64,
	FRONT_DEVICES = 64,
};
#ifndef FRONT_MAX_REQUEST
#define FRONT_MAX_REQUEST ((size_t)1 << 20)
#endif
#ifndef FRONT_BYTES
#define FRONT_BYTES ((uint64_t)4 << 20)
#endif

typedef struct {
	uintptr_t ptr, stream;
	uint64_t req, block;
	int device;
	int recorded; /* live only: record_stream named it */
} front_buf;

/* live: open addressing, linear probing; ptr 0 empty, 1 deleted. */
#define TOMB ((uintptr_t)1)

static struct {
	pthread_mutex_t mu;
	front_buf slot[FRONT_SLOTS]; /* parked, oldest first */
	int n;
	uint64_t bytes;
	struct {
		uint64_t n, bytes, req;
		uintptr_t stream;
	} reused[FRONT_DEVICES];
	/* Per device: the parked buffers' blocks and requests, and Go's
	 * gauges as the last miss's answer gave them (gpumem.Gauges), less
	 * what the front freed in Go since. Valid while lone_at says so. */
	struct {
		uint64_t active, allocated;
	} parked[FRONT_DEVICES];
	struct {
		uint64_t active, allocated, peak_active, peak_allocated;
	} go[FRONT_DEVICES];
	front_buf *live;
	size_t cap, used, tombs; /* cap: a power of two (0: not made yet) */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

static atomic_int stops;   /* reasons to stand aside (gpumem_front_stop) */
static int checking;       /* GPUMEM_FRONT=check: front_check after every change */

/* What the front did, counted under the lock and printed at exit with
 * GPUMEM_FRONT=stats or check: why requests went to Go. */
static struct {
	uint64_t hits, misses, large, unknown, over_peaks, drains, parks, evictions, unparkable;
	uint64_t reads, stops; /* drains with buffers parked: by an entry point, by a stop */
	atomic_ullong aside_frees; /* counted without the lock */
} C;

static void print_counts(void) {
	fprintf(stderr,
	        "gpumem: front: %llu hits, %llu misses (%llu over %zu bytes, %llu with Go's gauges unknown, %llu where a parked "
	        "buffer would pass the peaks); %llu drains for Go's slow path; %llu buffers parked, %llu evicted; frees to Go: "
	        "%llu not parkable, %llu while standing aside; drains with buffers parked: %llu by an entry point, %llu by a stop\n",
	        (unsigned long long)C.hits, (unsigned long long)C.misses, (unsigned long long)C.large, FRONT_MAX_REQUEST,
	        (unsigned long long)C.unknown, (unsigned long long)C.over_peaks, (unsigned long long)C.drains,
	        (unsigned long long)C.parks, (unsigned long long)C.evictions, (unsigned long long)C.unparkable,
	        (unsigned long long)atomic_load(&C.aside_frees), (unsigned long long)C.reads, (unsigned long long)C.stops);
}
static atomic_int pending; /* something parked or counted: drain has work */
/* lone: Go's last answer to a miss said the device's allocator has one
 * pool (gpumem.Allocator.Lone), and no other entry point ran since (one may
 * have added a pool). Parking needs it: with more pools, a free's flush in
 * Go may publish a peak, which would count what is parked. */
static atomic_uint gen;                 /* bumped by gpumem_front_go and _moved */
static unsigned lone_at[FRONT_DEVICES]; /* gen+1 when a miss found lone; under the lock */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
	const char *v = getenv("GPUMEM_FRONT");
	if (v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false"))) atomic_fetch_add(&stops, 1);
	checking = v && !strcmp(v, "check");
	if (v && (checking || !strcmp(v, "stats"))) atexit(print_counts);
}

/* A fork (DataLoader workers) while another thread holds the lock would
 * leave the child's copy locked for good: the lock is taken across fork. */
static void fork_prepare(void) { pthread_mutex_lock(&F.mu); }
static void fork_done(void) { pthread_mutex_unlock(&F.mu); }
__attribute__((constructor)) static void front_init(void) { pthread_atfork(fork_prepare, fork_done, fork_done); }

static size_t slot_of(uintptr_t p, size_t cap) {
	return (size_t)((((uint64_t)p >> 9) * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static front_buf *live_find(uintptr_t p) {
	if (!F.cap) return NULL;
	for (size_t i = slot_of(p, F.cap);; i = (i + 1) & (F.cap - 1)) {
		if (F.live[i].ptr == p) return &F.live[i];
		if (F.live[i].ptr == 0) return NULL;
	}
}

static int live_grow(void) {
	size_t cap = F.cap ? F.cap : 4096;
	if ((F.used + 1) * 2 > cap) cap *= 2; /* else only tombstones to drop */
	front_buf *t = calloc(cap, sizeof *t);
	if (!t) return 0;
	for (size_t j = 0; j < F.cap; j++) {
		uintptr_t p = F.live[j].ptr;
		if (p <= TOMB) continue;
		size_t i = slot_of(p, cap);
		while (t[i].ptr) i = (i + 1) & (cap - 1);
		t[i] = F.live[j];
	}
	free(F.live);
	F.live = t;
	F.cap = cap;
	F.tombs = 0;
	return 1;
}

/* live_put enters b (0 if the set could not grow: b is then never parked,
 * its free goes to Go, which is only slower). */
static int live_put(front_buf b) {
	front_buf *e = live_find(b.ptr);
	if (e) { /* Go handed out an address the books hold: keep Go's word */
		*e = b;
		return 1;
	}
	if ((F.used + F.tombs + 1) * 4 > F.cap * 3 && !live_grow()) return 0;
	size_t i = slot_of(b.ptr, F.cap);
	while (F.live[i].ptr > TOMB) i = (i + 1) & (F.cap - 1);
	if (F.live[i].ptr == TOMB) F.tombs--;
	F.live[i] = b;
	F.used++;
	return 1;
}

static void live_drop(front_buf *e) {
	e->ptr = TOMB;
	F.used--;
	F.tombs++;
}

static int parked_at(uintptr_t p) {
	for (int i = 0; i < F.n; i++)
		if (F.slot[i].ptr == p) return i;
	return -1;
}

/* front_check checks the invariants of the overview (under the lock). A
 * violation is printed and the front stands aside for good: the process
 * goes on without it. */
static void front_check(void) {
	static uint64_t calls;
	const char *bad = NULL;
	uint64_t bytes = 0;
	if (F.n < 0 || F.n > FRONT_SLOTS) bad = "more parked buffers than slots";
	for (int i = 0; i < F.n && !bad; i++) {
		bytes += F.slot[i].block;
		if (live_find(F.slot[i].ptr)) bad = "a parked buffer is also live";
		for (int j = 0; j < i && !bad; j++)
			if (F.slot[j].ptr == F.slot[i].ptr) bad = "a buffer parked twice";
	}
	if (!bad && bytes != F.bytes) bad = "parked bytes differ from the sum of the parked blocks";
	for (int d = 0; d < FRONT_DEVICES && !bad; d++) {
		uint64_t act = 0, req = 0;
		for (int i = 0; i < F.n; i++)
			if (F.slot[i].device == d) act += F.slot[i].block, req += F.slot[i].req;
		if (act != F.parked[d].active || req != F.parked[d].allocated) bad = "a device's parked sums differ from its parked buffers";
	}
	if (!bad && F.bytes > FRONT_BYTES) bad = "more parked bytes than FRONT_BYTES";
	if (!bad && F.n > 0 && !atomic_load(&pending)) bad = "buffers parked with nothing pending";
	if (!bad && ++calls % 4096 == 0) {
		size_t used = 0, tombs = 0;
		for (size_t i = 0; i < F.cap; i++) {
			used += F.live[i].ptr > TOMB;
			tombs += F.live[i].ptr == TOMB;
		}
		if (used != F.used || tombs != F.tombs) bad = "the live set's counts differ from its entries";
	}
	if (bad) {
		fprintf(stderr, "gpumem: front cache invariant broken: %s; the front stands aside from now on\n", bad);
		checking = 0;
		atomic_fetch_add(&stops, 1);
	}
}

static void unlock(void) {
	if (checking) front_check();
	pthread_mutex_unlock(&F.mu);
}

static void set_pending(void) {
	int any = F.n > 0;
	for (int d = 0; d < FRONT_DEVICES && !any; d++) any = F.reused[d].n > 0;
	atomic_store_explicit(&pending, any, memory_order_relaxed);
}

/* unpark removes slot i. */
static front_buf unpark(int i) {
	front_buf b = F.slot[i];
	memmove(&F.slot[i], &F.slot[i + 1], (size_t)(F.n - i - 1) * sizeof F.slot[0]);
	F.n--;
	F.bytes -= b.block;
	F.parked[b.device].active -= b.block;
	F.parked[b.device].allocated -= b.req;
	return b;
}

/* gone notes that b, unparked, was freed in Go. */
static void gone(front_buf b) {
	F.go[b.device].active -= b.block;
	F.go[b.device].allocated -= b.req;
}

static void park(front_buf b) {
	F.slot[F.n++] = b;
	F.bytes += b.block;
	F.parked[b.device].active += b.block;
	F.parked[b.device].allocated += b.req;
}

static void say(gpumem_status st) {
	if (st == GPUMEM_SUCCESS) return;
	static atomic_int said;
	if (atomic_exchange(&said, 1) == 0) fprintf(stderr, "gpumem: %s (reported once)\n", gpumem_last_error());
}

/* drain_device gives Go device d's parked buffers and reuse counts (under
 * the lock). */
static void drain_device(int d) {
	uint64_t ptrs[FRONT_SLOTS];
	size_t k = 0;
	for (int i = 0; i < F.n;) {
		if (F.slot[i].device == d) {
			front_buf b = unpark(i);
			gone(b);
			ptrs[k++] = b.ptr;
		} else
			i++;
	}
	if (k == 0 && F.reused[d].n == 0) return;
	say(gpumemGo_front_drain(d, ptrs, k, F.reused[d].stream, F.reused[d].n, F.reused[d].bytes, F.reused[d].req));
	memset(&F.reused[d], 0, sizeof F.reused[d]);
}

static void drain_all(void) {
	for (int d = 0; d < FRONT_DEVICES; d++) drain_device(d);
	set_pending();
}

void gpumem_front_drain(void) {
	if (!atomic_load_explicit(&pending, memory_order_acquire)) return;
	pthread_mutex_lock(&F.mu);
	C.reads += F.n > 0;
	drain_all();
	unlock();
}

gpumem_status gpumem_front_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
	if (device < 0 || device >= FRONT_DEVICES) {
		gpumem_front_drain();
		return gpumemGo_mem_info(device, free_bytes, total_bytes);
	}
	/* No drain: Go counts the parked buffers live, so they are free memory
	 * it does not count; the lock keeps the two consistent. */
	pthread_mutex_lock(&F.mu);
	gpumem_status st = gpumemGo_mem_info(device, free_bytes, total_bytes);
	if (st == GPUMEM_SUCCESS) *free_bytes += F.parked[device].active;
	unlock();
	return st;
}

void gpumem_front_stop(void) {
	atomic_fetch_add(&stops, 1);
	pthread_mutex_lock(&F.mu); /* not by pending: every park before the stop goes back */
	C.stops += F.n > 0;
	drain_all();
	unlock();
}

void gpumem_front_go(void) {
	atomic_fetch_add(&gen, 1);
	atomic_fetch_sub(&stops, 1);
}

void gpumem_front_moved(void) { atomic_fetch_add(&gen, 1); }

static int standing_aside(void) {
	pthread_once(&env_once, read_env);
	return atomic_load_explicit(&stops, memory_order_relaxed) > 0 || gpumem_torch_profiling();
}

/* known reports whether Go's gauges of device d are known (lone_at). */
static int known(int d) { return lone_at[d] == atomic_load(&gen) + 1; }

/* under_peaks reports whether handing out parked s keeps the program
 * within Go's peaks: what it holds after is what Go counts less what
 * stays parked. A reuse that would set a peak is a request for Go. */
static int under_peaks(const front_buf *s) {
	int d = s->device;
	return F.go[d].active - (F.parked[d].active - s->block) <= F.go[d].peak_active &&
	       F.go[d].allocated - (F.parked[d].allocated - s->req) <= F.go[d].peak_allocated;
}

int gpumem_front_alloc(uintptr_t *out, size_t size, int device, uintptr_t stream, gpumem_status *st) {
	if (size == 0) return -1; /* no buffer: Go answers NULL and changes nothing */
	if (device < 0 || device >= FRONT_DEVICES || standing_aside()) {
		gpumem_front_drain(); /* the profiler on since buffers were parked: Go must see none */
		return -1;
	}
	pthread_mutex_lock(&F.mu);
	if (atomic_load_explicit(&stops, memory_order_relaxed) > 0) { /* stopped since: its drain waited for us */
		unlock();
		return -1;
	}
	/* Every request goes through here while the front may park, the large
	 * ones too: Go must know what is parked whenever it may set a peak. */
	int may_hit = size <= FRONT_MAX_REQUEST && known(device);
	for (int i = F.n - 1; i >= 0 && may_hit; i--) {
		front_buf *s = &F.slot[i];
		if (s->req != size || s->stream != stream || s->device != device) continue;
		if (!under_peaks(s)) {
			C.over_peaks++;
			break;
		}
		C.hits++;
		front_buf b = unpark(i);
		live_put(b); /* it was in live before it was parked: room is there */
		F.reused[device].n++;
		F.reused[device].bytes += b.block;
		F.reused[device].req += b.req;
		F.reused[device].stream = stream;
		unlock();
		*out = b.ptr;
		*st = GPUMEM_SUCCESS;
		return 0;
	}
	C.misses++;
	if (size > FRONT_MAX_REQUEST) C.large++;
	else if (!known(device)) C.unknown++;
	uint64_t active = F.parked[device].active, allocated = F.parked[device].allocated, block = 0;
	uint64_t gauges[4] = {0};
	int parkable = 0;
	uintptr_t p = 0;
	unsigned g = atomic_load(&gen);
	*st = gpumemGo_front_alloc(&p, &block, &parkable, gauges, size, device, stream, active, allocated);
	if (*st == GPUMEM_FRONT_DRAIN) {
		C.drains++;
		drain_device(device);
		set_pending();
		*st = gpumemGo_front_alloc(&p, &block, &parkable, gauges, size, device, stream, 0, 0);
	}
	if (*st == GPUMEM_SUCCESS) {
		lone_at[device] = parkable ? g + 1 : 0; /* in the front's path only Lone says no */
		F.go[device].active = gauges[0];
		F.go[device].allocated = gauges[1];
		F.go[device].peak_active = gauges[2];
		F.go[device].peak_allocated = gauges[3];
		if (parkable && size <= FRONT_MAX_REQUEST) live_put((front_buf){.ptr = p, .stream = stream, .req = size, .block = block, .device = device});
	}
	unlock();
	*out = p;
	return 0;
}

/* free_in_go frees p in Go for the front (under the lock), keeping Go's
 * gauges as the front follows them. */
static gpumem_status free_in_go(uintptr_t p, int device) {
	int dev = device;
	uint64_t block = 0, req = 0;
	gpumem_status st = gpumemGo_front_free(p, device, &dev, &block, &req);
	if (st == GPUMEM_SUCCESS && dev >= 0 && dev < FRONT_DEVICES && known(dev)) {
		F.go[dev].active -= block;
		F.go[dev].allocated -= req;
	}
	return st;
}

int gpumem_front_free(void *ptr, int device, gpumem_status *st) {
	uintptr_t p = (uintptr_t)ptr;
	if (standing_aside()) {
		gpumem_front_forget(ptr);
		atomic_fetch_add_explicit(&C.aside_frees, 1, memory_order_relaxed);
		return 0;
	}
	pthread_mutex_lock(&F.mu);
	front_buf *e = live_find(p);
	if (!e) {
		if (parked_at(p) >= 0) drain_all(); /* a double free: Go sees the first, reports the second */
		*st = free_in_go(p, device);
		unlock();
		return 1;
	}
	front_buf b = *e;
	live_drop(e);
	if (b.recorded || atomic_load_explicit(&stops, memory_order_relaxed) > 0 || !known(b.device)) { /* stopped since the check above */
		C.unparkable++;
		*st = free_in_go(p, b.device); /* with events where record_stream named it */
		unlock();
		return 1;
	}
	C.parks++;
	while (F.n == FRONT_SLOTS || (F.n > 0 && F.bytes + b.block > FRONT_BYTES)) {
		C.evictions++;
		front_buf old = unpark(0);
		gone(old);
		say(gpumemGo_free(old.ptr, old.device));
	}
	park(b);
	atomic_store_explicit(&pending, 1, memory_order_relaxed);
	*st = GPUMEM_SUCCESS;
	unlock();
	return 1;
}

void gpumem_front_forget(void *ptr) {
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&F.mu);
	front_buf *e = live_find(p);
	if (e) live_drop(e);
	else if (parked_at(p) >= 0) drain_all();
	unlock();
}

void gpumem_front_record(void *ptr) {
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&F.mu);
	front_buf *e = live_find(p);
	if (e) e->recorded = 1;
	else if (parked_at(p) >= 0) drain_all(); /* freed: Go says so */
	unlock();
}
