#!/usr/bin/env bash
# Three JAX programs on one GPU under gpumem run, each with its own limit:
# two that fit (the MLP, 3 GiB live, under 8 GiB each) and one that cannot
# (the LM, 26 GiB live, under 8 GiB). The two must finish with their NVML
# peaks under their limits plus the CUDA context, the third must fail with
# gpumem's verdict, and the others must be unharmed. Writes OUT/limits.txt.
set -u
cd "$(dirname "$0")/../.."
G=${GPUMEM:-build/gpu/gpumem}
out=${OUT:-/tmp}
run() { $G run --limit 8GiB -- python3 bench/jax/run.py "$1" "limit-$2" --wait 0.1 --out "$out/limits.jsonl" >"$out/limit_$2.out" 2>"$out/limit_$2.err"; echo $? >"$out/limit_$2.rc"; }
run mlp a & run mlp b & sleep 5; run lm c & wait
{
	for p in a b c; do echo "== $p: exit $(cat "$out/limit_$p.rc")"; grep -E "gpumem: out of memory|RESOURCE_EXHAUSTED|Error" "$out/limit_$p.err" | head -3; done
	python3 -c "
import json
for l in open('$out/limits.jsonl'):
    r = json.loads(l)
    print(r['mode'], 'peak MiB', r['nvml_peak_bytes'] >> 20, 'start MiB', r['nvml_start_bytes'] >> 20, 'limit MiB', 8192)
"
} >"$out/limits.txt" 2>&1
cat "$out/limits.txt"
