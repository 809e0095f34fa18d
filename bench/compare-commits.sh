#!/usr/bin/env bash
# The cost of a change: smart-client PUT and GET of this working tree's build against the build
# of an earlier commit, each on a fresh local 6-node 4+2 cluster (1 MiB chunks), turns
# alternated so that both see the same machine load. Prints every turn and the ratio of the
# medians (this tree / base).
#
# Usage: bench/compare-commits.sh BASE_REV
#   env: DURATION=10s SIZE=1MiB OBJECTS=256 TURNS=3 PUT_CONCURRENCY=8 GET_CONCURRENCY=16
# The base is built once into bench/.cache/base-<sha> (its own target directory; ~3 min cold).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_rev="${1:?usage: bench/compare-commits.sh BASE_REV}"
duration="${DURATION:-10s}"
size="${SIZE:-1MiB}"
objects="${OBJECTS:-256}"
turns="${TURNS:-3}"
put_concurrency="${PUT_CONCURRENCY:-8}"
get_concurrency="${GET_CONCURRENCY:-16}"
base_port="${BASE_PORT:-27301}"

sha="$(git -C "$root" rev-parse --short=12 "$base_rev")"
cache="$root/bench/.cache/base-$sha"
new_bin="$root/target/release/tessera"
[ -x "$new_bin" ] || { echo "error: build this tree first (make build)" >&2; exit 1; }
if [ ! -x "$cache/target/release/tessera" ]; then
    echo "building $base_rev ($sha) into $cache" >&2
    rm -rf "$cache/src"
    mkdir -p "$cache"
    git -C "$root" worktree add --detach -f "$cache/src" "$sha" >/dev/null
    (cd "$cache/src" && CARGO_TARGET_DIR="$cache/target" cargo build --release -p cli --bin tessera >&2)
    git -C "$root" worktree remove --force "$cache/src"
fi
base_bin="$cache/target/release/tessera"

bench_name=compare-commits
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"

# One turn: a fresh cluster from binary $2, PUT then GET, results appended as JSON lines.
turn() {
    local label="$1" bin="$2" n="$3"
    local dir="$work/$label-$n" port=$((base_port + 10 * (n % 4)))
    "$bin" init --nodes 6 --ec 4+2 --data "$dir" --base-port "$port" >/dev/null
    local config="$dir/cluster.toml" node_pids=()
    for i in 1 2 3 4 5 6; do
        TESSERA_LOG=warn "$bin" node --config "$config" --id "n$i" 2>>"$work/nodes.log" &
        node_pids+=($!)
        pids+=($!)
    done
    for i in 0 1 2 3 4 5; do
        for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$((port + i))") 2>/dev/null && break; sleep 0.05; done
    done
    local common=(--config "$config" --size "$size" --objects "$objects" --duration "$duration" --json)
    printf '{"label":"%s","op":"put","result":%s}\n' "$label" \
        "$("$bin" bench put "${common[@]}" --concurrency "$put_concurrency" --bucket bench-put)" >>"$work/results.jsonl"
    printf '{"label":"%s","op":"get","result":%s}\n' "$label" \
        "$("$bin" bench get "${common[@]}" --concurrency "$get_concurrency")" >>"$work/results.jsonl"
    kill -9 "${node_pids[@]}" 2>/dev/null || true
    wait "${node_pids[@]}" 2>/dev/null || true
    rm -rf "$dir"
}

for n in $(seq "$turns"); do
    echo "turn $n/$turns: base ($sha)" >&2
    turn base "$base_bin" $((2 * n))
    echo "turn $n/$turns: this tree" >&2
    turn new "$new_bin" $((2 * n + 1))
done

python3 - "$work/results.jsonl" "$sha" <<'PY'
import json, statistics, sys, datetime, subprocess
rows = [json.loads(line) for line in open(sys.argv[1])]
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.date.today()}  cpu {cpu}  base {sys.argv[2]}")
print(f"{'build':<6} {'op':<4} {'GB/s per turn':<28} {'median':>7} {'p99 ms (median)':>16} {'cpu-s/GB':>9}")
med = {}
for label in ("base", "new"):
    for op in ("put", "get"):
        rs = [r["result"] for r in rows if r["label"] == label and r["op"] == op]
        gbs = [r["throughput_bytes_per_s"] / 1e9 for r in rs]
        med[(label, op)] = statistics.median(gbs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        cpu_gb = statistics.median(r["client_cpu_s_per_gb"] for r in rs)
        turns = " ".join(f"{g:.3f}" for g in gbs)
        print(f"{label:<6} {op:<4} {turns:<28} {med[(label, op)]:>7.3f} {p99:>16.2f} {cpu_gb:>9.3f}")
for op in ("put", "get"):
    print(f"{op.upper()} this tree / base: {med[('new', op)] / med[('base', op)]:.3f}")
PY
