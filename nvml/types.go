package nvml

import "structs"

// Hand-written mirrors of the nvml.h structures this package reads; the
// tests check their sizes and offsets.

// pciInfo mirrors nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3), 68 bytes:
//
//	char busIdLegacy[16];        // @0
//	unsigned int domain;         // @16
//	unsigned int bus;            // @20
//	unsigned int device;         // @24
//	unsigned int pciDeviceId;    // @28
//	unsigned int pciSubSystemId; // @32
//	char busId[32];              // @36
type pciInfo struct {
	_              structs.HostLayout
	BusIDLegacy    [16]byte
	Domain         uint32
	Bus            uint32
	Device         uint32
	PCIDeviceID    uint32
	PCISubSystemID uint32
	BusID          [32]byte
}

// memoryInfo mirrors nvmlMemory_t (nvmlDeviceGetMemoryInfo), 24 bytes:
// unsigned long long total @0, free @8, used @16.
type memoryInfo struct {
	_     structs.HostLayout
	Total uint64
	Free  uint64
	Used  uint64
}

// processInfo mirrors nvmlProcessInfo_t as nvmlDevice*RunningProcesses_v3
// (and _v2) take it, i.e. nvmlProcessInfo_v2_t, 24 bytes:
//
//	unsigned int pid;                 // @0
//	unsigned long long usedGpuMemory; // @8
//	unsigned int gpuInstanceId;       // @16
//	unsigned int computeInstanceId;   // @20
//
// Some R535 drivers wrote a 32-byte entry (an extra usedGpuCcProtectedMemory
// at @24) from the same _v3 entry point, and the unversioned entry points
// write the 16-byte nvmlProcessInfo_v1_t (pid, usedGpuMemory); the first
// fields are common to all three, and decodeProcesses finds the stride the
// library actually used.
type processInfo struct {
	_                 structs.HostLayout
	PID               uint32
	_                 uint32
	UsedGPUMemory     uint64
	GPUInstanceID     uint32
	ComputeInstanceID uint32
}

const (
	// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long
	// long: usedGpuMemory is unknown (e.g. under Windows WDDM or without
	// the permission to see other processes).
	valueNotAvailable = ^uint64(0)

	nameBufferSize    = 96 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
	uuidBufferSize    = 96 // NVML_DEVICE_UUID_V2_BUFFER_SIZE
	versionBufferSize = 80 // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
)
