# Sourced by the cluster benchmarks: `work`, a fresh temporary directory (under $TMPDIR, else
# /var/tmp: a disk, not a tmpfs), and `pids`, processes to SIGKILL; both are cleaned up on exit.
# Expects `bench_name`.
work="$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-$bench_name.XXXXXX")"
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM
