#!/usr/bin/env bash
# Config.Defrag on the H100, in one device call of at most 10 minutes.
#
#   bench/core/defrag_gpu.sh build [BASE]
#                                    here: build/dg/ (the CLI and the GPU
#                                    test binaries, stripped and gzipped:
#                                    they share 64 MiB with the tree); with
#                                    BASE (a commit) also that commit's CLI,
#                                    which run replays with --defrag beside
#                                    the working tree's (base.jsonl)
#   bench/core/defrag_gpu.sh run     there, from the repository root: the
#                                    GPU tests of Defrag and the conformance
#                                    suite (its virtual/defrag configuration
#                                    included), then each trace of TRACES
#                                    (default: the tune programs and the
#                                    shipped traces) replayed on the real
#                                    device over 10 passes by default, then
#                                    with --defrag, alternating, ROUNDS times
#                                    (default 1), then PyTorch's allocator as
#                                    shipped and with expandable segments from
#                                    C++ on the same traces until BUDGET
#                                    seconds (default 540) are spent
#
# Writes $OUT/tests.txt, $OUT/default.jsonl, $OUT/defrag.jsonl,
# $OUT/base.jsonl (with BASE), $OUT/peers.jsonl and $OUT/run.log; tables from bench/core/speed_table.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
	rm -rf build/dg && mkdir -p build/dg
	CGO_ENABLED=0 go build -ldflags="-s -w" -o build/dg/gpumem ./cmd/gpumem
	CGO_ENABLED=0 go test -c -ldflags="-s -w" -o build/dg/gputest.test ./internal/gputest
	gzip -9 build/dg/gpumem build/dg/gputest.test
	git describe --always --dirty >build/dg/COMMIT
	if [ -n "${2:-}" ]; then
		bash bench/core/build_cli_at.sh "$2" build/dg/base
		gzip -9 build/dg/base
		git rev-parse --short "$2" >>build/dg/COMMIT
	fi
	;;
run)
	out=${OUT:-bench/out/defrag_gpu}
	mkdir -p "$out"
	budget=${BUDGET:-540} rounds=${ROUNDS:-1}
	start=$SECONDS
	gunzip -kf build/dg/*.gz
	chmod +x build/dg/gpumem build/dg/gputest.test
	modes="default defrag"
	if [ -f build/dg/base ]; then
		chmod +x build/dg/base
		modes="$modes base"
	fi
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
		cat build/dg/COMMIT
	} >"$out/run.log" 2>&1
	build/dg/gputest.test -test.run 'Conformance|DataReadsBack' -test.v >"$out/tests.txt" 2>&1
	echo "tests: exit $? [$((SECONDS - start))s]" >>"$out/run.log"
	traces=${TRACES:-$(python3 - <<'PY'
import re
rows = [l.split("|") for l in open("bench/corpus/MANIFEST.md") if l.startswith("| ") and "|" in l[2:]]
print(" ".join("bench/corpus/traces/%s.trace.gz" % r[1].strip() for r in rows if len(r) > 3 and r[2].strip() == "tune"))
PY
) $(ls testdata/traces/*.trace.gz)}
	for r in $(seq "$rounds"); do
		for t in $traces; do
			for mode in $modes; do
				args="" bin=build/dg/gpumem
				[ "$mode" != default ] && args=--defrag
				[ "$mode" = base ] && bin=build/dg/base
				timeout 120 $bin replay --device cuda --json --passes 10 $args "$t" >>"$out/$mode.jsonl" 2>>"$out/run.log" ||
					echo "$mode failed on $t: $?" >>"$out/run.log"
			done
			echo "[$((SECONDS - start))s] round $r $t" >>"$out/run.log"
		done
	done
	for t in $traces; do
		if [ $((SECONDS - start)) -ge "$budget" ]; then
			echo "budget spent: peers not run on $t" >>"$out/run.log"
			continue
		fi
		OUT="$out" bash bench/peers/run_all.sh --peers torch-native-cxx,torch-expandable-cxx --no-warm \
			--passes 10 --timeout 120 --out "$out/peers.jsonl" "$t" >>"$out/run.log" 2>&1 ||
			echo "peers failed on $t" >>"$out/run.log"
		echo "[$((SECONDS - start))s] peers $t" >>"$out/run.log"
	done
	echo "total $((SECONDS - start)) s" >>"$out/run.log"
	;;
*)
	echo "usage: $0 build|run" >&2
	exit 2
	;;
esac
