#!/usr/bin/env bash
# record_all.sh [--budget S] [--deadline S] [--timeout S] [--import-timeout S] [--out DIR] [NAMES...]
#
# Records the corpus programs (all of programs.PROGRAMS in its order, or
# NAMES) one process each with bench/corpus/record.py, on the GPU machine,
# from the repository root, with the Go binary at build/gpumem:
#
#   - each program runs under `timeout` (--timeout, default 90 s), cut
#     shorter so that it ends by --deadline (default 500 s after the start);
#   - no program starts after --budget seconds (default 420);
#   - a program that fails or times out is logged, with its traceback, and
#     the next one runs;
#   - while the GPU runs the next program, the previous snapshot is
#     converted by `gpumem import` in the background (CPU only, at most
#     --import-timeout s each, default 60).
#
# The defaults leave a device call of 600 s about 100 s for the last
# imports and the packing: the tars are written only at the end, so a run
# killed before it returns nothing.
#
# At the end, under DIR (default $OUT, else bench/out/corpus): at most 3
# tar files corpus-N.tar (uncompressed; the traces inside are gzip) of at
# most 15 MiB each, summary.jsonl (one line per program, run or not) and
# record.log (everything the programs and the imports printed). Nothing
# else is left there, so all of it comes back from a device run ($OUT: 8
# files at most). A trace too big for a tar is named in the log and in its
# summary line.
set -u
cd "$(dirname "$0")/../.."
budget=420 deadline=500 per=90 import_limit=60 out="${OUT:-bench/out/corpus}"
names=()
while [ $# -gt 0 ]; do
	case "$1" in
	--budget) budget=$2; shift 2 ;;
	--deadline) deadline=$2; shift 2 ;;
	--timeout) per=$2; shift 2 ;;
	--import-timeout) import_limit=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h|--help) sed -n '2,30p' "$0"; exit 0 ;;
	-*) echo "record_all.sh: unknown option $1" >&2; exit 2 ;;
	*) names+=("$1"); shift ;;
	esac
done
py=${PYTHON:-python3}
# Nothing is downloaded: every model is built from a config. Offline, a
# library that would look something up fails at once instead of waiting.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ ! -x build/gpumem ]; then
	echo "record_all.sh: build/gpumem is missing: CGO_ENABLED=0 go build -o build/gpumem ./cmd/gpumem, and carry build/" >&2
	exit 2
fi
if [ ${#names[@]} -eq 0 ]; then
	mapfile -t names < <($py -c 'import sys; sys.path.insert(0, "bench/corpus"); import programs; print("\n".join(programs.PROGRAMS))')
fi
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/corpus.XXXXXX")
log="$out/record.log"
: >"$log"
start=$SECONDS
say() { echo "[$((SECONDS - start))s] $*" | tee -a "$log" >&2; }
say "recording ${#names[@]} programs into $work; budget ${budget}s, deadline ${deadline}s, timeout ${per}s each"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$log" 2>&1
$py -c 'import torch, transformers, torchvision; print("torch", torch.__version__, "transformers", transformers.__version__, "torchvision", torchvision.__version__)' >>"$log" 2>&1

imports=()
for name in "${names[@]}"; do
	now=$((SECONDS - start))
	if [ "$now" -ge "$budget" ]; then
		say "$name: not started (budget ${budget}s spent)"
		echo "{\"name\": \"$name\", \"error\": \"not started: budget of ${budget}s spent\"}" >"$work/$name.json"
		continue
	fi
	limit=$per
	[ $((deadline - now)) -lt "$limit" ] && limit=$((deadline - now))
	say "$name: start (timeout ${limit}s)"
	echo "===== $name: record" >"$work/$name.record.log"
	timeout -k 10 "$limit" $py bench/corpus/record.py --no-import "$name" "$work" >>"$work/$name.record.log" 2>&1
	rc=$?
	cat "$work/$name.record.log" >>"$log"
	if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		say "$name: timed out after ${limit}s"
		echo "{\"name\": \"$name\", \"error\": \"timed out after ${limit}s\"}" >"$work/$name.json"
		rm -f "$work/$name.snapshot.pickle" "$work/$name.snapshot.pickle.tmp"
		continue
	fi
	if [ $rc -ne 0 ]; then
		say "$name: failed (exit $rc); see its traceback above in this log"
		[ -s "$work/$name.json" ] || echo "{\"name\": \"$name\", \"error\": \"record.py exited $rc\"}" >"$work/$name.json"
		rm -f "$work/$name.snapshot.pickle"
		continue
	fi
	say "$name: recorded; importing in the background"
	( timeout -k 5 "$import_limit" $py bench/corpus/record.py --import-only "$name" "$work" >"$work/$name.import.log" 2>&1 ||
		echo "record_all.sh: import of $name failed or timed out (exit $?)" >>"$work/$name.import.log" ) &
	imports+=($!)
done
for pid in "${imports[@]}"; do wait "$pid"; done
for name in "${names[@]}"; do
	if [ -f "$work/$name.import.log" ]; then
		echo "===== $name: import" >>"$log"
		cat "$work/$name.import.log" >>"$log"
	fi
done
say "all done; packing"

# Pack the traces into at most 3 tars of at most 15 MiB, largest first
# (first fit); a trace that fits in none is reported and left out.
$py - "$work" "$out" "${names[@]}" <<'EOF' 2>&1 | tee -a "$log" >&2
import json, os, sys, tarfile
work, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
cap, tars = 15 << 20, 3
bins = [[] for _ in range(tars)]
used = [0] * tars
traces = [(os.path.getsize(os.path.join(work, n + ".trace.gz")), n) for n in names
          if os.path.exists(os.path.join(work, n + ".trace.gz"))]
left_out = {}
for size, n in sorted(traces, reverse=True):
    need = size + 1024  # the tar header and padding
    for i in range(tars):
        if used[i] + need + 10240 <= cap:  # 10 KiB: the end of the archive
            bins[i].append(n)
            used[i] += need + (-size % 512)
            break
    else:
        left_out[n] = size
        print("record_all: %s.trace.gz (%d bytes) fits in no tar; left out" % (n, size))
for i, b in enumerate(bins):
    if b:
        with tarfile.open(os.path.join(out, "corpus-%d.tar" % (i + 1)), "w", format=tarfile.GNU_FORMAT) as t:
            for n in sorted(b):
                t.add(os.path.join(work, n + ".trace.gz"), arcname=n + ".trace.gz")
with open(os.path.join(out, "summary.jsonl"), "w") as f:
    for n in names:
        try:
            with open(os.path.join(work, n + ".json")) as j:
                d = json.loads(j.readline())
        except (OSError, ValueError) as e:
            d = {"name": n, "error": "no summary: %s" % e}
        if n in left_out:
            d["left_out"] = "trace of %d bytes fits in no tar" % left_out[n]
        if "error" not in d and not os.path.exists(os.path.join(work, n + ".trace.gz")):
            d["error"] = "no trace: the import failed or timed out (record.log)"
        f.write(json.dumps(d, sort_keys=True) + "\n")
ok = sum(1 for n in names if os.path.exists(os.path.join(work, n + ".trace.gz")) and n not in left_out)
print("record_all: %d of %d traces packed into %s" % (ok, len(names), out))
EOF
rm -rf "$work"
say "finished"
# What comes back from a device run is at most 16 MiB a file: keep the end.
if [ "$(stat -c %s "$log")" -gt $((15 << 20)) ]; then
	tail -c $((15 << 20)) "$log" >"$log.tmp" && mv "$log.tmp" "$log"
fi
