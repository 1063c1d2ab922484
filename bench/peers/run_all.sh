#!/usr/bin/env bash
# Replay every trace through every peer allocator, one process per peer and trace,
# and print the side-by-side table.
#
#   bash bench/peers/run_all.sh [options] [TRACE...]
#
# TRACE defaults to every testdata/traces/*.trace.gz (found relative to this
# script). Each (peer, trace) pair runs as its own `python3 replay_peer.py PEER
# TRACE` under `timeout`; whatever happens, one JSON line is appended to the
# result file ($OUT/peers.jsonl when OUT is set, else bench/out/peers.jsonl): the
# peer's own line, or one with "error" (exit status, timeout, or skip reason).
# Stderr of every process goes to peers.log beside it; the table is printed at
# the end and saved as peers_table.md.
#
# Options (environment variable in brackets):
#   --peers LIST      comma-separated peers [PEERS]; default: torch-native,
#                     torch-expandable,torch-async,cupy,jax-bfc,torch-native-cxx,
#                     torch-expandable-cxx
#   --timeout S       per-process limit in seconds [PEER_TIMEOUT, default 150]
#   --budget S        stop starting new processes after S seconds in all, recording
#                     the rest as skipped [BUDGET, default 0 = none]
#   --cap PEER=N      replay only the first N events of any longer trace for PEER;
#                     the row is marked "truncated" [CAPS, comma-separated]
#   --skip PEER:TRACE skip that pair with a recorded reason [SKIPS, comma-separated]
#   --no-warm         no second (warm) timed pass
#   --repeat N        C++ peers: N runs from an emptied cache, median times
#                     reported [REPEAT, default 1]
#   --passes N        PyTorch peers: also the peak over N passes in a row
#                     (key passes), as gpumem replay --passes [PASSES, default 1]
#   --out FILE        result file (overrides the default above)
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}

PEERS=${PEERS:-torch-native,torch-expandable,torch-async,cupy,jax-bfc,torch-native-cxx,torch-expandable-cxx}
TIMEOUT=${PEER_TIMEOUT:-150}
BUDGET=${BUDGET:-0}
CAPS=${CAPS:-}
SKIPS=${SKIPS:-}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}
WARM=()
REPEAT=${REPEAT:-1}
PASSES=${PASSES:-1}
RESULT=""

TRACES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --peers) PEERS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --cap) CAPS="${CAPS:+$CAPS,}$2"; shift 2 ;;
    --skip) SKIPS="${SKIPS:+$SKIPS,}$2"; shift 2 ;;
    --no-warm) WARM=(--no-warm); shift ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --passes) PASSES=$2; shift 2 ;;
    --out) RESULT=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; TRACES+=("$@"); break ;;
    -*) echo "run_all.sh: unknown option $1" >&2; exit 2 ;;
    *) TRACES+=("$1"); shift ;;
  esac
done
if [ ${#TRACES[@]} -eq 0 ]; then
  for t in "$REPO"/testdata/traces/*.trace.gz; do
    [ -e "$t" ] && TRACES+=("$t")
  done
fi
if [ ${#TRACES[@]} -eq 0 ]; then
  echo "run_all.sh: no traces" >&2; exit 2
fi

if [ -z "$RESULT" ]; then
  if [ -n "${OUT:-}" ]; then RESULT="$OUT/peers.jsonl"; else RESULT="$HERE/../out/peers.jsonl"; fi
fi
mkdir -p "$(dirname "$RESULT")"
RESULT=$(cd "$(dirname "$RESULT")" && pwd)/$(basename "$RESULT")
OUTDIR=$(dirname "$RESULT")
LOG="$OUTDIR/peers.log"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

IFS=',' read -r -a PEER_LIST <<<"$PEERS"

cap_for() {  # cap_for PEER -> N or empty
  local item
  IFS=',' read -r -a items <<<"$CAPS"
  for item in "${items[@]}"; do
    [ "${item%%=*}" = "$1" ] && { echo "${item#*=}"; return; }
  done
}
is_skipped() {  # is_skipped PEER TRACENAME
  local item
  IFS=',' read -r -a items <<<"$SKIPS"
  for item in "${items[@]}"; do
    [ "$item" = "$1:$2" ] && return 0
  done
  return 1
}
trace_name() { local b; b=$(basename "$1"); b=${b%.gz}; b=${b%.trace}; b=${b%.txt}; echo "$b"; }

START=$SECONDS
elapsed() { echo $((SECONDS - START)); }
{ echo "=== run_all.sh $(date -u +%FT%TZ) peers=$PEERS timeout=${TIMEOUT}s budget=${BUDGET}s caps=${CAPS:-none}"; } >>"$LOG"
echo "results -> $RESULT (log: $LOG)"

# Build the C++ peer once, before any timed process, so no process pays for it.
CXX_BROKEN=""
case ",$PEERS," in
  *-cxx,*)
    echo "[$(elapsed)s] building torch_cxx.cpp"
    echo "=== build torch_cxx" >>"$LOG"
    if ! timeout -k 10 "$BUILD_TIMEOUT" "$PY" "$HERE/replay_peer.py" --build-cxx \
        >"$TMP/build.out" 2>>"$LOG"; then
      CXX_BROKEN="torch_cxx.cpp did not build: $(tail -c 300 "$TMP/build.out") (see peers.log)"
      echo "[$(elapsed)s] $CXX_BROKEN"
    else
      echo "[$(elapsed)s] built: $(cat "$TMP/build.out")"
    fi
    ;;
esac

for trace in "${TRACES[@]}"; do
  name=$(trace_name "$trace")
  for peer in "${PEER_LIST[@]}"; do
    if is_skipped "$peer" "$name"; then
      "$PY" "$HERE/results.py" skip "$RESULT" "$peer" "$trace" "asked (--skip $peer:$name)"
      continue
    fi
    if [ -n "$CXX_BROKEN" ] && [ "${peer%-cxx}" != "$peer" ]; then
      "$PY" "$HERE/results.py" skip "$RESULT" "$peer" "$trace" "$CXX_BROKEN"
      continue
    fi
    limit=$TIMEOUT
    if [ "$BUDGET" -gt 0 ]; then
      left=$((BUDGET - $(elapsed)))
      if [ "$left" -lt 15 ]; then
        "$PY" "$HERE/results.py" skip "$RESULT" "$peer" "$trace" "run budget of ${BUDGET}s spent"
        continue
      fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    extra=("${WARM[@]}")
    [ "${peer%-cxx}" != "$peer" ] && [ "$REPEAT" -gt 1 ] && extra+=(--repeat "$REPEAT")
    [ "${peer#torch}" != "$peer" ] && [ "$PASSES" -gt 1 ] && extra+=(--passes "$PASSES")
    cap=$(cap_for "$peer")
    [ -n "$cap" ] && extra+=(--max-events "$cap")
    echo "=== $peer $name (limit ${limit}s ${extra[*]})" >>"$LOG"
    t0=$(date +%s.%N)
    timeout -k 10 "$limit" "$PY" "$HERE/replay_peer.py" "$peer" "$trace" "${extra[@]}" \
      >"$TMP/out" 2>"$TMP/err"
    rc=$?
    t1=$(date +%s.%N)
    cat "$TMP/err" >>"$LOG"
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
    printf '[%ss] ' "$(elapsed)"
    "$PY" "$HERE/results.py" record "$RESULT" "$peer" "$trace" "$rc" "$wall" \
      "$TMP/out" "$TMP/err" "$limit"
  done
done

echo
echo "total ${SECONDS}s; table from $RESULT:"
echo
"$PY" "$HERE/table.py" "$RESULT" | tee "$OUTDIR/peers_table.md"
