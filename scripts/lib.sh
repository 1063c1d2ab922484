#!/usr/bin/env bash
# Builds libgpumem (the C library: clib/, gpumem.h) and the preload shim
# that `gpumem run` uses (shim/c/preload.c: libgpumem_preload.so) into
# build/, and puts a copy of the library with its header beside the Python
# package (python/gpumem/), which is where the package looks for it and what
# `pip install ./python` ships. Needs Go and a C compiler (cgo); no CUDA
# toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
CGO_ENABLED=1 go build -buildmode=c-shared -trimpath -ldflags="-s -w" -o build/libgpumem.so ./clib
rm -f build/libgpumem.h # cgo's generated header; users include clib/gpumem.h
cp clib/gpumem.h build/gpumem.h
cc -O2 -Wall -fPIC -shared -o build/libgpumem_preload.so shim/c/preload.c shim/c/gate.c -ldl -lpthread
cp build/libgpumem.so build/gpumem.h python/gpumem/
echo "built build/libgpumem.so ($(du -h build/libgpumem.so | cut -f1)), copied into python/gpumem/, and build/libgpumem_preload.so"
