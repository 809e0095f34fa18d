"""The short fault-injection run of `make test`: the regression seeds, each for a bounded time.

`make chaos DURATION=600` runs the long one (random seeds) through chaos/checker.py directly.
The seeds below are the ones that reproduced the durability review's bugs on the build before
their fix (see RELIABILITY.md); they must stay free of anomalies.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import checker

# Seeds 1-3 found stale reads (writes from lagging clocks discarded after being acknowledged)
# and acknowledged PUTs read back absent on build 7960c51; seed 5 found an acknowledged version
# passed over for an older retained delete marker on the first fix (67179eb).
REGRESSION_SEEDS = [1, 2, 3, 5]
DURATION_S = float(os.environ.get("TESSERA_CHAOS_SECONDS", "25"))
TESSERA = Path(os.environ.get("TESSERA_BIN", checker.REPO / "target" / "release" / "tessera"))


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_no_acknowledged_version_is_lost_under_faults(seed: int) -> None:
    if os.geteuid() != 0:
        pytest.fail("the fault checker needs root (network namespaces, tmpfs); CI runs as root")
    try:
        report = checker.run_checker(seed, DURATION_S, TESSERA)
    except checker.CheckerError as e:
        pytest.fail(f"the checker could not run: {e}")
    print(report.text())
    assert report.counts.get("put:ok", 0) > 50, "the workload must write under faults"
    assert any(line.split()[1] == "inject" for line in report.schedule), "faults must strike"
    assert not report.anomalies, report.text()
