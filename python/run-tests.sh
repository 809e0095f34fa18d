#!/usr/bin/env bash
# Builds the tessera Python package and runs its pytest suite against a real local cluster.
#
#   python/run-tests.sh [pytest args...]
#
# Uses (or creates) the repo venv .venv (TESSERA_VENV overrides), installs the pinned test
# dependencies (torch from PyPI pulls ~5 GB of CUDA wheels the first time; pip's cache serves
# later runs), builds the release `tessera` binary the cluster fixture starts, builds the
# extension wheel with maturin (release) and installs it, then runs pytest. Exits non-zero on
# any failure.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
venv=${TESSERA_VENV:-$repo/.venv}
wheels=$repo/target/python-wheels

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r python/requirements-test.txt

# The whole workspace, as `make build` does: a build of one package resolves features on its own
# and would rebuild DataFusion (see crates/workspace-hack).
cargo build --release --quiet
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet --manifest-path python/Cargo.toml --interpreter "$venv/bin/python" --out "$wheels"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheels"/tessera-*.whl

# Run from the repo root with the venv's pytest (not `python -m pytest` inside python/), so
# `import tessera` finds the installed package with its extension, not the source folder.
exec "$venv/bin/pytest" -q python/tests "$@"
