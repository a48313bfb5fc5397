#!/bin/bash
B=./shoal-pf
for a in 256 2048 2048 256; do
  echo "== insert ahead=$a"; SHOAL_PF_AHEAD=$a nice -n -20 $B bench insert --cc 2pl --threads 1,2 --duration 4 2>&1 | grep -E "^(2pl|occ) "
  echo "== tpcc ahead=$a"; SHOAL_PF_AHEAD=$a nice -n -20 $B bench tpcc --warehouses 4 --cc 2pl --threads 1,2 --duration 5 2>&1 | grep -E "^(2pl|occ) +[12] +[0-9]"
done
