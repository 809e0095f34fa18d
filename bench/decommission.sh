#!/usr/bin/env bash
# How fast `tessera pool decommission` empties a pool, against two baselines measured in the
# same run on the same machine: the byte budget it is given (100 MiB/s by default, the repair
# budget's default: the mover should use it, not more), and, unpaced, the smart client's own
# PUT throughput of the same object size on the same cluster (a move is a read plus a PUT, so
# that is its ceiling). Each turn: 6 nodes (4+2, one drive each) filled with OBJECTS objects of
# SIZE, a second pool of 6 added and activated, then `pool decommission 1` timed to the end
# (listing passes, copies, evictions, the map changes). Chunk bytes (data and parity) are what
# the budget counts.
#
# Usage: bench/decommission.sh   (env: OBJECTS=256 SIZE=4MiB RATE=100MiB/s BASE_PORT=27501)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
objects="${OBJECTS:-256}"
size="${SIZE:-4MiB}"
rate="${RATE:-100MiB/s}"
base_port="${BASE_PORT:-27501}"
bin="$root/target/release/tessera"
[ -x "$bin" ] || { echo "error: build first (make build)" >&2; exit 1; }

bench_name=decommission
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"
# shellcheck source=bench/pool-helpers.sh
source "$root/bench/pool-helpers.sh"

# One turn: a fresh cluster, filled, grown, then pool 1 decommissioned at budget $2; prints
# "LABEL SECONDS PUT_BYTES_PER_S" (the PUT baseline measured on pool 2 afterwards).
turn() {
    local label="$1" budget="$2" port="$3"
    local dir="$work/$label"
    "$bin" init --nodes 6 --ec 4+2 --data "$dir" --base-port "$port" >/dev/null
    local config="$dir/cluster.toml" node_pids=()
    for i in $(seq 6); do start_node "$config" "$i"; done
    for i in $(seq 0 5); do wait_port $((port + i)); done
    # `bench get` writes its objects first: they stay in pool 1.
    "$bin" bench get --config "$config" --size "$size" --objects "$objects" --concurrency 4 --duration 1s \
        --bucket moved >/dev/null
    add_second_pool "$config" "$port"
    sync
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" pool decommission --config "$config" 1 --rate "$budget" >"$work/$label.out"
    t1=$(date +%s.%N)
    grep -q "pool 1 is removed" "$work/$label.out" || { cat "$work/$label.out" >&2; exit 1; }
    local put
    put="$("$bin" bench put --config "$config" --size "$size" --objects 16 --concurrency 4 --duration 10s \
        --bucket baseline --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["throughput_bytes_per_s"])')"
    echo "$label $(python3 -c "print($t1 - $t0)") $put"
    kill -9 "${node_pids[@]}" 2>/dev/null || true
    wait "${node_pids[@]}" 2>/dev/null || true
    rm -rf "$dir"
}

echo "turn 1/2: decommission at the budget $rate" >&2
paced="$(turn paced "$rate" "$base_port")"
echo "turn 2/2: decommission unpaced (budget 100GiB/s)" >&2
unpaced="$(turn unpaced 100GiB/s $((base_port + 20)))"

python3 - "$objects" "$size" "$rate" "$paced" "$unpaced" <<'PY'
import datetime, re, subprocess, sys
objects, size_text, rate_text, paced, unpaced = sys.argv[1:]
units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
def parse(text):
    number, unit = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text.strip().removesuffix("/s")).groups()
    return int(number) * units[unit.lower()]
size, budget = parse(size_text), parse(rate_text)
object_bytes = int(objects) * size
chunk_bytes = object_bytes * 6 // 4  # 4+2: the budget counts data and parity
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.date.today()}  cpu {cpu}  6 nodes (4+2) -> a second pool of 6; "
      f"{objects} objects of {size_text} ({chunk_bytes / 2**20:.0f} MiB of chunks) moved")
for line in (paced, unpaced):
    label, secs, put = line.split()
    secs, put = float(secs), float(put)
    rate = chunk_bytes / secs
    print(f"{label:<9} {secs:7.1f} s  {rate / 2**20:7.1f} MiB/s of chunks  ({object_bytes / secs / 2**20:.1f} MiB/s of objects)"
          f"  PUT baseline {put / 2**20:.1f} MiB/s of objects")
    if label == "paced":
        print(f"decommission throughput / budget ({rate_text}): {rate / budget:.3f}")
    else:
        print(f"decommission throughput unpaced / smart-client PUT of the same size: {object_bytes / secs / put:.3f}")
PY
