# Sourced by the healing benchmarks (bench/rebuild.sh, bench/heal.sh): a fresh 6-node 4+2
# cluster (1 MiB chunks) in a temporary directory, removed with its processes on exit.
# Expects `root` (the repository), `bench_name` and `base_port`; defines `tessera`, `work`,
# TESSERA_CONFIG, `start_node I [NODE ARGS...]` (starts nI and waits until it listens;
# scrubbing daily, so it does not compete with what is measured) and `kill_node I` (SIGKILL).
tessera="$root/target/release/tessera"
[ -x "$tessera" ] || { echo "error: build first (make build)" >&2; exit 1; }
# shellcheck source=bench/work-dir.sh
source "$root/bench/work-dir.sh"

"$tessera" init --nodes 6 --ec 4+2 --data "$work/d" --base-port "$base_port" >/dev/null
export TESSERA_CONFIG="$work/d/cluster.toml"
start_node() {
    local i=$1
    shift
    TESSERA_LOG=info "$tessera" node --config "$TESSERA_CONFIG" --id "n$i" --scrub-interval 24h "$@" >>"$work/n$i.log" 2>&1 &
    pids[$i]=$!
    local port=$((base_port + i - 1))
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return; sleep 0.05; done
    echo "error: n$i did not start" >&2; exit 1
}
kill_node() { kill -9 "${pids[$1]}"; wait "${pids[$1]}" 2>/dev/null || true; }

# Sequential write bandwidth of the file system under $work, in MB/s, by dd: `measure_dd GIB
# conv=fsync` (buffered, one fsync at the end; the VM's host may cache it) or `measure_dd GIB
# oflag=direct conv=fsync` (no page cache on this side).
measure_dd() {
    local gib=$1 out secs
    shift
    out=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count=$((gib * 1024)) "$@" 2>&1 | tail -1)
    rm -f "$work/dd.bin"
    secs=$(echo "$out" | sed -E 's/.* copied, ([0-9.]+) s.*/\1/')
    awk -v b=$((gib << 30)) -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }'
}

# Bytes read and written so far by the block device under $work: "READ WRITTEN".
work_disk=$(lsblk -no PKNAME "$(df --output=source "$work" | tail -1)" 2>/dev/null | head -1)
[ -n "$work_disk" ] || work_disk=$(basename "$(df --output=source "$work" | tail -1)")
disk_bytes() {
    awk -v d="$work_disk" '$3 == d { printf "%.0f %.0f\n", $6 * 512, $10 * 512 }' /proc/diskstats
}

# Waits until node nI reports no drive rebuilding (and answers at all).
wait_rebuilt() {
    while "$tessera" repair status --json 2>/dev/null | grep "\"node\":\"n$1\"" | grep -q '"rebuilding":true' \
        || ! "$tessera" repair status --json 2>/dev/null | grep -q "\"node\":\"n$1\""; do
        sleep 0.2
    done
}

# Writes COUNT objects of 1 MiB to BUCKET through the smart client (8 in flight).
fill() {
    "$tessera" bench get --bucket "$1" --objects "$2" --size 1MiB --concurrency 8 --duration 1ms --json >/dev/null
}

# Bytes in the regular files under DIR, 0 if it does not exist yet (directories' own sizes
# depend on their history).
file_bytes() {
    { find "$1" -type f -printf '%s\n' 2>/dev/null || true; } | awk '{ s += $1 } END { printf "%.0f\n", s }'
}

# A new disk where the old one was: drive directory DIR moves aside to $work/old-drive (deleting
# its files would leave the file system busy skipping thousands of just-freed inodes) and an
# empty one takes its place. Then the clock starts: t0, and the disk's counters r0 and w0.
replace_disk() {
    mv "$1" "$work/old-drive"
    mkdir "$1"
    sync
    read -r r0 w0 < <(disk_bytes)
    t0=$(date +%s.%N)
}
