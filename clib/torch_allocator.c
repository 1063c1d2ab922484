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
 * free), as PyTorch's cudaMallocAsync backend answers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define EXPORT __attribute__((visibility("default")))

static const char vtable_name[] = "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
static const char cache_info_name[] = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator9cacheInfoEaPm";

/* c10::cuda::CUDACachingAllocator::CUDAAllocator::cacheInfo(DeviceIndex, size_t*). */
static void cache_info(void *self, int8_t device, size_t *largest) {
	(void)self;
	uint64_t free_bytes = 0, total = 0;
	if (gpumem_mem_info(device, &free_bytes, &total) != GPUMEM_SUCCESS) free_bytes = 0;
	*largest = (size_t)free_bytes;
}

static gpumem_status refuse(const char *why) {
	char msg[512];
	int n = snprintf(msg, sizeof msg, "gpumem: PyTorch's CUDAPluggableAllocator::cacheInfo left as it is (%s): "
	                 "torch.backends.cudnn.benchmark fails under gpumem", why);
	gpumem_set_error(GPUMEM_ERROR_CONFIG, msg, n > 0 && (size_t)n < sizeof msg ? (size_t)n : strlen(msg), NULL);
	return GPUMEM_ERROR_CONFIG;
}

EXPORT gpumem_status gpumem_torch_cache_info(const char *libtorch_cuda) {
	if (!libtorch_cuda) return refuse("no library given");
	void *lib = dlopen(libtorch_cuda, RTLD_NOW | RTLD_NOLOAD);
	if (!lib) return refuse("libtorch_cuda.so is not loaded");
	void *fn = dlsym(lib, cache_info_name);
	if (!fn) return refuse("CUDAPluggableAllocator::cacheInfo was not found in libtorch_cuda.so");
	void **vt = dlsym(lib, vtable_name);
	size_t slots = 0;
	Dl_info info;
	const ElfW(Sym) *sym = NULL;
	if (vt && dladdr1(vt, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size >= 3 * sizeof(void *))
		slots = sym->st_size / sizeof(void *);
	if (!slots) {
		/* No vtable symbol: the vtable of the allocator PyTorch uses now
		 * (c10::cuda::CUDACachingAllocator::allocator, the pluggable one
		 * once gpumem.torch.use() changed it), through its object's vptr,
		 * slot by slot while the slots lie in libtorch_cuda.so. */
		void **current = dlsym(RTLD_DEFAULT, "_ZN3c104cuda20CUDACachingAllocator9allocatorE");
		void *object = current ? __atomic_load_n(current, __ATOMIC_SEQ_CST) : NULL;
		if (!object) return refuse("neither the vtable nor the current allocator was found");
		vt = (void **)(*(void ***)object) - 2;
		if (!dladdr(vt, &info) || !dladdr(fn, &info)) return refuse("the allocator's vtable is not in a loaded library");
		Dl_info here;
		for (slots = 2; slots < 256; slots++) {
			if (!dladdr(&vt[slots], &here) || here.dli_fbase != info.dli_fbase) break;
		}
	}
	size_t slot = 0;
	/* Slots 0 and 1: offset to top and typeinfo; the functions follow. */
	for (size_t i = 2; i < slots; i++) {
		if (vt[i] == fn || vt[i] == (void *)cache_info) {
			slot = i;
			break;
		}
	}
	if (!slot) return refuse("no vtable slot holds cacheInfo");
	if (vt[slot] == (void *)cache_info) return GPUMEM_SUCCESS; /* done before */
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)&vt[slot] & ~(uintptr_t)(page - 1);
	size_t len = (uintptr_t)&vt[slot] + sizeof(void *) - start;
	if (mprotect((void *)start, len, PROT_READ | PROT_WRITE) != 0) return refuse("its page could not be made writable");
	__atomic_store_n(&vt[slot], (void *)cache_info, __ATOMIC_SEQ_CST);
	mprotect((void *)start, len, PROT_READ);
	return GPUMEM_SUCCESS;
}
