"""PyTorch's memory statistics, history and snapshots, answered by gpumem.

gpumem.torch.use() installs these in place of what PyTorch's pluggable
allocator refuses or answers wrongly:

- memory_stats(): PyTorch's keys wherever gpumem has the figure (keys of
  figures gpumem does not keep are absent), plus gpumem's own
  (fragmentation, limit, ...). gpumem has one pool for every size, where
  PyTorch's allocator splits requests into a small and a large pool: each
  "<name>.all.<figure>" comes with "<name>.large_pool.<figure>", the same
  value, and "<name>.small_pool.<figure>", 0, so that code reading
  PyTorch's per-pool keys gets the truth in PyTorch's shape;
- memory_summary(): PyTorch's table layout over those figures, its "from
  large pool" and "from small pool" rows filled the same way;
- _record_memory_history(), _snapshot(), _dump_snapshot(): PyTorch's
  snapshot format (segments with their blocks, and device_traces of alloc,
  free_requested, free_completed and oom entries), from gpumem's segments
  and a ring of its latest allocations and frees, each with the Python
  frames that made it. torch.cuda._memory_viz renders it and `gpumem
  import` reads it back.

How the history's context works, as under PyTorch's allocator: context
"state" gives live blocks their frames and trace entries none; "alloc"
gives trace entries the frames of the allocation (a free's entries too);
"all" the same here, where PyTorch gives a free's entries the stack of the
free: the library asks for Python frames only when it allocates, so that
stack is not known (clib's gpumem_free would have to ask too); None
records no frames from then on. Each entry is judged by the context in
force at its time, so a change of context mid-way leaves earlier entries
as they were. compile_context=True gives each allocation's entry the
torch.compile region it was made in ("Torch-Compiled Region: 0/0", found
from the Python stack); frees' entries say "N/A" (the region at a free is
not known, for the same reason).
"""

import bisect
import json
import os
import pickle
import sys
import threading
import time

_DEPTH = 16  # Python frames kept per call site


class Sites:
    """Interns the Python call sites of allocations: the library calls
    callback on the allocating thread (ctypes takes the GIL) while a
    recording or a history is on; each new stack gets an id (from base + 1
    on), its frames in PyTorch's form ({"filename", "line", "name"},
    innermost first), the torch.compile region it ran in if asked, and,
    for a recording, its text through on_new(id, text)."""

    def __init__(self, on_new=None, base=0):
        self.on_new = on_new
        self.base = base
        self.ids = {}
        self.frames = {0: []}
        self.regions = {}  # site -> torch.compile region (compiled_region)
        self.lock = threading.Lock()

    def site(self, skip=1, region=None, frames=True):
        """The id of the calling stack (skip: frames of the caller's own
        to leave out). region, if given, is called with the caller's
        frame and names the stack's torch.compile region (part of the key);
        with frames False the stack's frames are not kept (the site only
        names a region; 0 when there is none)."""
        try:
            top = sys._getframe(skip + 1)
            key, kept = [], []
            frame = top if frames else None
            while frame is not None and len(kept) < _DEPTH:
                code = frame.f_code
                key.append((id(code), frame.f_lineno))
                kept.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
                frame = frame.f_back
            where = region(top) if region is not None else None
            if not frames and where is None:
                return 0
            key = (tuple(key), where)
            with self.lock:
                site = self.ids.get(key)
                if site is None:
                    site = self.base + len(self.ids) + 1
                    if self.on_new is not None:
                        self.on_new(site, kept)  # named first: an error leaves it unknown
                    self.ids[key] = site
                    self.frames[site] = kept
                    if where is not None:
                        self.regions[site] = where
            return site
        except Exception:  # a site never breaks an allocation
            return 0


def compiled_region(frame):
    """The torch.compile region a Python stack runs in, as PyTorch's
    allocator names it for compile_context: the trace annotation
    ("Torch-Compiled Region: 0/0") of the code dynamo made that the
    innermost such frame from frame outward runs. PyTorch's RecordFunction
    for the region spans exactly that frame's run. None outside compiled
    code, before torch._dynamo is loaded, or where dynamo's tables do not
    tell."""
    utils = sys.modules.get("torch._dynamo.utils")
    made = getattr(utils, "orig_code_map", None)  # code dynamo made -> the user's code
    if made is None:
        return None
    while frame is not None:
        code = frame.f_code
        source = made.get(code)
        if source is not None:
            try:
                from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
                for entry in _debug_get_cache_entry_list(source):
                    if entry.code is code:
                        return str(entry.trace_annotation)
            except Exception:
                pass
            return None  # compiled code whose region is not known
        frame = frame.f_back
    return None


def _short(filename):
    """A file name as a trace names it: from site-packages on, or relative
    to the working directory when under it."""
    i = filename.rfind("site-packages" + os.sep)
    if i >= 0:
        return filename[i:]
    try:
        rel = os.path.relpath(filename)
        return rel if not rel.startswith("..") else filename
    except ValueError:
        return filename


def site_text(frames, depth=8):
    """A call site as a gpumem trace writes it: its innermost depth frames."""
    if not frames:
        return "<no Python frame: a C++ thread such as autograd's>"
    return " < ".join(f"{f['name']} {_short(f['filename'])}:{f['line']}" for f in frames[:depth])


# --- statistics -------------------------------------------------------------

def _accumulated(key):
    """Whether key is an accumulated figure (reset_accumulated_memory_stats)."""
    return key.endswith((".allocated", ".freed")) or key.startswith("num_")


# NestedStats: the dict of each level of memory_stats_as_nested_dict()
# (gpumem.torch._nested makes its levels with it); a plain dict, as PyTorch's.
NestedStats = dict


def _pools(out):
    """PyTorch's small/large pool split of each "<name>.all.<figure>" in out,
    added in place: gpumem has one pool, reported as the large pool (the
    "all" figure) beside an empty small pool (0)."""
    for key, v in list(out.items()):
        parts = key.split(".")
        if len(parts) == 3 and parts[1] == "all":
            out[f"{parts[0]}.large_pool.{parts[2]}"] = v
            out[f"{parts[0]}.small_pool.{parts[2]}"] = 0


def memory_stats(s, base=None):
    """gpumem's numbers (a _lib.Stats) under torch.cuda.memory_stats()'s
    keys, sorted as PyTorch sorts them; base is the figures at the last
    reset_accumulated_memory_stats, which the accumulated ones count from."""
    out = {}

    def stat(name, current=None, peak=None, allocated=None, freed=None):
        for key, v in (("current", current), ("peak", peak), ("allocated", allocated), ("freed", freed)):
            if v is not None:
                out[f"{name}.all.{key}"] = int(v)

    # PyTorch's allocated and active bytes are its blocks' (requests
    # rounded): gpumem's active; requested_bytes are the requests.
    stat("allocated_bytes", s.active, s.peak_active, s.alloc_bytes, s.free_bytes)
    stat("active_bytes", s.active, s.peak_active, s.alloc_bytes, s.free_bytes)
    stat("requested_bytes", s.allocated, s.peak_allocated, s.alloc_requested, s.free_requested)
    stat("reserved_bytes", s.reserved, s.peak_reserved)
    stat("inactive_split_bytes", s.cached - min(s.releasable, s.cached))
    # Counts: a live buffer is one block, active and allocated alike. An
    # older library reports no peak counts (0): then the key is left out
    # rather than a wrong 0.
    peak_live = s.peak_live_buffers or None
    stat("allocation", s.live_buffers, peak_live, s.allocs, s.frees)
    stat("active", s.live_buffers, peak_live, s.allocs, s.frees)
    stat("segment", s.segments, s.peak_segments or None, s.device_allocs, s.device_frees)
    # PyTorch's oversize allocations and segments are those above its
    # max_split_size, which gpumem has no counterpart of: none, and the
    # setting unset (PyTorch's SIZE_MAX, reported as -1).
    for name in ("oversize_allocations", "oversize_segments"):
        for key in ("current", "peak", "allocated", "freed"):
            out[f"{name}.{key}"] = 0
    out["max_split_size"] = -1
    out["num_alloc_retries"] = s.retries
    out["num_ooms"] = s.ooms
    # PyTorch synchronizes every stream before it frees cached segments;
    # gpumem's host waits are its fences (before an unmap or a release).
    out["num_sync_all_streams"] = s.fences
    out["num_device_alloc"] = s.device_allocs
    out["num_device_free"] = s.device_frees
    # gpumem's own.
    out["num_device_calls"] = s.device_calls
    out["num_trims"] = s.trims
    out["fragmentation"] = s.fragmentation
    out["limit"] = s.limit
    out["graph_pool_reserved_bytes"] = s.pool_reserved
    for k, v in (base or {}).items():
        if _accumulated(k) and k in out:
            out[k] -= v
    _pools(out)  # from the "all" figures as counted from base: equal after a reset too
    return dict(sorted(out.items()))


def _fmt_bytes(n):
    # PyTorch's memory_summary format (_format_size).
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 * 1024 or unit == "TiB":
            return f"{n:6d} {unit}"
        n //= 1024


def _fmt_count(n):
    for unit in (" ", "K", "M"):
        if abs(n) < 1000 * 1000 or unit == "M":
            return f"{n:8d} {unit}"
        n //= 1000


def memory_summary(s, device, abbreviated=False, base=None):
    """torch.cuda.memory_summary()'s table over gpumem's figures: the
    rows PyTorch prints, each metric's "from large pool" and "from small
    pool" rows under it unless abbreviated (memory_stats's pool keys: the
    large pool all of it, the small pool empty), a blank cell where gpumem
    keeps no such figure."""
    st = memory_stats(s, base)
    width = 75
    rule, thick = "|" + "-" * width + "|", "|" + "=" * width + "|"
    lines = [thick, "|{:^75}|".format(f"gpumem CUDA memory summary, device ID {device}"), rule,
             "|{:^37}|{:^37}|".format(f"CUDA OOMs: {s.ooms}", f"allocation retries: {s.retries}"), thick,
             "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", rule]
    rows = [("Allocated memory", "allocated_bytes", _fmt_bytes), ("Active memory", "active_bytes", _fmt_bytes),
            ("Requested memory", "requested_bytes", _fmt_bytes), ("GPU reserved memory", "reserved_bytes", _fmt_bytes),
            ("Non-releasable memory", "inactive_split_bytes", _fmt_bytes), ("Allocations", "allocation", _fmt_count),
            ("Active allocs", "active", _fmt_count), ("GPU reserved segments", "segment", _fmt_count)]
    pools = [("all", None)] if abbreviated else [("all", None), ("large_pool", "      from large pool"),
                                                 ("small_pool", "      from small pool")]
    for title, name, fmt in rows:
        for pool, label in pools:
            cells = []
            for key in ("current", "peak", "allocated", "freed"):
                v = st.get(f"{name}.{pool}.{key}")
                cells.append(" " * 10 if v is None else fmt(v))
            lines.append("| {:<21} | {} |".format(label or title, " | ".join(cells)))
        lines.append(rule)
    for text in (f" Fragmentation {100 * s.fragmentation:.1f}%; limit {s.limit} bytes; {s.device_calls} driver calls",
                 f" CUDA graphs' pools hold {s.pool_reserved} bytes (in the figures above)"):
        lines.append("|{:<75}|".format(text[:75]))
    lines.append(thick)
    return "\n".join(lines) + "\n"


# --- history and snapshots --------------------------------------------------

# The history's site ids start above those of gpumem.torch.record()
# (numbered from 1): a buffer allocated during a recording and freed, or
# still live, under a history keeps the recording's id, which the history
# must not read as one of its own.
_HISTORY_SITES = 1 << 31

_CONTEXTS = (None, "state", "alloc", "all")


class History:
    """PyTorch's memory history under gpumem: which devices record, and
    the call sites (shared with gpumem.torch.record: one site callback)."""

    def __init__(self, lib):
        self.lib = lib
        self.on = {}  # device -> "all" or "state"
        # The sites of the history, kept while the process lives: the
        # library keeps each live buffer's site id, and the ring its
        # entries', across changes of context and history off and on
        # (PyTorch's blocks keep their frames likewise). self.sites is
        # this table while the site callback is installed, else None
        # (gpumem.torch.record() refuses to run while it is not None).
        self.table = Sites(base=_HISTORY_SITES)
        self.sites = None
        self.context = None  # the context in force: None, "state", "alloc" or "all"
        self.compile_context = False
        # The context at each change (time in us, context), oldest first:
        # which frames a trace entry shows depends on the context at its
        # time (entries are stamped on the same clock).
        self.contexts = [(0, None)]
        self.skip = set()  # trace actions left out (skip_actions)
        # torch.cuda.memory._set_memory_metadata: (time in us, text) at
        # each change, oldest first; a trace entry carries the text set
        # at its time (entries are stamped on the same clock).
        self.metadata = [(0, "")]

    def record(self, enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
               clear_history=False, compile_context=False, skip_actions=None, **ignored):
        """torch.cuda.memory._record_memory_history: enabled None (off),
        "state" (blocks keep their sites) or "all" (also the trace of
        allocations and frees, the latest max_entries); context None
        records no frames, "state" frames for live blocks only, "alloc"
        and "all" for trace entries too (the module's docstring says where
        "all" falls short); stacks "python" and "all" both give Python
        frames (gpumem sees no C++ stack); compile_context names the
        torch.compile region of each allocation."""
        import torch
        if enabled is True:
            enabled = "all"
        if enabled not in (None, False, "state", "all"):
            raise ValueError(f"gpumem: _record_memory_history(enabled={enabled!r}): want None, 'state' or 'all'")
        if context not in _CONTEXTS:
            raise ValueError(f"gpumem: _record_memory_history(context={context!r}): "
                             "want None, 'state', 'alloc' or 'all'")
        if stacks not in ("python", "all"):
            raise ValueError(f"gpumem: _record_memory_history(stacks={stacks!r}): want 'python' or 'all'")
        dev = torch.cuda._utils._get_device_index(device, optional=True)
        self.skip = set(skip_actions or ())
        if not enabled:
            self.lib.history(dev, False, 0)
            self.on.pop(dev, None)
        else:
            self._mark(context)
            self.context, self.compile_context = context, bool(compile_context)
            if clear_history or dev not in self.on:
                self.lib.history(dev, True, max(1, min(int(max_entries), 1 << 31)))
            self.on[dev] = enabled
        self._callback(bool(self.on) and (self.context is not None or self.compile_context))
        # A free's own stack (context "all") and region: the library asks
        # for a site at each free too, only then.
        self._free_sites(bool(self.on) and (self.context == "all" or self.compile_context))

    def _mark(self, context):
        """Notes that entries from now on are made under context. The
        change takes the next microsecond, so that no entry made before it
        shares its time."""
        t = now = time.time_ns() // 1000
        give_up = time.monotonic() + 0.001
        while now == t and time.monotonic() < give_up:
            now = time.time_ns() // 1000
        self.contexts.append((now, context))
        if len(self.contexts) > 1 << 16:
            del self.contexts[1:1 << 15]  # the oldest changes go first

    def _site(self, device):
        """The site callback: the allocating stack's site, with its frames
        while a context is on, and its torch.compile region if asked."""
        table = self.sites
        if table is None:
            return 0
        return table.site(region=compiled_region if self.compile_context else None,
                          frames=self.context is not None)

    def _callback(self, want):
        from . import _lib
        if want and self.sites is None:
            self.sites = self.table
            self._c = _lib.SITE_CALLBACK(self._site)
            self.lib.set_site_callback(self._c)
        elif not want and self.sites is not None:
            self.lib.set_site_callback(_lib.SITE_CALLBACK())
            self.sites = None

    def _free_sites(self, want):
        setter = getattr(self.lib, "set_free_sites", None)
        if setter is not None and want != getattr(self, "_freeing", False):
            setter(want)
            self._freeing = want

    def set_metadata(self, text):
        """torch.cuda.memory._set_memory_metadata: text that the trace
        entries from now on carry (user_metadata)."""
        self.metadata.append((time.time_ns() // 1000, str(text)))
        if len(self.metadata) > 1 << 16:
            del self.metadata[1:1 << 15]  # the oldest changes go first

    def get_metadata(self):
        return self.metadata[-1][1]

    def _metadata_at(self, t):
        i = bisect.bisect_right(self.metadata, (t, chr(0x10FFFF))) - 1
        return self.metadata[max(i, 0)][1]

    def frames(self, site):
        return list(self.table.frames.get(site, []))

    def snapshot(self, device=None):
        """torch.cuda.memory._snapshot: every device's segments, and the
        traces of the devices whose history is on ("all")."""
        import torch
        n = torch.cuda.device_count()
        segments, traces = [], []
        for dev in range(n):
            snap = json.loads(self.lib.torch_snapshot_json(dev))
            for seg in snap["segments"] or []:
                seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
                seg["frames"] = []
                for b in seg["blocks"]:
                    b["frames"] = self.frames(b.pop("site"))
                segments.append(seg)
            trace = []
            if self.on.get(dev) == "all":
                changes = [c[0] for c in self.contexts]
                for e in snap["device_traces"][0]:
                    if e["action"] in self.skip:
                        continue
                    site, t = e.pop("site"), e.get("time_us", 0)
                    freed = e.pop("free_site", 0)  # the free's own site (context "all", compile_context)
                    context = self.contexts[max(bisect.bisect_right(changes, t) - 1, 0)][1]
                    # PyTorch's trace entries carry frames under "alloc"
                    # and "all" only: under "all" a free's are the free's
                    # own, under "alloc" the allocation's.
                    if context == "all" and freed:
                        e["frames"] = self.frames(freed)
                    else:
                        e["frames"] = self.frames(site) if context in ("alloc", "all") else []
                    e["user_metadata"] = self._metadata_at(t)
                    # A region is the allocation's for an allocation, the
                    # free's for a free (when the library asked for it).
                    made = e["action"] in ("alloc", "oom")
                    e["compile_context"] = self.table.regions.get(site if made else freed, "N/A") if (made or freed) else "N/A"
                    trace.append(e)
            traces.append(trace)
        return {"segments": segments, "device_traces": traces}

    def dump(self, filename="dump_snapshot.pickle"):
        """torch.cuda.memory._dump_snapshot."""
        with open(filename, "wb") as f:
            pickle.dump(self.snapshot(), f)
