#!/usr/bin/env bash
# Feature gathers on a fresh local 6-node 4+2 cluster (1 MiB chunks) against numpy.memmap of
# the same table (bench/gather_bench.py): warm, then with COLD=1 (root) cold, every batch after
# dropping the page cache, for Tessera with and without the nodes' read-ahead hints and for
# numpy.memmap, with fio's 4 KiB random reads at queue depth 1 and 32 as the disk's limits; and
# the row cache's hit ratio against LRU's on the same trace (bench/gather_cache.py).
# Usage: bench/gather.sh   (env: TABLE_GIB=1 BATCHES=20 COLD=1 BASE_PORT=27401, and
# BENCH_ARGS for bench/gather_bench.py: "--rmat" to sample an R-MAT graph with a node per row
# (TABLE_GIB=8: 2 M nodes), "--minio" to add boto3 ranged GETs against MinIO, "--uniform" for
# neighbours without hot rows, "--seeds N", "--plain-upload" for 64 KiB checksum blocks,
# "--reuse-out" to gather into one output array allocated once, "--row-cache 0.1" the share of
# the table the second Tessera client caches, 0 for none)
# The full issue-12 run: COLD=1 TABLE_GIB=8 BATCHES=10 BENCH_ARGS="--rmat --minio" bench/gather.sh
# (34 GB of disk: the table, the cluster's and MinIO's copies; more than 24 GiB of page cache, so
# its warm memmap is not warm: run without --minio for the warm ratios, 20 GB).
# Needs the Python package in .venv (python/run-tests.sh builds it); COLD=1 needs fio.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_port="${BASE_PORT:-27401}"
bench_name=gather
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"
for i in 1 2 3 4 5 6; do start_node "$i"; done
run() {
    "$root/.venv/bin/python" "$root/bench/gather_bench.py" --config "$TESSERA_CONFIG" \
        --table-gib "${TABLE_GIB:-1}" --batches "${BATCHES:-20}" --dir "$work/local" --cluster-data "$work/d" \
        ${BENCH_ARGS:-} "$@"
}
run
# The row cache (S3-FIFO) against LRU on the same Zipf trace, a cache of 10% of a 256 MiB table.
"$root/.venv/bin/python" "$root/bench/gather_cache.py" --config "$TESSERA_CONFIG" --table-mib 256 \
    --batches "${BATCHES:-20}"
if [ -n "${COLD:-}" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "error: COLD=1 drops the page cache and needs root" >&2; exit 1; }
    command -v fio >/dev/null || { echo "error: COLD=1 needs fio (apt-get install fio)" >&2; exit 1; }
    run --cold
    for i in 1 2 3 4 5 6; do kill_node "$i"; done
    for i in 1 2 3 4 5 6; do start_node "$i" --no-read-hints; done
    run --cold --only tessera --label "no read hints"
    for qd in 1 32; do
        iops=$(fio --name="qd$qd" --filename="$work/fio.dat" --size=2G --rw=randread --bs=4k --direct=1 \
            --ioengine=libaio --iodepth="$qd" --runtime=10 --time_based --output-format=json \
            | "$root/.venv/bin/python" -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
        echo "{\"system\": \"fio randread 4 KiB direct\", \"iodepth\": $qd, \"iops\": $iops}"
    done
    rm -f "$work/fio.dat"
fi
