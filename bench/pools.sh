#!/usr/bin/env bash
# The cost of finding objects across pools: smart-client PUT and GET on 12 local nodes (4+2,
# one drive each) laid out as ONE pool of two erasure sets (`init --nodes 12`, the baseline)
# and as TWO pools of one set each (`init --nodes 6` then `pool add` of 6 more). Same shape of
# processes, drives and sets: the only difference is that with two pools every read and every
# write's version read asks the key's set in both pools.
#
# Both clusters run side by side (the idle one costs next to nothing) and the runs alternate
# between them, ROUNDS times each, so that this shared machine's slow and fast spells hit both
# layouts alike: each operation's ratio is the median of the per-round ratios. Prints every
# round and, per layout, the median throughput, 4 KiB GET latency p50/p99, and the metadata
# requests and items (a key on a drive) per operation (concurrent reads share metadata requests
# per node).
#
# Usage: bench/pools.sh   (env: DURATION=5s ROUNDS=6 OBJECTS=256 CONCURRENCY=16 BASE_PORT=27401,
# TESSERA_BIN=another build of the tessera binary)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
duration="${DURATION:-5s}"
rounds="${ROUNDS:-6}"
objects="${OBJECTS:-256}"
concurrency="${CONCURRENCY:-16}"
base_port="${BASE_PORT:-27401}"
bin="${TESSERA_BIN:-$root/target/release/tessera}"
[ -x "$bin" ] || { echo "error: build first (make build)" >&2; exit 1; }

bench_name=pools
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"
# shellcheck source=bench/pool-helpers.sh
source "$root/bench/pool-helpers.sh"

# start_layout LABEL PORT: a 12-node cluster laid out as LABEL ("one" or "two" pools).
start_layout() {
    local label="$1" port="$2" dir="$work/$1" first=12 node_pids=()
    [ "$label" = two ] && first=6
    "$bin" init --nodes "$first" --ec 4+2 --data "$dir" --base-port "$port" >/dev/null
    for i in $(seq "$first"); do start_node "$dir/cluster.toml" "$i"; done
    for i in $(seq 0 $((first - 1))); do wait_port $((port + i)); done
    if [ "$label" = two ]; then
        add_second_pool "$dir/cluster.toml" "$port"
    fi
}

# run LABEL OP ROUND ARGS...: one `tessera bench` run against LABEL's cluster, appended as JSON.
run() {
    local label="$1" op="$2" round="$3"
    shift 3
    printf '{"label":"%s","op":"%s","round":%s,"result":%s}\n' "$label" "$op" "$round" \
        "$("$bin" bench "$@" --config "$work/$label/cluster.toml" --objects "$objects" --json)" >>"$work/results.jsonl"
}

start_layout one "$base_port"
start_layout two $((base_port + 20))
# The objects the GETs read, written once per layout (not measured).
for label in one two; do
    run "$label" fill 0 get --size 1MiB --concurrency 8 --duration 1s
    run "$label" fill 0 get --size 4KiB --concurrency 4 --duration 1s --bucket bench-small
done
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    for label in one two; do
        run "$label" put "$r" put --size 1MiB --concurrency 8 --duration "$duration" --bucket bench-put
    done
    for label in one two; do
        run "$label" get "$r" get --size 1MiB --concurrency "$concurrency" --duration "$duration" --no-prefill
    done
    for label in one two; do
        run "$label" get4k "$r" get --size 4KiB --concurrency 4 --duration "$duration" --no-prefill --bucket bench-small
    done
done

python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys, datetime, subprocess
rows = [json.loads(line) for line in open(sys.argv[1]) if '"fill"' not in line]
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.date.today()}  cpu {cpu}  12 nodes, 4+2: one pool of 2 sets vs two pools of 1 set, alternated")
print(f"{'layout':<6} {'op':<6} {'GB/s per round':<42} {'median':>7} {'p50 ms':>7} {'p99 ms':>7} {'meta req/op':>11} {'items/op':>8}")
by = {}
for r in rows:
    by.setdefault((r["label"], r["op"]), {})[r["round"]] = r["result"]
for label in ("one", "two"):
    for op in ("put", "get", "get4k"):
        rs = list(by[(label, op)].values())
        gbs = [r["throughput_bytes_per_s"] / 1e9 for r in rs]
        p50 = statistics.median(r["p50_ms"] for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        reqs = statistics.median(r.get("metadata_requests_per_op") or 0 for r in rs)
        items = statistics.median(r.get("metadata_items_per_op") or 0 for r in rs)
        turns = " ".join(f"{g:.3f}" for g in gbs)
        print(f"{label:<6} {op:<6} {turns:<42} {statistics.median(gbs):>7.3f} {p50:>7.2f} {p99:>7.2f} {reqs:>11.2f} {items:>8.2f}")
def ratios(op, metric):
    one, two = by[("one", op)], by[("two", op)]
    return [two[k][metric] / one[k][metric] for k in sorted(one) if one[k][metric] > 0]
for op in ("put", "get"):
    rs = ratios(op, "throughput_bytes_per_s")
    print(f"{op.upper()} 1 MiB throughput, two pools / one pool: median {statistics.median(rs):.3f} of rounds "
          + " ".join(f"{x:.2f}" for x in rs))
for metric in ("p50_ms", "p99_ms"):
    rs = ratios("get4k", metric)
    print(f"GET 4 KiB latency {metric[:3]}, two pools / one pool: median {statistics.median(rs):.3f} of rounds "
          + " ".join(f"{x:.2f}" for x in rs))
PY
