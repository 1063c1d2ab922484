#!/usr/bin/env bash
# The GPU measurements of issue 10 (JAX under gpumem run) in one device call
# of at most 9 minutes.
#
#   bench/jax/gpu_issue10.sh build   here, with Go and cc: everything the run
#                                    needs into build/issue10/ (the CLI, the
#                                    library, the shim, shimbench); carry
#                                    that folder
#   bench/jax/gpu_issue10.sh run     on the GPU machine (JAX and pynvml, no
#                                    Go), from the repository root; writes
#                                    under $OUT (6 files) and prints the
#                                    summary
#
# Parts, each in processes of its own with a time limit, errors kept:
#   1. shimbench against the real driver, without the shim (the driver's own
#      cuda_async pair, and gpumem called directly) and with it (JAX's pair
#      through the shim, and each part of the path): shimbench_driver.txt,
#      shimbench_shim.txt
#   2. mlp, lm, rebuild (bench/jax/programs.py), each under BFC growth and
#      gpumem run alternately in separate processes, A/B/A/B (the second
#      gpumem run trims at once; the first waits for the idle release), as
#      long as the time allows (--deadline): jax_ab.jsonl, jax_ab.log, and
#      the tables in jax_ab.md (PROGRAMS=a,b and JAX_MODES=a,b choose others,
#      such as gpumem-compact)
#   summary.txt: the machine, the commit, and both parts' tables
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${BUILD_DIR:-build/issue10} # bench/jax/gpu_lmperf.sh builds into its own

build() {
	set -e
	mkdir -p "$dir"
	# Stripped (-s -w): the device tool carries at most 64 MiB with the
	# tree, of which the tree (traces, results) takes about 40.
	CGO_ENABLED=0 go build -ldflags="-s -w" -o "$dir/gpumem" ./cmd/gpumem
	CGO_ENABLED=1 go build -buildmode=c-shared -trimpath -ldflags="-s -w" -o "$dir/libgpumem.so" ./clib
	rm -f "$dir/libgpumem.h"
	cc -O2 -Wall -fPIC -shared -o "$dir/libgpumem_preload.so" shim/c/preload.c shim/c/gate.c -ldl -lpthread
	cc -O2 -Wall -o "$dir/shimbench" shim/c/shimbench.c -ldl
	git describe --always --dirty >"$dir/COMMIT" 2>/dev/null || true
	du -sh "$dir"
}

run() {
	local out=${OUT:-$dir/out} budget=${BUDGET:-530} t0=$SECONDS
	mkdir -p "$out"
	local lib=$PWD/$dir/libgpumem.so shim=$PWD/$dir/libgpumem_preload.so
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
		echo "commit $(cat "$dir/COMMIT" 2>/dev/null)"
		python3 -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -1
	} >"$out/summary.txt"

	echo "== shimbench (driver, then shim)" >&2
	GPUMEM_LIBRARY=$lib timeout 90 "$dir/shimbench" >"$out/shimbench_driver.txt" 2>&1 ||
		echo "shimbench without the shim: exit $?" >>"$out/shimbench_driver.txt"
	GPUMEM_LIBRARY=$lib GPUMEM_PRELOAD_REPORT=1 LD_PRELOAD=$shim timeout 90 "$dir/shimbench" >"$out/shimbench_shim.txt" 2>&1 ||
		echo "shimbench under the shim: exit $?" >>"$out/shimbench_shim.txt"

	local left=$((budget - (SECONDS - t0) - 15))
	echo "== JAX A/B ($left s left)" >&2
	timeout $((left + 10)) python3 bench/jax/suite.py --programs "${PROGRAMS:-mlp,lm,rebuild}" \
		--modes "${JAX_MODES:-bfc-growth,gpumem,bfc-growth2,gpumem-trim}" --gpumem "$dir/gpumem" --timeout 150 \
		--deadline "$left" --ab --out "$out/jax_ab.jsonl" >"$out/jax_ab.md" 2>"$out/jax_ab.log" ||
		echo "suite.py: exit $?" >>"$out/jax_ab.log"
	# The tables again, from what was written (suite.py may have been cut off).
	python3 -c 'import sys; sys.path.insert(0, "bench/jax"); import suite; print(suite.ab_table(sys.argv[1]))' \
		"$out/jax_ab.jsonl" >"$out/jax_ab.md" 2>>"$out/jax_ab.log" || echo "table: exit $?" >>"$out/jax_ab.log"

	{
		echo
		echo "## shimbench, the driver's own calls"
		cat "$out/shimbench_driver.txt"
		echo
		echo "## shimbench through the shim"
		cat "$out/shimbench_shim.txt"
		echo
		echo "## JAX, BFC growth and gpumem run alternating"
		cat "$out/jax_ab.md"
		echo
		echo "## runs"
		grep -E " (ok|FAILED|skipped)" "$out/jax_ab.log"
		echo
		echo "## the shim's reports (captures begun, allocations passed to the driver while captured)"
		grep -h '"preload"' "$out/jax_ab.jsonl" 2>/dev/null
	} >>"$out/summary.txt"
	cat "$out/summary.txt"
	echo "total $((SECONDS - t0)) s" >&2
}

case ${1:-} in
build) build ;;
run) run ;;
*) sed -n '2,28p' "$0"; exit 2 ;;
esac
