#!/usr/bin/env bash
# Rebuild of a wiped drive under a foreground GET load, on a fresh local 6-node 4+2 cluster
# (1 MiB chunks), against the same load on the healthy idle cluster and the disk's sequential
# write bandwidth (dd), all measured in this run.
#
#  1. Fills the cluster until one drive holds DRIVE_GIB of 1 MiB objects, plus FG_OBJECTS
#     objects of 1 MiB that the foreground load reads.
#  2. Capacity: closed-loop GETs (16 in flight) on the healthy idle cluster, DURATION.
#  3. The load: LOAD x that capacity in objects/s, offered on a fixed schedule (tessera bench
#     --rate, latency counted from each request's scheduled start), DURATION on the healthy
#     cluster.
#     The same load with n2 down (read around, nothing rebuilt) separates the cost of reading
#     around a drive from the cost of rebuilding it.
#  4. For each budget in BUDGETS ("default": the node's default budget), twice: n2's drive is
#     replaced by an empty one and n2 restarted; SETTLE (2) seconds later, while it rebuilds,
#     the same load runs for DURATION (the first time) or the closed-loop GETs do (the
#     second); the rebuild's rate is the bytes n2's drive gained over the window. Then the
#     budget is raised so the rebuild finishes before the next window.
# Usage: bench/rebuild-under-load.sh  (env: DRIVE_GIB=4 FG_OBJECTS=256 LOAD=0.5 DURATION=10s
#        SETTLE=2 BUDGETS="default 300MiB/s" BASE_PORT=27251)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
drive_gib="${DRIVE_GIB:-4}"
fg_objects="${FG_OBJECTS:-256}"
load="${LOAD:-0.5}"
duration="${DURATION:-10s}"
settle="${SETTLE:-2}"
budgets="${BUDGETS:-default 300MiB/s}"
base_port="${BASE_PORT:-27251}"
bench_name=rebuild-load
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

need_gib=$((drive_gib * 6 + drive_gib + 2))
avail_gib=$(( $(df -Pk "$work" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
[ "$avail_gib" -ge "$need_gib" ] || { echo "error: $work has ${avail_gib} GiB free, this run needs ${need_gib}" >&2; exit 1; }

for i in 1 2 3 4 5 6; do start_node "$i"; done
default_budget=$("$tessera" repair status --json | sed -n 's/.*"bytes_per_s":\([0-9]*\).*/\1/p' | head -1)
objects=$((drive_gib * 1024 * 4))
echo "== writing $objects objects of 1 MiB ($((objects / 1024)) GiB) and $fg_objects for the load" >&2
fill rebuild "$objects"
fill foreground "$fg_objects"
drive="$work/d/n2/d1"
sync
echo "== dd: sequential write of $drive_gib GiB on the same file system" >&2
dd_mbs=$(measure_dd "$drive_gib" conv=fsync)
direct_mbs=$(measure_dd "$drive_gib" oflag=direct conv=fsync)

results="$work/results.txt"
# get LABEL [--rate R]: one foreground run, appended to the results as `LABEL json`.
get() {
    local label=$1
    shift
    echo "== $label" >&2
    printf '%s %s\n' "$label" "$("$tessera" bench get --bucket foreground --objects "$fg_objects" --size 1MiB --no-prefill \
        --duration "$duration" --json "$@")" >>"$results"
}
field() { grep "^$1 " "$results" | tail -1 | sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p"; }
held() { file_bytes "$drive/data"; }

get capacity --concurrency 16
rate=$(awk -v c="$(field capacity objects_per_s)" -v l="$load" 'BEGIN { printf "%.1f", c * l }')
get healthy --rate "$rate" --concurrency 64
# What the rebuild costs apart from the reads around the drive it rebuilds: the same load with
# n2 down (its chunks decoded from parity, nothing rebuilt).
kill_node 2
get degraded --rate "$rate" --concurrency 64
start_node 2

rebuild_rows=()
for budget in $budgets; do
    if [ "$budget" = default ]; then
        budget_bytes=$default_budget
    else
        "$tessera" repair rate "$budget" >/dev/null
        budget_bytes=$("$tessera" repair status --json | sed -n 's/.*"bytes_per_s":\([0-9]*\).*/\1/p' | head -1)
    fi
    # One rebuild per window: the drive formats and starts rebuilding at once, and the
    # window's rate is what it gained.
    for kind in open closed; do
        "$tessera" repair rate "$budget_bytes" >/dev/null
        kill_node 2
        replace_disk "$drive"
        rm -rf "$work/old-drive"
        start_node 2
        # The window opens once the rebuild is under way (the first seconds after a restart
        # with a new drive cost clients more; SETTLE=0 measures them too).
        sleep "$settle"
        h0=$(held); t0=$(date +%s.%N)
        if [ "$kind" = open ]; then
            get "rebuild-$budget-open" --rate "$rate" --concurrency 64
        else
            get "rebuild-$budget-closed" --concurrency 16
        fi
        h1=$(held); t1=$(date +%s.%N)
        ended=no
        "$tessera" repair status --json | grep '"node":"n2"' | grep -q '"rebuilding":true' || ended=yes
        rebuild_rows+=("$budget $kind $budget_bytes $(awk -v a="$h0" -v b="$h1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.1f", (b - a) / (e - s) / 1e6 }') $ended")
        "$tessera" repair rate 2GiB/s >/dev/null
        wait_rebuilt 2
    done
done

echo
echo "date $(date -u +%F)  cpu $(lscpu | sed -n 's/^Model name: *//p')  nproc $(nproc)  drive $drive_gib GiB of 1 MiB objects"
echo "disk: dd conv=fsync $dd_mbs MB/s, dd oflag=direct $direct_mbs MB/s"
cap_tp=$(field capacity throughput_bytes_per_s); cap_p99=$(field capacity p99_ms)
h_tp=$(field healthy throughput_bytes_per_s); h_p99=$(field healthy p99_ms)
d_tp=$(field degraded throughput_bytes_per_s); d_p99=$(field degraded p99_ms)
printf '%-34s %9s %9s %10s %10s %12s %11s %12s %12s\n' "foreground GET (1 MiB)" "GET MB/s" "p99 ms" "vs healthy" "p99 ratio" "rebuild MB/s" "vs budget" "vs dd fsync" "vs dd direct"
printf '%-34s %9.1f %9.2f %10s %10s %12s %11s %12s %12s\n' "healthy, closed loop (16)" "$(awk -v t="$cap_tp" 'BEGIN { print t / 1e6 }')" "$cap_p99" "1.00x" "1.00x" "-" "-" "-" "-"
printf '%-34s %9.1f %9.2f %10s %10s %12s %11s %12s %12s\n' "healthy, open loop ($rate obj/s)" "$(awk -v t="$h_tp" 'BEGIN { print t / 1e6 }')" "$h_p99" "1.00x" "1.00x" "-" "-" "-" "-"
printf '%-34s %9.1f %9.2f %10s %10s %12s %11s %12s %12s\n' "n2 down, no rebuild, open loop" "$(awk -v t="$d_tp" 'BEGIN { print t / 1e6 }')" "$d_p99" \
    "$(awk -v a="$d_tp" -v b="$h_tp" 'BEGIN { printf "%.2fx", a / b }')" "$(awk -v a="$d_p99" -v b="$h_p99" 'BEGIN { printf "%.2fx", a / b }')" "-" "-" "-" "-"
for entry in "${rebuild_rows[@]}"; do
    read -r budget kind budget_bytes rebuild_mbs ended <<<"$entry"
    label="rebuild-$budget-$kind"
    tp=$(field "$label" throughput_bytes_per_s); p99=$(field "$label" p99_ms)
    if [ "$kind" = open ]; then base_tp=$h_tp base_p99=$h_p99; else base_tp=$cap_tp base_p99=$cap_p99; fi
    printf '%-34s %9.1f %9.2f %10s %10s %12s %11s %12s %12s\n' \
        "rebuilding at $budget, $kind loop$([ "$ended" = yes ] && echo '*')" "$(awk -v t="$tp" 'BEGIN { print t / 1e6 }')" "$p99" \
        "$(awk -v a="$tp" -v b="$base_tp" 'BEGIN { printf "%.2fx", a / b }')" \
        "$(awk -v a="$p99" -v b="$base_p99" 'BEGIN { printf "%.2fx", a / b }')" \
        "$rebuild_mbs" \
        "$(awk -v r="$rebuild_mbs" -v b="$budget_bytes" 'BEGIN { printf "%.2fx", r * 1e6 / b }')" \
        "$(awk -v r="$rebuild_mbs" -v d="$dd_mbs" 'BEGIN { printf "%.2fx", r / d }')" \
        "$(awk -v r="$rebuild_mbs" -v d="$direct_mbs" 'BEGIN { printf "%.2fx", r / d }')"
done
if printf '%s\n' "${rebuild_rows[@]}" | grep -q ' yes$'; then
    echo "* the rebuild finished inside the window: its rate there is a lower bound"
fi
