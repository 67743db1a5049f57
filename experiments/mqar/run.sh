#!/usr/bin/env bash
# The study's question on associative recall (docs/mqar.md): GRU and the Mamba core, vanilla vs
# sinusoidal PE, 3 seeds, on mqar with dual-frequency keys at CPU scale. Trains the 12 runs (two at a
# time, one thread each; resumable: a finished run is skipped), evaluates each, and summarises.
# Usage: bash experiments/mqar/run.sh [OUT]   (default OUT: runs/mqar)
set -euo pipefail
OUT=${1:-runs/mqar}
mkdir -p "$OUT"
SETTINGS=(--task mqar --distribution dual --rarity 0.125 --vocab-size 128 --length 16 --embed-size 32
          --hidden-size 128 --iterations 3000 --batch-size 64 --lr 3e-3 --warmup 100 --checkpoint-every 3000
          --log-every 100 --heldout-size 1024 --threads 1 -q)

one() {  # core pe seed
  local dir="$OUT/$1-$2-s$3"
  if [ ! -f "$dir/accuracy.zarr/zarr.json" ]; then
    if [ -f "$dir/config.json" ]; then
      gradscope train --resume "$dir" -q
    else
      gradscope train --core "$1" --pe "$2" --seed "$3" "${SETTINGS[@]}" -o "$dir"
    fi
    gradscope accuracy "$dir" -o "$dir/accuracy.zarr" --overwrite -q > "$dir/accuracy.txt"
  fi
}

for core in gru mamba; do
  (for pe in none sinusoidal; do for seed in 0 1 2; do one "$core" "$pe" "$seed"; done; done) &
done
wait
# CIs over the 3 seeds (Student t: better coverage with few trials), and over the pooled queries
gradscope summarize "$OUT"/*/accuracy.zarr --by model,pe --unit trial --interval t --metric all \
  -o "$OUT/summary-trial.zarr" --csv "$OUT/summary-trial.csv" --overwrite > "$OUT/summary-trial.txt"
gradscope summarize "$OUT"/*/accuracy.zarr --by model,pe --unit token --metric all \
  -o "$OUT/summary-token.zarr" --csv "$OUT/summary-token.csv" --overwrite > "$OUT/summary-token.txt"
gradscope report "$OUT"/*/accuracy.zarr -o "$OUT/report.html" --overwrite 2>/dev/null || \
  gradscope report "$OUT"/*/accuracy.zarr -o "$OUT/report.html"
