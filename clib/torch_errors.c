/* torch_errors.c: PyTorch's exceptions, raised from gpumem_alloc.
 *
 * PyTorch's CUDAPluggableAllocator does not check what the allocator
 * returns: a NULL becomes a tensor without memory, and the program fails
 * later, far from the cause ("data is not allocated yet"), or writes to
 * address 0. PyTorch's own allocator throws c10::OutOfMemoryError instead,
 * which its Python bindings turn into torch.cuda.OutOfMemoryError. So does
 * this file, with gpumem's verdict as the message; other failures throw
 * c10::Error (Python's RuntimeError) through c10::detail::torchCheckFail.
 *
 * There is no C++ here: the exception is built and thrown through the C++
 * ABI (Itanium, as libstdc++ implements it), from symbols looked up in the
 * libraries PyTorch has already loaded:
 *
 *   c10::Error::Error(c10::SourceLocation, std::string)  libc10.so
 *   vtable and typeinfo for c10::OutOfMemoryError         libc10_cuda.so
 *   c10::detail::torchCheckFail(const char*, const char*, uint32_t, const char*)  libc10.so
 *   __cxa_allocate_exception, __cxa_throw, operator new/delete  libstdc++.so.6
 *
 * c10::OutOfMemoryError adds nothing to c10::Error but its type, so the
 * object is built by Error's constructor and then given OutOfMemoryError's
 * vtable, which is what its own (inline) constructor does. The std::string
 * argument is built in libstdc++'s layout (pointer, length, and a 16-byte
 * buffer or the capacity), its characters allocated with operator new since
 * the constructor may take them over. gpumem_torch_errors resolves every
 * symbol first and enables the raise only if all are there; otherwise
 * gpumem_alloc keeps returning NULL. The throw unwinds through
 * gpumem_alloc's frame, compiled with -fexceptions, and no Go frame is on
 * the stack when it happens (the Go side has returned).
 *
 * Called by capi.c (gpumem_alloc, gpumem_free); calls down only: errors.c
 * (gpumem_set_error, gpumem_last_verdict) and the Go side (gpumemGo_*),
 * never capi.c (internal.h: the layers).
 *
 * Checked on the H100 machine with PyTorch 2.11 (pytest python/tests). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_cgo_export.h"
#include "internal.h"

typedef struct {
	const char *function;
	const char *file;
	uint32_t line;
} c10_source_location;

/* libstdc++'s std::string (the C++11 ABI). */
typedef struct {
	char *p;
	size_t len;
	union {
		char local[16];
		size_t capacity;
	} u;
} cxx_string;

static struct {
	void (*error_ctor)(void *self, c10_source_location loc, cxx_string *msg);
	char *oom_vtable;
	void *oom_typeinfo;
	void (*check_fail)(const char *func, const char *file, uint32_t line, const char *msg);
	void *(*allocate_exception)(size_t);
	void (*throw_)(void *obj, void *typeinfo, void (*dtor)(void *));
	void *(*op_new)(size_t);
	void (*op_delete)(void *);
} cxx;

static atomic_int enabled;

/* PyTorch's profiler: c10::memoryProfilingEnabled() and
 * c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, size_t
 * total_allocated, size_t total_reserved, c10::Device device), which
 * PyTorch's own allocator calls at every allocation and free and a
 * pluggable allocator does not: without them torch.profiler's
 * profile_memory and its memory timeline see nothing of gpumem's.
 * c10::Device is two bytes (DeviceType, then the index), trivially
 * copyable: passed in a register as an integer. Optional: resolved by
 * gpumem_torch_errors, used where both are found. */
static _Bool (*_Atomic prof_enabled)(void);
static void (*_Atomic prof_report)(void *ptr, int64_t size, size_t total_allocated, size_t total_reserved, uint16_t device);
#define C10_DEVICE_CUDA 1

void gpumem_torch_report(void *ptr, int64_t size, int device) {
	_Bool (*on)(void) = atomic_load_explicit(&prof_enabled, memory_order_relaxed);
	if (!on || !ptr || !on()) return;
	void (*report)(void *, int64_t, size_t, size_t, uint16_t) = atomic_load(&prof_report);
	uint64_t allocated = 0, reserved = 0;
	gpumemGo_totals(device, &allocated, &reserved);
	report(ptr, size, allocated, reserved, (uint16_t)(C10_DEVICE_CUDA | ((uint8_t)device << 8)));
}

int gpumem_torch_enabled(void) { return atomic_load_explicit(&enabled, memory_order_relaxed); }

/* A safe upper bound on sizeof(c10::Error) (128 bytes in PyTorch 2.11). */
#define ERROR_OBJECT_SIZE 512

static void *lookup(void *lib, const char *name) { return lib ? dlsym(lib, name) : NULL; }

__attribute__((visibility("default"))) gpumem_status gpumem_torch_errors(const char *c10, const char *c10_cuda) {
	if (!c10 || !c10_cuda) return GPUMEM_ERROR_INVALID_VALUE;
	/* RTLD_NOLOAD: only libraries PyTorch has loaded; nothing new is loaded. */
	void *lc10 = dlopen(c10, RTLD_NOW | RTLD_NOLOAD);
	void *lcuda = dlopen(c10_cuda, RTLD_NOW | RTLD_NOLOAD);
	void *lstd = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
	cxx.error_ctor = lookup(lc10, "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
	cxx.check_fail = lookup(lc10, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_");
	cxx.oom_vtable = lookup(lcuda, "_ZTVN3c1016OutOfMemoryErrorE");
	cxx.oom_typeinfo = lookup(lcuda, "_ZTIN3c1016OutOfMemoryErrorE");
	cxx.allocate_exception = lookup(lstd, "__cxa_allocate_exception");
	cxx.throw_ = lookup(lstd, "__cxa_throw");
	cxx.op_new = lookup(lstd, "_Znwm");
	cxx.op_delete = lookup(lstd, "_ZdlPv");
	void *report = lookup(lc10, "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE");
	void *profiling = lookup(lc10, "_ZN3c1022memoryProfilingEnabledEv");
	if (report && profiling) {
		atomic_store(&prof_report, report);
		atomic_store(&prof_enabled, profiling);
	}
	int ok = cxx.error_ctor && cxx.check_fail && cxx.oom_vtable && cxx.oom_typeinfo &&
	         cxx.allocate_exception && cxx.throw_ && cxx.op_new && cxx.op_delete;
	/* The handles stay open: the libraries stay loaded while PyTorch is. */
	if (!ok) {
		static const char msg[] = "gpumem: PyTorch's exception symbols were not found in the given libc10.so, libc10_cuda.so and libstdc++.so.6: an out-of-memory will return NULL to PyTorch";
		gpumem_set_error(GPUMEM_ERROR_CONFIG, msg, sizeof msg - 1, NULL);
		return GPUMEM_ERROR_CONFIG;
	}
	atomic_store(&enabled, 1);
	return GPUMEM_SUCCESS;
}

/* PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp): bytes up to
 * 1 KiB, then KiB, MiB and GiB with two decimals. */
static void torch_size(char *out, size_t n, uint64_t v) {
	if (v <= 1024) snprintf(out, n, "%llu bytes", (unsigned long long)v);
	else if (v <= 1048576) snprintf(out, n, "%.2f KiB", v / 1024.0);
	else if (v <= 1073741824ULL) snprintf(out, n, "%.2f MiB", v / 1048576.0);
	else snprintf(out, n, "%.2f GiB", v / 1073741824.0);
}

/* The message of an out-of-memory as PyTorch's begins ("CUDA out of
 * memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ...":
 * what batch-size finders and other tools match on), then gpumem's
 * verdict. */
static void torch_oom_message(char *out, size_t n, const gpumem_oom *o, const char *verdict) {
	if (o->requested >= (1ULL << 60)) {
		/* PyTorch's words for a request of 1 EB or more. */
		snprintf(out, n, "CUDA out of memory. Tried to allocate more than 1EB memory. %s", verdict);
		return;
	}
	char req[32], total[32], free_[32], active[32], cached[32];
	torch_size(req, sizeof req, o->requested);
	torch_size(total, sizeof total, o->total);
	torch_size(free_, sizeof free_, o->device_free);
	torch_size(active, sizeof active, o->active);
	torch_size(cached, sizeof cached, o->reserved > o->active ? o->reserved - o->active : 0);
	snprintf(out, n,
	         "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free. "
	         "Of the allocated memory %s is allocated by PyTorch, and %s is reserved by gpumem but unallocated. %s",
	         req, o->device, total, free_, active, cached, verdict);
}

void gpumem_torch_fail(const char *where, const char *msg) {
	if (atomic_load_explicit(&enabled, memory_order_relaxed)) cxx.check_fail(where, "gpumem", 0, msg); /* throws c10::Error */
}

void gpumem_torch_raise(gpumem_status status, const char *verdict, size_t size, int device) {
	char msg[3072];
	gpumem_oom o;
	if (status == GPUMEM_ERROR_INVALID_VALUE && size > 0 && strstr(verdict, "invalid size")) {
		/* A size beyond anything the device could hold: PyTorch's own
		 * allocator calls that an out-of-memory, and so do its tests. */
		char copy[2048];
		snprintf(copy, sizeof copy, "%s", verdict);
		memset(&o, 0, sizeof o);
		o.requested = size;
		o.device = device;
		gpumemGo_mem_info(device, &o.device_free, &o.total);
		torch_oom_message(msg, sizeof msg, &o, copy);
	} else if (status != GPUMEM_ERROR_OUT_OF_MEMORY) {
		cxx.check_fail("gpumem_alloc", "gpumem", 0, verdict); /* throws c10::Error */
		return;
	} else {
		gpumem_last_verdict(&o);
		torch_oom_message(msg, sizeof msg, &o, verdict);
	}
	size_t n = strlen(msg);
	cxx_string s;
	s.p = cxx.op_new(n + 1);
	memcpy(s.p, msg, n + 1);
	s.len = n;
	s.u.capacity = n;
	void *obj = cxx.allocate_exception(ERROR_OBJECT_SIZE);
	memset(obj, 0, ERROR_OBJECT_SIZE);
	c10_source_location loc = {"gpumem_alloc", "gpumem", 0};
	cxx.error_ctor(obj, loc, &s);
	/* The constructor moved the characters out, or copied them. */
	if (s.p != s.u.local) cxx.op_delete(s.p);
	/* The vtable's address point is past offset-to-top and typeinfo; its
	 * first slot is the complete-object destructor. */
	char *vptr = cxx.oom_vtable + 2 * sizeof(void *);
	*(void **)obj = vptr;
	cxx.throw_(obj, cxx.oom_typeinfo, *(void (**)(void *))vptr);
}
