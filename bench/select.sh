#!/usr/bin/env bash
# S3 Select over CSV benchmark (bench/select_bench.py): Tessera's node-side record evaluation vs
# MinIO's S3 Select and DuckDB over httpfs, with the client in its own network namespace; twice,
# unshaped and with the client's link limited to 1 Gbit/s. Needs root. Installs what it needs
# into .venv (boto3, DuckDB with httpfs, pyarrow). Extra arguments go to both runs (e.g.
# --rows 2000000). Results: bench/results/select-*-<date>.json and bench/plots/select-<date>.png.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -r e2e/requirements.txt matplotlib
cargo build --release --quiet
mkdir -p bench/results bench/plots
day=$(date +%F)
.venv/bin/python bench/select_bench.py --json "bench/results/select-unshaped-$day.json" "$@"
.venv/bin/python bench/select_bench.py --shaped --json "bench/results/select-shaped-$day.json" "$@"
.venv/bin/python bench/select_plot.py "bench/results/select-unshaped-$day.json" "bench/results/select-shaped-$day.json" "bench/plots/select-$day.png"
