#!/usr/bin/env bash
# Issue #38 part 4: evaluate the two trained models (experiments/text_models/train.py) on the held-out
# paragraphs; the stores go beside the models under runs/text_models/ (the dynamics table is the one
# `gradscope dynamics` prints: summarize reads no dynamics store). One thread, nice 10.
set -euo pipefail
ROOT=${ROOT:-runs/text_models}
export OMP_NUM_THREADS=1
for arch in ${ARCHS:-mamba rwkv}; do
  nice -n 10 gradscope accuracy "$ROOT/$arch" --model hf --text "$ROOT/heldout.txt" --counts-text "$ROOT/train.txt" --max-length 128 \
    --seed 0 --resamples 1000 --overwrite -o "$ROOT/$arch-accuracy.zarr"
  nice -n 10 gradscope stability "$ROOT/$arch" --model hf --token-counts "$ROOT/counts.npy" --length 32 --target-pos 16 \
    --triplets 64 --seed 0 --overwrite -o "$ROOT/$arch-stability.zarr"
  nice -n 10 gradscope dynamics "$ROOT/$arch" --model hf --token-counts "$ROOT/counts.npy" --length 32 --seed 0 \
    --budget-seconds 300 --overwrite -o "$ROOT/$arch-dynamics.zarr"
  # summarize reads the accuracy store; it refuses a stability store of a --model hf directory ("lacks its
  # run configuration"), so table.py bootstraps the stability means itself.
  gradscope summarize "$ROOT/$arch-accuracy.zarr" --overwrite -o "$ROOT/$arch-summary.zarr"
  gradscope report "$ROOT/$arch-accuracy.zarr" "$ROOT/$arch-stability.zarr" "$ROOT/$arch-dynamics.zarr" \
    -o "$ROOT/$arch-report.html"
done
