#!/usr/bin/env bash
# scripts/wheel.sh [DIR]: builds the wheel of the Python package for this
# platform into DIR (default dist/): gpumem-VERSION-py3-none-manylinux_X_Y_ARCH.whl,
# with libgpumem.so, the preload shim of gpumem run (libgpumem_preload.so)
# and the gpumem command (static) inside, and the `gpumem` console command.
# X.Y is the highest glibc symbol version the natives need. Needs Go, a C
# compiler and Python 3.9+ (nothing from PyPI); the machine that installs
# the wheel needs none of them:
#
#   pip install gpumem-*.whl        # no network: add --no-index
#
# The build is python/backend/gpumem_backend.py, the package's PEP 517
# backend, which pip install ./python runs too.
set -euo pipefail
out=${1:-}
[ -n "$out" ] && [ "${out#/}" = "$out" ] && out=$PWD/$out # DIR is relative to where this is run
cd "$(dirname "$0")/.."
out=${out:-dist}
wheel=$("${PYTHON:-python3}" python/backend/gpumem_backend.py "$out")
echo "built $wheel ($(du -h "$wheel" | cut -f1))"
