"""record.py NAME OUTDIR: record one corpus program and turn it into a trace.

    python3 bench/corpus/record.py llama_train_varlen out/
        -> out/llama_train_varlen.trace.gz, out/llama_train_varlen.json

The program (programs.PROGRAMS[NAME]) runs in this process under PyTorch's
native caching allocator with its memory history on:

    torch.cuda.memory._record_memory_history(context="alloc", stacks="python",
                                             max_entries=MAX_ENTRIES)

context="alloc" keeps a call stack for each allocation only (frees need
none: a trace's free names its request), and stacks="python" keeps the
Python frames only (no C++ frames, which would make the pickle many times
larger): the sites a trace carries, at a fraction of the size.
MAX_ENTRIES is far above what any program here makes; the summary says
how many entries there were, and `lost: true` if the ring buffer filled.

Then the snapshot is dumped to OUTDIR/NAME.snapshot.pickle and
`build/gpumem import` (the Go binary, built with
`CGO_ENABLED=0 go build -o build/gpumem ./cmd/gpumem`) converts it into
OUTDIR/NAME.trace.gz, in gpumem-trace v2 (`-format v2`: the packed form,
a third to a quarter of v1's size, that the corpus is kept in); the
pickle is deleted once the trace is written.
The call sites in the trace are then rewritten to name no directory of the
recording machine (shorten_sites: "site-packages/...", "python/...", and
paths relative to the repository root).

OUTDIR/NAME.json gets one line of JSON: name, split, seconds (the program,
model build included, without the dump), max_memory_allocated,
max_memory_reserved, streams (distinct streams of the recorded
allocations), entries, lost, and the import's own line (import) and its
seconds; "error" with the message if anything failed (the traceback goes to
stderr). A program that fails leaves no snapshot and no trace: a partial
run is not the program. The exit status is 0 only if the trace was written.

Two halves, so that record_all.sh can convert one program's snapshot while
the GPU runs the next:

    record.py --no-import NAME OUTDIR     run, dump, summary; keep the pickle
    record.py --import-only NAME OUTDIR   convert the pickle, update the summary
"""

import gzip
import json
import os
import pickle
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GPUMEM = os.environ.get("GPUMEM_BIN", os.path.join(ROOT, "build", "gpumem"))
MAX_ENTRIES = 50_000_000
RECORDED = ("alloc", "free_requested")


# Absolute paths of the recording machine in call sites: the packages and
# the standard library lose their prefix, files of this repository become
# relative to its root.
_SITE_PREFIXES = [
    (re.compile(r"(?<![^\s<])/\S*?/(?:site|dist)-packages/"), "site-packages/"),
    (re.compile(r"(?<![^\s<])/\S*?/lib/python3(?:\.\d+)?/"), "python/"),
]


def shorten_sites(trace_path, root=ROOT):
    """Rewrite the site lines ("s N TEXT") of a gzip trace so that they name
    no directory of the machine that recorded it; returns the number of
    site lines changed. Event lines are copied as they are."""
    root = root.rstrip("/") + "/"
    tmp = trace_path + ".tmp"
    changed = 0
    with gzip.open(trace_path, "rt", encoding="utf-8", newline="\n") as src, \
            gzip.open(tmp, "wt", encoding="utf-8", newline="\n", compresslevel=6) as dst:
        for line in src:
            if line.startswith("s "):
                new = line.replace(" " + root, " ")
                for pat, repl in _SITE_PREFIXES:
                    new = pat.sub(repl, new)
                if new != line:
                    changed += 1
                line = new
            dst.write(line)
    os.replace(tmp, trace_path)
    return changed


def paths(name, outdir):
    base = os.path.join(outdir, name)
    return base + ".snapshot.pickle", base + ".trace.gz", base + ".json"


def write_summary(path, summary):
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(summary, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)


def history_stats(snap):
    """Streams, recorded entries and whether the ring buffer overflowed."""
    streams, entries = set(), 0
    for dev in snap.get("device_traces", []):
        entries += len(dev)
        for e in dev:
            if e.get("action") in RECORDED:
                streams.add(e.get("stream"))
    return sorted(s for s in streams if s is not None), entries


def record(name, outdir):
    pickle_path, _, json_path = paths(name, outdir)
    summary = {"name": name}
    try:
        sys.path.insert(0, HERE)
        import programs
        fn, split, _ = programs.PROGRAMS[name]
        summary["split"] = split
        import torch
        summary["torch"] = torch.__version__
        torch.cuda.init()
        summary["device"] = torch.cuda.get_device_name()
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=MAX_ENTRIES)
        start = time.monotonic()
        try:
            fn(seed=0)
        finally:
            # What the program reached, even when it failed.
            summary["seconds"] = round(time.monotonic() - start, 2)
            summary["max_memory_allocated"] = torch.cuda.max_memory_allocated()
            summary["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        streams, entries = history_stats(snap)
        summary.update(streams=len(streams), stream_ids=streams, entries=entries, lost=entries >= MAX_ENTRIES)
        t = time.monotonic()
        with open(pickle_path + ".tmp", "wb") as f:
            pickle.dump(snap, f, protocol=4)
        os.replace(pickle_path + ".tmp", pickle_path)
        summary["pickle_bytes"] = os.path.getsize(pickle_path)
        summary["dump_seconds"] = round(time.monotonic() - t, 2)
    except BaseException as e:  # noqa: B902 - a failed program is summarized, not recorded
        summary["error"] = "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
    write_summary(json_path, summary)
    return summary


def convert(name, outdir):
    pickle_path, trace_path, json_path = paths(name, outdir)
    try:
        with open(json_path) as f:
            summary = json.loads(f.readline())
    except (OSError, ValueError) as e:
        summary = {"name": name, "error": "no summary from the recording: %s" % e}
    if not os.path.exists(pickle_path):
        summary.setdefault("error", "no snapshot to import")
        write_summary(json_path, summary)
        return summary
    t = time.monotonic()
    proc = subprocess.run([GPUMEM, "import", "-format", "v2", pickle_path, "-o", trace_path], capture_output=True, text=True)
    summary["import_seconds"] = round(time.monotonic() - t, 2)
    summary["import"] = proc.stdout.strip().replace(trace_path, os.path.basename(trace_path))
    if proc.stderr.strip():
        summary["import_notes"] = proc.stderr.strip()
        sys.stderr.write(proc.stderr)
    if proc.returncode == 0 and os.path.exists(trace_path):
        summary["sites_shortened"] = shorten_sites(trace_path)
        summary["trace_bytes"] = os.path.getsize(trace_path)
        os.remove(pickle_path)
    else:
        summary.setdefault("error", "gpumem import exited %d: %s" % (proc.returncode, proc.stderr.strip()[-500:]))
    write_summary(json_path, summary)
    return summary


def main(argv):
    mode = "both"
    if argv and argv[0] in ("--no-import", "--import-only"):
        mode, argv = argv[0], argv[1:]
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    name, outdir = argv
    if mode != "--import-only":  # (converting needs no torch: only recording imports the programs)
        sys.path.insert(0, HERE)
        import programs
        if name not in programs.PROGRAMS:
            sys.stderr.write("record.py: unknown program %r; known: %s\n" % (name, ", ".join(programs.PROGRAMS)))
            return 2
    os.makedirs(outdir, exist_ok=True)
    if mode != "--import-only":
        summary = record(name, outdir)
        if mode == "--no-import":
            return 0 if os.path.exists(paths(name, outdir)[0]) and "error" not in summary else 1
    summary = convert(name, outdir)
    print(json.dumps(summary, sort_keys=True))
    return 0 if "error" not in summary else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
