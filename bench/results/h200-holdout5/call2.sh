#!/bin/bash
# Fifth holdout: record the six under native (memory history) again (call 1's traces did not come back),
# then one native real run each; everything into one tar under $OUT.
cd "$(dirname "$0")/../.."
start=$SECONDS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
w=/tmp/h5; rm -rf $w; mkdir -p $w
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__)'; } > $w/machine.txt 2>&1
progs="mamba_scan_lm swin_train nerf_rays save_on_cpu_train dpsgd_per_sample rnnt_asr"
bash bench/corpus/record_all.sh --timeout 150 --budget 300 --deadline 380 --import-timeout 60 --out $w/rec $progs > $w/record_all.out 2>&1
echo "recorded at $((SECONDS-start)) s"
for p in $progs; do
  [ $((SECONDS-start)) -gt 480 ] && { echo "time: skip $p native"; continue; }
  timeout 120 python3 bench/corpus/run.py $p native --out $w/real-call2.jsonl --tag r1 > $w/run-$p-native.log 2>&1 || echo "FAIL $p native"
done
tar cf $OUT/h5.tar -C /tmp h5
ls -la $OUT; tar tf $OUT/h5.tar | head -30
echo "done at $((SECONDS-start)) s"
