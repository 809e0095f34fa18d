#!/usr/bin/env bash
# Healing on a fresh local 6-node 4+2 cluster (1 MiB chunks), idle:
#  1. time from a node's return to full redundancy for what it missed: n3 is killed, OBJECTS
#     objects of 1 MiB are written, n3 restarts; timed until the cluster reports every one of
#     them repaired (the sum of `versions_repaired` over the nodes);
#  2. kill -9 mid-rebuild: n2's drive is wiped and rebuilt at a 20 MiB/s budget; n2 is killed
#     once a third of its keys are done and restarted; the rebuild must go on from its cursor
#     (the keys it goes through after the restart are counted) and finish.
# Usage: bench/heal.sh   (env: OBJECTS=1024 BASE_PORT=27301)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
objects="${OBJECTS:-1024}"
base_port="${BASE_PORT:-27301}"
bench_name=heal
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

# The sum of one JSON field over every node's `repair status --json` line.
# (`repair status` exits non-zero while a node is down; its other lines still count.)
status_json() { "$tessera" repair status --json 2>/dev/null || true; }
status_sum() { status_json | { grep -o "\"$1\":[0-9]*" || true; } | cut -d: -f2 | awk '{s+=$1} END {print s+0}'; }
n2_field() { status_json | { grep '"node":"n2"' || true; } | { grep -o "\"$1\":[a-z0-9]*" || true; } | cut -d: -f2; }
for i in 1 2 3 4 5 6; do start_node "$i"; done
"$tessera" mb heal >/dev/null
head -c $((1 << 20)) /dev/urandom >"$work/obj"

echo "== 1. n3 down while $objects objects are written" >&2
kill_node 3
seq 0 $((objects - 1)) | xargs -P 8 -I{} "$tessera" put "$work/obj" "heal/o{}" >/dev/null 2>>"$work/puts.log"
before=$(status_sum versions_repaired)
t0=$(date +%s.%N)
start_node 3
until [ "$(status_sum versions_repaired)" -ge $((before + objects)) ]; do sleep 0.2; done
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
printf '\n%-52s %10s\n' "healing" "result"
printf '%-52s %10s\n' "n3 back to full redundancy for $objects MiB written" "${secs} s"
printf '%-52s %10s\n' "  rate (MiB of objects made whole per second)" "$(awk -v n="$objects" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')"

echo "== 2. n2 wiped, rebuilt at 20 MiB/s, killed -9 a third of the way" >&2
"$tessera" repair rate 20MiB/s >/dev/null
kill_node 2
find "$work/d/n2/d1" -mindepth 1 -delete
start_node 2
total=$objects
until [ "$(n2_field rebuild_keys_checked)" -ge $((total / 3)) ] 2>/dev/null; do sleep 0.1; done
done_before=$(n2_field rebuild_keys_checked)
kill_node 2
start_node 2
until [ "$(n2_field rebuilding)" = "false" ]; do sleep 0.2; done
after=$(n2_field rebuild_keys_checked)
printf '%-52s %10s\n' "keys rebuilt before kill -9 (of $total)" "$done_before"
printf '%-52s %10s\n' "keys gone through after the restart (cursor)" "$after"
[ "$after" -lt "$total" ] || echo "note: the restarted rebuild went through every key again" >&2
[ "$(n2_field rebuilding)" = "false" ] && printf '%-52s %10s\n' "rebuild finished after the restart" "yes"
