#!/usr/bin/env bash
# Feature gathers on a fresh local 6-node 4+2 cluster (1 MiB chunks) against numpy.memmap of
# the same table, warm (bench/gather_bench.py). A first measurement for issue 12; the full
# benchmark (cold runs, MinIO, fio, a cache) is still to come.
# Usage: bench/gather.sh   (env: TABLE_GIB=1 BATCHES=20 BASE_PORT=27401)
# Needs the Python package in .venv (python/run-tests.sh builds it).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_port="${BASE_PORT:-27401}"
bench_name=gather
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"
for i in 1 2 3 4 5 6; do start_node "$i"; done
"$root/.venv/bin/python" "$root/bench/gather_bench.py" --config "$TESSERA_CONFIG" \
    --table-gib "${TABLE_GIB:-1}" --batches "${BATCHES:-20}" --dir "$work/local"
