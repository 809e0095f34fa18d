#!/usr/bin/env bash
# The cost of finding objects across pools: smart-client PUT and GET on 12 local nodes (4+2,
# one drive each) laid out as ONE pool of two erasure sets (`init --nodes 12`, the baseline)
# and as TWO pools of one set each (`init --nodes 6` then `pool add` of 6 more), turns
# alternated so that both see the same machine load. Same processes, drives and sets: the only
# difference is that with two pools every read and every write's version read asks the key's
# set in both pools. Prints every turn and the ratios of the medians (two pools / one pool) for
# 1 MiB PUT and GET throughput and 4 KiB GET latency p50/p99, with the metadata requests and
# items (a key on a drive) per operation: concurrent reads share metadata requests per node.
#
# Usage: bench/pools.sh   (env: DURATION=10s OBJECTS=256 TURNS=3 CONCURRENCY=16 BASE_PORT=27401)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
duration="${DURATION:-10s}"
objects="${OBJECTS:-256}"
turns="${TURNS:-3}"
concurrency="${CONCURRENCY:-16}"
base_port="${BASE_PORT:-27401}"
bin="$root/target/release/tessera"
[ -x "$bin" ] || { echo "error: build first (make build)" >&2; exit 1; }

bench_name=pools
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"
# shellcheck source=bench/pool-helpers.sh
source "$root/bench/pool-helpers.sh"

# One turn: a fresh 12-node cluster laid out as $1 ("one" or "two" pools), then PUT 1 MiB,
# GET 1 MiB and GET 4 KiB, results appended as JSON lines.
turn() {
    local label="$1" n="$2"
    local dir="$work/$label-$n" port=$((base_port + 20 * (n % 4)))
    if [ "$label" = one ]; then
        "$bin" init --nodes 12 --ec 4+2 --data "$dir" --base-port "$port" >/dev/null
    else
        "$bin" init --nodes 6 --ec 4+2 --data "$dir" --base-port "$port" >/dev/null
    fi
    local config="$dir/cluster.toml" node_pids=()
    local first=12
    [ "$label" = two ] && first=6
    for i in $(seq "$first"); do start_node "$config" "$i"; done
    for i in $(seq 0 $((first - 1))); do wait_port $((port + i)); done
    if [ "$label" = two ]; then
        add_second_pool "$config" "$port"
    fi
    local common=(--config "$config" --objects "$objects" --duration "$duration" --json)
    printf '{"label":"%s","op":"put","result":%s}\n' "$label" \
        "$("$bin" bench put "${common[@]}" --size 1MiB --concurrency 8 --bucket bench-put)" >>"$work/results.jsonl"
    printf '{"label":"%s","op":"get","result":%s}\n' "$label" \
        "$("$bin" bench get "${common[@]}" --size 1MiB --concurrency "$concurrency")" >>"$work/results.jsonl"
    printf '{"label":"%s","op":"get4k","result":%s}\n' "$label" \
        "$("$bin" bench get "${common[@]}" --size 4KiB --concurrency 4 --bucket bench-small)" >>"$work/results.jsonl"
    kill -9 "${node_pids[@]}" 2>/dev/null || true
    wait "${node_pids[@]}" 2>/dev/null || true
    rm -rf "$dir"
}

for n in $(seq "$turns"); do
    echo "turn $n/$turns: one pool" >&2
    turn one $((2 * n))
    echo "turn $n/$turns: two pools" >&2
    turn two $((2 * n + 1))
done

python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys, datetime, subprocess
rows = [json.loads(line) for line in open(sys.argv[1])]
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.date.today()}  cpu {cpu}  12 nodes, 4+2: one pool of 2 sets vs two pools of 1 set")
print(f"{'layout':<6} {'op':<6} {'GB/s per turn':<24} {'median':>7} {'p50 ms':>7} {'p99 ms':>7} {'meta req/op':>11} {'items/op':>8}")
med = {}
for label in ("one", "two"):
    for op in ("put", "get", "get4k"):
        rs = [r["result"] for r in rows if r["label"] == label and r["op"] == op]
        gbs = [r["throughput_bytes_per_s"] / 1e9 for r in rs]
        p50 = statistics.median(r["p50_ms"] for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        med[(label, op)] = (statistics.median(gbs), p50, p99)
        turns = " ".join(f"{g:.3f}" for g in gbs)
        reqs = statistics.median(r.get("metadata_requests_per_op") or 0 for r in rs)
        items = statistics.median(r.get("metadata_items_per_op") or 0 for r in rs)
        print(f"{label:<6} {op:<6} {turns:<24} {med[(label, op)][0]:>7.3f} {p50:>7.2f} {p99:>7.2f} {reqs:>11.2f} {items:>8.2f}")
for op in ("put", "get"):
    print(f"{op.upper()} 1 MiB throughput, two pools / one pool: {med[('two', op)][0] / med[('one', op)][0]:.3f}")
for i, name in ((1, "p50"), (2, "p99")):
    print(f"GET 4 KiB latency {name}, two pools / one pool: {med[('two', 'get4k')][i] / med[('one', 'get4k')][i]:.3f}")
PY
