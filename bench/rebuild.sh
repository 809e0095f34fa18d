#!/usr/bin/env bash
# Rebuild of a wiped drive on a fresh local 6-node 4+2 cluster (1 MiB chunks), idle, against
# (1) the same disk's sequential write bandwidth measured by dd in the same run (fsync'd, and
# O_DIRECT) and (2) MinIO (6 servers x 1 drive, EC:2) healing the same wiped drive holding the
# same objects, in the same run.
#
# Fills the cluster with 1 MiB objects until one drive holds DRIVE_GIB of chunks, then for each
# budget in RATES: kills node n2, replaces its drive directory by an empty one (a new disk),
# restarts it, and times the rebuild until `tessera repair status` says the drive is no longer
# rebuilding. The disk column is what the one disk under all six drives read and wrote meanwhile (the rebuild
# reads k chunks for each one it writes; on separate disks those reads land elsewhere).
# Then, with Tessera stopped, MinIO gets the same number of 1 MiB objects, its n2 drive is
# replaced the same way and n2 restarted; timed until the drive's bucket directory holds as
# many bytes as before (MinIO's automatic healing of a new drive). MINIO=0 skips it.
# Usage: bench/rebuild.sh   (env: DRIVE_GIB=4 RATES="1GiB/s 100MiB/s" MINIO=1 BASE_PORT=27201)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
drive_gib="${DRIVE_GIB:-4}"
rates="${RATES:-1GiB/s 100MiB/s}"
with_minio="${MINIO:-1}"
minio_timeout_s="${MINIO_TIMEOUT_S:-3600}"
base_port="${BASE_PORT:-27201}"
bench_name=rebuild
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

# Each drive holds a quarter of the data (4+2), plus parity: 6 x DRIVE_GIB in all (twice with
# MinIO, whose copy is written while Tessera's is still there), the wiped drive kept aside
# until its rebuild is timed, and dd's file.
need_gib=$((drive_gib * 6 * (with_minio == 1 ? 2 : 1) + drive_gib * 2 + 2))
avail_gib=$(( $(df -Pk "$work" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
[ "$avail_gib" -ge "$need_gib" ] || { echo "error: $work has ${avail_gib} GiB free, this run needs ${need_gib}" >&2; exit 1; }

minio_bin="$root/bench/.cache/bin/minio"
if [ "$with_minio" = 1 ] && [ ! -x "$minio_bin" ]; then
    # The version bench/compare_minio.py pins; about 5 minutes, once.
    command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
    command -v go >/dev/null || { echo "error: MinIO is built with go, which is missing (MINIO=0 skips MinIO)" >&2; exit 1; }
    echo "== installing MinIO with go install (cached in bench/.cache/bin)" >&2
    GOBIN="$root/bench/.cache/bin" go install github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c
fi

for i in 1 2 3 4 5 6; do start_node "$i"; done

# One drive holds a quarter of each 1 MiB object: 4 objects per MiB on the drive.
objects=$((drive_gib * 1024 * 4))
echo "== writing $objects objects of 1 MiB ($((objects / 1024)) GiB)" >&2
fill rebuild "$objects"
drive="$work/d/n2/d1"
sync

echo "== dd: sequential write of $drive_gib GiB on the same file system (conv=fsync, then oflag=direct)" >&2
dd_mbs=$(measure_dd "$drive_gib" conv=fsync)
direct_mbs=$(measure_dd "$drive_gib" oflag=direct conv=fsync)

rows=()
tessera_secs=()
row() { rows+=("$(printf '%-30s %12s %9s %9s %11s %12s %15s' "$@")"); }
# measured_row LABEL BYTES: a row for BYTES rebuilt between t0 and t1, with the disk's reads and
# writes between (r0, w0) and (r1, w1); sets `secs`.
measured_row() {
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    local mbs disk
    mbs=$(awk -v b="$2" -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
    disk=$(awk -v r=$((r1 - r0)) -v w=$((w1 - w0)) -v s="$secs" 'BEGIN { printf "%.0f r + %.0f w", r / s / 1e6, w / s / 1e6 }')
    row "$1" "$2" "$secs" "$mbs" \
        "$(awk -v r="$mbs" -v d="$dd_mbs" 'BEGIN { printf "%.2fx", r / d }')" \
        "$(awk -v r="$mbs" -v d="$direct_mbs" 'BEGIN { printf "%.2fx", r / d }')" "$disk"
}
row "dd conv=fsync" "$((drive_gib << 30))" "-" "$dd_mbs" "1.00x" "-" "-"
row "dd oflag=direct" "$((drive_gib << 30))" "-" "$direct_mbs" "-" "1.00x" "-"
for rate in $rates; do
    "$tessera" repair rate "$rate" >/dev/null
    kill_node 2
    before=$(file_bytes "$drive/data")
    replace_disk "$drive"
    start_node 2
    wait_rebuilt 2
    t1=$(date +%s.%N)
    read -r r1 w1 < <(disk_bytes)
    after=$(file_bytes "$drive/data")
    [ "$after" -ge "$before" ] || { echo "error: n2 holds $after bytes after the rebuild, $before before" >&2; exit 1; }
    rm -rf "$work/old-drive"
    measured_row "tessera, budget $rate" "$after"
    tessera_secs+=("$rate $secs")
done
grep -h "drive rebuilt" "$work/n2.log" | tail -1 >&2 || true

if [ "$with_minio" = 1 ]; then
    for i in 1 2 3 4 5 6; do kill_node "$i"; done
    access=benchadmin secret=benchadmin-secret-key
    mport=$((base_port + 40))
    endpoints=()
    for i in 1 2 3 4 5 6; do
        mkdir -p "$work/minio/n$i/d1"
        endpoints+=("http://127.0.0.1:$((mport + i - 1))$work/minio/n$i/d1")
    done
    minio_pids=()
    start_minio() {
        MINIO_ROOT_USER=$access MINIO_ROOT_PASSWORD=$secret MINIO_STORAGE_CLASS_STANDARD=EC:2 \
            _MINIO_SERVER_LOCAL="127.0.0.1:$((mport + $1 - 1))" MINIO_ROOTDRIVE_THRESHOLD_SIZE=1 \
            MINIO_BROWSER=off MINIO_UPDATE=off "$minio_bin" server --quiet --address "127.0.0.1:$((mport + $1 - 1))" \
            --console-address "127.0.0.1:$((mport + $1 + 9))" "${endpoints[@]}" >>"$work/minio-n$1.log" 2>&1 &
        minio_pids[$1]=$!
        pids+=($!)
    }
    for i in 1 2 3 4 5 6; do start_minio "$i"; done
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$mport/minio/health/cluster" >/dev/null && break
        sleep 0.1
    done
    curl -sf "http://127.0.0.1:$mport/minio/health/cluster" >/dev/null || { echo "error: MinIO did not start" >&2; exit 1; }
    echo "== MinIO: writing $objects objects of 1 MiB" >&2
    "$tessera" bench get --s3 "http://127.0.0.1:$mport" --access-key "$access" --secret-key "$secret" \
        --bucket rebuild --objects "$objects" --size 1MiB --concurrency 8 --duration 1ms --json >/dev/null
    mdrive="$work/minio/n2/d1"
    sync
    mbefore=$(file_bytes "$mdrive/rebuild")
    kill -9 "${minio_pids[2]}"
    wait "${minio_pids[2]}" 2>/dev/null || true
    replace_disk "$mdrive"
    start_minio 2
    echo "== MinIO: healing n2's new drive (until it holds $mbefore bytes again; at most ${minio_timeout_s} s)" >&2
    held=0
    next_report=$(( $(date +%s) + 30 ))
    while :; do
        held=$(file_bytes "$mdrive/rebuild")
        [ "${held:-0}" -ge "$mbefore" ] && break
        now=$(date +%s)
        if [ "$now" -ge "$next_report" ]; then
            echo "   $(awk -v a="$t0" -v b="$now" 'BEGIN { printf "%.0f", b - a }') s: $held of $mbefore bytes" >&2
            next_report=$((now + 30))
        fi
        if awk -v a="$t0" -v b="$now" -v m="$minio_timeout_s" 'BEGIN { exit !(b - a > m) }'; then
            echo "error: MinIO healed $held of $mbefore bytes in ${minio_timeout_s} s" >&2
            exit 1
        fi
        sleep 0.5
    done
    t1=$(date +%s.%N)
    read -r r1 w1 < <(disk_bytes)
    measured_row "minio heal (EC:2, 6 x 1 drive)" "$held"
fi

echo
echo "date $(date -u +%F)  cpu $(lscpu | sed -n 's/^Model name: *//p')  nproc $(nproc)  objects $objects x 1 MiB"
printf '%-30s %12s %9s %9s %11s %12s %15s\n' "rebuild of a wiped drive" "bytes" "seconds" "MB/s" "vs dd fsync" "vs dd direct" "disk MB/s"
printf '%s\n' "${rows[@]}"
if [ "$with_minio" = 1 ]; then
    for entry in "${tessera_secs[@]}"; do
        awk -v r="${entry% *}" -v t="${entry#* }" -v m="$secs" \
            'BEGIN { printf "time to a full drive again, tessera at budget %s vs minio: %.1fx faster\n", r, m / t }'
    done
fi
