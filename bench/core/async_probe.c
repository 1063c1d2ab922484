// async_probe: can a stream wait on the GPU for mappings another host
// thread makes, so that the thread that allocates does not wait for the
// driver's mapping calls? (issue 40: the tightening's moves cost a map, an
// access grant and an unmap each, about 150 us of the allocating thread's
// time on PyTorch's legacy default stream; the step's host is on the
// critical path.)
//
//     gcc -O2 -pthread -o async_probe bench/core/async_probe.c -I$CUDA_HOME/include -lcuda
//     ./async_probe [ROUNDS]
//
// Prints the device's stream-memory-operation attributes; what
// cuMemsetD32Async and cuMemcpyDtoHAsync answer when enqueued on a range
// that is reserved but not mapped, and mapped but not yet granted access
// (the work a program queues right after an allocation returns, before a
// worker thread could have mapped or granted it); then, on the legacy
// default stream and on a non-blocking stream, with about 20 ms of memsets
// queued ahead: the allocating thread's time to map, grant and unmap a
// 2 MiB chunk itself, against its time to enqueue a cuStreamWaitValue64 on
// a host counter while a worker thread grants access and then bumps the
// counter (a stream waiting on the GPU for the worker), with the data of
// a kernel-free check (a memset after the wait, read back) when the
// enqueue is accepted. An alarm ends the probe if a stream waiting on the
// counter keeps the worker's calls from returning (a deadlock).
#include "probe.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#define CHUNK (2u << 20)
#define BUSY (1u << 28)

static CUcontext ctx;
static CUmemAllocationProp prop;
static CUmemAccessDesc desc;
static CUdeviceptr busy, va;
static volatile unsigned long long *counter;
static CUdeviceptr counterDev;
static CUmemGenericAllocationHandle handle;
static int memsets = 64;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int job;          // 1: map, grant, bump; 2: unmap, bump; -1: quit
static unsigned long long target;
static double workerUs;
static volatile const char *stage = "start"; // where each thread is, for the alarm
static volatile const char *wstage = "idle";
static int delayUs; // the worker sleeps this long before its calls: the stream is then blocked on the wait

static void *worker(void *arg) {
	(void)arg;
	CK(cuCtxSetCurrent(ctx));
	for (;;) {
		pthread_mutex_lock(&mu);
		while (job == 0) {
			pthread_cond_wait(&cv, &mu);
		}
		int j = job;
		unsigned long long v = target;
		pthread_mutex_unlock(&mu);
		if (j < 0) {
			return NULL;
		}
		if (delayUs > 0) {
			usleep(delayUs);
		}
		double t0 = now_us();
		if (j == 1) {
			wstage = "in cuMemSetAccess";
			CK(cuMemSetAccess(va, CHUNK, &desc, 1));
		} else {
			wstage = "in cuMemUnmap";
			CK(cuMemUnmap(va, CHUNK));
		}
		wstage = "idle";
		workerUs = now_us() - t0;
		__atomic_store_n(counter, v, __ATOMIC_RELEASE);
		__sync_synchronize();
		pthread_mutex_lock(&mu);
		job = 0;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
	}
}

static void post(int j, unsigned long long v) {
	pthread_mutex_lock(&mu);
	target = v;
	job = j;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void waitIdle(void) {
	pthread_mutex_lock(&mu);
	while (job != 0) {
		pthread_cond_wait(&cv, &mu);
	}
	pthread_mutex_unlock(&mu);
}

static void queue(CUstream s) {
	for (int i = 0; i < memsets; i++) {
		CK(cuMemsetD32Async(busy, (unsigned)i, BUSY / 4, s));
	}
}

static void onAlarm(int sig) {
	(void)sig;
	printf("DEADLOCK: the alarm fired: main thread %s, worker %s\n", stage, wstage);
	fflush(stdout);
	_exit(2);
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	CUdevice dev = probe_open(&ctx, &prop, &desc);
	int a92 = -1, a93 = -1, a94 = -1;
	cuDeviceGetAttribute(&a92, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
	cuDeviceGetAttribute(&a93, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
	cuDeviceGetAttribute(&a94, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
	int drv = 0;
	cuDriverGetVersion(&drv);
	printf("driver %d; attributes: stream mem ops v1 %d, 64-bit %d, wait NOR %d\n", drv, a92, a93, a94);

	CK(cuMemAlloc(&busy, BUSY));
	CK(cuMemAddressReserve(&va, CHUNK, 0, 0, 0));
	CK(cuMemCreate(&handle, CHUNK, &prop, 0));
	void *hp;
	CK(cuMemHostAlloc(&hp, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
	counter = hp;
	*counter = 0;
	CK(cuMemHostGetDevicePointer(&counterDev, hp, 0));
	unsigned *back;
	CK(cuMemHostAlloc((void **)&back, 64, 0));

	// calibrate the memsets to about 20 ms
	CK(cuCtxSynchronize());
	double t0 = now_us();
	queue(NULL);
	CK(cuCtxSynchronize());
	double per = (now_us() - t0) / memsets;
	memsets = (int)(20000 / per) + 1;
	printf("memsets: %d of %u MiB, about %.1f us each\n", memsets, BUSY >> 20, per);

	// What the driver checks when work is enqueued on a range.
	{
		const char *n1 = "?", *n2 = "?", *n3 = "?", *n4 = "?";
		CUresult r1 = cuMemsetD32Async(va, 1, CHUNK / 4, NULL);
		CUresult r2 = cuMemcpyDtoHAsync(back, va, 4, NULL);
		CK(cuMemMap(va, CHUNK, 0, handle, 0));
		CUresult r3 = cuMemsetD32Async(va, 1, CHUNK / 4, NULL);
		CUresult r4 = cuMemcpyDtoHAsync(back, va, 4, NULL);
		cuGetErrorName(r1, &n1);
		cuGetErrorName(r2, &n2);
		cuGetErrorName(r3, &n3);
		cuGetErrorName(r4, &n4);
		printf("enqueue on a reserved, unmapped range: memset %s, copy %s\n", n1, n2);
		printf("enqueue on a mapped range without access: memset %s, copy %s\n", n3, n4);
		CK(cuCtxSynchronize());
		CK(cuMemUnmap(va, CHUNK));
		if (r3 != CUDA_SUCCESS) {
			printf("so a stream cannot wait on the GPU for a grant made after the allocation returns: memsets and copies are refused at once\n");
		}
	}
	int asyncOK = 1;
	{
		CK(cuMemMap(va, CHUNK, 0, handle, 0));
		asyncOK = cuMemsetD32Async(va, 1, CHUNK / 4, NULL) == CUDA_SUCCESS;
		CK(cuCtxSynchronize());
		CK(cuMemUnmap(va, CHUNK));
	}

	pthread_t th;
	pthread_create(&th, NULL, worker, NULL);
	signal(SIGALRM, onAlarm);

	CUstream nb;
	CK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
	// argv[2] "nb": the non-blocking stream first (a deadlock ends the probe)
	int nbFirst = argc > 2 && strcmp(argv[2], "nb") == 0;
	CUstream streams[2] = {nbFirst ? nb : NULL, nbFirst ? NULL : nb};
	const char *snames[2] = {nbFirst ? "nonblocking" : "legacy", nbFirst ? "legacy" : "nonblocking"};
	unsigned long long v = 0;
	for (int si = 0; si < 2; si++) {
		CUstream s = streams[si];
		for (int r = 0; r < rounds; r++) {
			delayUs = r % 2 ? 30000 : 0; // odd rounds: the stream waits before the worker calls
			// sync: the allocating thread maps, grants, the work is queued after
			CK(cuCtxSynchronize());
			queue(s);
			double a0 = now_us();
			CK(cuMemMap(va, CHUNK, 0, handle, 0));
			CK(cuMemSetAccess(va, CHUNK, &desc, 1));
			double a1 = now_us();
			CK(cuMemsetD32Async(va, 0x1000 + r, CHUNK / 4, s));
			CK(cuMemcpyDtoHAsync(back, va, 4, s));
			CK(cuStreamSynchronize(s));
			int okSync = back[0] == 0x1000u + (unsigned)r;
			double u0 = now_us();
			CK(cuMemUnmap(va, CHUNK));
			double u1 = now_us();

			// async: the allocating thread enqueues a wait; the worker maps
			CK(cuCtxSynchronize());
			queue(s);
			alarm(5);
			v++;
			double b0 = now_us();
			CK(cuMemMap(va, CHUNK, 0, handle, 0)); // the map stays here: memsets and copies check the address when enqueued
			CK(cuStreamWaitValue64(s, counterDev, v, CU_STREAM_WAIT_VALUE_GEQ));
			double b1 = now_us();
			stage = "after posting the grant";
			post(1, v);
			back[0] = 0;
			if (asyncOK) {
				CK(cuMemsetD32Async(va, 0x2000 + r, CHUNK / 4, s));
				CK(cuMemcpyDtoHAsync(back, va, 4, s));
			}
			double b2 = now_us();
			stage = "in cuStreamSynchronize after the wait";
			CK(cuStreamSynchronize(s));
			stage = "waiting for the worker's grant";
			waitIdle();
			stage = "after the grant";
			double wMap = workerUs;
			const char *okAsync = !asyncOK ? "not enqueued" : back[0] == 0x2000u + (unsigned)r ? "ok" : "WRONG";
			// async unmap: the work that used the mapping is done first
			// (here a synchronize; an event in a real design), then the
			// worker unmaps while the allocating thread goes on.
			CK(cuMemsetD32Async(va, 0x3000 + r, CHUNK / 4, s));
			CK(cuStreamSynchronize(s));
			queue(s);
			v++;
			double c0 = now_us();
			stage = "after posting the unmap";
			post(2, v);
			double c1 = now_us();
			waitIdle();
			stage = "after the unmap";
			double wUnmap = workerUs;
			CK(cuCtxSynchronize());
			alarm(0);
			printf("%s round %d (worker delay %d us): sync map+grant %.1f us, unmap %.1f us, data %s | async: map+wait enqueue %.1f us, "
				   "map+wait+memset+copy enqueue %.1f us, worker grant %.1f us, data %s, unmap post %.1f us, worker unmap %.1f us\n",
				   snames[si], r, delayUs, a1 - a0, u1 - u0, okSync ? "ok" : "WRONG", b1 - b0, b2 - b0, wMap,
				   okAsync, c1 - c0, wUnmap);
		}
	}
	post(-1, 0);
	pthread_join(th, NULL);
	printf("done\n");
	return 0;
}
