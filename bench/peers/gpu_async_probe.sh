#!/usr/bin/env bash
# The cuda-async emulation's data: CUDA's default memory pool replayed event
# by event (bench/peers/async_probe.py) on the shipped traces (three passes),
# the kv, serve and rand synthetic traces (seeds 100-104) and the corpus (one
# pass; streams collapsed onto the default stream), one process per trace.
#
#   bench/peers/gpu_async_probe.sh build   here: the synthetic traces into
#                                          build/probe/synth; carry build/probe
#   bench/peers/gpu_async_probe.sh run     on the GPU machine; writes $OUT/probe
#                                          (NAME.npz, probe.jsonl, probe.log)
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=build/probe

case ${1:-} in
build)
	rm -rf "$dir" && mkdir -p "$dir/synth"
	python3 bench/synth/gen.py "$dir/synth" >/dev/null
	find "$dir/synth" -name '*.gz' ! -name 'kv*' ! -name 'serve*' ! -name 'rand*' -delete
	ls "$dir/synth" | wc -l
	;;
run)
	out=${OUT:-$dir/out}/probe budget=${BUDGET:-400} t0=$SECONDS
	mkdir -p "$out"
	one() { # PASSES TRACE
		[ $((SECONDS - t0)) -lt "$budget" ] || { echo "skipped $2: budget" >>"$out/probe.log"; return; }
		timeout 120 python3 bench/peers/async_probe.py "$out" "$2" --passes "$1" >>"$out/probe.jsonl" 2>>"$out/probe.log" ||
			echo "$2: exit $?" >>"$out/probe.log"
	}
	for t in testdata/traces/*.trace.gz; do one 3 "$t"; done
	for t in "$dir"/synth/*.gz; do one 1 "$t"; done
	for t in bench/corpus/traces/*.trace.gz; do one 1 "$t"; done
	cat "$out/probe.jsonl" "$out/probe.log"
	echo "total $((SECONDS - t0)) s"
	;;
*) sed -n '2,12p' "$0"; exit 2 ;;
esac
