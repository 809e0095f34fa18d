"""The LIST check of chaos/checker.py on hand-made histories: no cluster, no root, well under a
second. chaos/run.sh runs these before the fault-injection seeds."""

from __future__ import annotations

import itertools

import checker
from checker import Op, check_listings, parse_listing, possible_states, unavailable_listings, write_error_effect

REFUSED = "error: cannot write bkt/k: 3 of 6 drives accepted it, 5 needed (node n2 timed out after 3s; ...)"
LOST_REPLIES = ("error: cannot write bkt/k: 4 of 6 drives accepted it, 5 needed; it may still take effect "
                "(the commit replies of n2, n3 were lost)")
_ids = itertools.count(1)


def put(key: str, t0: float, t1: float, size: int, outcome: str = "ok", detail: str = "") -> Op:
    op = Op(next(_ids), 0, "put", key, t0, t1, outcome=outcome, detail=detail, size=size)
    if outcome == "error":
        op.effect = write_error_effect(-9 if detail == "timed out" else 1, detail)
    return op


def delete(key: str, t0: float, t1: float, outcome: str = "ok", detail: str = "") -> Op:
    op = Op(next(_ids), 0, "delete", key, t0, t1, outcome=outcome, detail=detail)
    if outcome == "error":
        op.effect = write_error_effect(-9 if detail == "timed out" else 1, detail)
    return op


def listing(t0: float, t1: float, listed: dict[str, int] | None, client: int = 1) -> Op:
    return Op(next(_ids), client, "list", "", t0, t1, outcome="ok" if listed is not None else "error",
              listed=listed, detail="" if listed is not None else "error: cannot list bkt/: ...")


def anomalies(*ops: Op) -> list[str]:
    found, verified = check_listings(list(ops))
    assert verified == sum(1 for op in ops if op.kind == "list" and op.outcome == "ok")
    return found


# --- Write errors: which prove the write did nothing.


def test_a_refused_write_did_nothing_and_every_other_error_is_unknown() -> None:
    assert write_error_effect(1, REFUSED) == "none"
    assert write_error_effect(1, LOST_REPLIES) == "unknown"
    assert write_error_effect(-9, "timed out") == "unknown"
    assert write_error_effect(1, "error: node n3 timed out after 3s") == "unknown"
    assert write_error_effect(1, "error: node n6: drive is full") == "unknown"


def test_ls_output_is_parsed_into_keys_and_sizes() -> None:
    out = "      123456  2026-11-28T10:00:01Z  k0\n          16  2026-11-28T10:00:02Z  k12\n"
    assert parse_listing(out) == {"k0": 123456, "k12": 16}
    assert parse_listing("") == {}
    for bad in ("k0\n", "12  2026-11-28T10:00:01Z  k0\n12  2026-11-28T10:00:01Z  k0\n"):
        try:
            parse_listing(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} must not parse")


# --- (a) Phantoms: a listed key needs a PUT that may be its state during the listing.


def test_a_key_whose_only_put_was_refused_is_a_phantom_when_listed() -> None:
    failed = put("k", 0, 1, 500, "error", REFUSED)
    found = anomalies(failed, listing(2, 3, {"k": 500}))
    assert len(found) == 1 and found[0].startswith("phantom:") and f"PUT op {failed.op_id}" in found[0], found
    assert "before the listing began" in found[0]
    # Not listed: as it should be.
    assert anomalies(failed, listing(2, 3, {})) == []


def test_a_refused_overwrite_listed_with_its_size_is_a_phantom() -> None:
    first = put("k", 0, 1, 100)
    failed = put("k", 2, 3, 700, "error", REFUSED)
    assert anomalies(first, failed, listing(4, 5, {"k": 100})) == []
    found = anomalies(first, failed, listing(4, 5, {"k": 700}))
    assert len(found) == 1 and "phantom" in found[0] and f"PUT op {failed.op_id}" in found[0], found


def test_a_refused_put_overlapping_the_listing_may_show_as_it_may_to_a_read() -> None:
    # Its commit may be on k drives while the listing (or a GET) reads, its rollback after.
    failed = put("k", 1, 3, 500, "error", REFUSED)
    assert anomalies(failed, listing(2, 2.5, {"k": 500})) == []
    # Once it has failed, no later listing may show it.
    found = anomalies(failed, listing(4, 5, {"k": 500}))
    assert len(found) == 1 and "phantom" in found[0], found


def test_a_put_of_unknown_outcome_may_be_listed_for_ever() -> None:
    for detail in (LOST_REPLIES, "timed out", "error: node n4: ..."):
        maybe = put("k", 0, 1, 500, "error", detail)
        assert anomalies(maybe, listing(2, 3, {"k": 500}), listing(50, 51, {"k": 500})) == []
        assert anomalies(maybe, listing(2, 3, {})) == []


def test_a_put_still_in_flight_may_be_listed() -> None:
    pending = put("k", 0, float("inf"), 500, "error", "still in flight")
    pending.effect = "unknown"
    assert anomalies(pending, listing(2, 3, {"k": 500})) == []
    assert anomalies(pending, listing(2, 3, {})) == []


def test_a_key_listed_with_no_put_at_all_is_a_phantom() -> None:
    found = anomalies(put("k", 5, 6, 10), listing(1, 2, {"k": 10, "other": 3}))
    assert len(found) == 2 and all(f.startswith("phantom:") for f in found), found


def test_a_put_that_began_after_the_listing_ended_cannot_be_listed() -> None:
    found = anomalies(put("k", 3, 4, 10), listing(1, 2, {"k": 10}))
    assert len(found) == 1 and "phantom" in found[0], found


def test_a_listed_size_no_possible_put_wrote_is_flagged() -> None:
    found = anomalies(put("k", 0, 1, 100), put("k", 2, 3, 200), listing(4, 5, {"k": 100}))
    assert len(found) == 1 and found[0].startswith("wrong size:"), found
    assert anomalies(put("k", 0, 1, 100), put("k", 2, 3, 200), listing(4, 5, {"k": 200})) == []


# --- (c) Resurrection: a key deleted by an acknowledged DELETE, listed afterwards.


def test_a_key_listed_after_an_acknowledged_delete_is_flagged() -> None:
    p, d = put("k", 0, 1, 100), delete("k", 2, 3)
    found = anomalies(p, d, listing(4, 5, {"k": 100}))
    assert len(found) == 1 and "phantom" in found[0] and f"DELETE op {d.op_id}" in found[0], found
    assert "resurrected" in found[0]
    # Overlapping the DELETE, either answer is right.
    assert anomalies(p, d, listing(2.5, 3.5, {"k": 100})) == []
    assert anomalies(p, d, listing(2.5, 3.5, {})) == []


def test_a_put_after_the_delete_may_bring_the_key_back() -> None:
    p, d = put("k", 0, 1, 100), delete("k", 2, 3)
    for again in (put("k", 4, 6, 300), put("k", 4, 4.5, 300, "error", LOST_REPLIES)):
        assert anomalies(p, d, again, listing(5, 7, {"k": 300})) == []
        assert anomalies(p, d, again, listing(5, 7, {})) == []
    refused = put("k", 4, 4.5, 300, "error", REFUSED)
    assert len(anomalies(p, d, refused, listing(5, 7, {"k": 300}))) == 1


def test_a_repeated_phantom_is_reported_once_with_a_count() -> None:
    p, d = put("k", 0, 1, 100), delete("k", 2, 3)
    found = anomalies(p, d, *(listing(t, t + 1, {"k": 100}) for t in (4, 6, 8)))
    assert len(found) == 1 and "and 2 later listing(s) the same" in found[0], found


# --- (b) Missing: a key whose state is an acknowledged PUT throughout the listing is listed.


def test_an_acknowledged_put_missing_from_a_listing_is_flagged() -> None:
    p = put("k", 0, 1, 100)
    found = anomalies(p, listing(2, 3, {}))
    assert len(found) == 1 and found[0].startswith("missing:") and f"PUT op {p.op_id}" in found[0], found
    assert anomalies(p, listing(2, 3, {"k": 100})) == []
    # A listing that began before the PUT was acknowledged may miss it.
    assert anomalies(p, listing(0.5, 3, {})) == []


def test_a_missing_key_is_explained_by_a_delete_that_may_have_taken_effect() -> None:
    p = put("k", 0, 1, 100)
    for d in (delete("k", 1.5, 2.5), delete("k", 1.5, 2.5, "error", "timed out"),
              delete("k", 1.5, 2.5, "error", LOST_REPLIES), delete("k", 2.5, 3.5)):
        assert anomalies(p, d, listing(2, 3, {})) == [], d
    # A DELETE refused by the drives, or one that found no object, did nothing: the key stays.
    for d in (delete("k", 1.5, 2.5, "error", REFUSED), delete("k", 1.5, 2.5, "absent", "no such object")):
        found = anomalies(p, d, listing(2, 3, {}))
        assert len(found) == 1 and "missing" in found[0] and f"DELETE op(s) {d.op_id}" in found[0], found
    # A DELETE that began after the listing ended explains nothing.
    assert len(anomalies(p, delete("k", 3.5, 4), listing(2, 3, {}))) == 1


def test_a_delete_replaced_by_a_later_acknowledged_put_explains_nothing() -> None:
    found = anomalies(put("k", 0, 1, 100), delete("k", 2, 3), put("k", 4, 5, 200), listing(6, 7, {}))
    assert len(found) == 1 and "missing" in found[0], found


# --- Overlapping writes are tolerated.


def test_overlapping_writes_allow_every_state_they_may_leave() -> None:
    a, b, c = put("k", 0, 5, 100), put("k", 1, 6, 200), delete("k", 2, 4)
    for listed in ({"k": 100}, {"k": 200}, {}):
        assert anomalies(a, b, c, listing(3, 7, listed)) == [], listed
    # Long after: the three overlapped, so any may have been applied last.
    for listed in ({"k": 100}, {"k": 200}, {}):
        assert anomalies(a, b, c, listing(8, 9, listed)) == [], listed
    # Once an acknowledged PUT follows them all, only its size is right.
    d = put("k", 7, 7.5, 300)
    for listed in ({"k": 100}, {"k": 200}, {}):
        assert len(anomalies(a, b, c, d, listing(8, 9, listed))) == 1, listed
    assert anomalies(a, b, c, d, listing(8, 9, {"k": 300})) == []
    # A write that completed before another began is replaced by it.
    early, late = put("k", 0, 1, 100), put("k", 2, 3, 200)
    assert len(anomalies(early, late, listing(4, 5, {"k": 100}))) == 1


def test_possible_states_start_absent_until_a_write_is_acknowledged() -> None:
    p = put("k", 1, 2, 100)
    assert possible_states([p], 0, 0.5) == [None]
    assert possible_states([p], 0, 1.5) == [p, None]
    assert possible_states([p], 3, 4) == [p]


def test_keys_are_checked_independently_in_one_listing() -> None:
    ops = [put("a", 0, 1, 10), put("b", 0, 1, 20), delete("b", 2, 3), put("c", 0, 1, 30, "error", REFUSED)]
    assert anomalies(*ops, listing(4, 5, {"a": 10})) == []
    found = anomalies(*ops, listing(4, 5, {"b": 20, "c": 30}))
    assert sorted(f.split()[0] for f in found) == ["missing:", "phantom:", "phantom:"], found


# --- Failed listings: allowed only when a read then could fail too.


def test_a_failed_listing_is_an_anomaly_unless_more_than_m_nodes_were_impaired() -> None:
    ops = [put("k", 0, 1, 10), listing(10, 11, None)]
    assert len(unavailable_listings(ops, [(1, 9, 12)])) == 1
    assert len(unavailable_listings(ops, [(1, 9, 12), (2, 10.5, 10.6)])) == 1
    assert unavailable_listings(ops, [(1, 9, 12), (2, 10.5, 10.6), (3, 0, 8)]) == []  # grace: 3 s
    # Nodes impaired while the key's current write was in flight count, as for reads.
    ops = [put("k", 0, 5, 10), listing(10, 11, None)]
    assert unavailable_listings(ops, [(1, 9, 12), (2, 10.5, 10.6), (3, 0.5, 1)]) == []
    assert checker.M == 2


def read(key: str, t0: float, t1: float, value: int | None) -> Op:
    return Op(next(_ids), 2, "get", key, t0, t1, outcome="value" if value is not None else "absent", value=value)


def test_a_read_after_a_refused_put_that_returns_it_is_a_failed_write_shown() -> None:
    refused = put("k", 0.0, 1.0, 10, outcome="error", detail=REFUSED)
    found = checker.check_history([refused, read("k", 2.0, 3.0, refused.op_id)], {})
    assert any("failed write visible" in a for a in found), found
    # A read that overlaps it may see it before its rollback; one of unknown outcome may stay.
    assert checker.check_history([refused, read("k", 0.5, 3.0, refused.op_id)], {}) == []
    unknown = put("k", 0.0, 1.0, 10, outcome="error", detail=LOST_REPLIES)
    assert checker.check_history([unknown, read("k", 2.0, 3.0, unknown.op_id)], {}) == []


def creator(key: str, t0: float, t1: float, outcome: str, detail: str = "") -> Op:
    op = Op(next(_ids), 1, "put", key, t0, t1, outcome=outcome, detail=detail, size=10)
    if outcome == "error":
        exists = checker.ALREADY_EXISTS in detail
        op.effect = "none" if exists else write_error_effect(-9 if detail == "timed out" else 1, detail)
    return op


EXISTS = "error: bkt/new1 already exists"


def test_creators_one_wins_the_other_is_refused_or_unknown() -> None:
    assert checker.check_races([("new1", [creator("new1", 0, 1, "ok"), creator("new1", 0, 1, "error", EXISTS)])]) == []
    assert checker.check_races([("new1", [creator("new1", 0, 1, "error", EXISTS),
                                          creator("new1", 0, 1, "error", "timed out")])]) == []
    both = checker.check_races([("new1", [creator("new1", 0, 1, "ok"), creator("new1", 0, 1, "ok")])])
    assert any("both acknowledged" in a for a in both), both
    # Both refused as existing: nothing else writes the key, so no object existed (issue 37, item 8).
    refused = checker.check_races([("new1", [creator("new1", 0, 1, "error", EXISTS),
                                             creator("new1", 0, 1, "error", EXISTS)])])
    assert any("refused as existing" in a for a in refused), refused
    beside_failed = checker.check_races([("new1", [creator("new1", 0, 1, "error", EXISTS),
                                                   creator("new1", 0, 1, "error", REFUSED)])])
    assert any("refused as existing" in a for a in beside_failed), beside_failed
