#!/usr/bin/env bash
# Rebuild of a wiped drive on a fresh local 6-node 4+2 cluster (1 MiB chunks), idle, against
# the same disk's sequential write bandwidth measured by dd in the same run (fsync'd, and
# O_DIRECT).
#
# Fills the cluster with 1 MiB objects until one drive holds DRIVE_GIB of chunks, then for each
# budget in RATES: kills node n2, empties its drive directory (a new disk), restarts it, and
# times the rebuild until `tessera repair status` says the drive is no longer rebuilding. Prints
# one table; each ratio is against dd in this run.
# Usage: bench/rebuild.sh   (env: DRIVE_GIB=4 RATES="1GiB/s 100MiB/s" BASE_PORT=27201)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
drive_gib="${DRIVE_GIB:-4}"
rates="${RATES:-1GiB/s 100MiB/s}"
base_port="${BASE_PORT:-27201}"
bench_name=rebuild
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

# Each drive holds a quarter of the data (4+2), plus parity: 6 x DRIVE_GIB in all, and dd's file.
need_gib=$((drive_gib * 6 + drive_gib + 2))
avail_gib=$(( $(df -Pk "$work" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
[ "$avail_gib" -ge "$need_gib" ] || { echo "error: $work has ${avail_gib} GiB free, this run needs ${need_gib}" >&2; exit 1; }

for i in 1 2 3 4 5 6; do start_node "$i"; done

# One drive holds a quarter of each 1 MiB object: 4 objects per MiB on the drive.
objects=$((drive_gib * 1024 * 4))
echo "== writing $objects objects of 1 MiB ($((objects / 1024)) GiB)" >&2
"$tessera" mb rebuild >/dev/null
head -c $((1 << 20)) /dev/urandom >"$work/obj"
seq 0 $((objects - 1)) | xargs -P 8 -I{} "$tessera" put "$work/obj" "rebuild/o{}" >/dev/null 2>>"$work/puts.log"
drive="$work/d/n2/d1"
sync

# Two baselines on the same file system: buffered with one fsync at the end (conv=fsync; the
# VM's host may cache it), and O_DIRECT (oflag=direct: no page cache on this side).
dd_bytes=$((drive_gib << 30))
dd_run() {
    local out
    out=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count=$((drive_gib * 1024)) "$@" 2>&1 | tail -1)
    rm -f "$work/dd.bin"
    echo "$out" | sed -E 's/.* copied, ([0-9.]+) s.*/\1/'
}
echo "== dd: sequential write of $drive_gib GiB on the same file system (conv=fsync, then oflag=direct)" >&2
dd_s=$(dd_run conv=fsync)
direct_s=$(dd_run oflag=direct conv=fsync)
dd_mbs=$(awk -v b="$dd_bytes" -v s="$dd_s" 'BEGIN { printf "%.1f", b / s / 1e6 }')
direct_mbs=$(awk -v b="$dd_bytes" -v s="$direct_s" 'BEGIN { printf "%.1f", b / s / 1e6 }')

printf '\n%-28s %12s %10s %10s %12s %12s\n' "rebuild of a wiped drive" "bytes" "seconds" "MB/s" "vs dd fsync" "vs dd direct"
printf '%-28s %12s %10s %10s %12s %12s\n' "dd conv=fsync" "$dd_bytes" "$dd_s" "$dd_mbs" "1.00x" "-"
printf '%-28s %12s %10s %10s %12s %12s\n' "dd oflag=direct" "$dd_bytes" "$direct_s" "$direct_mbs" "-" "1.00x"
for rate in $rates; do
    "$tessera" repair rate "$rate" >/dev/null
    kill_node 2
    before=$(du -sb "$drive/data" | cut -f1)
    find "$drive" -mindepth 1 -delete
    sync
    t0=$(date +%s.%N)
    start_node 2
    while "$tessera" repair status --json 2>/dev/null | grep '"node":"n2"' | grep -q '"rebuilding":true' \
        || ! "$tessera" repair status --json 2>/dev/null | grep -q '"node":"n2"'; do
        sleep 0.2
    done
    t1=$(date +%s.%N)
    after=$(du -sb "$drive/data" | cut -f1)
    [ "$after" -ge "$before" ] || { echo "error: n2 holds $after bytes after the rebuild, $before before" >&2; exit 1; }
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    mbs=$(awk -v b="$after" -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
    ratio=$(awk -v r="$mbs" -v d="$dd_mbs" 'BEGIN { printf "%.2fx", r / d }')
    direct_ratio=$(awk -v r="$mbs" -v d="$direct_mbs" 'BEGIN { printf "%.2fx", r / d }')
    printf '%-28s %12s %10s %10s %12s %12s\n' "budget $rate" "$after" "$secs" "$mbs" "$ratio" "$direct_ratio"
done
grep -h "drive rebuilt" "$work/n2.log" | tail -2 >&2 || true
