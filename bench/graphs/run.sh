#!/usr/bin/env bash
# CUDA graphs under gpumem, on the GPU machine, from the repository root:
# runs python/tests/test_graphs.py (each scenario under gpumem and under
# PyTorch's own allocator) and writes its log, headed by the machine, to
# $OUT/graphs.log (default OUT=build/graphs-out). Needs PyTorch with a GPU
# and libgpumem.so beside the package (scripts/lib.sh builds it; carry
# python/gpumem/libgpumem.so). The exit status is pytest's.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/graphs-out}"
mkdir -p "$OUT"
log="$OUT/graphs.log"
{
	echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with changes)')"
	python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
	  torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' 2>&1
	PYTHONPATH=python python3 -c 'import gpumem; print("library", gpumem.library().path, gpumem.version())' 2>&1
} >"$log"
PYTHONUNBUFFERED=1 python3 -m pytest -q -rsx python/tests/test_graphs.py 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
echo "pytest exit $status" >>"$log"
exit "$status"
