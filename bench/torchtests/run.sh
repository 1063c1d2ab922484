#!/usr/bin/env bash
# Runs PyTorch's own test/test_cuda.py on the GPU under PyTorch's allocator and
# under gpumem, and prints how many tests pass under each, with every test
# whose outcome differs (issue 28). See bench/torchtests/README.md.
#
#   bash bench/torchtests/run.sh [SELECTION...]
#
# From the repository root of a machine with an NVIDIA GPU, PyTorch and pytest,
# the library built at python/gpumem/libgpumem.so, and PyTorch's test file at
# build/third_party/test_cuda.py (it is not kept in this repository).
#
# SELECTION: graphs (tests whose name contains "graph") and/or memory (name
# contains memory, oom, alloc, stream, cache, fraction, record, snapshot or
# pool, and not graph); default both. all: every test of TEST_FILE (for
# other files of PyTorch's, such as test/inductor/test_cudagraph_trees.py). Each selection runs under each
# allocator in a process of its own: first PyTorch's allocator
# (GPUMEM_TORCH_ALLOCATOR unset), then gpumem (GPUMEM_TORCH_ALLOCATOR=gpumem,
# which sitecustomize.py turns into gpumem.torch.use() at interpreter start).
#
# Environment:
#   OUT              results folder [build/torchtests-out]
#   TEST_FILE        PyTorch's test file [build/third_party/test_cuda.py]
#   PYTHON           interpreter [python3]
#   ALLOCATORS       which runs, in order [native gpumem]
#   TEST_TIMEOUT     seconds one test may take before its process is ended
#                    (its stacks go to the log) [300]
#   RUN_TIMEOUT      seconds one pytest process may take, `timeout` [5400]
#   MAX_ATTEMPTS     pytest processes per run: when one dies (crash, watchdog,
#                    timeout) the test it was in is recorded as crashed and a
#                    new process goes on with the tests left [25]
#   ISOLATE=1        afterwards, run every test whose outcome differs again,
#                    alone in a process of its own, under each allocator
#   ISOLATE_TIMEOUT  seconds for one such process [900]
#   MATCH_CLASS=1    select on "Class.name" rather than the test name alone
#   EXTRA_PYTHONPATH prepended to PYTHONPATH (the harness's own checks use it)
#
# What it leaves in $OUT, per allocator A and selection S:
#   A-S.xml          junit XML of the run (A-S.rN.xml: of its Nth process)
#   A-S.log          pytest's output (-q -rA), every process of the run
#   A-S.jsonl        the run's record (torchtests_plugin.py): selected tests,
#                    starts, finishes, crashes, process exit statuses
#   isolated/A-S/    the ISOLATE=1 reruns, one xml/jsonl/log per test
#   preflight.txt    what each allocator's interpreter had (torch, device,
#                    allocator backend, stand-ins in use)
#   compare.txt      compare.py's table and differences
#
# Exit status: 0 when every run finished (whatever its tests did), 1 when a
# run could not start or gave up, 2 on bad usage.

set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO" || exit 2

PY=${PYTHON:-python3}
OUT=${OUT:-build/torchtests-out}
TEST_FILE=${TEST_FILE:-build/third_party/test_cuda.py}
ALLOCATORS=${ALLOCATORS:-native gpumem}
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
RUN_TIMEOUT=${RUN_TIMEOUT:-5400}
MAX_ATTEMPTS=${MAX_ATTEMPTS:-25}
ISOLATE=${ISOLATE:-0}
ISOLATE_TIMEOUT=${ISOLATE_TIMEOUT:-900}
MATCH_CLASS=${MATCH_CLASS:-0}

if [ $# -eq 0 ]; then
	set -- graphs memory
fi
for sel in "$@"; do
	case "$sel" in
	graphs | memory | all) ;;
	*) echo "run.sh: unknown selection '$sel' (want graphs, memory and/or all)" >&2; exit 2 ;;
	esac
done
for a in $ALLOCATORS; do
	case "$a" in
	native | gpumem) ;;
	*) echo "run.sh: unknown allocator '$a' in ALLOCATORS (want native and/or gpumem)" >&2; exit 2 ;;
	esac
done

include_of() { case "$1" in graphs) echo graph ;; memory) echo memory,oom,alloc,stream,cache,fraction,record,snapshot,pool ;; all) echo "" ;; esac; }
exclude_of() { case "$1" in graphs) echo "" ;; memory) echo graph ;; all) echo "" ;; esac; }

if [ ! -f "$TEST_FILE" ]; then
	echo "run.sh: $TEST_FILE is missing: PyTorch's test/test_cuda.py goes there (see bench/torchtests/README.md)" >&2
	exit 1
fi
if [[ " $ALLOCATORS " == *" gpumem "* ]] && [ -z "${GPUMEM_LIBRARY:-}" ] && [ ! -f python/gpumem/libgpumem.so ]; then
	echo "run.sh: python/gpumem/libgpumem.so is missing: build the library first (scripts/lib.sh)" >&2
	exit 1
fi

# A clean baseline: nothing that changes PyTorch's allocator, which tests run,
# or how they run, comes in from the caller's environment.
for v in PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF PYTORCH_HIP_ALLOC_CONF \
	PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_TEST_SKIP_CUDAGRAPH PYTORCH_TEST_WITH_SLOW \
	PYTORCH_TEST_SKIP_FAST PYTORCH_TEST_WITH_ROCM PYTORCH_TEST_WITH_DYNAMO \
	PYTORCH_TEST_WITH_INDUCTOR PYTORCH_TEST_CUDA_MEM_LEAK_CHECK PYTORCH_TESTING_DEVICE_ONLY_FOR \
	PYTORCH_TESTING_DEVICE_EXCEPT_FOR PYTORCH_TEST_FBCODE CUDA_LAUNCH_BLOCKING CI IN_CI \
	SANDCASTLE TW_JOB_USER EXPECTTEST_ACCEPT GPUMEM_TORCH_ALLOCATOR GPUMEM_TORCH_INHERIT; do
	unset "$v"
done

# PYTHONPATH: the package (python/), sitecustomize.py and the pytest plugin
# (bench/torchtests), and a stand-in for expecttest / psutil only where the
# real module is missing.
base_path="python:bench/torchtests"
[ -n "${EXTRA_PYTHONPATH:-}" ] && base_path="$EXTRA_PYTHONPATH:$base_path"
stand_ins=""
if ! PYTHONPATH="$base_path" "$PY" -c 'import expecttest' >/dev/null 2>&1; then
	base_path="$base_path:bench/torchtests/stubs"
	stand_ins="$stand_ins expecttest"
fi
if ! PYTHONPATH="$base_path" "$PY" -c 'import psutil' >/dev/null 2>&1; then
	base_path="$base_path:bench/torchtests/stubs_psutil"
	stand_ins="$stand_ins psutil"
fi
export PYTHONPATH="$base_path"

mkdir -p "$OUT"
echo "run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) test file $TEST_FILE ($(wc -c <"$TEST_FILE") bytes), stand-ins:${stand_ins:- none}" >"$OUT/preflight.txt"

# alloc_env ALLOC: the env(1) arguments that select ALLOC.
alloc_env() {
	if [ "$1" = gpumem ]; then
		echo "GPUMEM_TORCH_ALLOCATOR=gpumem"
	else
		echo "-u GPUMEM_TORCH_ALLOCATOR"
	fi
}

status=0
for alloc in $ALLOCATORS; do
	# shellcheck disable=SC2046
	if ! env $(alloc_env "$alloc") "$PY" bench/torchtests/preflight.py "$alloc" "$TEST_FILE" >>"$OUT/preflight.txt" 2>&1; then
		echo "run.sh: preflight for '$alloc' failed; see $OUT/preflight.txt:" >&2
		tail -5 "$OUT/preflight.txt" >&2
		exit 1
	fi
done
cat "$OUT/preflight.txt"

# pytest_run ALLOC LOG RECORD JUNIT SECONDS ARGS...: one pytest process.
pytest_run() {
	local alloc=$1 log=$2 rec=$3 junit=$4 secs=$5
	shift 5
	# shellcheck disable=SC2046
	timeout -k 30 "$secs" env $(alloc_env "$alloc") "$PY" -m pytest "$@" \
		-p torchtests_plugin -p no:cacheprovider -q -rA \
		--junitxml="$junit" --tt-record="$rec" --tt-test-timeout="$TEST_TIMEOUT" --tt-stacks="$log" >>"$log" 2>&1
}

# run_selection ALLOC SEL: the whole selection, in as many processes as it
# takes (a new one after each that dies), up to MAX_ATTEMPTS.
run_selection() {
	local alloc=$1 sel=$2
	local rec="$OUT/$alloc-$sel.jsonl" log="$OUT/$alloc-$sel.log"
	local match=()
	[ "$MATCH_CLASS" = 1 ] && match=(--tt-match-class)
	rm -f "$rec" "$log" "$OUT/$alloc-$sel".xml "$OUT/$alloc-$sel".r*.xml
	local attempt=1 rc
	while :; do
		local junit="$OUT/$alloc-$sel.xml"
		[ "$attempt" -gt 1 ] && junit="$OUT/$alloc-$sel.r$attempt.xml"
		echo "=== run.sh: $alloc $sel, process $attempt, $(date -u +%H:%M:%S)" >>"$log"
		pytest_run "$alloc" "$log" "$rec" "$junit" "$RUN_TIMEOUT" "$TEST_FILE" \
			--tt-include="$(include_of "$sel")" --tt-exclude="$(exclude_of "$sel")" ${match[@]+"${match[@]}"}
		rc=$?
		echo "{\"attempt\": $attempt, \"event\": \"process_end\", \"rc\": $rc}" >>"$rec"
		echo "=== run.sh: $alloc $sel, process $attempt ended with status $rc" >>"$log"
		if grep -q "\"attempt\": $attempt, \"event\": \"session_finish\"" "$rec"; then
			echo "run.sh: $alloc $sel: done in $attempt process(es), pytest status $rc"
			return 0
		fi
		if ! grep -q "\"attempt\": $attempt, \"event\": \"start\"" "$rec"; then
			echo "run.sh: $alloc $sel: process $attempt (status $rc) ended before running a test; giving up (see $log)" >&2
			return 1
		fi
		if [ "$attempt" -ge "$MAX_ATTEMPTS" ]; then
			echo "run.sh: $alloc $sel: $attempt processes died; giving up with tests left (see $log)" >&2
			return 1
		fi
		echo "run.sh: $alloc $sel: process $attempt died (status $rc) during a test; going on in a new one"
		attempt=$((attempt + 1))
	done
}

# isolate SEL: each test whose outcome differs, alone, under each allocator.
isolate() {
	local sel=$1 key nodeid safe dir
	local keys
	keys=$("$PY" bench/torchtests/compare.py --differing "$sel" "$OUT") || return 1
	[ -z "$keys" ] && { echo "run.sh: $sel: no differing test to isolate"; return 0; }
	while IFS= read -r key; do
		[ -z "$key" ] && continue
		if [[ "$key" == ::* ]]; then nodeid="$TEST_FILE$key"; else nodeid="$TEST_FILE::$key"; fi
		safe=$(printf '%s' "$key" | tr -c 'A-Za-z0-9_.-' '_')
		for alloc in $ALLOCATORS; do
			dir="$OUT/isolated/$alloc-$sel"
			mkdir -p "$dir"
			rm -f "$dir/$safe".*
			pytest_run "$alloc" "$dir/$safe.log" "$dir/$safe.jsonl" "$dir/$safe.xml" "$ISOLATE_TIMEOUT" "$nodeid"
			echo "{\"attempt\": 1, \"event\": \"process_end\", \"rc\": $?}" >>"$dir/$safe.jsonl"
		done
		echo "run.sh: $sel: isolated $key"
	done <<<"$keys"
}

for sel in "$@"; do
	for alloc in $ALLOCATORS; do
		run_selection "$alloc" "$sel" || status=1
	done
	if [ "$ISOLATE" = 1 ]; then
		isolate "$sel" || status=1
	fi
done

# What the run wrote names no path of this machine (results are kept in
# bench/results): the repository's root goes, Python's site-packages and
# standard library become site-packages/ and python3.X/.
"$PY" - "$OUT" "$REPO" <<'PY'
import os, site, sys, sysconfig
out, repo = sys.argv[1], sys.argv[2]
subs = [(repo.rstrip("/") + "/", "")]
for p in set(site.getsitepackages() + [site.getusersitepackages()]):
    subs.append((p.rstrip("/") + "/", "site-packages/"))
std = sysconfig.get_paths()["stdlib"].rstrip("/")
subs.append((std + "/", os.path.basename(std) + "/"))
subs.sort(key=lambda s: -len(s[0]))
for d, _, names in os.walk(out):
    for n in names:
        if n.endswith((".xml", ".log", ".jsonl", ".txt")):
            f = os.path.join(d, n)
            with open(f, encoding="utf-8", errors="surrogateescape") as fh:
                text = fh.read()
            new = text
            for a, b in subs:
                new = new.replace(a, b)
            if new != text:
                with open(f, "w", encoding="utf-8", errors="surrogateescape") as fh:
                    fh.write(new)
PY
"$PY" bench/torchtests/compare.py "$OUT" | tee "$OUT/compare.txt"
exit "$status"
