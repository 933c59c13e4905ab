#!/usr/bin/env bash
# On a GPU machine without a package index, from the project root, with `.gpu34/` carried: the carried wheels
# (cryptography for the keyed stream) under /tmp/site and the embedded HeteroData written here by
# `python benchmarks/entities_items.py --save-data .gpu34/data.pt`. Runs the entities-items benchmark on the GPU, the three
# seeds as three processes side by side, then merges them. Usage: bash benchmarks/gpu/entities_items.sh OUT_DIR
set -euo pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu34/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for s in 0 1 2; do
  python3 benchmarks/entities_items.py --device cuda --data .gpu34/data.pt --seeds $s --out "$out" > "$out/log_s$s.txt" 2>&1 &
done
wait
python3 benchmarks/entities_items.py --merge "$out"/entities_items_cuda_s?.json --out "$out"
