#!/usr/bin/env bash
# What the gateway's metrics cost: S3 PUT and GET throughput through a gateway that counts
# (--metrics-listen, scraped every second, 15x Prometheus' default rate) against one that does
# not (no --metrics-listen: the request path does no metrics work), on the same fresh local
# 6-node 4+2 cluster, with the same client (`tessera bench --s3`).
#
# Both gateways are driven at the same time, each by its own `tessera bench` with half the
# operations in flight, each into its own bucket. Run one after the other, what the 2-core VM
# does between two runs swamps a 2% effect; side by side, both see the same moments, and what
# one gateway spends on counting is what it loses against the other in the competition for
# the same cores. Each round starts a fresh pair of gateways. Two identical gateways still
# differ (by up to 15% in a GET round here, unpaired), and so may what else tells the two sides apart
# (which starts first, which bucket's keys it reads), so everything but the counting belongs to
# a port: port A's gateway and its client start first, and it uses bucket bench-a. Rounds come
# in pairs that swap which port counts, and a pair's ratio is the geometric mean of its two
# rounds' ratios: what belongs to a port cancels within the pair.
#
# Prints each round and, over the pairs, the geometric mean of the on/off ratios with a 95%
# interval (Student's t over the pairs' log ratios): throughput, and the gateway's CPU seconds
# per GB (user + system, from /proc). The issue's target is throughput on/off >= 0.98; it is
# shown when the interval's lower end is >= 0.98. CONTROL=1 runs the same with neither gateway
# counting (an A/A run): what it prints is the method's own resolution.
# Usage: bench/metrics-overhead.sh   (env: PAIRS=8 SECONDS_PER_RUN=10 SIZE=1MiB CONCURRENCY=8
#                                     CONTROL=0 BASE_PORT=27401)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pairs="${PAIRS:-8}"
secs="${SECONDS_PER_RUN:-10}"
size="${SIZE:-1MiB}"
concurrency="${CONCURRENCY:-8}"
control="${CONTROL:-0}"
base_port="${BASE_PORT:-27401}"
bench_name=metrics-overhead
((pairs >= 2 && pairs <= 30)) || { echo "error: PAIRS must be 2 to 30 (an interval needs two)" >&2; exit 1; }
((concurrency >= 2 && concurrency % 2 == 0)) || { echo "error: CONCURRENCY must be even (half per gateway)" >&2; exit 1; }
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

export TESSERA_ACCESS_KEY=BENCHMETRICS TESSERA_SECRET_KEY="bench-metrics-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
port_a=$((base_port + 10)) port_b=$((base_port + 11)) scrape_port=$((base_port + 12))
for i in 1 2 3 4 5 6; do start_node "$i"; done
declare -A gateway_pid=()
start_gateway() {
    "$tessera" gateway --config "$TESSERA_CONFIG" --listen "127.0.0.1:$1" --relayout-rate 0 "${@:2}" >>"$work/gw-$1.log" 2>&1 &
    gateway_pid[$1]=$!
    pids+=($!)
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done
    echo "error: the gateway on $1 did not start" >&2; exit 1
}
stop_gateways() {
    for pid in "${gateway_pid[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    gateway_pid=()
}
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }
# The scraper: every second, as long as the benchmark runs.
(while true; do curl -s -o /dev/null "http://127.0.0.1:$scrape_port/metrics" || true; sleep 1; done) &
pids+=($!)

bench_into() { # bench_into OP PORT BUCKET OUT_FILE
    local prefill=()
    [ "$1" = get ] && prefill=(--no-prefill) # reads what this round's PUT wrote
    "$tessera" bench "$1" --s3 "http://127.0.0.1:$2" --bucket "$3" --size "$size" --objects 64 \
        --concurrency $((concurrency / 2)) --duration "${secs}s" --json "${prefill[@]}" >"$4"
}
field() { grep -o "\"$1\":[0-9.]*" "$2" | cut -d: -f2; }

mode="one gateway counts (on), one does not (off); the ports swap every round"
on_name=on off_name=off
if ((control)); then
    mode="CONTROL: neither gateway counts (an A/A run; A and B take the places of on and off)"
    on_name=A off_name=B
fi
echo "# metrics overhead: $pairs pairs of rounds of ${secs}s side by side, $size objects, $((concurrency / 2)) in flight per gateway ($(date -u +%F), $(nproc) cores, $(uname -m))"
echo "# $mode"
ratios="$work/ratios"
: >"$ratios"
for round in $(seq $((2 * pairs))); do
    on_port=$port_a off_port=$port_b
    if ((round % 2 == 0)); then on_port=$port_b off_port=$port_a; fi
    # Port A's gateway starts first every round.
    for port in "$port_a" "$port_b"; do
        if ((port == on_port && !control)); then
            start_gateway "$port" --metrics-listen "127.0.0.1:$scrape_port"
        else
            start_gateway "$port"
        fi
    done
    for op in put get; do
        declare -A before=()
        for port in "$port_a" "$port_b"; do before[$port]=$(cpu_s "${gateway_pid[$port]}"); done
        bench_into "$op" "$port_a" bench-a "$work/$port_a.json" &
        a_bench=$!
        bench_into "$op" "$port_b" bench-b "$work/$port_b.json" &
        b_bench=$!
        wait "$a_bench" # each on its own: `wait A B` returns only B's status
        wait "$b_bench"
        cp "$work/$on_port.json" "$work/on.json"
        cp "$work/$off_port.json" "$work/off.json"
        line=""
        for which in on off; do
            port=$on_port
            [ "$which" = off ] && port=$off_port
            cpu=$(awk -v a="${before[$port]}" -v b="$(cpu_s "${gateway_pid[$port]}")" 'BEGIN { print b - a }')
            for name in throughput_bytes_per_s bytes; do
                [ -n "$(field "$name" "$work/$which.json")" ] || { echo "error: round $round $op: no $name from the client of port $port" >&2; exit 1; }
            done
            line+=" $(field throughput_bytes_per_s "$work/$which.json") $(field bytes "$work/$which.json") $cpu"
        done
        # op round  on_bps on_bytes on_cpu  off_bps off_bytes off_cpu
        echo "$op $round$line" >>"$ratios"
        # shellcheck disable=SC2086
        set -- $line
        awk -v r="$round" -v op="$op" -v a="$on_name" -v b="$off_name" -v on="$on_port" -v off="$off_port" \
            -v tb="$1" -v ob="$2" -v oc="$3" -v fb="$4" -v fby="$5" -v fc="$6" 'BEGIN {
            printf "round %2d  %-3s  %-3s (port %d) %7.1f MB/s %5.2f CPU s/GB | %-3s (port %d) %7.1f MB/s %5.2f CPU s/GB | %s/%s %.3f\n",
                r, op, a, on, tb / 1e6, oc / (ob / 1e9), b, off, fb / 1e6, fc / (fby / 1e9), a, b, tb / fb }'
    done
    # The counting gateway counted what it served (in an A/A run no metrics address answers).
    series=$(curl -s "http://127.0.0.1:$scrape_port/metrics" | grep -c '^tessera_s3_requests_total' || true)
    stop_gateways
done
echo "the counting gateway of the last round exposed $series request series"

# A pair's log ratio is the mean of its two rounds'; over the pairs: the mean +- t * sd / sqrt(n).
label="$on_name/$off_name"
for op in put get; do
    awk -v op="$op" -v label="$label" -v control="$control" '
    function t975(df) { # Student t, two-sided 95%
        split("12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145 2.131 2.120 2.110 2.101 2.093 2.086 2.080 2.074 2.069 2.064 2.060 2.056 2.052 2.048 2.045", t, " ")
        return t[df]
    }
    function report(name, sum, sumsq, n,   m, sd, h) {
        m = sum / n; sd = sqrt((sumsq - n * m * m) / (n - 1)); h = t975(n - 1) * sd / sqrt(n)
        printf "%s %-24s %.3f  (95%% interval %.3f to %.3f over %d pairs of rounds)\n", op, name, exp(m), exp(m - h), exp(m + h), n
        return exp(m - h)
    }
    $1 == op {
        x = log($3 / $6) / 2                 # throughput, on over off
        y = log(($5 / $4) / ($8 / $7)) / 2  # gateway CPU per GB, on over off
        if ($2 % 2 == 1) { px = x; py = y; next }
        n++; st += px + x; sst += (px + x) ^ 2; sc += py + y; ssc += (py + y) ^ 2
    }
    END {
        low = report(label " throughput", st, sst, n)
        report(label " gateway CPU/GB", sc, ssc, n)
        if (!control) printf "%s target on/off >= 0.98: %s\n", op, (low >= 0.98 ? "met (the whole interval lies above it)" : "NOT shown by this run")
    }' "$ratios"
done
