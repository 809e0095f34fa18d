#!/usr/bin/env bash
# The fault-injection checker. Without arguments: the short run of `make test` (pytest over the
# regression seeds). `chaos/run.sh --long SECONDS [SEEDS...]`: `make chaos`, random seeds unless
# given. Needs root and target/release/tessera; uses the repository's .venv for pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[ -x target/release/tessera ] || { echo "error: build first (make build)" >&2; exit 1; }
if [ "${1:-}" = "--long" ]; then
    duration="${2:?usage: chaos/run.sh --long SECONDS [SEED...]}"
    shift 2
    # The long run adds the faults aimed at commits (lost replies, stalls beside them).
    args=(--duration "$duration" --aimed)
    for seed in "$@"; do args+=(--seed "$seed"); done
    if [ $# -eq 0 ]; then
        # A long run goes through several fresh seeds, each for the whole duration.
        for _ in 1 2 3; do args+=(--seed "$(python3 -c 'import random; print(random.SystemRandom().randrange(1, 1 << 31))')"); done
    fi
    exec python3 chaos/checker.py "${args[@]}"
fi
# The short run takes 5 of the 15 pairs of nodes down after repair; the long one takes all.
export TESSERA_CHAOS_PROBES="${TESSERA_CHAOS_PROBES:-5}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check pytest
# The checker's own logic first, on hand-made histories (no cluster: under a second).
.venv/bin/python -m pytest chaos/test_list_check.py -q -p no:cacheprovider
# Each seed's time in the log (CI runs near its 90 minutes: know where they go).
exec .venv/bin/python -m pytest chaos -q -p no:cacheprovider --durations=0 --ignore=chaos/test_list_check.py "$@"
