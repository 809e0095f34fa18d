#!/usr/bin/env bash
# Near-data query benchmark (bench/query_bench.py): Tessera pushdown vs DuckDB over httpfs, with
# the client in its own network namespace; twice, unshaped and with the client's link limited
# to 1 Gbit/s, then a plot. Needs root. Installs what it needs into .venv (DuckDB with httpfs,
# the tessera package, matplotlib). Extra arguments go to both runs (e.g. --rows 10000000,
# --minio). Results: bench/results/query-*.json and bench/plots/query-<date>.png.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -r e2e/requirements.txt matplotlib
if ! .venv/bin/python -c 'import tessera._tessera' 2>/dev/null; then
    .venv/bin/pip install -q maturin==1.16.0
    cargo build --release --quiet
    .venv/bin/maturin build --release --quiet --manifest-path python/Cargo.toml --interpreter .venv/bin/python --out target/python-wheels
    .venv/bin/pip install -q --force-reinstall --no-deps target/python-wheels/tessera-*.whl
fi
mkdir -p bench/results bench/plots
day=$(date +%F)
.venv/bin/python bench/query_bench.py --json "bench/results/query-unshaped-$day.json" "$@"
.venv/bin/python bench/query_bench.py --shaped --json "bench/results/query-shaped-$day.json" "$@"
.venv/bin/python bench/query_plot.py "bench/results/query-unshaped-$day.json" "bench/results/query-shaped-$day.json" \
    "bench/plots/query-$day.png"
