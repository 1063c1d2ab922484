// probe.h: what the driver probes of bench/core (access_probe.c,
// unmap_probe.c, overlap_probe.c) share: a check that prints the failed
// call and exits, a microsecond clock, and the device's primary context
// with the allocation properties and access the allocator uses (pinned
// device memory, read-write from the device).
#ifndef GPUMEM_PROBE_H
#define GPUMEM_PROBE_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                             \
	do {                                                                  \
		CUresult r_ = (x);                                                \
		if (r_ != CUDA_SUCCESS) {                                         \
			const char *s_ = "?";                                         \
			cuGetErrorName(r_, &s_);                                      \
			printf("%s: %s (line %d)\n", #x, s_, __LINE__);               \
			exit(1);                                                      \
		}                                                                 \
	} while (0)

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// probe_open makes device 0's primary context current and fills prop and
// desc for it; it returns the device.
static CUdevice probe_open(CUcontext *ctx, CUmemAllocationProp *prop, CUmemAccessDesc *desc) {
	CUdevice dev;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(ctx, dev));
	CK(cuCtxSetCurrent(*ctx));
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	desc->location = prop->location;
	desc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return dev;
}

#endif
