"""Reading gpumem-trace v1 and v2 files into flat arrays, with no third-party packages.

The format is described in testdata/traces/README.md:

    # gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US
    a ID SIZE STREAM T_US [SITE]   the program asked for SIZE bytes, named ID
    f ID T_US                      the program freed request ID
    s SITE TEXT                    call site SITE is the call stack TEXT
    t T_US                         the program emptied its allocator's cache

(package trace's doc.go has the whole of it, call sites included). Version 2, the
packed form of bench/corpus/traces, numbers requests by their alloc lines and gives
times as deltas:

    # gpumem-trace v2: a SIZE STREAM DT_US | f BACK DT_US | t DT_US
    a SIZE STREAM DT_US [SITE]     the next request (ID: the alloc lines before it)
    f BACK DT_US                   request N-1-BACK freed, N allocated so far

load() turns a file (gzip or plain text) into three parallel lists, one entry per
event, so that a replay loop does no parsing while it is timed:

    kinds[k]  1 for an allocation, 0 for a free
    ids[k]    the request ID (IDs count up from 0, so they index a flat list)
    sizes[k]  SIZE for an allocation, 0 for a free

and checks the file on the way (header, unique IDs, no free of an unknown or
already freed ID, sites defined once and before use). Call sites play no part in
a replay; their texts are kept in Trace.sites (site number -> TEXT). A "t" line
(torch.cuda.empty_cache in the recorded program) is not an event: Trace.trims
holds, for each, the number of events before it, and the PyTorch peers empty
their cache there as the program did. peak_live()
gives the largest sum of SIZE over requests alive at the same moment, for the
whole trace or for a prefix of it.

This module is imported by replay_peer.py on the GPU machine and by selftest.py on
a machine without one. It is named tracefile, not trace, so as not to shadow the
standard library's trace module.
"""

import gzip
import os
import re

HEADER = "# gpumem-trace v1"
HEADER_V2 = "# gpumem-trace v2"

# A site definition: TEXT is the rest of the line, without the spaces and tabs
# around it (spaces inside it are kept).
_SITE = re.compile(r"[ \t]*s[ \t]+([0-9]+)[ \t]+(.*?)[ \t\r\n]*\Z", re.S)


class TraceError(ValueError):
    """The file is not a valid gpumem-trace v1 file; the message names the line."""


class Trace:
    """A parsed trace. See the module docstring for the meaning of the lists."""

    def __init__(self, name, kinds, ids, sizes, streams, sites=None, trims=None):
        self.name = name
        self.kinds = kinds
        self.ids = ids
        self.sizes = sizes
        self.streams = streams  # set of STREAM values seen (as strings)
        self.sites = sites if sites is not None else {}  # SITE -> TEXT
        # Where the program emptied its allocator's cache ("t" lines): the
        # number of events before each, ascending.
        self.trims = trims if trims is not None else []
        self.n_ids = (max(ids) + 1) if ids else 0
        self.peak_live_bytes = peak_live(kinds, ids, sizes)

    def __len__(self):
        return len(self.kinds)

    def truncated(self, max_events):
        """The first max_events events as a new Trace (the same one if it is shorter)."""
        if max_events is None or max_events <= 0 or max_events >= len(self.kinds):
            return self
        return Trace(self.name, self.kinds[:max_events], self.ids[:max_events],
                     self.sizes[:max_events], self.streams, self.sites,
                     [t for t in self.trims if t < max_events])

    @property
    def allocations(self):
        return sum(self.kinds)

    def peak_live_passes(self, n):
        """The most live over n passes in one process, what the trace never
        frees staying live from the pass that allocated it and not allocated
        again (package trace's Trace.PeakLivePasses; gpumem replay --passes)."""
        if n <= 1:
            return self.peak_live_bytes
        size, freed = {}, set()
        for k, i, s in zip(self.kinds, self.ids, self.sizes):
            if k:
                size[i] = s
            else:
                freed.add(i)
        live = sum(s for i, s in size.items() if i not in freed)
        peak = max(self.peak_live_bytes, live)
        for k, i, s in zip(self.kinds, self.ids, self.sizes):
            if i not in freed:
                continue
            if k:
                live += s
                peak = max(peak, live)
            else:
                live -= size[i]
        return peak


def trace_name(path):
    """The trace's name: the file name without directory and without extensions
    (testdata/traces/resnet50_train.trace.gz -> resnet50_train)."""
    base = os.path.basename(path)
    for ext in (".gz", ".trace", ".txt"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base


def _open_text(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    # UTF-8, not ASCII: a site's TEXT may name files and functions in any
    # script. newline="\n" keeps a stray "\r" inside a line where it is.
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, "rt", encoding="utf-8", newline="\n")


def load(path):
    """Parse the trace at path. Raises TraceError on a malformed file."""
    kinds, ids, sizes, trims = [], [], [], []
    streams = set()
    sites = {}
    size_of = {}  # live request ID -> SIZE, to check frees
    seen = set()
    with _open_text(path) as f:
        first = f.readline()
        if first and not first.endswith("\n"):
            raise TraceError("%s: line 1: the last line, %r, has no newline: the trace is cut short" % (path, first[:40]))
        v2 = _is_header(first, HEADER_V2)
        if not v2 and not _is_header(first, HEADER):
            raise TraceError("%s: line 1: expected header %r or %r, got %r"
                             % (path, HEADER, HEADER_V2, first[:60]))
        for lineno, line in enumerate(f, start=2):
            if not line.endswith("\n"):
                # As package trace: every line ends with a newline, so the
                # file was cut short and its last line may read as a
                # shorter valid one ("f 4" of "f 421 ...").
                raise TraceError("%s: line %d: the last line, %r, has no newline: the trace is cut short"
                                 % (path, lineno, line[:40]))
            p = line.split()
            if not p or p[0].startswith("#"):
                continue
            op = p[0]
            try:
                if v2 and op in ("a", "f", "t"):
                    p = _v1_fields(p, len(seen))
                if op == "a":
                    if len(p) not in (5, 6):
                        raise TraceError("want 'a ID SIZE STREAM T_US [SITE]'")
                    rid, size = int(p[1]), int(p[2])
                    if rid < 0 or size < 0:
                        raise TraceError("negative ID or SIZE")
                    if len(p) == 6 and int(p[5]) not in sites:
                        raise TraceError("site %s is not defined" % p[5])
                    if rid in seen:
                        raise TraceError("request ID %d allocated twice" % rid)
                    seen.add(rid)
                    size_of[rid] = size
                    streams.add(p[3])
                    kinds.append(1)
                    ids.append(rid)
                    sizes.append(size)
                elif op == "f":
                    if len(p) != 3:
                        raise TraceError("want 'f ID T_US'")
                    rid = int(p[1])
                    if rid not in size_of:
                        raise TraceError("free of request ID %d, which is not live" % rid)
                    del size_of[rid]
                    kinds.append(0)
                    ids.append(rid)
                    sizes.append(0)
                elif op == "t":
                    if len(p) != 2:
                        raise TraceError("want 't T_US'")
                    int(p[1])
                    trims.append(len(kinds))
                elif op == "s":
                    m = _SITE.match(line)
                    if not m:
                        raise TraceError("want 's SITE TEXT'")
                    site = int(m.group(1))
                    if site < 1 or site in sites:
                        raise TraceError("site %d is 0 or defined twice" % site)
                    sites[site] = m.group(2)
                else:
                    raise TraceError("unknown event %r" % op)
            except TraceError as e:
                raise TraceError("%s: line %d: %s" % (path, lineno, e)) from None
            except ValueError as e:
                raise TraceError("%s: line %d: %s" % (path, lineno, e)) from None
    return Trace(trace_name(path), kinds, ids, sizes, streams, sites, trims)


def _is_header(line, header):
    """Whether line is the header line header, with or without text after it."""
    return line.startswith(header) and (len(line) == len(header) or line[len(header)] in ": \t\r\n")


def _v1_fields(p, allocated):
    """The fields of v2 line p as v1 fields (times left relative, checked only
    for sign): allocated requests came before it."""
    op = p[0]
    if op == "a":
        if len(p) not in (4, 5):
            raise TraceError("want 'a SIZE STREAM DT_US [SITE]' (v2)")
        return ["a", str(allocated)] + p[1:]
    if op == "f":
        if len(p) != 3:
            raise TraceError("want 'f BACK DT_US' (v2)")
        back = int(p[1])
        if back < 0 or back >= allocated:
            raise TraceError("BACK %d: no such request (%d allocated so far)" % (back, allocated))
        return ["f", str(allocated - 1 - back), p[2]]
    return p


def peak_live(kinds, ids, sizes, upto=None):
    """Largest sum of SIZE over requests alive at once, over the first upto events
    (all of them if upto is None)."""
    n = len(kinds) if upto is None else min(upto, len(kinds))
    size_of = {}
    live = peak = 0
    for k in range(n):
        if kinds[k]:
            s = sizes[k]
            size_of[ids[k]] = s
            live += s
            if live > peak:
                peak = live
        else:
            live -= size_of.pop(ids[k])
    return peak


def write(path, events, header=HEADER + ": a ID SIZE STREAM T_US | f ID T_US"):
    """Write a trace (for tests): events are ('a', id, size) or ('f', id)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(header + "\n")
        for t, ev in enumerate(events):
            if ev[0] == "a":
                f.write("a %d %d 0 %d\n" % (ev[1], ev[2], t))
            else:
                f.write("f %d %d\n" % (ev[1], t))
