"""gpumem.torch's memory history and snapshots: torch.cuda.memory's
_record_memory_history, _snapshot, _dump_snapshot, memory_snapshot and the
memory metadata, answered by gpumem (_torchmem.History, which also holds
the format). Wired by _torch_plugin._patch at gpumem.torch.use()."""

import sys

from . import _torchmem
from ._torch_graphs import _pool_id
from ._torch_state import _patched, _put, _replace_all, _state


def _patch_history(torch, lib):
    """PyTorch's memory history and snapshots, answered by gpumem
    (_torchmem.History): _record_memory_history, _snapshot, _dump_snapshot,
    memory_snapshot and torch._C._cuda_isHistoryEnabled."""
    hist = _state["history"] = _torchmem.History(lib)
    mem = torch.cuda.memory

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, **kwargs):
        """Records gpumem's allocations and frees for _snapshot (patched by
        gpumem.torch)."""
        if _state.get("recording"):
            raise RuntimeError("gpumem: _record_memory_history while gpumem.torch.record() runs: "
                               "the two share the call-site hook; end the recording first")
        hist.record(enabled, context, stacks, max_entries, device, clear_history, **kwargs)

    def _augmented(snap, augment_with_fx_traces):
        # PyTorch's own pass (torch.cuda.memory imports it): frames in code
        # FX generated get the FX node they ran (fx_node_op, fx_node_name,
        # fx_original_trace). A PyTorch without it has no such option.
        if not augment_with_fx_traces:
            return snap
        fn = getattr(getattr(torch.cuda, "memory", None), "_augment_memory_snapshot_stack_traces", None)
        if fn is None:
            raise TypeError("gpumem: this PyTorch's _snapshot has no augment_with_fx_traces")
        return fn(snap)

    def _snapshot(device=None, augment_with_fx_traces=False):
        """gpumem's segments and history in PyTorch's snapshot format
        (patched by gpumem.torch)."""
        return _augmented(hist.snapshot(device), augment_with_fx_traces)

    def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
        """Pickles _snapshot() to filename (patched by gpumem.torch)."""
        import pickle
        with open(filename, "wb") as f:
            pickle.dump(_augmented(hist.snapshot(), augment_with_fx_traces), f)

    def memory_snapshot(mempool_id=None, *args, **kwargs):
        """gpumem's segments in PyTorch's format, or those of the pool
        mempool_id (a MemPool's id) alone (patched by gpumem.torch)."""
        segments = hist.snapshot()["segments"]
        if mempool_id is None:
            return segments
        want = tuple(_pool_id(mempool_id))
        return [seg for seg in segments if tuple(seg["segment_pool_id"]) == want]

    def _set_memory_metadata(metadata):
        """Text the history's entries from now on carry as user_metadata
        (patched by gpumem.torch)."""
        hist.set_metadata(metadata)

    def _get_memory_metadata():
        """The text _set_memory_metadata set (patched by gpumem.torch)."""
        return hist.get_metadata()

    news = {}
    if hasattr(torch._C, "_cuda_setMemoryMetadata"):
        news["_cuda_setMemoryMetadata"] = lambda metadata: hist.set_metadata(metadata)
    if hasattr(torch._C, "_cuda_getMemoryMetadata"):
        news["_cuda_getMemoryMetadata"] = lambda: hist.get_metadata()
    _replace_all(torch, news)

    for name, fn in (("_record_memory_history", _record_memory_history), ("_snapshot", _snapshot),
                     ("_dump_snapshot", _dump_snapshot), ("memory_snapshot", memory_snapshot),
                     ("_set_memory_metadata", _set_memory_metadata),
                     ("_get_memory_metadata", _get_memory_metadata)):
        _put((mem, torch.cuda), name, fn)
    if hasattr(torch._C, "_cuda_isHistoryEnabled"):
        _patched[("torch._C", "_cuda_isHistoryEnabled")] = torch._C._cuda_isHistoryEnabled
        torch._C._cuda_isHistoryEnabled = lambda *a, **k: bool(hist.on)
