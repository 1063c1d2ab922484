"""gpumem.torch's CUDA graphs and private pools: CUDAGraph's capture, reset
and collection, torch._C's pool calls (and where modules imported them),
torch.cuda.MemPool over gpumem's private pools, and the allocator
checkpoints of torch.compile's CUDA graph trees (_checkpoint.py). Wired by
_torch_plugin._patch at gpumem.torch.use()."""

import inspect
import sys
import warnings
import weakref

from . import _checkpoint, _lib
from ._torch_state import _lock, _patched, _put, _replace_all, _state


# --- CUDA graphs -------------------------------------------------------------
#
# A CUDA graph's replays write, at the addresses the capture got, the memory
# its capture allocated, for as long as the graph lives. PyTorch's own
# allocator routes the allocations of a capture into the graph's private
# pool (beginAllocateToPool/endAllocateToPool) and keeps that pool from
# every other allocation until the graph is reset or deleted (releasePool);
# CUDAPluggableAllocator drops these calls. So they are made here, at the
# Python entry points that lead to them, against gpumem's private pools.

def _pool_id(pool):
    """(hi, lo) of a pool as PyTorch names it: a MempoolId_t tuple
    (torch.cuda.graph_pool_handle(), CUDAGraph.pool()) or a MemPool (.id)."""
    pid = getattr(pool, "id", pool)
    if callable(pid):
        pid = pid()
    hi, lo = pid
    return int(hi), int(lo)


class _GraphPools:
    """gpumem's side of one CUDA graph: the route its capture opened and the
    pool uses it holds. It holds no reference to the graph, so that the
    weakref.finalize set on the graph fires when the graph is collected."""

    __slots__ = ("lib", "route", "held")

    def __init__(self, lib):
        self.lib = lib
        self.route = None  # (device, pool) while the capture's route is open
        self.held = []     # [(device, pool)]: uses to give back (reset, collection)

    def begin(self, device, pool, stream):
        self.lib.pool_begin(device, pool, stream, _lib.POOL_CAPTURE)
        self.route = (device, pool)
        self.held.append((device, pool))

    def end(self):
        route, self.route = self.route, None
        if route is not None:
            self.lib.pool_end(*route)

    def release(self):
        held, self.held = self.held, []
        failed = None
        for device, pool in held:
            try:
                self.lib.pool_release(device, pool)
            except Exception as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def collected(self):
        """The graph was collected (its C++ destructor resets it without
        calling Python): give its uses back. Runs in the garbage collector,
        so it warns rather than raises."""
        for step in (self.end, self.release):
            try:
                step()
            except Exception as e:
                warnings.warn(f"gpumem: giving back a collected CUDA graph's pool: {e}", RuntimeWarning)


_graph_states = weakref.WeakKeyDictionary()  # for graphs that take no attribute


def _graph_pools(graph, lib=None):
    """graph's _GraphPools; with lib, made (and set to be given back when the
    graph is collected) if it has none yet."""
    st = getattr(graph, "_gpumem_pools", None)
    if st is None:
        st = _graph_states.get(graph)
    if st is None and lib is not None:
        st = _GraphPools(lib)
        try:
            graph._gpumem_pools = st
        except AttributeError:
            _graph_states[graph] = st
        weakref.finalize(graph, st.collected).atexit = False
    return st


def _quietly(fn):
    try:
        fn()
    except Exception:
        pass


def _capture_pool(torch, args, kwargs):
    """capture_begin's arguments with the pool made explicit, and its (hi, lo).
    PyTorch's CUDAGraph.pool() answers only after the capture has ended
    (TORCH_CHECK(capture_ended_)), so when the caller names no pool, a fresh
    torch.cuda.graph_pool_handle() goes in its place: the graph's pool, known
    while the capture runs, serving this graph alone as the one PyTorch would
    have made."""
    args = list(args)
    pool = args[0] if args else kwargs.get("pool")
    if pool is None or _pool_id(pool) == (0, 0):
        pool = torch.cuda.graph_pool_handle()
        if args:
            args[0] = pool
        else:
            kwargs["pool"] = pool
    return tuple(args), kwargs, _pool_id(pool)


def _patch_graphs(torch, lib):
    graphs = getattr(torch.cuda, "graphs", None)
    cls = getattr(graphs, "CUDAGraph", None) or getattr(torch.cuda, "CUDAGraph", None)
    if cls is not None:
        _patch_graph_class(torch, lib, cls)
    _patch_pool_calls(torch, lib)
    _patch_mempool(torch, lib)


def _release_pool(lib, device, pool):
    # PyTorch's ~MemPool empties the pool's cache: its memory goes back now
    # if nothing else holds the pool. At the interpreter's exit (finalizers
    # of objects still alive) the device may be going away: the use only.
    try:
        (lib.pool_release if sys.is_finalizing() else lib.pool_drop)(device, pool)
    except Exception as e:  # in the garbage collector: warn, never raise
        warnings.warn(f"gpumem: giving back a collected MemPool's pool: {e}", RuntimeWarning)


def _patch_mempool(torch, lib):
    """torch.cuda.MemPool, which PyTorch cannot make for a pluggable
    allocator ("createOrIncrefPool"): gpumem's own, over a private pool.
    torch.cuda.use_mem_pool(pool) routes the calling thread's allocations to
    it through the pool calls patched above; the pool holds one use while
    the object lives; when the object is collected its memory goes back at
    once if nothing else holds the pool (PyTorch's ~MemPool empties the
    pool's cache), else once freeable, at the next empty_cache. Options gpumem does not have (another allocator,
    use_on_oom, no_split) are gpumem's too: the pool's segments come from
    that allocator's functions (their addresses kept when the allocator was
    made, _patch_custom_allocator), an allocation outside every pool that
    would run out of memory is served from a use_on_oom pool, and a
    no_split pool gives each buffer a segment of its own. The arguments
    are bound as the installed PyTorch's MemPool binds them (an argument
    it does not take is its TypeError); one it takes that gpumem does not
    have (a later version's symmetric memory, say) fails at once with one
    line."""
    orig = getattr(torch.cuda, "MemPool", None)
    if orig is None:
        return
    _patch_custom_allocator(torch)
    try:
        signature = inspect.signature(orig.__init__)
    except (TypeError, ValueError):
        signature = inspect.signature(lambda self, allocator=None, use_on_oom=False, no_split=False: None)
    known = {"self", "allocator", "use_on_oom", "no_split"}

    class MemPool:
        """A pool of memory of its own: allocations made inside
        torch.cuda.use_mem_pool(pool) come from it and its memory serves
        nothing else (gpumem.torch's, over a gpumem private pool)."""

        def __init__(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)  # PyTorch's TypeError for what it does not take
            given = bound.arguments
            other = [f"{k}={v!r}" for k, v in given.items()
                     if k not in known and v != signature.parameters[k].default]
            if other:
                raise RuntimeError(f"gpumem: torch.cuda.MemPool({', '.join(other)}) is not supported under "
                                   "gpumem.torch.use(); MemPool with an allocator, use_on_oom or no_split is, or "
                                   "use PyTorch's allocator for this program")
            allocator = given.get("allocator")
            use_on_oom, no_split = bool(given.get("use_on_oom")), bool(given.get("no_split"))
            fns = None
            if allocator is not None and allocator is not _state["allocator"].allocator():
                fns = _custom_allocators.get(id(allocator))
                if fns is None or fns[0] is not allocator:
                    raise RuntimeError("gpumem: torch.cuda.MemPool(allocator): gpumem does not know this allocator's "
                                       "functions; make it with torch.cuda.memory.CUDAPluggableAllocator after "
                                       "gpumem.torch.use()")
                if fns[1] == _own_function(lib, "gpumem_alloc"):
                    fns = None  # gpumem's own functions: a pool of gpumem's
            self._device = torch.cuda.current_device()
            self._id = _pool_id(torch.cuda.graph_pool_handle())  # unique among PyTorch's pool ids
            if fns is None and not use_on_oom and not no_split:
                lib.pool_retain(self._device, self._id)
            else:
                lib.pool_create(self._device, self._id, alloc=fns[1] if fns else 0, free=fns[2] if fns else 0,
                                no_split=no_split, use_on_oom=use_on_oom)
            self._allocator = allocator if fns else None
            weakref.finalize(self, _release_pool, lib, self._device, self._id)

        @property
        def id(self):
            """The pool's id, a pair of ints as PyTorch's."""
            return self._id

        @property
        def allocator(self):
            """The allocator given (its allocator() handle), or None: the
            pool is gpumem's."""
            return self._allocator

        def use_count(self):
            """How many uses hold the pool: this object, and each
            use_mem_pool block it is in."""
            return lib.pool_uses(self._device, self._id)

        def snapshot(self, include_traces=True):
            """The pool's segments in PyTorch's snapshot format."""
            segs = _state["history"].snapshot()["segments"]
            return [seg for seg in segs if tuple(seg["segment_pool_id"]) == self._id]

    MemPool._gpumem = True
    _put((torch.cuda, getattr(torch.cuda, "memory", None)), "MemPool", MemPool)
    try:
        from torch._C._distributed_c10d import ProcessGroupNCCL
    except ImportError:  # PyTorch built without NCCL
        return
    _refuse_nccl_pool_registration(ProcessGroupNCCL)


def _nccl_pool_refusal(what):
    """The one line ProcessGroupNCCL's register_mem_pool and
    deregister_mem_pool fail with under gpumem.torch.use() (what: the
    method's name)."""
    return (f"gpumem: ProcessGroupNCCL.{what}(pool) takes a PyTorch MemPool, which PyTorch cannot make for a "
            "pluggable allocator: NCCL's registration of user buffers is not supported under gpumem (collectives "
            "on gpumem's memory work without it); use PyTorch's allocator for this program to register them")


def _refuse_nccl_pool_registration(cls):
    """cls.register_mem_pool and cls.deregister_mem_pool (ProcessGroupNCCL)
    made to fail at once with gpumem's line for a MemPool of gpumem's: the
    binding takes only PyTorch's own MemPool, and refused gpumem's with a
    TypeError listing C++ signatures (PyTorch 2.11, H200: bench/nccl/
    register_probe.py). Anything else goes to PyTorch's method as before."""
    for name in ("register_mem_pool", "deregister_mem_pool"):
        orig = getattr(cls, name, None)
        if orig is None or getattr(orig, "_gpumem", False):
            continue

        def method(self, pool, *args, _orig=orig, _name=name, **kwargs):
            if getattr(type(pool), "_gpumem", False):
                raise RuntimeError(_nccl_pool_refusal(_name))
            return _orig(self, pool, *args, **kwargs)

        method._gpumem = True
        method.__name__ = method.__qualname__ = name
        method.__doc__ = getattr(orig, "__doc__", None)
        try:
            setattr(cls, name, method)
        except (AttributeError, TypeError):
            continue  # a class that takes no new attributes: PyTorch's TypeError stays
        _patched[(cls.__module__ + "." + cls.__name__, name)] = orig


def _own_function(lib, name):
    """The address of the library's own C function name (0 if unknown)."""
    import ctypes
    fn = getattr(getattr(lib, "c", None), name, None)
    return ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else 0


# The functions of each CUDAPluggableAllocator made since use(): id of its
# handle -> (handle, alloc address, free address). The handle is kept
# alive here, so that an id is never reused for another.
_custom_allocators = {}


def _patch_custom_allocator(torch):
    """torch._C._cuda_customAllocator, which every CUDAPluggableAllocator
    calls with its functions' addresses, made to remember them: PyTorch's
    handle does not give them back, and a MemPool with that allocator
    needs them."""
    orig = getattr(torch._C, "_cuda_customAllocator", None)
    if orig is None or getattr(orig, "_gpumem", False):
        return

    def _cuda_customAllocator(alloc_fn, free_fn):
        handle = orig(alloc_fn, free_fn)
        _custom_allocators[id(handle)] = (handle, int(alloc_fn), int(free_fn))
        return handle

    _cuda_customAllocator._gpumem = True
    _cuda_customAllocator.__doc__ = orig.__doc__
    _patched[("torch._C", "_cuda_customAllocator")] = orig
    torch._C._cuda_customAllocator = _cuda_customAllocator


def _patch_graph_class(torch, lib, cls):
    """Wraps torch.cuda.CUDAGraph (the Python class; torch.cuda.graphs.CUDAGraph
    is the same): its capture routes to its pool, its reset and collection
    give its pool uses back."""
    where = f"{cls.__module__}.{cls.__qualname__}"
    originals = {}
    for name in ("capture_begin", "capture_end", "capture_end_pre", "reset"):
        fn = getattr(cls, name, None)
        if fn is not None:
            originals[name] = _patched[(where, name)] = fn

    begin, end, reset = originals.get("capture_begin"), originals.get("capture_end"), originals.get("reset")
    if begin is None or end is None:
        return

    def capture_begin(self, *args, **kwargs):
        args, kwargs, pool = _capture_pool(torch, args, kwargs)
        st = _graph_pools(self, lib)
        st.end()
        device = torch.cuda.current_device()
        # Held from before PyTorch begins the capture until its route is
        # open: a free on another thread in between records no event.
        lib.capture_hold(device)
        try:
            begin(self, *args, **kwargs)
            # The capture runs now on the current stream (PyTorch has begun
            # it): send its allocations, on whatever stream joins it, to the
            # pool.
            try:
                st.begin(device, pool, torch.cuda.current_stream(device).cuda_stream)
            except BaseException:
                _quietly(lambda: end(self))  # leave no stream capturing
                raise
        finally:
            lib.capture_release(device)

    def ending(orig):
        def capture_end(self, *args, **kwargs):
            st = _graph_pools(self)
            try:
                result = orig(self, *args, **kwargs)
            except BaseException:
                if st is not None:
                    _quietly(st.end)
                raise
            if st is not None:
                st.end()
            return result
        return capture_end

    def reset_graph(self, *args, **kwargs):
        # PyTorch's order: releasePool, then the graph and its exec are
        # destroyed. The release gives the memory back only once the pool's
        # buffers are all freed.
        st = _graph_pools(self)
        try:
            if st is not None:
                try:
                    st.end()
                finally:
                    st.release()
        finally:
            if reset is not None:
                reset(self, *args, **kwargs)

    capture_begin.__doc__ = getattr(begin, "__doc__", None)
    cls.capture_begin = capture_begin
    for name in ("capture_end", "capture_end_pre"):
        if name in originals:
            fn = ending(originals[name])
            fn.__name__ = fn.__qualname__ = name
            fn.__doc__ = getattr(originals[name], "__doc__", None)
            setattr(cls, name, fn)
    if reset is not None:
        reset_graph.__name__ = reset_graph.__qualname__ = "reset"
        reset_graph.__doc__ = getattr(reset, "__doc__", None)
        cls.reset = reset_graph


def _patch_pool_calls(torch, lib):
    """torch._C's private-pool calls, made on gpumem's pools too. PyTorch's
    own (called first) do nothing under a pluggable allocator."""
    C = torch._C

    def dev(device):
        return torch.cuda._utils._get_device_index(device, optional=True)

    begun = {}  # device -> [pool]: routes begun here, for the old end(device)

    def began(device, pool):
        with _lock:
            begun.setdefault(device, []).append(pool)

    def ended(device, pool):
        """The pool of the route end(device, pool) ends: pool, or, for the
        old one-argument end, the latest begun on device."""
        with _lock:
            stack = begun.get(device, [])
            if pool is None:
                return stack.pop() if stack else None
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == pool:
                    del stack[i]
                    break
            return pool

    news = {}

    def patch(name, make):
        orig = getattr(C, name, None)
        if orig is not None:
            news[name] = make(orig)

    def beginning(route):
        def make(orig):
            def begin(device, mempool_id):
                orig(device, mempool_id)
                d, pool = dev(device), _pool_id(mempool_id)
                lib.pool_begin(d, pool, 0, route)
                began(d, pool)
            return begin
        return make

    # PyTorch's filters: the calling thread; every allocation ([](cudaStream_t) { return true; }).
    patch("_cuda_beginAllocateCurrentThreadToPool", beginning(_lib.POOL_THREAD))
    patch("_cuda_beginAllocateToPool", beginning(_lib.POOL_ALL))

    def stream_begin(orig):
        # Older PyTorch: allocations on the current stream. gpumem routes by
        # capture, which holds the stream, when it captures, else by thread.
        def begin(device, mempool_id):
            orig(device, mempool_id)
            d, pool = dev(device), _pool_id(mempool_id)
            capturing = d == torch.cuda.current_device() and torch.cuda.is_current_stream_capturing()
            if capturing:
                lib.pool_begin(d, pool, torch.cuda.current_stream(d).cuda_stream, _lib.POOL_CAPTURE)
            else:
                lib.pool_begin(d, pool, 0, _lib.POOL_THREAD)
            began(d, pool)
        return begin

    patch("_cuda_beginAllocateCurrentStreamToPool", stream_begin)

    def ending(orig):
        def end(device, mempool_id=None):
            if mempool_id is None:
                orig(device)
            else:
                orig(device, mempool_id)
            d = dev(device)
            pool = ended(d, None if mempool_id is None else _pool_id(mempool_id))
            if pool is not None:
                lib.pool_end(d, pool)
        return end

    patch("_cuda_endAllocateToPool", ending)
    patch("_cuda_endAllocateCurrentStreamToPool", ending)

    def releasing(orig):
        def release(device, mempool_id):
            orig(device, mempool_id)
            lib.pool_release(dev(device), _pool_id(mempool_id))
        return release

    patch("_cuda_releasePool", releasing)

    def checking(orig):
        # PyTorch's answer: whether the pool's allocated blocks are exactly these.
        def check(device, mempool_id, expected_live_allocations):
            live = lib.pool_live(dev(device), _pool_id(mempool_id))
            return live == {int(p) for p in expected_live_allocations}
        return check

    patch("_cuda_checkPoolLiveAllocations", checking)

    # Allocator checkpoints, for torch.compile's CUDA graph trees
    # (_checkpoint.py).
    cps = _checkpoint.Checkpoints(torch, lib, dev, _pool_id)

    def calling(method):
        def make(orig):
            def fn(*args, **kwargs):
                return method(*args, **kwargs)
            return fn
        return make

    patch("_cuda_getCheckpointState", calling(cps.get_state))
    patch("_cuda_setCheckpointPoolState", calling(cps.set_state))
    patch("_cuda_cudaCachingAllocator_raw_delete", calling(cps.raw_delete))
    patch("_free_And_Remove_DeleterFn", calling(cps.free_and_remove_deleter))
    patch("_has_Standard_Deleter", calling(cps.has_standard_deleter))
    _replace_all(torch, news)
