#!/usr/bin/env bash
# Issue 10's LM step time: XLA's cuda_async mode against gpumem's cost, in
# one device call of at most 5 minutes.
#
#   bench/jax/gpu_lmperf.sh build   here, with Go and cc: the CLI, the
#                                   library and the shim into build/lmperf/;
#                                   carry that folder
#   [MODES=a,b] [PROGRAM=mlp LENGTHS=512,2048,8192] [REPEATS=2] bench/jax/gpu_lmperf.sh run
#                                   on the GPU machine (JAX, no Go), from the
#                                   repository root; writes under $OUT
#                                   (lmperf.jsonl, lmperf.md, lmperf.log)
#                                   and prints the summary
#
# bench/jax/lmperf.py: the lm program at lengths 256 and 1024, in processes
# of their own, round by round: BFC growth, XLA's cuda_async on the driver's
# pool, gpumem run, then both BFC growth and gpumem run with XLA's command
# buffers off; two rounds. Per length: each run's median step, each mode's
# mean against BFC growth, how many distinct output address sets the steps
# got, and each run's shim report (stream captures, calls per entry point;
# under BFC and cuda_async with GPUMEM_PRELOAD_PASSTHROUGH=1).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=build/lmperf

build() {
	BUILD_DIR=$dir bash bench/jax/gpu_issue10.sh build # the same files, shimbench too
}

run() {
	local out=${OUT:-$dir/out} budget=${BUDGET:-280} t0=$SECONDS
	mkdir -p "$out"
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
		echo "commit $(cat "$dir/COMMIT" 2>/dev/null)"
		python3 -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -1
	} >"$out/summary.txt"
	local left=$((budget - (SECONDS - t0) - 10))
	GPUMEM_LIBRARY=$PWD/$dir/libgpumem.so timeout $((left + 10)) python3 bench/jax/lmperf.py \
		--gpumem "$dir/gpumem" --shim "$PWD/$dir/libgpumem_preload.so" --lengths "${LENGTHS:-256,1024}" --steps 16 ${MODES:+--modes "$MODES"} ${PROGRAM:+--program "$PROGRAM"} \
		--repeats "${REPEATS:-2}" --timeout 120 --deadline "$left" --out "$out/lmperf.jsonl" >"$out/lmperf.md" 2>"$out/lmperf.log" ||
		echo "lmperf.py: exit $?" >>"$out/lmperf.log"
	{
		echo
		cat "$out/lmperf.md"
		echo
		echo "## runs"
		cat "$out/lmperf.log"
	} >>"$out/summary.txt"
	cat "$out/summary.txt"
	echo "total $((SECONDS - t0)) s" >&2
}

case ${1:-} in
build) build ;;
run) run ;;
*) sed -n '2,20p' "$0"; exit 2 ;;
esac
