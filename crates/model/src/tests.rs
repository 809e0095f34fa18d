//! Teeth: with any one fix off the checker finds a counterexample to the property that fix
//! protects; with all on it explores every state and finds none.

use std::collections::BTreeSet;

use stateright::{Checker, HasDiscoveries, Model};

use crate::{Config, Fixes, INVARIANTS, WriteModel};

/// Runs the small model with `fixes` until `property` has a counterexample or every state is
/// explored; returns the counterexample, rendered.
fn check(fixes: Fixes, property: &'static str) -> Option<String> {
    find(&WriteModel::new(Config::small(fixes)), property)
}

/// Runs `model` until `property` has a counterexample or every state is explored; returns the
/// counterexample, rendered.
fn find(model: &WriteModel, property: &'static str) -> Option<String> {
    let checker = model
        .clone()
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    checker.discovery(property).map(|path| crate::render(model, &path))
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn assert_found(fixes: Fixes, property: &'static str) {
    let trace = check(fixes, property);
    assert!(trace.is_some(), "{property}: no counterexample with {fixes:?}");
    println!("{property} with {fixes:?}:\n{}", trace.expect("checked above"));
}

#[test]
fn rollback_when_unknown_loses_an_acknowledged_version_after_scrub_finalize() {
    assert_found(Fixes { no_rollback_when_unknown: false, ..Fixes::ALL }, "acknowledged_never_lost");
}

#[test]
fn rollback_when_unknown_spreads_a_failed_write() {
    assert_found(Fixes { no_rollback_when_unknown: false, ..Fixes::ALL }, "repair_only_acknowledged");
}

#[test]
fn commit_queueing_repair_spreads_a_failed_write() {
    assert_found(Fixes { commit_queues_no_repair: false, ..Fixes::ALL }, "repair_only_acknowledged");
}

#[test]
fn list_of_newest_current_disagrees_with_reads() {
    assert_found(Fixes { list_answers_as_reads: false, ..Fixes::ALL }, "list_agrees_with_reads");
}

#[test]
fn rollback_of_applied_drives_only_leaves_a_failed_write_readable() {
    assert_found(Fixes { rollback_fences_unknown: false, ..Fixes::ALL }, "failed_write_invisible");
}

#[test]
fn all_fixes_hold_every_invariant_in_every_reachable_state() {
    let model = WriteModel::new(Config::small(Fixes::ALL));
    let checker = model.clone().checker().threads(threads()).spawn_bfs().join();
    for property in INVARIANTS {
        if let Some(path) = checker.discovery(property) {
            panic!("{property} violated:\n{}", crate::render(&model, &path));
        }
    }
    for property in model.properties().iter().filter(|p| !p.expectation.discovery_is_failure()) {
        assert!(checker.discovery(property.name).is_some(), "never reached: {}", property.name);
    }
    assert!(checker.is_done());
}

#[test]
fn a_readable_write_of_unknown_outcome_left_alone_stays_without_redundancy() {
    assert_found(Fixes { complete_readable: false, ..Fixes::ALL }, "quiet_reads_fully_held");
}

/// Two writers on a 1 + 1 set (W = 2), so that a write and its re-stamp fit a test's depth.
fn two_writers(fixes: Fixes) -> WriteModel {
    WriteModel::new(Config { k: 1, m: 1, writers: 2, ..Config::small(fixes) })
}

#[test]
fn without_restamps_the_write_acknowledged_last_can_lose() {
    let model = two_writers(Fixes { restamp_superseded: false, ..Fixes::ALL });
    let trace = find(&model, "acknowledged_in_order");
    assert!(trace.is_some(), "acknowledged_in_order: no counterexample without re-stamps");
    println!("acknowledged_in_order without re-stamps:\n{}", trace.expect("checked above"));
}

#[test]
fn two_overlapping_writers_are_acknowledged_in_order() {
    // Every state within 13 steps (1.5 million): both writers through their first round, one
    // re-stamp, faults and an outage among them.
    let model = two_writers(Fixes::ALL);
    let checker = model.clone().checker().threads(threads()).target_max_depth(13).spawn_bfs().join();
    for property in INVARIANTS {
        if let Some(path) = checker.discovery(property) {
            panic!("{property} violated:\n{}", crate::render(&model, &path));
        }
    }
    let restamped = checker.discovery("a re-stamped write");
    assert!(restamped.is_some(), "no write was re-stamped within the bound");
}
