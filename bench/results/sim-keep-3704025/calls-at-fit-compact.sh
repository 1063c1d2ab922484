#!/bin/bash
# $1: fit line file; unlimited and at-capacity replays under Config.Compact (the "gather" key holds the limited run, for calls_table.py)
while read path pol cap unit ratio rest; do
  case $unit in GiB) mib=$(python3 -c "import math; print(int(math.ceil(($cap*1024+5.12)/2)*2))");; MiB) mib=$(python3 -c "import math; print(int(math.ceil($cap/2)*2))");; esac
  u=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 --compact $path 2>/dev/null)
  g=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 --compact --capacity ${mib}MiB $path 2>/dev/null)
  echo "{\"path\":\"$path\",\"cap_mib\":$mib,\"unlimited\":$u,\"gather\":$g}"
done < $1
