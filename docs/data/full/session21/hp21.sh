#!/bin/bash
# Interleaved (ABBA) runs of --huge-pages on and off, one process each.
B=./shoal
for r in 1 2; do
for h in on off off on; do
  echo "== insert huge=$h round $r"; nice -n -20 $B bench insert --cc 2pl,occ --threads 1,2 --duration 4 --huge-pages $h 2>&1 | grep -E "^(2pl|occ) "
done; done
for r in 1 2; do
for h in on off off on; do
  echo "== tpcc huge=$h round $r"; nice -n -20 $B bench tpcc --warehouses 4 --cc 2pl,occ --threads 1,2 --duration 5 --huge-pages $h 2>&1 | grep -E "^(2pl|occ) +[12] +[0-9]"
  echo "== ycsbc huge=$h round $r"; nice -n -20 $B bench ycsb --mix c --cc 2pl --threads 1 --duration 4 --huge-pages $h 2>&1 | grep -E "^2pl "
  echo "== neworder huge=$h round $r"; nice -n -20 $B bench tpcc --mix new-order --cc none --threads 1 --duration 5 --huge-pages $h 2>&1 | grep -E "^none "
done; done
