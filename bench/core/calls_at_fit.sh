#!/bin/bash
# Ten passes at a fit figure against unlimited: for each line of $1 (a
# `gpumem fit --passes 10` line prefixed with the trace's path), `gpumem
# replay --json --passes 10 FLAGS` unlimited and at the fit figure (rounded
# up to 2 MiB; a GiB figure, shown to 0.01, first raised by half of that
# step), one JSON line {"path", "round", "cap_mib", "unlimited", "gather"}
# ("gather": the run at the figure, whatever FLAGS are).
#
#   FLAGS   default --gather (Config.Gather changes nothing unlimited);
#           FLAGS= for the default placement, FLAGS=--compact for Compact
#   DEVICE  sim (default) or cuda
#   AT      how the figure is given: capacity (the simulated device's
#           memory; the default on sim) or limit (Config.Limit; the only
#           form on cuda). The two decide differently under Gather
#           (docs/BENCHMARKS.md, "On the GPU: allocator time at the fit").
#   ROUNDS  every line replayed this many times over, round after round
#           (default 1)
#   GPUMEM  the command (default gpumem); its stderr goes to stderr, and a
#           replay that fails is a "FAIL: ..." line there, its line skipped
#
# bench/core/calls_table.py compares two such files; tight_table.py (the
# GPU's rounds, scripts/gpu.sh run tight) and sim_vs_gpu.py read them too.
flags=${FLAGS---gather}
device=${DEVICE:-sim}
at=${AT:-capacity}
[ "$device" = cuda ] && at=limit
extra=()
[ "$device" = cuda ] && extra=(--driver-times)
for round in $(seq "${ROUNDS:-1}"); do
	while read -r path pol cap unit rest; do
		[ -f "$path" ] || { echo "FAIL: missing $path" >&2; continue; }
		case $unit in
		GiB) mib=$(python3 -c "import math; print(int(math.ceil(($cap*1024+5.12)/2)*2))") ;;
		MiB) mib=$(python3 -c "import math; print(int(math.ceil($cap/2)*2))") ;;
		*) echo "FAIL: $path: no fit figure in '$cap $unit'" >&2; continue ;;
		esac
		u=$(${GPUMEM:-gpumem} replay --device "$device" --json --passes 10 "${extra[@]}" $flags "$path") ||
			{ echo "FAIL: $path unlimited" >&2; continue; }
		g=$(${GPUMEM:-gpumem} replay --device "$device" --json --passes 10 "${extra[@]}" $flags --"$at" "${mib}MiB" "$path") ||
			{ echo "FAIL: $path at ${mib}MiB" >&2; continue; }
		echo "{\"path\":\"$path\",\"round\":$round,\"cap_mib\":$mib,\"unlimited\":$u,\"gather\":$g}"
	done <"$1"
done
