/* torch_allocator.c: what PyTorch's C++ code asks of its allocator and
 * CUDAPluggableAllocator refuses, answered by gpumem.
 *
 * CUDAPluggableAllocator forwards malloc and free to gpumem; most of its
 * other virtual functions throw "CUDAPluggableAllocator does not yet
 * support ...". Python-level callers are patched in gpumem.torch.use(),
 * but some callers are C++: cuDNN's convolution benchmark
 * (torch.backends.cudnn.benchmark = True) sizes its workspace by
 * cacheInfo, the largest block the allocator could hand out now, and so
 * fails on every convolution under a pluggable allocator.
 *
 * gpumem_torch_cache_info puts gpumem's answer in the class's vtable: it
 * finds the vtable and CUDAPluggableAllocator::cacheInfo among the symbols
 * of the libtorch_cuda.so PyTorch has loaded (or, with no vtable symbol,
 * the vtable of the allocator PyTorch uses now), finds the slot within the
 * vtable's bounds (its symbol's size, or the library's) that holds that
 * function, and
 * writes gpumem's function there (the page made writable for the write,
 * read-only again after). Any symbol missing, or no such slot: nothing is
 * written, and the call fails with one line.
 *
 * The answer is what gpumem could hand out on the device now without
 * going past its limit or the device's free memory (gpumem_mem_info's
 * free, asked of the Go side as gpumem_mem_info does), as PyTorch's
 * cudaMallocAsync backend answers.
 *
 * gpumem_torch_cpp_history does the same for two functions C++ code calls
 * for memory history, torch::cuda::_record_memory_history and
 * _memory_snapshot_pickled (a C++ extension's, say): the allocator's
 * recordHistory and snapshot. Python's entry points are gpumem's, but a
 * snapshot is a C++ object (SnapshotInfo: vectors, strings, shared
 * contexts) that C cannot build safely, so these answer with c10::Error
 * and gpumem's one line naming the Python calls that work, where PyTorch's
 * said only "CUDAPluggableAllocator does not yet support recordHistory".
 * Their slots are found by the names dladdr gives each slot of the vtable
 * (the mangled parameter lists differ between versions).
 *
 * Like torch_errors.c, it calls down only: torch_errors.c's
 * gpumem_torch_fail and gpumem_torch_enabled, errors.c and the Go side,
 * never capi.c (internal.h: the layers). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "internal.h"

#define EXPORT __attribute__((visibility("default")))

static const char vtable_name[] = "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
static const char cache_info_name[] = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator9cacheInfoEaPm";

/* c10::cuda::CUDACachingAllocator::CUDAAllocator::cacheInfo(DeviceIndex, size_t*). */
static void cache_info(void *self, int8_t device, size_t *largest) {
	(void)self;
	uint64_t free_bytes = 0, total = 0;
	if (gpumemGo_mem_info(device, &free_bytes, &total) != GPUMEM_SUCCESS) free_bytes = 0;
	*largest = (size_t)free_bytes;
}

/* refuse records, as the calling thread's GPUMEM_ERROR_CONFIG, that the
 * vtable slots of what were not written, why, and what follows. */
static gpumem_status refuse(const char *what, const char *why, const char *follows) {
	char msg[512];
	int n = snprintf(msg, sizeof msg, "gpumem: PyTorch's CUDAPluggableAllocator::%s not replaced (%s): %s", what, why, follows);
	gpumem_set_error(GPUMEM_ERROR_CONFIG, msg, n > 0 && (size_t)n < sizeof msg ? (size_t)n : strlen(msg), NULL);
	return GPUMEM_ERROR_CONFIG;
}

static gpumem_status refuse_cache_info(const char *why) {
	return refuse("cacheInfo", why, "torch.backends.cudnn.benchmark fails under gpumem");
}

/* find_vtable finds CUDAPluggableAllocator's vtable in lib and the number
 * of its slots: by its symbol, or, with no vtable symbol, as the vtable of
 * the allocator PyTorch uses now (c10::cuda::CUDACachingAllocator::
 * allocator, the pluggable one once gpumem.torch.use() changed it),
 * through its object's vptr, slot by slot while the slots lie in the
 * library that holds known (a function of the class). NULL if not found. */
static void **find_vtable(void *lib, void *known, size_t *nslots) {
	void **vt = dlsym(lib, vtable_name);
	Dl_info info;
	const ElfW(Sym) *sym = NULL;
	if (vt && dladdr1(vt, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size >= 3 * sizeof(void *)) {
		*nslots = sym->st_size / sizeof(void *);
		return vt;
	}
	void **current = dlsym(RTLD_DEFAULT, "_ZN3c104cuda20CUDACachingAllocator9allocatorE");
	void *object = current ? __atomic_load_n(current, __ATOMIC_SEQ_CST) : NULL;
	if (!object) return NULL;
	vt = (void **)(*(void ***)object) - 2;
	if (!dladdr(vt, &info) || !known || !dladdr(known, &info)) return NULL;
	Dl_info here;
	size_t slots;
	for (slots = 2; slots < 256; slots++) {
		if (!dladdr(&vt[slots], &here) || here.dli_fbase != info.dli_fbase) break;
	}
	*nslots = slots;
	return vt;
}

/* put writes fn in slot i of vtable vt (its page made writable for the
 * write, read-only again after). */
static int put(void **vt, size_t i, void *fn) {
	if (vt[i] == fn) return 1; /* done before */
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)&vt[i] & ~(uintptr_t)(page - 1);
	size_t len = (uintptr_t)&vt[i] + sizeof(void *) - start;
	if (mprotect((void *)start, len, PROT_READ | PROT_WRITE) != 0) return 0;
	__atomic_store_n(&vt[i], fn, __ATOMIC_SEQ_CST);
	mprotect((void *)start, len, PROT_READ);
	return 1;
}

EXPORT gpumem_status gpumem_torch_cache_info(const char *libtorch_cuda) {
	if (!libtorch_cuda) return refuse_cache_info("no library given");
	void *lib = dlopen(libtorch_cuda, RTLD_NOW | RTLD_NOLOAD);
	if (!lib) return refuse_cache_info("libtorch_cuda.so is not loaded");
	void *fn = dlsym(lib, cache_info_name);
	if (!fn) return refuse_cache_info("CUDAPluggableAllocator::cacheInfo was not found in libtorch_cuda.so");
	size_t slots = 0;
	void **vt = find_vtable(lib, fn, &slots);
	if (!vt) return refuse_cache_info("neither the vtable nor the current allocator was found");
	size_t slot = 0;
	/* Slots 0 and 1: offset to top and typeinfo; the functions follow. */
	for (size_t i = 2; i < slots; i++) {
		if (vt[i] == fn || vt[i] == (void *)cache_info) {
			slot = i;
			break;
		}
	}
	if (!slot) return refuse_cache_info("no vtable slot holds cacheInfo");
	if (!put(vt, slot, (void *)cache_info)) return refuse_cache_info("its page could not be made writable");
	return GPUMEM_SUCCESS;
}

static const char record_history_prefix[] = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator13recordHistoryE";
static const char snapshot_prefix[] = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator8snapshotE";

/* CUDAAllocator::recordHistory(...), from C++: gpumem's line. */
static void record_history(void *self) {
	(void)self;
	gpumem_torch_fail("recordHistory",
	                  "gpumem: C++ memory history (torch::cuda::_record_memory_history, the allocator's recordHistory) is not "
	                  "available under gpumem.torch.use(); torch.cuda.memory._record_memory_history from Python is, with "
	                  "torch.cuda.memory._snapshot and _dump_snapshot");
}

/* CUDAAllocator::snapshot(...), from C++: gpumem's line. (It returns a
 * SnapshotInfo through a hidden pointer; it never returns here.) */
static void snapshot(void *ret, void *self) {
	(void)ret, (void)self;
	gpumem_torch_fail("snapshot",
	                  "gpumem: a C++ memory snapshot (torch::cuda::_memory_snapshot_pickled, the allocator's snapshot) is "
	                  "not available under gpumem.torch.use(); torch.cuda.memory._snapshot() and memory_snapshot() from "
	                  "Python are");
}

static gpumem_status refuse_history(const char *why) {
	return refuse("recordHistory and snapshot", why, "from C++ they fail with PyTorch's words, not gpumem's");
}

EXPORT gpumem_status gpumem_torch_cpp_history(const char *libtorch_cuda) {
	if (!libtorch_cuda) return refuse_history("no library given");
	if (!gpumem_torch_enabled()) return refuse_history("PyTorch's exceptions are not enabled (gpumem_torch_errors)");
	void *lib = dlopen(libtorch_cuda, RTLD_NOW | RTLD_NOLOAD);
	if (!lib) return refuse_history("libtorch_cuda.so is not loaded");
	size_t slots = 0;
	void **vt = find_vtable(lib, dlsym(lib, cache_info_name), &slots);
	if (!vt) return refuse_history("neither the vtable nor the current allocator was found");
	size_t rh = 0, sn = 0;
	Dl_info info;
	for (size_t i = 2; i < slots; i++) {
		if (vt[i] == (void *)record_history) rh = i;
		else if (vt[i] == (void *)snapshot) sn = i;
		else if (dladdr(vt[i], &info) && info.dli_sname && info.dli_saddr == vt[i]) {
			if (!strncmp(info.dli_sname, record_history_prefix, sizeof record_history_prefix - 1)) rh = i;
			else if (!strncmp(info.dli_sname, snapshot_prefix, sizeof snapshot_prefix - 1)) sn = i;
		}
	}
	if (!rh || !sn) return refuse_history("no vtable slot holds recordHistory or snapshot");
	if (!put(vt, rh, (void *)record_history) || !put(vt, sn, (void *)snapshot))
		return refuse_history("their page could not be made writable");
	return GPUMEM_SUCCESS;
}
