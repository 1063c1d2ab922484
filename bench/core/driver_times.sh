#!/usr/bin/env bash
# Where replay time goes on the real driver, call by call (replay
# --driver-times), in one device call.
#
#   bench/core/driver_times.sh build   here: build/dt/ (the CLI, stripped and
#                                      gzipped; with BASE=COMMIT also that
#                                      commit's CLI as build/dt/base.gz)
#   bench/core/driver_times.sh run     there, from the repository root: each
#                                      trace of TRACES (default: the tune
#                                      programs, the shipped traces and
#                                      rand0-2 of bench/synth, generated
#                                      there) under each mode of MODES
#                                      (default, defrag, compact; "base" runs
#                                      build/dt/base by default, "base-compact"
#                                      and "base-defrag" with those flags), PASSES
#                                      passes (default 3), ROUNDS rounds
#                                      (default 1), until BUDGET seconds
#                                      (default 500) are spent; DEVICE=sim
#                                      tries the script here
#
# Writes $OUT/<mode>.jsonl and $OUT/run.log; the table:
# python3 bench/core/driver_table.py $OUT/*.jsonl
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
	rm -rf build/dt && mkdir -p build/dt
	CGO_ENABLED=0 go build -ldflags="-s -w" -o build/dt/gpumem ./cmd/gpumem
	git describe --always --dirty >build/dt/COMMIT
	if [ -n "${BASE:-}" ]; then
		bash bench/core/build_cli_at.sh "$BASE" build/dt/base
		git rev-parse --short "$BASE" >>build/dt/COMMIT
	fi
	gzip -9 build/dt/gpumem build/dt/base 2>/dev/null
	ls -l build/dt
	;;
run)
	out=${OUT:-bench/out/driver_times}
	mkdir -p "$out"
	budget=${BUDGET:-500} rounds=${ROUNDS:-1} passes=${PASSES:-3}
	modes=${MODES:-default defrag compact}
	start=$SECONDS
	gunzip -kf build/dt/*.gz
	chmod +x build/dt/gpumem
	[ -f build/dt/base ] && chmod +x build/dt/base
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
		cat build/dt/COMMIT
	} >"$out/run.log" 2>&1
	synth=$(mktemp -d)
	if [ -z "${TRACES:-}" ]; then
		python3 bench/synth/gen.py "$synth" 100 3 >>"$out/run.log" 2>&1
	fi
	traces=${TRACES:-$(python3 - <<'PY'
rows = [l.split("|") for l in open("bench/corpus/MANIFEST.md") if l.startswith("| ") and "|" in l[2:]]
print(" ".join("bench/corpus/traces/%s.trace.gz" % r[1].strip() for r in rows if len(r) > 3 and r[2].strip() == "tune"))
PY
) $(ls testdata/traces/*.trace.gz) $(ls "$synth"/rand[012].trace* 2>/dev/null)}
	for r in $(seq "$rounds"); do
		for t in $traces; do
			for mode in $modes; do
				if [ $((SECONDS - start)) -ge "$budget" ]; then
					echo "budget spent before $mode $t" >>"$out/run.log"
					break 3
				fi
				bin=build/dt/gpumem args=""
				case $mode in
				defrag) args=--defrag ;;
				compact) args=--compact ;;
				base) bin=build/dt/base ;;
				base-compact) bin=build/dt/base args=--compact ;;
				base-defrag) bin=build/dt/base args=--defrag ;;
				esac
				timeout 120 $bin replay --device "${DEVICE:-cuda}" --json --driver-times --passes "$passes" $args "$t" |
					python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["label"] = sys.argv[1]; print(json.dumps(d))' "$mode" >>"$out/$mode.jsonl" 2>>"$out/run.log" ||
					echo "$mode failed on $t" >>"$out/run.log"
			done
			echo "[$((SECONDS - start))s] round $r $t" >>"$out/run.log"
		done
	done
	rm -rf "$synth"
	;;
*)
	echo "usage: $0 build|run" >&2
	exit 2
	;;
esac
