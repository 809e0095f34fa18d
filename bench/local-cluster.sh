# Sourced by the healing benchmarks (bench/rebuild.sh, bench/heal.sh): a fresh 6-node 4+2
# cluster (1 MiB chunks) in a temporary directory, removed with its processes on exit.
# Expects `root` (the repository), `bench_name` and `base_port`; defines `tessera`, `work`,
# TESSERA_CONFIG, `start_node I` (starts nI and waits until it listens; scrubbing daily, so
# it does not compete with what is measured) and `kill_node I` (SIGKILL).
tessera="$root/target/release/tessera"
[ -x "$tessera" ] || { echo "error: build first (make build)" >&2; exit 1; }
work="$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-$bench_name.XXXXXX")"
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

"$tessera" init --nodes 6 --ec 4+2 --data "$work/d" --base-port "$base_port" >/dev/null
export TESSERA_CONFIG="$work/d/cluster.toml"
start_node() {
    TESSERA_LOG=info "$tessera" node --config "$TESSERA_CONFIG" --id "n$1" --scrub-interval 24h >>"$work/n$1.log" 2>&1 &
    pids[$1]=$!
    local port=$((base_port + $1 - 1))
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return; sleep 0.05; done
    echo "error: n$1 did not start" >&2; exit 1
}
kill_node() { kill -9 "${pids[$1]}"; wait "${pids[$1]}" 2>/dev/null || true; }
