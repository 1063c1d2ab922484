#!/usr/bin/env bash
# Two builds of the CLI under Config.Compact, side by side on the H100, with
# PyTorch's allocators from C++ in the same device call.
#
#   BASE=COMMIT bash bench/core/driver_times.sh build    here: build/dt/gpumem.gz
#                                                        and build/dt/base.gz
#   SET=holdout|tune OUT=... bash bench/core/compact_ab.sh   there
#
# For each program of the set (bench/corpus/MANIFEST.md's holdout rows, or
# its tune rows and the shipped traces), `replay --device cuda --json
# --passes 3 --compact` by the base build and by this one, alternating, into
# $OUT/base.jsonl and $OUT/new.jsonl; then PyTorch as shipped and with
# expandable segments from C++ on every program (bench/peers/run_all.sh,
# three passes) into $OUT/peers.jsonl. Skip the peers with PEERS=none.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out/compact_ab}
mkdir -p "$out"
gunzip -kf build/dt/*.gz
chmod +x build/dt/gpumem build/dt/base
traces=$(python3 - "${SET:-holdout}" <<'PY'
import glob, sys
rows = [l.split("|") for l in open("bench/corpus/MANIFEST.md") if l.startswith("| ") and "|" in l[2:]]
want = sys.argv[1]
t = ["bench/corpus/traces/%s.trace.gz" % r[1].strip() for r in rows if len(r) > 3 and r[2].strip() == want]
if want == "tune":
    t += sorted(glob.glob("testdata/traces/*.trace.gz"))
print(" ".join(t))
PY
)
{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	cat build/dt/COMMIT
} >"$out/run.log" 2>&1
for t in $traces; do
	for b in base new; do
		bin=build/dt/gpumem
		[ $b = base ] && bin=build/dt/base
		timeout 200 $bin replay --device cuda --json --passes 3 --compact "$t" >>"$out/$b.jsonl" 2>>"$out/run.log" ||
			echo "$b failed on $t" >>"$out/run.log"
	done
done
if [ "${PEERS:-}" != none ]; then
	OUT=$out bash bench/peers/run_all.sh --peers torch-native-cxx,torch-expandable-cxx --no-warm --passes 3 \
		--timeout 120 --out "$out/peers.jsonl" $traces >/dev/null 2>&1
fi
echo "done in $SECONDS s" >>"$out/run.log"
