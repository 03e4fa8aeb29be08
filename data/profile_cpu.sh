#!/usr/bin/env bash
# Builds (or resumes) the local CPU dataset: every zoo architecture at the small size first,
# then larger sizes (image side / text sequence length per pass). Run alone on the machine
# (nothing else heavy): timings are labels. The folder defaults to this machine's device slug
# (`mdot profile` refuses a folder measured on another CPU); OUT=DIR names one.
#   nohup bash data/profile_cpu.sh > profile.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:+--out $OUT}
for pass in "64 32" "96 64" "128 128" "160 192" "224 256"; do
  set -- $pass
  mdot profile --zoo torchvision,timm,hf --batch-sizes 2,4,8,16,32,64 --image-sizes "$1" \
    --seq-lens "$2" --threads 2 --max-iter-s 2.5 --budget-s 12 $OUT || exit 1
done
