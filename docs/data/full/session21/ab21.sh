#!/bin/bash
# ABBA: shoal-s21a (067d1e9) against shoal-s21z (the session's last engine commit).
for b in s21a s21z s21z s21a s21a s21z; do
  echo "== $b"; nice -n -20 ./shoal-$b bench tpcc --warehouses 4 --cc 2pl,occ --threads 1 --duration 4 2>&1 | grep -E "^(2pl|occ) +1 +[0-9]"
done
