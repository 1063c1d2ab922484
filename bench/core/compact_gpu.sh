#!/usr/bin/env bash
# The H100 check of Config.Compact (docs/EXPERIMENTS.md, "Compact
# placement"), in two device calls:
#
#   here:  bench/core/gpu_corpus.sh build
#          go test -c -o build/gpu/cuda.test ./device/cuda
#          go test -c -o build/gpu/gputest.test ./internal/gputest
#   there: bash bench/core/compact_gpu.sh tests   # driver and data tests, compact replays
#          bash bench/core/compact_gpu.sh peers   # the default and PyTorch's allocators, compact again
#
# Results under $OUT; tables from bench/core/speed_table.py.
set -u
OUT=${OUT:-bench/out/compact_gpu}
mkdir -p "$OUT"
T="bench/corpus/traces/llama_train_varlen.trace.gz bench/corpus/traces/t5_beam_search.trace.gz bench/corpus/traces/ckpt_grad_accum.trace.gz bench/corpus/traces/diffusion_unet.trace.gz bench/corpus/traces/fcn_segmentation.trace.gz bench/corpus/traces/gnn_random_graphs.trace.gz bench/corpus/traces/model_sweep.trace.gz testdata/traces/gpt2_generate.trace.gz testdata/traces/bert_mlm_varlen.trace.gz testdata/traces/sweep_create_dispose.trace.gz"
case "${1:-}" in
tests)
{ build/gpu/cuda.test -test.run 'TestGPUMapOneHandleTwice|TestGPUVirtualMemoryRoundTrip' -test.v 2>&1 | tail -8
  build/gpu/gputest.test -test.run 'TestGPUCompactDataReadsBack|TestGPUDataReadsBack' -test.v 2>&1 | tail -12
  timeout 200 build/gpu/gputest.test -test.run 'TestConformanceCUDA' 2>&1 | tail -15; } > $OUT/tests.txt 2>&1
OUT=$OUT/compact TRACES="$T" REPLAY_ARGS=--compact PEERS=0 BUDGET=200 bash bench/core/gpu_corpus.sh run > /dev/null 2>&1
cat "$OUT/tests.txt"; tail -3 "$OUT/compact/run.log" ;;
peers)
build/gpu/gputest.test -test.run 'TestGPUCompactDataReadsBack' -test.v > $OUT/compact_data.txt 2>&1
OUT=$OUT/default TRACES="$T" BUDGET=420 bash bench/core/gpu_corpus.sh run > /dev/null 2>&1
OUT=$OUT/compact2 TRACES="$T" REPLAY_ARGS=--compact PEERS=0 BUDGET=60 bash bench/core/gpu_corpus.sh run > /dev/null 2>&1
tail -5 "$OUT/compact_data.txt" "$OUT/default/run.log" "$OUT/compact2/run.log" ;;
*)
	sed -n '2,11p' "$0"
	exit 2 ;;
esac
