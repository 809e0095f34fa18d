"""The short fault-injection run of `make test`: the regression seeds, each for a bounded time.

`make chaos DURATION=600` runs the long one (random seeds) through chaos/checker.py directly.
The seeds below are the ones that reproduced the durability review's bugs on the build before
their fix (see RELIABILITY.md); they must stay free of anomalies. Every run also lists the
bucket (a tenth of the operations, and once after the final reads) and checks each listing
against the history; chaos/test_list_check.py tests that check on hand-made histories.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import checker

# Seeds 1-3 found stale reads (writes from lagging clocks discarded after being acknowledged)
# and acknowledged PUTs read back absent on build 7960c51; seed 5 found an acknowledged version
# passed over for an older retained delete marker on the first fix (67179eb). Seeds 11 and 15
# (two nodes killed at one instant, with clocks in step: `--no-skew`) found the failed overwrite
# that destroys the previous version on 7960c51: acknowledged objects unreadable after every
# fault healed (11), and read back absent (15). Seed 3 found a full drive that stayed unusable
# after space was freed. Every seed's redundancy check found writes that missed a drive never
# repaired on 7960c51.
REGRESSION_CASES = [(1, True), (2, True), (3, True), (5, True), (11, False), (15, False)]  # (seed, skew)
# Nodes moving to new addresses (map pushes) among the other faults, with one client that plans
# with the map of the start throughout: seed 8 moves nodes six times. On builds before db8d159
# about one run in eight (more under load) had a delete whose commit failed as the map changed:
# every node refused its rollback as planned with a stale map, the marker stayed, and the
# retried delete answered "no such object" for the delete it had made.
READDRESS_SEED = 8
# The cluster grows from 6 to 12 nodes (a second pool added and activated a third of the way
# in) among the other faults, with one client on the map of the start throughout.
GROW_SEED = 4
# The same growth, then the first pool decommissioned from two thirds of the way in, under the
# faults (which strike the first pool); its nodes are down for the final reads. Seed 7 kills
# two nodes in the middle of a delete's commit: its marker, left on one of them, read as
# "absent" over an acknowledged PUT in about one run of three on builds before 1b350b4 (the
# fix: a reader never takes an unconfirmed marker). Seed 7 also failed a fresh-clone CI once
# (2026-11-27): the stale-map client heard from one node only, just as the pool addition's map
# reached the others, and a ranged GET read the value an acknowledged overwrite had replaced (the
# fix: too few answers to see every acknowledged version fail the read).
DECOMMISSION_SEEDS = [4, 7]
# Reads racing overwrites on a healthy cluster: on 7960c51 they failed (the old data file was
# unlinked under them); every read must succeed.
RACING_SEED = 21
# Faults aimed at commits (issue 37): replies dropped by nftables while requests still arrive,
# alone and in pairs with a stall or a kill at the same instant (`--aimed`); with them a hot key
# overwritten without pause by two writers (who re-stamp when they overlap) under a slow
# reader, and pairs of `put --if-absent` creators racing the faults.
AIMED_SEED = 32
DURATION_S = float(os.environ.get("TESSERA_CHAOS_SECONDS", "25"))
TESSERA = Path(os.environ.get("TESSERA_BIN", checker.REPO / "target" / "release" / "tessera"))


def run(seed: int, **options) -> "checker.Report":
    if os.geteuid() != 0:
        pytest.fail("the fault checker needs root (network namespaces, tmpfs); CI runs as root")
    try:
        report = checker.run_checker(seed, DURATION_S, TESSERA, **options)
    except checker.CheckerError as e:
        pytest.fail(f"the checker could not run: {e}")
    print(report.text())
    return report


@pytest.mark.parametrize("seed,skew", REGRESSION_CASES)
def test_no_acknowledged_version_is_lost_under_faults(seed: int, skew: bool) -> None:
    report = run(seed, skew=skew)
    assert report.counts.get("put:ok", 0) > 50, "the workload must write under faults"
    assert report.verified_listings > 10, "the workload must list under faults:\n" + report.text()
    assert any(line.split()[1] == "inject" for line in report.schedule), "faults must strike"
    assert not report.anomalies, report.text()


def test_reads_racing_overwrites_never_fail() -> None:
    report = run(RACING_SEED, skew=False, faults_on=False)
    assert report.counts.get("put:ok", 0) > 50 and report.counts.get("get:value", 0) > 50
    assert report.verified_listings > 10, report.text()
    assert not report.schedule, "no faults in this run"
    assert not report.read_errors and not report.list_errors and not report.anomalies, report.text()


def test_nodes_moving_to_new_addresses_lose_nothing_and_stale_clients_follow() -> None:
    report = run(READDRESS_SEED, readdress=True)
    assert report.readdressed >= 2, "nodes must move during the run:\n" + report.text()
    assert report.counts.get("put:ok", 0) > 50, "the workload must write under faults"
    # The stale client planned every operation with version 1 of the map, which names the old
    # addresses: each was refused, fetched the new map and ran again.
    assert report.stale_client_done > 50, report.text()
    assert not report.anomalies, report.text()


def test_a_pool_added_under_faults_loses_nothing_and_stale_clients_follow() -> None:
    report = run(GROW_SEED, grow=True)
    assert report.grown_active_at is not None, "the second pool must become active:\n" + report.text()
    # New keys and versions kept being acknowledged with two pools (deletes make new first
    # versions, which go to either pool).
    assert report.ops_after_growth > 10, report.text()
    assert report.keys_in_second_pool > 0, "some keys must live in the new pool:\n" + report.text()
    assert report.stale_client_done > 50, report.text()
    assert not report.anomalies, report.text()


@pytest.mark.parametrize("seed", DECOMMISSION_SEEDS)
def test_a_pool_decommissioned_under_faults_loses_nothing(seed: int) -> None:
    report = run(seed, decommission=True)
    assert report.grown_active_at is not None, "the second pool must become active:\n" + report.text()
    assert report.removed_at is not None, "the first pool must be removed:\n" + report.text()
    assert report.counts.get("put:ok", 0) > 50, "the workload must write under faults"
    assert report.stale_client_done > 50, report.text()
    assert not report.anomalies, report.text()


def test_faults_aimed_at_commits_lose_nothing_and_leave_no_failed_write_visible() -> None:
    report = run(AIMED_SEED, aimed=True)
    assert report.counts.get("put:ok", 0) > 50, "the workload must write under faults"
    assert any("reply-drop" in line for line in report.schedule), "replies must be dropped:\n" + report.text()
    assert report.verified_listings > 10, report.text()
    # The hot key's slow reads each outlived more overwrites than a drive keeps rows of (8): the
    # versions they chose lost their rows while being read (issue 37, item 7).
    assert max(report.slow_read_spans, default=0) > 8, "a slow read must span overwrites:\n" + report.text()
    # Creators really raced: both PUTs of a pair in flight at once, under the same faults.
    assert report.races_overlapped >= 5, report.text()
    # The hot key's two writers overlapped, and writes whose commit met the other's newer
    # version re-stamped (issue 37, item 9), under the same faults.
    assert report.restamped_writes > 0, "overlapping writers must re-stamp:\n" + report.text()
    assert not report.anomalies, report.text()
