#!/usr/bin/env bash
# Compares crates/ec against the best baseline per cell, single thread, GB/s of data.
# Baselines: klauspost/reedsolomon (Go, bench/ec-baseline) and ISA-L 2.32 called directly
# (the "isal-direct" cells of the ec criterion bench). Prints ours, best baseline, ours/best.
# Usage: bench/ec-compare.sh   (about 5 minutes; set CARGO_TARGET_DIR if you use one)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== klauspost/reedsolomon (go run bench/ec-baseline --json)" >&2
(cd "$root/bench/ec-baseline" && go run . --json) >"$work/go.jsonl"

echo "== cargo bench -p ec --bench codec" >&2
(cd "$root" && cargo bench -p ec --bench codec -- --noplot) >"$work/bench.log" 2>&1 || {
    tail -40 "$work/bench.log" >&2
    exit 1
}

python3 - "$work/go.jsonl" "$target_dir/criterion" <<'PY'
import glob, json, os, platform, subprocess, sys, datetime

go_path, criterion_dir = sys.argv[1:]
configs = [(4, 2), (8, 3), (10, 4), (16, 4)]
chunks = [(64 << 10, "64KiB"), (1 << 20, "1MiB")]
ops = ["encode", "decode1", "decodem"]

# Criterion: <criterion>/<group>/<function>/new/{benchmark,estimates}.json, throughput in bytes.
criterion = {}
for bench_path in glob.glob(os.path.join(criterion_dir, "*", "*", "new", "benchmark.json")):
    bench = json.load(open(bench_path))
    estimates = json.load(open(os.path.join(os.path.dirname(bench_path), "estimates.json")))
    data_bytes = (bench.get("throughput") or {}).get("Bytes")
    if data_bytes:
        ns = estimates["mean"]["point_estimate"]
        criterion[(bench["group_id"], bench["function_id"])] = data_bytes / ns

go = {}
go_name = "klauspost (Go)"
for line in open(go_path):
    r = json.loads(line)
    go_name = r["codec"].replace("klauspost/reedsolomon", "klauspost") + " (Go)"
    go[(r["k"], r["m"], r["chunk_bytes"], r["op"])] = r["gb_per_s"]

model = "unknown CPU"
for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
    if line.startswith("Model name:"):
        model = line.split(":", 1)[1].strip()
print(f"# ec vs best baseline, 1 thread, GB/s of data; {datetime.date.today()}; {model}")
print(f"{'cell':<24} {'ours':>7} {'best baseline':>28} {'GB/s':>7} {'ours/best':>9}")
for k, m in configs:
    for chunk_bytes, chunk_name in chunks:
        group = f"{k}+{m}/{chunk_name}"
        for op in ops:
            ours = criterion.get((group, f"tessera/{op}"))
            baselines = {
                "isa-l-2.32 direct": criterion.get((group, f"isal-direct/{op}")),
                go_name: go.get((k, m, chunk_bytes, op)),
            }
            baselines = {name: v for name, v in baselines.items() if v is not None}
            cell = f"{k}+{m} {chunk_name} {op}"
            if ours is None or not baselines:
                print(f"{cell:<24} missing results")
                continue
            best = max(baselines, key=baselines.get)
            print(f"{cell:<24} {ours:7.2f} {best:>28} {baselines[best]:7.2f} {ours / baselines[best]:9.2f}")
for k, m in configs:
    group = f"{k}+{m}/64KiB"
    aligned = criterion.get((group, "tessera/encode"))
    unaligned = criterion.get((group, "tessera-unaligned16/encode"))
    if aligned and unaligned:
        print(f"# {k}+{m} 64KiB encode, chunks 16 bytes off a 64-byte boundary: "
              f"{unaligned:.2f} GB/s, {unaligned / aligned:.2f} of aligned")
PY
