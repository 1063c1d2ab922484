#!/bin/bash
# Fifth holdout: record the six under native (memory history), then real runs while time remains.
cd "$(dirname "$0")/../.."
start=$SECONDS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__)'; git log -1 --format='COMMIT %H' 2>/dev/null; } > $OUT/machine.txt 2>&1
progs="mamba_scan_lm swin_train nerf_rays save_on_cpu_train dpsgd_per_sample rnnt_asr"
bash bench/corpus/record_all.sh --timeout 150 --budget 300 --deadline 380 --import-timeout 60 --out $OUT/rec $progs
echo "recorded at $((SECONDS-start)) s"
for alloc in gpumem expandable; do
  for p in $progs; do
    [ $((SECONDS-start)) -gt 520 ] && { echo "time: skip $p $alloc"; continue; }
    timeout 120 python3 bench/corpus/run.py $p $alloc --out $OUT/real-call1.jsonl --tag r1 > $OUT/run-$p-$alloc.log 2>&1 || echo "FAIL $p $alloc"
    tail -c 400 $OUT/run-$p-$alloc.log | tail -2
  done
done
echo "done at $((SECONDS-start)) s"
