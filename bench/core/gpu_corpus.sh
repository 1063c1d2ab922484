#!/usr/bin/env bash
# The H100 run of issue 11's speed and fit bars on the corpus, in one device
# call of at most 9 minutes.
#
#   bench/core/gpu_corpus.sh build   here: build/gpu/gpumem (static, no cgo)
#   bench/core/gpu_corpus.sh run     there, from the repository root (PyTorch,
#                                    nvcc and ninja for the C++ peer): for each
#                                    trace of TRACES (default: the corpus, tune
#                                    then holdout, then the shipped traces),
#                                    gpumem replay on the real device over
#                                    PASSES passes (default 10) and PyTorch's
#                                    allocator as shipped and with expandable
#                                    segments driven from C++ over the same
#                                    passes, until BUDGET seconds (default 480);
#                                    REPLAY_ARGS (such as --compact) go to
#                                    gpumem replay, PEERS=0 skips the peers
#
# Writes $OUT/gpumem_cuda.jsonl, $OUT/peers.jsonl, $OUT/peers.log and
# $OUT/run.log; the tables come from bench/core/speed_table.py here.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
	mkdir -p build/gpu
	# Stripped: what the device tool carries shares 64 MiB with the tree.
	CGO_ENABLED=0 go build -ldflags="-s -w" -o build/gpu/gpumem ./cmd/gpumem
	git describe --always --dirty >build/gpu/COMMIT
	;;
run)
	out=${OUT:-bench/out/corpus_gpu}
	mkdir -p "$out"
	passes=${PASSES:-10} budget=${BUDGET:-480}
	start=$SECONDS
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
		cat build/gpu/COMMIT
	} >"$out/run.log" 2>&1
	traces=${TRACES:-$(python3 - <<'PY'
import re
rows = [l.split("|") for l in open("bench/corpus/MANIFEST.md") if l.startswith("| ") and "|" in l[2:]]
names = [(r[2].strip(), r[1].strip()) for r in rows if len(r) > 3 and r[2].strip() in ("tune", "holdout")]
order = [n for s, n in names if s == "tune"] + [n for s, n in names if s == "holdout"]
print(" ".join("bench/corpus/traces/%s.trace.gz" % n for n in order))
PY
) $(ls testdata/traces/*.trace.gz)}
	for t in $traces; do
		if [ $((SECONDS - start)) -ge "$budget" ]; then
			echo "budget spent: $t not run" >>"$out/run.log"
			continue
		fi
		echo "[$((SECONDS - start))s] $t" >>"$out/run.log"
		timeout 120 build/gpu/gpumem replay --device cuda --json --passes "$passes" ${REPLAY_ARGS:-} "$t" >>"$out/gpumem_cuda.jsonl" 2>>"$out/run.log" ||
			echo "gpumem failed on $t: $?" >>"$out/run.log"
		[ "${PEERS:-1}" = 0 ] && continue
		OUT="$out" bash bench/peers/run_all.sh --peers torch-native-cxx,torch-expandable-cxx --no-warm \
			--passes "$passes" --timeout 120 --out "$out/peers.jsonl" "$t" >>"$out/run.log" 2>&1 ||
			echo "peers failed on $t" >>"$out/run.log"
	done
	echo "total $((SECONDS - start)) s" >>"$out/run.log"
	tail -5 "$out/run.log"
	;;
*)
	sed -n '2,16p' "$0"
	exit 2
	;;
esac
