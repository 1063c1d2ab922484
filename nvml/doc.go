// Package nvml reads GPU telemetry through NVML, the NVIDIA Management
// Library: each GPU's name, UUID, PCI bus id and memory, and the device
// memory each process holds. It backs `gpumem devices` (List and Format)
// and lets tests and tools check, from outside the allocator, how much
// memory a process really holds (ProcessMemory).
//
// # What is loaded
//
// libnvidia-ml.so.1 is loaded at run time with dlopen through
// github.com/ebitengine/purego: no cgo and no NVIDIA headers at build time
// (CGO_ENABLED=0 works). Without a driver, Open and List fail with one line,
//
//	libnvidia-ml.so.1 not found: no NVIDIA driver on this machine
//
// matching ErrUnavailable and device.ErrNoDriver. The entry points used are
// nvmlInit_v2, nvmlShutdown, nvmlErrorString, nvmlSystemGetDriverVersion,
// nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetName,
// nvmlDeviceGetUUID, nvmlDeviceGetPciInfo_v3, nvmlDeviceGetMemoryInfo and
// nvmlDevice{Compute,MPSCompute,Graphics}RunningProcesses_v3 (falling back
// to _v2 and the unversioned ones on older drivers). NVML needs no context:
// unlike package cuda, nothing here is bound to an OS thread.
//
// # Process memory
//
// Processes merges the compute, MPS-client and graphics lists by pid.
// NVML_VALUE_NOT_AVAILABLE (all ones) as a process's memory means unknown
// (MemoryKnown false). NVML's process entry has had three layouts behind the
// same entry points (16, 24 and 32 bytes; see processInfo); the package
// detects the one the installed library wrote instead of trusting a header.
// Pids are those of the host's PID namespace.
//
// # Errors
//
// A failed nvmlReturn_t becomes a *device.OpError (Op is the NVML function,
// e.g. "nvmlDeviceGetMemoryInfo", Args e.g. "index=0") wrapping an *Error
// with the code, its name and nvmlErrorString's description.
// NVML_ERROR_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _LIB_RM_VERSION_MISMATCH
// and _UNINITIALIZED match ErrUnavailable (and device.ErrNoDriver);
// _NOT_SUPPORTED and _FUNCTION_NOT_FOUND match device.ErrUnsupported;
// _INVALID_ARGUMENT, _NOT_FOUND and _GPU_NOT_FOUND match device.ErrInvalid.
package nvml
