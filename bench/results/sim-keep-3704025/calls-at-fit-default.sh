#!/bin/bash
# $1: fit line file; runs unlimited and at-capacity replays with the default placement (no --gather; the "gather" key holds the limited run, for calls_table.py)
while read path pol cap unit ratio rest; do
  case $unit in GiB) mib=$(python3 -c "import math; print(int(math.ceil(($cap*1024+5.12)/2)*2))");; MiB) mib=$(python3 -c "import math; print(int(math.ceil($cap/2)*2))");; esac
  u=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 $path 2>/dev/null)
  g=$(${GPUMEM:-gpumem} replay --device sim --json --passes 10 --capacity ${mib}MiB $path 2>/dev/null)
  echo "{\"path\":\"$path\",\"cap_mib\":$mib,\"unlimited\":$u,\"gather\":$g}"
done < $1
