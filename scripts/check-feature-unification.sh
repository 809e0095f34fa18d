#!/usr/bin/env bash
# Fails when maturin's build of the Python extension alone (`-p tessera-python --lib`) would
# compile a shared dependency with other features than the workspace build (`cargo build
# --release`) does. Any such crate, and everything above it (DataFusion included), is then
# compiled twice: ~8 minutes on 2 cores, and CI's 90-minute bound is not far. The fix is a line
# in crates/workspace-hack/Cargo.toml ([dependencies] for target crates, [build-dependencies]
# for crates that build scripts and proc-macros use); this script names the crate and features.
#
# Compares cargo's unit graphs (`--unit-graph`, still unstable: RUSTC_BOOTSTRAP=1 lets the
# pinned stable toolchain print it; nothing is compiled).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export RUSTC_BOOTSTRAP=1
cargo build --release --quiet -Z unstable-options --unit-graph >"$tmp/workspace.json"
cargo build --release --quiet -p tessera-python --lib -Z unstable-options --unit-graph >"$tmp/python.json"
python3 - "$tmp/workspace.json" "$tmp/python.json" <<'PY'
import json
import sys


def units(path):
    """(package, mode, target name, platform) -> set of (features, opt-level) built."""
    graph = json.load(open(path))
    out = {}
    for unit in graph["units"]:
        key = (unit["pkg_id"], unit["mode"], unit["target"]["name"], unit["platform"])
        out.setdefault(key, set()).add((tuple(unit["features"]), unit["profile"]["opt_level"]))
    return out


workspace, python = units(sys.argv[1]), units(sys.argv[2])
differences = []
for key, builds in sorted(python.items(), key=lambda item: str(item[0])):
    if key not in workspace:
        continue  # only the extension uses it (pyo3): built once either way
    for features, opt_level in sorted(builds - workspace[key]):
        # Cargo's release profile builds build scripts and proc-macros (host crates, unified
        # apart from normal ones) at opt-level 0; the project's own overrides use 1 and 3.
        side = "build scripts/proc-macros: [build-dependencies]" if opt_level == "0" else "[dependencies]"
        wanted = sorted({f for other, _ in workspace[key] for f in other} - set(features))
        differences.append(f"  {key[0].split('#')[-1]} ({side}): extension build lacks {wanted}")
if differences:
    print("error: maturin's build of the Python extension would rebuild shared crates:", file=sys.stderr)
    print("\n".join(differences), file=sys.stderr)
    print("add those features to crates/workspace-hack/Cargo.toml", file=sys.stderr)
    sys.exit(1)
print("feature unification: the Python extension shares the workspace build")
PY
