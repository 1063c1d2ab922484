/*
 * gpumem.h: the C interface of gpumem, a GPU memory manager.
 *
 * libgpumem.so holds one allocator per CUDA device, made on the first call
 * that names the device, on the device's primary context (the one the CUDA
 * runtime, PyTorch and CuPy use, so pointers and streams are shared with
 * them). It is configured by the environment variable GPUMEM_CONFIG and by
 * gpumem_configure, both in the form
 *
 *     limit=40GiB,release_after=30s,mode=virtual
 *
 * (keys: device, capacity, mode, limit, preallocate, release_threshold,
 * release_after, span_size, compact, record_sites, check; see
 * gpumem_configure and internal/host/config.go; compact=true trades driver
 * calls for memory, gpumem.Config.Compact).
 *
 * Conventions, after the CUDA driver's and SQLite's:
 *   - Every function that can fail returns a gpumem_status; GPUMEM_SUCCESS
 *     is 0. The two PyTorch entry points, which have no status by PyTorch's
 *     contract, set it too.
 *   - After a failure, gpumem_last_error() describes it in one line and
 *     gpumem_last_status() repeats its status; after an out-of-memory,
 *     gpumem_last_oom() gives the verdict (limit, device or fragmentation)
 *     with the numbers. All three are per thread, and stay until the
 *     thread's next failing call.
 *   - Every function is safe to call from any thread at any time, unless
 *     its comment says otherwise. The library never keeps a pointer the
 *     caller passed in, and owns nothing the caller must free except the
 *     strings documented so.
 *   - Streams are CUDA streams (cudaStream_t or CUstream, the same handle);
 *     0 is the default stream. Memory from an allocation on stream s is
 *     valid for work on s; freeing it makes it reusable on s at once, and on
 *     other streams only after the work of the streams recorded with
 *     gpumem_record_stream.
 *   - A device is a CUDA device ordinal as the runtime numbers it (after
 *     CUDA_VISIBLE_DEVICES); -1 means "every device" where a function says
 *     so.
 *
 * Build: go build -buildmode=c-shared -o libgpumem.so ./clib (see README).
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; gpumem_version() returns the library's. */
#define GPUMEM_API_VERSION 1

typedef int gpumem_status;

enum {
	GPUMEM_SUCCESS = 0,
	GPUMEM_ERROR_OUT_OF_MEMORY = 1,  /* see gpumem_last_oom */
	GPUMEM_ERROR_INVALID_VALUE = 2,  /* a size of 0 or absurd, a bad device, a bad fraction */
	GPUMEM_ERROR_INVALID_POINTER = 3,/* not allocated by gpumem, or freed already */
	GPUMEM_ERROR_NO_DRIVER = 4,      /* libcuda.so.1 missing or unusable */
	GPUMEM_ERROR_DEVICE = 5,         /* the CUDA driver failed */
	GPUMEM_ERROR_CONFIG = 6,         /* a bad configuration, or a key that cannot change now */
	GPUMEM_ERROR_CLOSED = 7,         /* the allocator was shut down */
	GPUMEM_ERROR_BUFFER_TOO_SMALL = 8,
	GPUMEM_ERROR_INTERNAL = 9,       /* a bug in gpumem: please report it with the message */
	GPUMEM_ERROR_IO = 10,            /* a file could not be read or written */
	GPUMEM_ERROR_FORMAT = 11,        /* a file is not what it should be (a corrupt or foreign snapshot) */
	GPUMEM_ERROR_NOT_SHAREABLE = 12  /* the buffer cannot be shared with another process (gpumem_share) */
};

/* Why an allocation ran out of memory. */
enum {
	GPUMEM_OOM_NONE = 0,
	GPUMEM_OOM_DEVICE = 1,        /* the GPU has no more memory to give */
	GPUMEM_OOM_LIMIT = 2,         /* the configured limit is reached: live buffers + request > limit */
	GPUMEM_OOM_FRAGMENTATION = 3  /* enough memory is held or allowed, but not in one usable piece */
};

/* The answer to a "would it have fit?" question of the verdict. 0 means not
 * decided (a library older than these fields leaves them 0). */
enum {
	GPUMEM_ANSWER_UNKNOWN = 0,
	GPUMEM_ANSWER_NO = 1,
	GPUMEM_ANSWER_YES = 2,
	GPUMEM_ANSWER_NOT_APPLICABLE = 3 /* with_virtual when mode is already virtual */
};

/* The allocator's mode (mode= of the configuration). */
enum {
	GPUMEM_MODE_PLAIN = 1,   /* whole segments from cuMemAlloc, as PyTorch's allocator */
	GPUMEM_MODE_VIRTUAL = 2  /* memory mapped in spans into reserved address space */
};

/* The verdict of the calling thread's last out-of-memory: the cause, the
 * numbers (bytes) at the failure, and what would have fit. The numbers are
 * read after gpumem returned its cache to the driver and retried once, so
 * what is still cached is memory it could not give back. gpumem_last_error
 * says the same in one paragraph.
 *
 * The fields from total on were added within API version 1: the struct
 * only grows at its end, and gpumem_last_oom fills as many bytes as the
 * caller's size says, so programs built with the shorter struct still
 * work. Identities: cached == releasable + pinned; pinned_in_chunks <=
 * pinned; others == total - device_free - reserved (0 if negative). */
typedef struct gpumem_oom {
	int cause;             /* GPUMEM_OOM_* */
	int device;
	uint64_t requested;    /* bytes asked for */
	uint64_t stream;
	uint64_t limit;        /* the allocator's limit */
	uint64_t device_free;  /* the driver's free memory at the failure */
	uint64_t reserved;     /* bytes gpumem held from the driver */
	uint64_t allocated;    /* bytes of live buffers */
	uint64_t cached;       /* reserved - in use: held but free */
	uint64_t largest_free; /* largest request that would have fit without growing */
	uint64_t would_fit;    /* largest request that would have succeeded: a free
	                        * piece, or room to grow within limit and device */
	uint64_t total;        /* the device's memory */
	uint64_t others;       /* device memory held by others (other processes):
	                        * not gpumem's to give back */
	uint64_t active;       /* bytes of live buffers' blocks (rounded to 512 B) */
	uint64_t releasable;   /* part of cached that gpumem_trim would still give
	                        * back (preallocated memory) */
	uint64_t pinned;       /* part of cached in segments or spans that also hold
	                        * live buffers: no trim gives it back */
	uint64_t pinned_in_chunks; /* virtual mode: part of pinned that is free
	                        * space in 2 MiB chunks holding live buffers; the
	                        * rest is idle chunks of spans holding live buffers */
	uint64_t growth;       /* what the request would take from the driver */
	uint64_t free_total;   /* cached + room to grow: free bytes in all pieces
	                        * (free_total / requested requests of this size) */
	int after_trim;        /* GPUMEM_ANSWER_*: would it fit after gpumem_trim
	                        * (torch.cuda.empty_cache) */
	int with_virtual;      /* GPUMEM_ANSWER_*: would mode=virtual have placed it
	                        * (NOT_APPLICABLE: already virtual; see pinned) */
	int mode;              /* GPUMEM_MODE_* */
	int reserved_0;        /* 0; keeps the struct's size a multiple of 8 */
} gpumem_oom;

/* An allocator's numbers (see gpumem.Stats in the Go package). Gauges are
 * bytes now; peaks since the start or gpumem_reset_peaks; counters only
 * grow. reserved == active + cached. */
typedef struct gpumem_stats {
	uint64_t allocated, peak_allocated; /* bytes requested by live buffers */
	uint64_t active, peak_active;       /* their blocks (requests rounded to 512 B) */
	uint64_t reserved, peak_reserved;   /* bytes held from the driver */
	uint64_t cached;                    /* reserved - active */
	uint64_t releasable;                /* the part of cached gpumem_trim gives back */
	uint64_t largest_free;              /* largest request served now without the driver */
	double fragmentation;               /* 1 - largest_free / cached */
	uint64_t live_buffers;
	uint64_t allocs, frees;             /* successful allocations and frees */
	uint64_t device_calls;              /* memory-management calls made to the driver */
	uint64_t ooms, trims;
	uint64_t limit;                     /* the allocator's limit */
	/* Config.Defrag (GPUMEM_CONFIG=defrag=true): spans whose live chunks
	 * moved, the device copies that moved them and their bytes, and the
	 * wall time of the moves in nanoseconds. */
	uint64_t splits, copies, copied_bytes, split_ns;
	/* Bytes of every allocation and free so far, as blocks and as asked
	 * for: alloc_bytes - free_bytes == active, alloc_requested -
	 * free_requested == allocated. Plain segments and virtual arenas held
	 * (segments); allocations retried after the cache went back
	 * (retries); device_allocs and device_frees: cuMemAlloc and cuMemFree
	 * of plain segments. The device's figures include its private pools
	 * (CUDA graphs), which pool_reserved counts alone. */
	uint64_t alloc_bytes, free_bytes, alloc_requested, free_requested;
	uint64_t segments, retries, device_allocs, device_frees;
	uint64_t pool_reserved;
	/* The most live buffers and segments since gpumem_reset_peaks; host
	 * waits for streams' work (fences: before memory is unmapped or
	 * released). */
	uint64_t peak_live_buffers, peak_segments, fences;
	/* Splits not made because the launch gate of `gpumem run`'s shim
	 * refused to close (moves off in the process: it says why on stderr). */
	uint64_t gate_refusals;
	/* Host time, in nanoseconds, spent in the driver's memory calls
	 * (device_calls) and waiting for the GPU in fences; allocations the
	 * cache could not serve at once (the slow path) and their host time,
	 * those two included. */
	uint64_t driver_ns, wait_ns, misses, miss_ns;
	/* The parts of driver_ns spent in cuMemCreate, cuMemMap,
	 * cuMemSetAccess, cuMemUnmap and cuMemRelease: which call a slow
	 * growth waited in. */
	uint64_t create_ns, map_ns, set_access_ns, unmap_ns, release_ns;
	/* Calls to the device's events (queries, records, stream waits) and
	 * their host time: what keeping the streams' order costs, mostly on
	 * misses (miss_ns includes them). Waits for an event are fences
	 * (wait_ns). */
	uint64_t event_calls, event_ns;
	uint64_t mark_calls, mark_ns; /* the markers' writes among them */
} gpumem_stats;

/* The figures of gpumem_stats kept as running counts (gpumem.Usage):
 * what torch.cuda.memory_allocated, memory_reserved and their peaks read,
 * and a CUDA pool's used and reserved attributes. Each is the field of
 * gpumem_stats of the same name. */
typedef struct gpumem_usage {
	uint64_t allocated, peak_allocated;
	uint64_t active, peak_active;
	uint64_t reserved, peak_reserved;
} gpumem_usage;

/* --- PyTorch's CUDAPluggableAllocator entry points ------------------------
 * torch.cuda.memory.CUDAPluggableAllocator("libgpumem.so", "gpumem_alloc",
 * "gpumem_free"); the Python package (gpumem.torch.use) does this and more.
 *
 * gpumem_alloc returns size bytes on device for work on stream; NULL for
 * size 0. On failure it returns NULL and sets the last error, unless
 * gpumem_torch_errors enabled PyTorch's exceptions: then it raises
 * torch.cuda.OutOfMemoryError (c10::OutOfMemoryError) with gpumem's verdict,
 * or RuntimeError for other failures, as PyTorch's own allocator does.
 * gpumem_free frees what gpumem_alloc returned (NULL is a no-op); size,
 * device and stream are PyTorch's record of the allocation and may be left
 * 0: the pointer alone identifies the buffer. A pointer gpumem did not hand
 * out is reported once on stderr and otherwise ignored. */
void *gpumem_alloc(size_t size, int device, void *stream);
void gpumem_free(void *ptr, size_t size, int device, void *stream);
/* Calls fn (on the allocating thread) when gpumem_alloc runs out of
 * memory, before it fails or raises: the device, the request, the limit
 * where one is set (else the device's memory) and the driver's free
 * memory, as PyTorch's out-of-memory observers get them. NULL removes it. */
gpumem_status gpumem_set_oom_callback(void (*fn)(int device, uint64_t size, uint64_t limit, uint64_t device_free));
/* Answers PyTorch's C++ cacheInfo queries (cuDNN's benchmark sizes its
 * workspace by them; CUDAPluggableAllocator refuses them) with what gpumem
 * could hand out on the device now, by writing gpumem's function into
 * CUDAPluggableAllocator's vtable in the given, loaded libtorch_cuda.so.
 * GPUMEM_ERROR_CONFIG, with nothing written, if the symbols or the slot
 * are not found. */
gpumem_status gpumem_torch_cache_info(const char *libtorch_cuda);
/* Makes C++ calls for memory history (torch::cuda::_record_memory_history
 * and _memory_snapshot_pickled: CUDAPluggableAllocator's recordHistory and
 * snapshot) fail with c10::Error and gpumem's one line naming the Python
 * calls that work, in the place of PyTorch's "does not yet support". Needs
 * gpumem_torch_errors first. GPUMEM_ERROR_CONFIG, with nothing written, if
 * the exceptions, the symbols or the slots are missing. */
gpumem_status gpumem_torch_cpp_history(const char *libtorch_cuda);

/* --- Allocation with a status -------------------------------------------- */

/* Allocates size bytes on device for work on stream into *ptr (NULL for
 * size 0). */
gpumem_status gpumem_allocate(void **ptr, size_t size, int device, void *stream);
/* Frees ptr (NULL: nothing). device may be -1 when unknown. A pointer not
 * allocated by gpumem, or freed already: GPUMEM_ERROR_INVALID_POINTER, and
 * nothing changes. */
gpumem_status gpumem_deallocate(void *ptr, int device);
/* Frees ptr as freed on stream (cuMemFreeAsync's meaning): if that is not
 * the stream it was allocated on, its memory is reused only after stream's
 * work up to now. */
gpumem_status gpumem_deallocate_on(void *ptr, int device, void *stream);
/* ptr (from gpumem) is also used by work on stream: after its free, its
 * memory is reused only once that stream's work up to the free is done
 * (torch.Tensor.record_stream). */
gpumem_status gpumem_record_stream(void *ptr, int device, void *stream);

/* --- Sharing with other processes ------------------------------------------ */

/* Shares the live buffer at ptr (the address gpumem gave, on device, or -1
 * for any) with another process. The buffer lies in physical chunks, each
 * mapped whole; the other process imports each descriptor
 * (cuMemImportFromShareableHandle, POSIX file descriptor), maps them back to
 * back over a range of its own in the order given, each over its size in
 * bytes, and finds the buffer at offset ptr - *base into that range. Up to
 * cap descriptors and sizes are written to fds and sizes, and how many there
 * are to *n: GPUMEM_ERROR_BUFFER_TOO_SMALL when cap < *n, with nothing
 * opened (call again with more room). The caller owns the descriptors
 * (close them once sent). Until gpumem_unshare the chunks are never moved
 * (Gather, Defrag), and the caller must keep the buffer allocated until no
 * other process maps it: a free does not wait for them.
 * GPUMEM_ERROR_NOT_SHAREABLE, saying why, where the device cannot export
 * (the simulated device, a driver without shareable handles) or the buffer
 * is not in mapped chunks (the cache off, a plain segment). */
gpumem_status gpumem_share(void *ptr, int device, uint64_t *base, int *fds, uint64_t *sizes, size_t cap, size_t *n);
/* Undoes one gpumem_share of ptr, once no other process maps its memory. */
gpumem_status gpumem_unshare(void *ptr, int device);

/* --- Control --------------------------------------------------------------- */

/* Applies a configuration string on top of GPUMEM_CONFIG and earlier calls.
 * Before the first allocation every key may change; after it, only limit. */
gpumem_status gpumem_configure(const char *config);
/* Caps the bytes held on device (0: the whole device). Lowering it below
 * what is held first gives the cache back. */
gpumem_status gpumem_set_limit(int device, uint64_t bytes);
/* The same as a fraction (0 < fraction <= 1) of the device's memory. */
gpumem_status gpumem_set_memory_fraction(int device, double fraction);
/* Gives every unused byte of device (-1: every device) back to the driver. */
gpumem_status gpumem_trim(int device);
/* Starts the peaks over from the current gauges (-1: every device). */
gpumem_status gpumem_reset_peaks(int device);

/* --- Observation ----------------------------------------------------------- */

/* Fills *out (size: sizeof(gpumem_stats), for compatibility with later
 * versions that add fields). Zeros for a device not used yet. */
gpumem_status gpumem_get_stats(int device, gpumem_stats *out, size_t size);
/* Fills *out (size: sizeof(gpumem_usage)) with gpumem_stats' gauges and
 * peaks of bytes alone: a read of counts (tens of nanoseconds), where
 * gpumem_get_stats walks the device's segments, empty spans and largest
 * free blocks (about a microsecond) and fills every field. For code that
 * asks at every step or layer. */
gpumem_status gpumem_get_usage(int device, gpumem_usage *out, size_t size);
/* Memory as a program on gpumem should see it: *total is the limit, *free
 * what could still be allocated (the cache plus what the driver can still
 * give within the limit). */
gpumem_status gpumem_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);
/* 1 if ptr lies in memory gpumem holds on any device (in use or not),
 * else 0: what the preload shim asks before an export of an address (an
 * RDMA or NCCL registration) turns moves off. */
int gpumem_owns(const void *ptr);
/* The allocator's state as JSON: segments, spans and blocks (snapshot), or
 * the statistics with every field (stats). The string is the caller's, to
 * free with gpumem_string_free; NULL on failure (see gpumem_last_error). */
char *gpumem_snapshot_json(int device);
char *gpumem_stats_json(int device);
void gpumem_string_free(char *s);
/* Serves the allocators' statistics, snapshots and Prometheus metrics over
 * HTTP on addr ("127.0.0.1:9464"; port 0 picks one): /debug/gpumem/stats,
 * /debug/gpumem/snapshot, /metrics. Returns the address bound (the
 * caller's, to free with gpumem_string_free), or NULL. One server per
 * process; GPUMEM_CONFIG's serve= starts it at the first allocation. */
char *gpumem_serve(const char *addr);

/* --- Private pools: CUDA graphs ------------------------------------------ */

/* A CUDA graph's replays write, at the same addresses, the memory its
 * capture allocated, for as long as the graph lives: that memory must serve
 * no other allocation. These calls give it a private pool, as PyTorch's
 * allocator does (beginAllocateToPool, endAllocateToPool, releasePool);
 * gpumem.torch.use() makes them for PyTorch. A pool is named by two
 * numbers (PyTorch's MempoolId_t: hi is its first, lo its second). Its
 * memory counts against the device's limit and is never given back or
 * moved while the pool has a use; then it goes back with its last buffer.
 * While a capture route is open, gpumem makes no driver call that would
 * break the capture. Thread-safe. */
enum {
	GPUMEM_POOL_CAPTURE = 0, /* allocations on any stream of stream's capture (stream must be capturing) */
	GPUMEM_POOL_THREAD = 1,  /* allocations by the calling thread (stream ignored) */
	GPUMEM_POOL_ALL = 2,     /* every allocation on the device (stream ignored) */
};
/* From now until gpumem_pool_end, the allocations that route selects on
 * device come from pool (hi, lo), made on first use; counts one use of the
 * pool. The latest route that matches an allocation wins. A bad route, or
 * a capture route on a stream that is not capturing:
 * GPUMEM_ERROR_INVALID_VALUE. */
gpumem_status gpumem_pool_begin(int device, uint64_t hi, uint64_t lo, void *stream, int route);
/* Counts one use of the pool, making it if need be, with no route
 * (PyTorch's createOrIncrefPool: a torch.cuda.MemPool holds one);
 * gpumem_pool_uses reads how many uses a pool has (0 for an unknown
 * pool). */
gpumem_status gpumem_pool_retain(int device, uint64_t hi, uint64_t lo);
gpumem_status gpumem_pool_uses(int device, uint64_t hi, uint64_t lo, uint64_t *uses);
/* A pool's options (PyTorch's MemPool(allocator, use_on_oom, no_split)),
 * fixed when it is made. */
typedef struct gpumem_pool_options {
	/* If both are set, the pool's segments come from them and go back to
	 * them (a CUDAPluggableAllocator's functions: ncclMemAlloc, say),
	 * counted against the device's limit; alloc returns NULL when it has
	 * no room. They are called with no lock of gpumem's held, from any
	 * thread; they must not throw. */
	void *(*alloc)(size_t size, int device, void *stream);
	void (*free)(void *ptr, size_t size, int device, void *stream);
	/* Nonzero: each buffer gets a segment of its own, never split; a free
	 * segment serves a later request whole, one of at least half its size. */
	int no_split;
	/* Nonzero: an allocation outside every pool that would fail with
	 * out-of-memory is served from this pool's memory instead, its buffer
	 * then the pool's. */
	int use_on_oom;
} gpumem_pool_options;
/* gpumem_pool_retain for a pool made with opts: the pool must not exist
 * yet (GPUMEM_ERROR_INVALID_VALUE if it does, or if only one of alloc and
 * free is set). */
gpumem_status gpumem_pool_create(int device, uint64_t hi, uint64_t lo, const gpumem_pool_options *opts);
/* Ends the latest route to the pool. GPUMEM_ERROR_INVALID_VALUE if none. */
gpumem_status gpumem_pool_end(int device, uint64_t hi, uint64_t lo);
/* Gives up one use of the pool (a graph that used it is gone). An unknown
 * pool is no error; one with no use left is GPUMEM_ERROR_INVALID_VALUE. */
gpumem_status gpumem_pool_release(int device, uint64_t hi, uint64_t lo);
/* gpumem_pool_release for the object that made the pool, now gone
 * (PyTorch's ~MemPool): if that leaves the pool with no use, route or live
 * buffer, its memory goes back now, after a synchronize of the device,
 * rather than at the next trim. */
gpumem_status gpumem_pool_drop(int device, uint64_t hi, uint64_t lo);
/* The addresses of the pool's live buffers: up to cap of them into ptrs,
 * and how many there are into *n (0 for an unknown pool).
 * GPUMEM_ERROR_BUFFER_TOO_SMALL when cap < *n: call again with more room. */
gpumem_status gpumem_pool_live(int device, uint64_t hi, uint64_t lo, uint64_t *ptrs, size_t cap, size_t *n);

/* A capture about to begin on device, before gpumem_pool_begin can route
 * it (its id exists only once it has begun): from gpumem_capture_hold to
 * gpumem_capture_release gpumem records, queries and waits for no event
 * and synchronizes nothing, so that a free on another thread meanwhile
 * cannot break the capture. Release once the route is open (or the
 * capture failed). Releasing with none held: GPUMEM_ERROR_INVALID_VALUE. */
gpumem_status gpumem_capture_hold(int device);
gpumem_status gpumem_capture_release(int device);

/* Checkpoints (torch.compile's CUDA graph trees, PyTorch's
 * getCheckpointState and setCheckpointPoolState). A live buffer of a pool
 * as a checkpoint keeps it: address, size asked for, stream. */
typedef struct gpumem_pool_buffer {
	uint64_t ptr;
	uint64_t size;
	uint64_t stream;
} gpumem_pool_buffer;
/* The pool's live buffers in address order: up to cap into bufs, how many
 * there are into *n. GPUMEM_ERROR_BUFFER_TOO_SMALL when cap < *n;
 * GPUMEM_ERROR_INVALID_VALUE for an unknown pool. */
gpumem_status gpumem_pool_checkpoint(int device, uint64_t hi, uint64_t lo, gpumem_pool_buffer *bufs, size_t cap, size_t *n);
/* Puts the pool back to a checkpoint: frees every live buffer of the pool
 * (gpumem_pool_live lists them) and makes each of the n buffers at its
 * address. Not during a capture, nor while another thread allocates into
 * the pool. A checkpoint that does not fit the pool is refused
 * (GPUMEM_ERROR_INVALID_VALUE) before anything changes. */
gpumem_status gpumem_pool_restore(int device, uint64_t hi, uint64_t lo, const gpumem_pool_buffer *bufs, size_t n);
/* A deleter for PyTorch's DataPtr (c10::DeleterFnPtr): frees the buffer
 * at ctx, as gpumem_free. Tensors a checkpoint restore gives back to their
 * owners free through it (python/gpumem/_torch_graphs.py). */
void gpumem_torch_delete(void *ctx);

/* --- Recording -------------------------------------------------------------- */

/* Starts writing device's allocations and frees to a gpumem trace at path
 * (gzip-compressed if it ends in .gz), for gpumem replay. */
gpumem_status gpumem_record_start(int device, const char *path);
/* Ends the recording and completes the file. */
gpumem_status gpumem_record_stop(int device);
/* Names call site id (>= 1) as text ("function file:line < caller ..."). */
gpumem_status gpumem_record_site(int device, uint32_t id, const char *text);
/* While a recording runs, gpumem_alloc calls fn (on the allocating thread)
 * for the call site of each allocation; fn returns a site defined with
 * gpumem_record_site, or 0. NULL removes it. */
gpumem_status gpumem_set_site_callback(uint32_t (*fn)(int device));

/* The cache on (on != 0, the default) or off, on every device (PyTorch's
 * caching_allocator_enable, PYTORCH_NO_CUDA_MEMORY_CACHING=1): while off,
 * an allocation that no private pool takes is a driver allocation of its
 * own and its free gives it straight back; such buffers count in none of
 * gpumem's statistics and the limit does not apply to them. For tools that
 * check each access against its allocation (compute-sanitizer). */
gpumem_status gpumem_set_caching(int on);

/* Reuse within a CUDA graph capture on (on != 0) or off (the default), on
 * every device (PyTorch's graph_capture_record_stream_reuse): a buffer
 * freed during a capture after gpumem_record_stream named other streams is
 * reused on its own stream, still within the capture, once the capture's
 * graph orders all those streams' work before that stream's next work;
 * otherwise it waits for the capture's end. Fails (GPUMEM_ERROR_DEVICE,
 * with its message) when on and a device in use cannot show capture
 * graphs; the setting stays, and changes nothing there. */
gpumem_status gpumem_set_capture_reuse(int on);

/* Memory history in PyTorch's snapshot format (torch.cuda.memory.
 * _record_memory_history and _snapshot under gpumem). gpumem_history turns
 * device's history on (enabled != 0), keeping the latest max_entries
 * allocations and frees with their call sites (gpumem_set_site_callback's
 * ids), or off. gpumem_torch_snapshot_json returns the device's segments
 * and blocks in PyTorch's layout and the history, as JSON
 * ({"segments": [...], "device_traces": [[...]]}; a block's or entry's
 * "site" is the call site id, 0 if none), in memory the caller frees with
 * gpumem_string_free; NULL on failure. */
gpumem_status gpumem_history(int device, int enabled, size_t max_entries);
char *gpumem_torch_snapshot_json(int device);
/* With on != 0, gpumem_free too calls the site callback (on the freeing
 * thread), and a free's history entries carry that site as "free_site"
 * (PyTorch's context "all": a free's entries show the stack of the free).
 * Off by default: a free then asks for nothing. */
gpumem_status gpumem_set_free_sites(int on);

/* Converts a PyTorch memory snapshot (the pickle that
 * torch.cuda.memory._dump_snapshot writes) into gpumem traces, as
 * `gpumem import SNAPSHOT -o TRACE` does: device 0's (or the only device's)
 * to trace, device N's to trace with ".devN" before ".trace". Needs no GPU.
 * A corrupt or foreign pickle: GPUMEM_ERROR_FORMAT, naming what and where. */
gpumem_status gpumem_import_snapshot(const char *snapshot, const char *trace);

/* --- Errors --------------------------------------------------------------- */

/* The calling thread's last failure: a one-line message (never NULL; ""
 * when none), its status, and for GPUMEM_ERROR_OUT_OF_MEMORY the verdict
 * (*out filled with size bytes; GPUMEM_OOM_NONE when the last failure was
 * not an out-of-memory). The message is valid until the thread's next
 * failing call. */
const char *gpumem_last_error(void);
gpumem_status gpumem_last_status(void);
gpumem_status gpumem_last_oom(gpumem_oom *out, size_t size);
/* The name of a status: "GPUMEM_ERROR_OUT_OF_MEMORY". */
const char *gpumem_status_name(gpumem_status s);

/* Makes gpumem_alloc raise PyTorch's exceptions instead of returning NULL.
 * c10 and c10_cuda are the paths of PyTorch's libc10.so and libc10_cuda.so,
 * already loaded (torch imported). Returns GPUMEM_SUCCESS, or
 * GPUMEM_ERROR_CONFIG if this PyTorch does not have the symbols needed
 * (gpumem_alloc then keeps returning NULL on failure). Call once, before
 * the first allocation. */
gpumem_status gpumem_torch_errors(const char *c10, const char *c10_cuda);

/* The library's version as a string ("gpumem v0.3.0" or a development
 * revision) and its interface version (GPUMEM_API_VERSION). */
const char *gpumem_version(void);
int gpumem_api_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_H */
