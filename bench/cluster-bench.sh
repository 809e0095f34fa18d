#!/usr/bin/env bash
# Smart-client GET and PUT on a fresh local 6-node 4+2 cluster (1 MiB chunks), then GET with one
# and two nodes killed (SIGKILL), against the loopback TCP bound measured by iperf3 in the same run.
# Prints one table; every ratio is against a number measured in this run.
# Usage: bench/cluster-bench.sh   (env: DURATION=20s SIZE=1MiB OBJECTS=256 CONCURRENCY=16)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tessera="$root/target/release/tessera"
duration="${DURATION:-20s}"
size="${SIZE:-1MiB}"
objects="${OBJECTS:-256}"
concurrency="${CONCURRENCY:-16}"
base_port="${BASE_PORT:-27101}"
bench_name=cluster-bench
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"

[ -x "$tessera" ] || { echo "error: build first (make build)" >&2; exit 1; }
if ! command -v iperf3 >/dev/null && [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null 2>&1 || true
fi

"$tessera" init --nodes 6 --ec 4+2 --data "$work/d" --base-port "$base_port" >/dev/null
export TESSERA_CONFIG="$work/d/cluster.toml"
for i in 1 2 3 4 5 6; do
    TESSERA_LOG=warn "$tessera" node --config "$TESSERA_CONFIG" --id "n$i" 2>>"$work/nodes.log" &
    pids+=($!)
done
for i in 0 1 2 3 4 5; do
    port=$((base_port + i))
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
done

results="$work/results.jsonl"
run() {
    local label="$1"; shift
    echo "== $label: tessera bench $*" >&2
    printf '{"label":"%s","result":%s}\n' "$label" "$("$tessera" bench "$@" --json)" >>"$results"
}
common=(--size "$size" --objects "$objects" --duration "$duration")

run "put" put "${common[@]}" --concurrency 8 --bucket bench-put
run "get healthy" get "${common[@]}" --concurrency "$concurrency"
kill -9 "${pids[1]}"   # n2
run "get 1 node down" get "${common[@]}" --concurrency "$concurrency" --no-prefill
kill -9 "${pids[4]}"   # n5
run "get 2 nodes down" get "${common[@]}" --concurrency "$concurrency" --no-prefill

iperf=""
if command -v iperf3 >/dev/null; then
    iperf3 -s -1 -B 127.0.0.1 -p $((base_port + 50)) >/dev/null 2>&1 &
    pids+=($!)
    sleep 0.3
    iperf=$(iperf3 -c 127.0.0.1 -p $((base_port + 50)) -t 5 -J 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8)' || true)
fi

python3 - "$results" "$iperf" <<'PY'
import json, sys, datetime, platform, subprocess
rows = [json.loads(line) for line in open(sys.argv[1])]
iperf = float(sys.argv[2]) if sys.argv[2] else None
healthy = next(r["result"]["throughput_bytes_per_s"] for r in rows if r["label"] == "get healthy")
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.date.today()}  cpu {cpu}  nproc {subprocess.run(['nproc'],capture_output=True,text=True).stdout.strip()}")
if iperf:
    print(f"iperf3 loopback, 1 stream: {iperf/1e9:.2f} GB/s")
print(f"{'run':<18} {'GB/s':>7} {'obj/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu-s/GB':>9} {'vs healthy':>10} {'vs iperf3':>9}")
for row in rows:
    r = row["result"]
    gbs = r["throughput_bytes_per_s"] / 1e9
    vs_healthy = f"{r['throughput_bytes_per_s']/healthy:.2f}" if r["op"] == "get" else "-"
    vs_iperf = f"{r['throughput_bytes_per_s']/iperf:.2f}" if iperf else "-"
    print(f"{row['label']:<18} {gbs:>7.3f} {r['objects_per_s']:>8.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['client_cpu_s_per_gb']:>9.3f} {vs_healthy:>10} {vs_iperf:>9}")
PY
