#!/usr/bin/env bash
# What TLS costs the S3 gateway: PUT and GET throughput, and CPU seconds per GB moved (the
# gateway's, from /proc, and the client's, as `tessera bench` reports it), through a gateway
# serving HTTPS (`--tls-cert/--tls-key`, a P-256 certificate from `tessera tls-cert`) against
# one serving plain HTTP, on the same fresh local 6-node 4+2 cluster, with the same client
# (`tessera bench --s3`, which speaks TLS with rustls too) and bucket. Each round starts a fresh
# pair of gateways and swaps which of the two ports serves TLS, and the order of the runs
# alternates, so what differs between two gateway processes cancels out over the rounds.
# Prints each run, then the ratios TLS / plain of the means.
# Usage: bench/tls-cost.sh   (env: ROUNDS=4 SECONDS_PER_RUN=15 SIZE=1MiB CONCURRENCY=8
#                             BASE_PORT=27501)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${ROUNDS:-4}"
secs="${SECONDS_PER_RUN:-15}"
size="${SIZE:-1MiB}"
concurrency="${CONCURRENCY:-8}"
base_port="${BASE_PORT:-27501}"
bench_name=tls-cost
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

export TESSERA_ACCESS_KEY=BENCHTLS TESSERA_SECRET_KEY="bench-tls-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
port_a=$((base_port + 10)) port_b=$((base_port + 11))
"$tessera" tls-cert --dir "$work/tls" --name 127.0.0.1 >/dev/null
cert="$work/tls/server.pem" key="$work/tls/server-key.pem" ca="$work/tls/ca.pem"
for i in 1 2 3 4 5 6; do start_node "$i"; done
declare -A gateway_pid=()
start_gateway() { # start_gateway PORT [ARGS...]
    "$tessera" gateway --config "$TESSERA_CONFIG" --listen "127.0.0.1:$1" --relayout-rate 0 "${@:2}" >>"$work/gw-$1.log" 2>&1 &
    gateway_pid[$1]=$!
    pids+=($!)
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done
    echo "error: the gateway on $1 did not start" >&2; exit 1
}
stop_gateways() {
    local pid kept=() p
    for pid in "${gateway_pid[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    # Reaped: the exit cleanup must not kill whatever process gets the pid next.
    for p in "${pids[@]}"; do [[ " ${gateway_pid[*]} " == *" $p "* ]] || kept+=("$p"); done
    pids=("${kept[@]}")
    gateway_pid=()
}
# CPU seconds (user + system) a process has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }

run() { # run OP SCHEME PORT -> "bytes/s bytes client_cpu_s gateway_cpu_s"
    local before after out extra=()
    # GETs read what the round's PUT runs wrote (same keys and size): no prefill through the
    # measured gateway, whose CPU would count against bytes it did not serve.
    [ "$1" = get ] && extra=(--no-prefill)
    before=$(cpu_s "${gateway_pid[$3]}")
    out=$("$tessera" bench "$1" --s3 "$2://127.0.0.1:$3" --ca-bundle "$ca" --bucket bench --size "$size" --objects 64 \
        --concurrency "$concurrency" --duration "${secs}s" --json "${extra[@]}") || { echo "error: bench $1 on $2 port $3 failed" >&2; return 1; }
    after=$(cpu_s "${gateway_pid[$3]}")
    field() { echo "$out" | grep -o "\"$1\":[0-9.]*" | cut -d: -f2; }
    echo "$(field throughput_bytes_per_s) $(field bytes) $(field client_cpu_s) $(awk -v a="$before" -v b="$after" 'BEGIN { print b - a }')"
}

declare -A bps=() bytes=() client=() server=()
for k in put-tls put-plain get-tls get-plain; do bps[$k]=0 bytes[$k]=0 client[$k]=0 server[$k]=0; done
add() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", a + b }'; }
echo "# TLS cost: $rounds rounds of ${secs}s, $size objects, concurrency $concurrency ($(date -u +%F), $(nproc) cores)"
for round in $(seq "$rounds"); do
    tls_port=$port_a plain_port=$port_b
    if ((round % 2 == 0)); then tls_port=$port_b plain_port=$port_a; fi
    # The gateway on port A starts first every round; which one serves TLS alternates.
    for port in "$port_a" "$port_b"; do
        if ((port == tls_port)); then start_gateway "$port" --tls-cert "$cert" --tls-key "$key"; else start_gateway "$port"; fi
    done
    order=("tls" "plain")
    if (((round + 1) / 2 % 2 == 0)); then order=("plain" "tls"); fi
    for op in put get; do
        for which in "${order[@]}"; do
            if [ "$which" = tls ]; then port=$tls_port scheme=https; else port=$plain_port scheme=http; fi
            result=$(run "$op" "$scheme" "$port")
            read -r b n c s <<<"$result"
            k="$op-$which"
            bps[$k]=$(add "${bps[$k]}" "$b") bytes[$k]=$(add "${bytes[$k]}" "$n")
            client[$k]=$(add "${client[$k]}" "$c") server[$k]=$(add "${server[$k]}" "$s")
            awk -v r="$round" -v op="$op" -v w="$which" -v p="$port" -v b="$b" -v n="$n" -v c="$c" -v s="$s" \
                'BEGIN { printf "round %d  %-3s %-5s (port %d) %8.1f MB/s  gateway %.2f CPU s/GB  client %.2f CPU s/GB\n", r, op, w, p, b / 1e6, s / (n / 1e9), c / (n / 1e9) }'
        done
    done
    stop_gateways
done
for op in put get; do
    awk -v op="$op" -v bt="${bps[$op-tls]}" -v bp="${bps[$op-plain]}" -v nt="${bytes[$op-tls]}" -v np="${bytes[$op-plain]}" \
        -v st="${server[$op-tls]}" -v sp="${server[$op-plain]}" -v ct="${client[$op-tls]}" -v cp="${client[$op-plain]}" -v r="$rounds" \
        'BEGIN {
            printf "%s: throughput TLS / plain = %.3f (TLS %.1f MB/s, plain %.1f MB/s, means)\n", op, bt / bp, bt / r / 1e6, bp / r / 1e6
            printf "%s: gateway CPU s/GB TLS %.2f, plain %.2f (TLS / plain = %.3f); client CPU s/GB TLS %.2f, plain %.2f\n", op, st / (nt / 1e9), sp / (np / 1e9), (st / nt) / (sp / np), ct / (nt / 1e9), cp / (np / 1e9)
        }'
done
