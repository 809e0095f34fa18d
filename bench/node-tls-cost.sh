#!/usr/bin/env bash
# What TLS costs the node protocol: PUT and GET throughput of the smart client (`tessera
# bench`), and CPU seconds per GB moved (the six nodes' together, from /proc, and the client's,
# as `tessera bench` reports it), on a fresh local 6-node 4+2 cluster made with
# `init --node-tls on` against an identical one made with `--node-tls off`, on the same disk.
# Both clusters run throughout; the order of the runs alternates each round, so drift (page
# cache, disk) falls on both. Prints each run, then the ratios TLS / plain of the means.
# Usage: bench/node-tls-cost.sh   (env: ROUNDS=4 SECONDS_PER_RUN=10 SIZE=1MiB CONCURRENCY=8
#                                  BASE_PORT=27601)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${ROUNDS:-4}"
secs="${SECONDS_PER_RUN:-10}"
size="${SIZE:-1MiB}"
concurrency="${CONCURRENCY:-8}"
base_port="${BASE_PORT:-27601}"
bench_name=node-tls-cost
tessera="$root/target/release/tessera"
[ -x "$tessera" ] || { echo "error: build first (make build)" >&2; exit 1; }
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"

declare -A node_pids=()
for which in tls plain; do
    port=$base_port
    [ "$which" = plain ] && port=$((base_port + 10))
    mode=on
    [ "$which" = plain ] && mode=off
    "$tessera" init --nodes 6 --ec 4+2 --data "$work/$which" --base-port "$port" --node-tls "$mode" >/dev/null
    for i in 1 2 3 4 5 6; do
        TESSERA_LOG=warn "$tessera" node --config "$work/$which/cluster.toml" --id "n$i" --scrub-interval 24h >>"$work/$which-n$i.log" 2>&1 &
        pids+=($!)
        node_pids[$which]="${node_pids[$which]:-} $!"
        p=$((port + i - 1))
        for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.05; done
    done
done
grep -q node_tls "$work/tls/cluster.toml" && ! grep -q node_tls "$work/plain/cluster.toml" \
    || { echo "error: the clusters are not what they should be" >&2; exit 1; }

# CPU seconds (user + system) the nodes of one cluster have used so far.
nodes_cpu_s() {
    local total=0 pid
    for pid in ${node_pids[$1]}; do
        total=$(awk -v hz="$(getconf CLK_TCK)" -v t="$total" '{ printf "%.3f", t + ($14 + $15) / hz }' "/proc/$pid/stat")
    done
    echo "$total"
}

run() { # run OP WHICH -> "bytes/s bytes client_cpu_s nodes_cpu_s"
    local before after out extra=()
    # GETs read what the round's PUT run wrote (same keys and size).
    [ "$1" = get ] && extra=(--no-prefill)
    before=$(nodes_cpu_s "$2")
    out=$("$tessera" bench "$1" --config "$work/$2/cluster.toml" --bucket bench --size "$size" --objects 64 \
        --concurrency "$concurrency" --duration "${secs}s" --json "${extra[@]}") || { echo "error: bench $1 on $2 failed" >&2; return 1; }
    after=$(nodes_cpu_s "$2")
    field() { echo "$out" | grep -o "\"$1\":[0-9.]*" | cut -d: -f2; }
    echo "$(field throughput_bytes_per_s) $(field bytes) $(field client_cpu_s) $(awk -v a="$before" -v b="$after" 'BEGIN { print b - a }')"
}

declare -A bps=() bytes=() client=() server=()
for k in put-tls put-plain get-tls get-plain; do bps[$k]=0 bytes[$k]=0 client[$k]=0 server[$k]=0; done
add() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", a + b }'; }
echo "# node protocol TLS cost: $rounds rounds of ${secs}s, $size objects, concurrency $concurrency ($(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
for round in $(seq "$rounds"); do
    order=("tls" "plain")
    if ((round % 2 == 0)); then order=("plain" "tls"); fi
    for op in put get; do
        for which in "${order[@]}"; do
            result=$(run "$op" "$which")
            read -r b n c s <<<"$result"
            k="$op-$which"
            bps[$k]=$(add "${bps[$k]}" "$b") bytes[$k]=$(add "${bytes[$k]}" "$n")
            client[$k]=$(add "${client[$k]}" "$c") server[$k]=$(add "${server[$k]}" "$s")
            awk -v r="$round" -v op="$op" -v w="$which" -v b="$b" -v n="$n" -v c="$c" -v s="$s" \
                'BEGIN { printf "round %d  %-3s %-5s %8.1f MB/s  nodes %.2f CPU s/GB  client %.2f CPU s/GB\n", r, op, w, b / 1e6, s / (n / 1e9), c / (n / 1e9) }'
        done
    done
done
for op in put get; do
    awk -v op="$op" -v bt="${bps[$op-tls]}" -v bp="${bps[$op-plain]}" -v nt="${bytes[$op-tls]}" -v np="${bytes[$op-plain]}" \
        -v st="${server[$op-tls]}" -v sp="${server[$op-plain]}" -v ct="${client[$op-tls]}" -v cp="${client[$op-plain]}" -v r="$rounds" \
        'BEGIN {
            printf "%s: throughput TLS / plain = %.3f (TLS %.1f MB/s, plain %.1f MB/s, means)\n", op, bt / bp, bt / r / 1e6, bp / r / 1e6
            printf "%s: nodes CPU s/GB TLS %.2f, plain %.2f (TLS / plain = %.3f); client CPU s/GB TLS %.2f, plain %.2f (TLS / plain = %.3f)\n", op, st / (nt / 1e9), sp / (np / 1e9), (st / nt) / (sp / np), ct / (nt / 1e9), cp / (np / 1e9), (ct / nt) / (cp / np)
        }'
done
