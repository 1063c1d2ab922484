#!/bin/bash
# The driver calls of ten passes at a fit figure against unlimited, on the
# simulated device: for each line of $1 (a `gpumem fit --passes 10` line
# prefixed with the trace's path), `gpumem replay --json --passes 10 FLAGS`
# unlimited and at the fit figure (rounded up to 2 MiB; a GiB figure, shown
# to 0.01, first raised by half of that step), one JSON line
# {"path", "cap_mib", "unlimited", "gather"} ("gather": the run at the
# figure, whatever FLAGS are). FLAGS defaults to --gather (Config.Gather
# changes nothing unlimited); FLAGS= for the default placement,
# FLAGS=--compact for Compact. GPUMEM: the command (default gpumem).
# bench/core/calls_table.py compares two such files.
flags=${FLAGS---gather}
while read -r path pol cap unit ratio rest; do
	case $unit in
	GiB) mib=$(python3 -c "import math; print(int(math.ceil(($cap*1024+5.12)/2)*2))") ;;
	MiB) mib=$(python3 -c "import math; print(int(math.ceil($cap/2)*2))") ;;
	esac
	u=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 $flags "$path" 2>/dev/null)
	g=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 $flags --capacity "${mib}MiB" "$path" 2>/dev/null)
	echo "{\"path\":\"$path\",\"cap_mib\":$mib,\"unlimited\":$u,\"gather\":$g}"
done <"$1"
