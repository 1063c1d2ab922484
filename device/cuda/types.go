package cuda

import "structs"

// Hand-written mirrors of the cuda.h structures the virtual-memory calls take.
// The layout is the one of cuda.h in CUDA 12.x and 13.x (the _v1 typedefs;
// older headers had fewer named allocFlags fields, carved since out of the
// reserved bytes, which keeps every offset). The tests check each size and
// offset with unsafe.Sizeof/Offsetof:
//
//	typedef struct CUmemLocation_st {
//	    CUmemLocationType type;          // @0, 4 bytes (C enum)
//	    int id;                          // @4
//	} CUmemLocation;                     // 8 bytes
//
//	typedef struct CUmemAllocationProp_st {
//	    CUmemAllocationType type;        // @0
//	    CUmemAllocationHandleType requestedHandleTypes; // @4
//	    CUmemLocation location;          // @8 (type @8, id @12)
//	    void *win32HandleMetaData;       // @16
//	    struct {
//	        unsigned char compressionType;      // @24
//	        unsigned char gpuDirectRDMACapable; // @25
//	        unsigned short usage;               // @26
//	        unsigned char reserved[4];          // @28
//	    } allocFlags;
//	} CUmemAllocationProp;               // 32 bytes
//
//	typedef struct CUmemAccessDesc_st {
//	    CUmemLocation location;          // @0 (type @0, id @4)
//	    CUmemAccess_flags flags;         // @8
//	} CUmemAccessDesc;                   // 12 bytes

// memLocation mirrors CUmemLocation.
type memLocation struct {
	_    structs.HostLayout
	Type uint32 // CUmemLocationType
	ID   int32
}

// memAllocFlags mirrors the anonymous allocFlags of CUmemAllocationProp.
type memAllocFlags struct {
	_                    structs.HostLayout
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// memAllocationProp mirrors CUmemAllocationProp.
type memAllocationProp struct {
	_                    structs.HostLayout
	Type                 uint32 // CUmemAllocationType
	RequestedHandleTypes uint32 // CUmemAllocationHandleType
	Location             memLocation
	Win32HandleMetaData  uintptr // void*, always 0 here
	AllocFlags           memAllocFlags
}

// memAccessDesc mirrors CUmemAccessDesc.
type memAccessDesc struct {
	_        structs.HostLayout
	Location memLocation
	Flags    uint32 // CUmemAccess_flags
}

// Enumerators of cuda.h used by this package.
const (
	cuMemAllocationTypePinned          = 0x1 // CU_MEM_ALLOCATION_TYPE_PINNED
	cuMemHandleTypeNone                = 0x0 // CU_MEM_HANDLE_TYPE_NONE
	cuMemHandleTypePosixFD             = 0x1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	cuMemLocationTypeDevice            = 0x1 // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAccessFlagsProtReadWrite      = 0x3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	cuMemAllocGranularityMinimum       = 0x0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	cuEventDisableTiming               = 0x2 // CU_EVENT_DISABLE_TIMING
	cuStreamNonBlocking                = 0x1 // CU_STREAM_NON_BLOCKING
	cuDeviceAttrVirtualMemorySupported = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cuDeviceAttrComputeCapMajor        = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	cuDeviceAttrComputeCapMinor        = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	cuDeviceAttrStreamMemOps64         = 122 // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (CUDA 12: the v2 memory operations)
	cuDeviceAttrStreamMemOps64V1       = 93  // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 (before: 0 unless the kernel module enables them)
	cuMemHostAllocPortable             = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	cuMemHostAllocDeviceMap            = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP
	cuJitErrorLogBuffer                = 5   // CU_JIT_ERROR_LOG_BUFFER
	cuJitErrorLogBufferSizeBytes       = 6   // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)

// devicePinnedProp is the allocation property of a device chunk on the
// device with the given ordinal: shareable through a POSIX file descriptor
// when shareable is set (as PyTorch's expandable segments make theirs),
// plain otherwise.
func devicePinnedProp(ordinal int, shareable bool) memAllocationProp {
	ht := uint32(cuMemHandleTypeNone)
	if shareable {
		ht = cuMemHandleTypePosixFD
	}
	return memAllocationProp{
		Type:                 cuMemAllocationTypePinned,
		RequestedHandleTypes: ht,
		Location:             memLocation{Type: cuMemLocationTypeDevice, ID: int32(ordinal)},
	}
}

// deviceReadWrite is the access descriptor "read-write from the device with
// the given ordinal".
func deviceReadWrite(ordinal int) memAccessDesc {
	return memAccessDesc{
		Location: memLocation{Type: cuMemLocationTypeDevice, ID: int32(ordinal)},
		Flags:    cuMemAccessFlagsProtReadWrite,
	}
}
