#!/usr/bin/env bash
# Builds the gpumem CLI of an older commit (stripped, CGO off) into OUT, in
# a temporary worktree: the "base" that the GPU scripts replay beside the
# working tree's build.
#
#   bench/core/build_cli_at.sh COMMIT OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "$2")
tmp=$(mktemp -d)
git worktree add --detach "$tmp" "$1" >/dev/null
trap 'git worktree remove --force "$tmp"' EXIT
(cd "$tmp" && CGO_ENABLED=0 go build -ldflags="-s -w" -o "$out" ./cmd/gpumem)
