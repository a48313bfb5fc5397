#!/bin/bash
B=./shoal
for r in 1 2 3; do
for m in advise off idle nice; do
  case $m in advise|off) H=$m; P=idle;; *) H=collapse; P=$m;; esac
  echo "== $m $r"; SHOAL_HUGE=$H SHOAL_COLLAPSE_PRIO=$P nice -n -20 $B bench insert --cc 2pl --threads 1,2 --duration 4 2>&1 | grep -E "^2pl"
done; done
