//! An executable model of Tessera's write protocol for one key on one erasure set, checked
//! exhaustively with [`stateright`]. Test-only: no product crate depends on it.
//!
//! # What it models
//!
//! One erasure set of n = k + m drives (default 3 + 2) and one key. The key starts with one
//! acknowledged version `v0` (a PUT, on every drive, every drive's floor naming it). Each of a
//! few writers does one operation, a PUT or a DELETE (a version with `deleted = true`), through
//! the whole protocol: version read, commits, the writer's decision, then finalize or rollback.
//! Drives repair, scrub and retire meanwhile. Every request to a drive and every reply is a
//! message that is delivered in any order or lost; a drive may refuse a commit (a full disk,
//! `TooManyVersions`); up to m drives are down at once (a down drive keeps its state, applies
//! nothing and answers nothing; what is sent to it waits). Losses and refusals share one bound
//! ([`Config::faults_max`]), drive outages another ([`Config::impairments_max`]).
//!
//! Reads are not actions: every property evaluates the reader's rule over a snapshot of the
//! current state (the drives that are down stay silent), as a GET, HEAD or LIST starting in
//! that state would. A real read's answers arrive at different moments; the snapshot is the
//! special case where they arrive together.
//!
//! # Actions and the product functions implementing them
//!
//! | [`Action`]            | product function                                                  |
//! |-----------------------|-------------------------------------------------------------------|
//! | `WriteTarget`         | `client::Client::write_target` (`head::newest_version_seen`, W answers) |
//! | `DriveCommit`         | `chunkstore::Drive::commit` (applied or superseded)               |
//! | `DriveCommitReplyLost`| `chunkstore::Drive::commit` applied, its reply lost               |
//! | `DriveCommitFails`    | `chunkstore::Drive::commit` returning an error                    |
//! | `FanoutCommit`        | `client::put::Fanout::commit` deciding (all replies in, or timeout) |
//! | `DriveRollback`       | `chunkstore::Drive::rollback`                                     |
//! | `DriveFinalize`       | `chunkstore::Drive::finalize`                                     |
//! | `PlanAndRepair`       | `node::repair::plan_and_repair` (one queue entry, one target)     |
//! | `Scrub`               | `node::scrub` (scrub-finalize, queueing `Missing` peers; with     |
//! |                       | `Fixes::complete_readable`, completing a readable version of      |
//! |                       | unknown outcome, spread in the same step)                         |
//! | `Retire`              | the node's `retire` thread (retained versions below the floor)    |
//! | `Lose`, `DriveDown`, `DriveUp` | the network and the drives                               |
//!
//! The reader is `client::choose_version` (with `head::choose_readable` and
//! `head::maybe_acknowledged_unreadable`): [`WriteModel::read`]. LIST is
//! `client::list::Client::list_inner`: [`WriteModel::list`].
//!
//! # The fixes
//!
//! [`Fixes`] holds one flag per rule the product moves to; each off restores the old
//! behaviour, and `tests` shows the checker finds a counterexample with any one of them off.
//!
//! # Properties
//!
//! - `acknowledged_never_lost`: the read returns the newest acknowledged version or a newer
//!   one. It may instead be unavailable only while a drive is down or a writer has not decided
//!   (a write in flight may be acknowledged on drives that are out of reach); with every drive
//!   up and every writer decided, an error is a lost version.
//! - `failed_write_invisible`: a write that definitely failed, once its rollbacks are settled
//!   (each delivered or lost), is not what a read or LIST answers from. Before they settle the
//!   version may still be on drives that are down: see `rollback_settled` for why this is the
//!   exact point.
//! - `list_agrees_with_reads`: LIST shows the key exactly when the read returns an object.
//! - `repair_only_acknowledged`: no version that repair copied or scrub finalized belongs to a
//!   write that definitely failed. Acting on a write not yet decided is fine exactly when its
//!   writer can no longer decide "failed"; the property, checked in every later state, says so.
//! - `quiet_reads_fully_held`: once nothing is left to happen (writers decided, nothing in
//!   flight, every drive up, no repair, scrub or retirement to do), the version the read
//!   returns is on every drive that holds nothing newer: what a reader was given has the
//!   redundancy the shape promises.
//!
//! # Example
//!
//! ```
//! use model::{Config, Fixes, WriteModel};
//! use stateright::{Checker, Model};
//! let checker = WriteModel::new(Config::small(Fixes::ALL)).checker().spawn_bfs().join();
//! assert!(checker.discovery("acknowledged_never_lost").is_none());
//! ```

use stateright::{Model, Property};

/// The rules the product moves to, each of which can be switched back to the old behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixes {
    /// `client::put::Fanout::commit`: fewer than W applied but W with the drives that never
    /// answered is an unknown outcome, not rolled back. Off: rollback whenever applied < W.
    pub no_rollback_when_unknown: bool,
    /// `chunkstore::Drive::commit` queues no repair; only `chunkstore::Drive::finalize` does.
    /// Off: the commit also queues the positions the writer skipped.
    pub commit_queues_no_repair: bool,
    /// `client::list::Client::list_inner` lists a key exactly when the read rule returns an
    /// object. Off: when the newest current version any drive reports is not a delete marker.
    pub list_answers_as_reads: bool,
    /// A definite failure rolls back the drives that never answered too, and
    /// `chunkstore::Drive::rollback` of a version the drive does not hold fences it: a commit
    /// of it arriving later is refused. Off: only the drives that applied are rolled back, and
    /// nothing is fenced.
    pub rollback_fences_unknown: bool,
    /// `node::scrub` completes a readable version nobody can decide about any more (its
    /// writer decided, rollbacks settled, nothing newer held anywhere, every drive up): it
    /// finalizes it and queues the drives that lack it. And `client::put::Fanout::commit`
    /// reports a failure only when fewer drives than a read takes may still hold the version
    /// once its rollbacks settle; otherwise the outcome is unknown. Off: a readable version of
    /// unknown outcome stays on the drives that took it, with less redundancy for ever.
    pub complete_readable: bool,
}

impl Fixes {
    /// Every fix on: the protocol the product moves to.
    pub const ALL: Fixes = Fixes {
        no_rollback_when_unknown: true,
        commit_queues_no_repair: true,
        list_answers_as_reads: true,
        rollback_fences_unknown: true,
        complete_readable: true,
    };
}

/// The size of the model: shape, writers and fault bounds.
#[derive(Clone, Debug)]
pub struct Config {
    /// Data chunks per version.
    pub k: u8,
    /// Parity chunks per version; also the most drives down at once.
    pub m: u8,
    /// Writers, each doing one PUT or DELETE; at most 7.
    pub writers: u8,
    /// Messages lost plus commits refused, in all.
    pub faults_max: u8,
    /// Times a drive goes down, in all.
    pub impairments_max: u8,
    /// A writer's clock may run one tick ahead of the newest version it read, so a later
    /// writer's version can order before an earlier writer's it did not see.
    pub clock_skew: bool,
    /// Which rules follow the new protocol.
    pub fixes: Fixes,
}

impl Config {
    /// 3 + 2, one writer beside the initial version, two faults, one outage: the default run
    /// and the tests, exhaustive in about 30 s on 2 cores (1.27 million states). A second writer
    /// multiplies the states by more than a thousand: run it depth-bounded (`--writers 2
    /// --depth 12`: 6.3 million states, about a minute, no counterexample).
    pub fn small(fixes: Fixes) -> Config {
        Config { k: 3, m: 2, writers: 1, faults_max: 2, impairments_max: 1, clock_skew: false, fixes }
    }

    /// 4 + 2 (the real default shape, W = n - 1 as in 3 + 2), one writer, two faults, two
    /// outages: `--large`, for long runs.
    pub fn large(fixes: Fixes) -> Config {
        Config { k: 4, m: 2, writers: 1, faults_max: 2, impairments_max: 2, clock_skew: false, fixes }
    }

    /// Drives in the set.
    pub fn n(&self) -> u8 {
        self.k + self.m
    }

    /// W = max(k + 1, ceil((n + 1) / 2)), as `cluster::Erasure::write_quorum`.
    pub fn write_quorum(&self) -> u8 {
        (self.k + 1).max((self.n() + 1).div_ceil(2))
    }

    /// Drives holding a delete marker that a reader needs: W - m.
    pub fn marker_quorum(&self) -> u8 {
        self.write_quorum() - self.m
    }
}

/// What a writer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    Delete,
}

/// How `client::put::Fanout::commit` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Acknowledged,
    /// Fewer than W applied, but with the drives that never answered W may hold it.
    Unknown,
    Failed,
}

/// A writer's progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Committing,
    Decided(Outcome),
}

/// Requests in flight for one writer, one bit per drive each. A writer sends each kind at most
/// once to a drive, so sets are exact. A commit's reply arrives with it, or is lost
/// (`Action::DriveCommitReplyLost`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Net {
    pub commit: u8,
    pub rollback: u8,
    pub finalize: u8,
}

/// One writer's write. Its version is `(counter, writer)`; the model names it by the writer's
/// number (version 0 is the initial one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Write {
    pub op: Op,
    pub counter: u8,
    pub phase: Phase,
    /// Drives sent a commit (those up when the write began); the rest were skipped.
    pub sent: u8,
    /// Drives that replied Applied or Superseded.
    pub applied: u8,
    /// Drives that replied an error.
    pub failed: u8,
    pub net: Net,
}

/// A repair queue entry: `targets` lack `version`; `finalizes` when it came from a Finalize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepairEntry {
    pub version: u8,
    pub targets: u8,
    pub finalizes: bool,
}

/// One drive's rows for the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Drive {
    /// Versions held, one bit per version: the newest is current, the others retained.
    pub held: u8,
    /// The newest version this drive was told is acknowledged.
    pub floor: Option<u8>,
    pub queue: Vec<RepairEntry>,
    /// Versions rolled back here: a later commit of one is refused.
    pub fenced: u8,
    pub down: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub drives: Vec<Drive>,
    /// Writer w (from 1) is `writers[w - 1]`; `None` until it takes its version.
    pub writers: Vec<Option<Write>>,
    pub faults_left: u8,
    pub impairments_left: u8,
    /// Versions that a repair copied or a scrub finalized, one bit per version.
    pub spread: u8,
}

/// A message kind, for [`Action::Lose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Message {
    Commit,
    Rollback,
    Finalize,
}

/// A step, named after the product function that takes it (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    WriteTarget { writer: u8, op: Op, counter: u8 },
    DriveCommit { writer: u8, drive: u8 },
    DriveCommitReplyLost { writer: u8, drive: u8 },
    DriveCommitFails { writer: u8, drive: u8 },
    FanoutCommit { writer: u8 },
    DriveRollback { writer: u8, drive: u8 },
    DriveFinalize { writer: u8, drive: u8 },
    PlanAndRepair { source: u8, version: u8, target: u8 },
    Scrub { drive: u8 },
    Retire { drive: u8 },
    Lose { writer: u8, message: Message, drive: u8 },
    DriveDown { drive: u8 },
    DriveUp { drive: u8 },
}

/// What a GET or HEAD starting in a state answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadOutcome {
    /// This version's object.
    Object(u8),
    /// Not found: a delete marker (its version), or no version at all.
    Absent(Option<u8>),
    /// The read fails: a version that may be acknowledged is not readable.
    Unavailable,
}

/// The model: a [`Config`]; implements [`stateright::Model`].
#[derive(Clone, Debug)]
pub struct WriteModel {
    pub config: Config,
}

/// The invariants, in the order the binary names them.
pub const INVARIANTS: [&str; 5] = [
    "acknowledged_never_lost",
    "failed_write_invisible",
    "list_agrees_with_reads",
    "repair_only_acknowledged",
    "quiet_reads_fully_held",
];

fn bits(mask: u8) -> impl Iterator<Item = u8> {
    (0..8u8).filter(move |b| mask & (1 << b) != 0)
}

fn count(mask: u8) -> u8 {
    mask.count_ones() as u8
}

impl WriteModel {
    pub fn new(config: Config) -> WriteModel {
        let w = config.write_quorum();
        assert!(config.n() <= 8 && config.writers >= 1 && config.writers <= 7, "masks are u8");
        assert!(w <= config.n() && w > config.m, "a shape whose m reaches W cannot read with m drives down");
        WriteModel { config }
    }

    fn all_drives(&self) -> u8 {
        ((1u16 << self.config.n()) - 1) as u8
    }

    fn write(state: &State, version: u8) -> Option<&Write> {
        match version {
            0 => None,
            w => state.writers[usize::from(w - 1)].as_ref(),
        }
    }

    /// The order of versions: `(counter, writer)`; version 0 is `(0, 0)`.
    fn order(state: &State, version: u8) -> (u8, u8) {
        Self::write(state, version).map_or((0, 0), |w| (w.counter, version))
    }

    fn is_delete(state: &State, version: u8) -> bool {
        Self::write(state, version).is_some_and(|w| w.op == Op::Delete)
    }

    fn outcome(state: &State, version: u8) -> Option<Outcome> {
        match version {
            0 => Some(Outcome::Acknowledged),
            _ => match Self::write(state, version)?.phase {
                Phase::Decided(outcome) => Some(outcome),
                Phase::Committing => None,
            },
        }
    }

    fn current(state: &State, drive: &Drive) -> Option<u8> {
        bits(drive.held).max_by_key(|&v| Self::order(state, v))
    }

    /// `client::choose_version` over the answers of the drives that are up: the newest version
    /// held by enough drives to read it (k, or W - m for a delete marker), never older than a
    /// floor any drive reports, and never read past one that may be acknowledged (its holders
    /// plus the silent drives reach W, or a floor names it): then the read fails.
    pub fn read(&self, state: &State) -> ReadOutcome {
        let (k, w, marker) = (self.config.k, self.config.write_quorum(), self.config.marker_quorum());
        let answering: Vec<&Drive> = state.drives.iter().filter(|d| !d.down).collect();
        let silent = self.config.n() - answering.len() as u8;
        let floor = answering.iter().filter_map(|d| d.floor).max_by_key(|&f| Self::order(state, f));
        let seen = answering.iter().fold(0, |acc, d| acc | d.held);
        let mut versions: Vec<u8> = bits(seen).collect();
        versions.sort_by_key(|&v| std::cmp::Reverse(Self::order(state, v)));
        for v in versions {
            if floor.is_some_and(|f| Self::order(state, f) > Self::order(state, v)) {
                break;
            }
            let holders = answering.iter().filter(|d| d.held & (1 << v) != 0).count() as u8;
            let delete = Self::is_delete(state, v);
            if holders >= if delete { marker } else { k } {
                return if delete { ReadOutcome::Absent(Some(v)) } else { ReadOutcome::Object(v) };
            }
            if holders + silent >= w || floor == Some(v) {
                return ReadOutcome::Unavailable;
            }
        }
        if floor.is_some() { ReadOutcome::Unavailable } else { ReadOutcome::Absent(None) }
    }

    /// `client::list::Client::list_inner` for the key: whether it is listed, and the version
    /// that decided it.
    pub fn list(&self, state: &State) -> (bool, Option<u8>) {
        if self.config.fixes.list_answers_as_reads {
            return match self.read(state) {
                ReadOutcome::Object(v) => (true, Some(v)),
                ReadOutcome::Absent(v) => (false, v),
                ReadOutcome::Unavailable => (false, None),
            };
        }
        let newest = state
            .drives
            .iter()
            .filter(|d| !d.down)
            .filter_map(|d| Self::current(state, d))
            .max_by_key(|&v| Self::order(state, v));
        (newest.is_some_and(|v| !Self::is_delete(state, v)), newest)
    }

    /// Whether a failed write's rollbacks are settled: none is still in flight. A rollback
    /// to a drive that is down waits for it; until it lands the drive may hold the version
    /// (its commit may land first), and nothing a reader sees can tell that drive from one
    /// holding an acknowledged version.
    fn rollback_settled(write: &Write) -> bool {
        write.phase == Phase::Decided(Outcome::Failed) && write.net.rollback == 0
    }

    fn acknowledged_never_lost(&self, state: &State) -> bool {
        let newest = (0..=self.config.writers)
            .filter(|&v| Self::outcome(state, v) == Some(Outcome::Acknowledged))
            .max_by_key(|&v| Self::order(state, v))
            .expect("version 0 is acknowledged");
        match self.read(state) {
            ReadOutcome::Object(v) | ReadOutcome::Absent(Some(v)) => {
                Self::order(state, v) >= Self::order(state, newest)
            }
            ReadOutcome::Absent(None) => false,
            ReadOutcome::Unavailable => {
                state.drives.iter().any(|d| d.down)
                    || state.writers.iter().flatten().any(|w| w.phase == Phase::Committing)
            }
        }
    }

    fn failed_write_invisible(&self, state: &State) -> bool {
        let settled_failure = |v: Option<u8>| v.and_then(|v| Self::write(state, v)).is_some_and(Self::rollback_settled);
        let read = match self.read(state) {
            ReadOutcome::Object(v) | ReadOutcome::Absent(Some(v)) => Some(v),
            _ => None,
        };
        !settled_failure(read) && !settled_failure(self.list(state).1)
    }

    fn list_agrees_with_reads(&self, state: &State) -> bool {
        self.list(state).0 == matches!(self.read(state), ReadOutcome::Object(_))
    }

    fn repair_only_acknowledged(&self, state: &State) -> bool {
        bits(state.spread).all(|v| Self::outcome(state, v) != Some(Outcome::Failed))
    }

    /// Once nothing is left to happen (every writer decided, no message in flight, no drive
    /// down, no repair, scrub or retirement to do), the version a read returns is on every
    /// drive that holds nothing newer: whatever a reader was given has full redundancy.
    fn quiet_reads_fully_held(&self, state: &State) -> bool {
        let quiet =
            state.writers.iter().flatten().all(|w| matches!(w.phase, Phase::Decided(_)) && w.net == Net::default())
                && state.drives.iter().all(|d| !d.down)
                && (0..state.drives.len() as u8).all(|d| !self.drive_has_work(state, d));
        if !quiet {
            return true;
        }
        let v = match self.read(state) {
            ReadOutcome::Object(v) | ReadOutcome::Absent(Some(v)) => v,
            _ => return true,
        };
        let order = |x| Self::order(state, x);
        state.drives.iter().all(|d| d.held & (1 << v) != 0 || bits(d.held).any(|x| order(x) > order(v)))
    }
}

mod step;

fn set(mask: u8) -> String {
    let items: Vec<String> = bits(mask).map(|b| b.to_string()).collect();
    format!("{{{}}}", items.join(","))
}

/// One line per drive and writer: what a counterexample's state holds.
pub fn describe(state: &State) -> String {
    let mut out = String::new();
    for (idx, d) in state.drives.iter().enumerate() {
        let floor = d.floor.map_or("-".to_owned(), |f| format!("v{f}"));
        let queue: Vec<String> = d
            .queue
            .iter()
            .map(|e| format!("v{}->{}{}", e.version, set(e.targets), if e.finalizes { " finalizes" } else { "" }))
            .collect();
        out.push_str(&format!(
            "    drive {idx}{}: versions {} floor {floor} queue [{}] fenced {}\n",
            if d.down { " DOWN" } else { "" },
            set(d.held),
            queue.join(", "),
            set(d.fenced),
        ));
    }
    for (idx, w) in state.writers.iter().enumerate() {
        let Some(w) = w else { continue };
        let n = w.net;
        out.push_str(&format!(
            "    writer {} ({:?}, counter {}): {:?} sent {} applied {} failed {}; in flight: commit {} rollback {} finalize {}\n",
            idx + 1,
            w.op,
            w.counter,
            w.phase,
            set(w.sent),
            set(w.applied),
            set(w.failed),
            set(n.commit),
            set(n.rollback),
            set(n.finalize),
        ));
    }
    out
}

/// A counterexample: each state, what a read and a LIST answer there, and the action taken
/// from it. Drives are renumbered after every step (see `step::canonical`): an action's drive
/// numbers refer to the state printed just above it.
pub fn render(model: &WriteModel, path: &stateright::Path<State, Action>) -> String {
    let mut out = String::from("  (drive numbers are renumbered after each step)\n  initially\n");
    for (state, action) in path.clone().into_vec() {
        out.push_str(&describe(&state));
        out.push_str(&format!("    read: {:?}; listed: {}\n", model.read(&state), model.list(&state).0));
        if let Some(action) = action {
            out.push_str(&format!("  then {action:?}\n"));
        }
    }
    out
}

impl Model for WriteModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let drive = Drive { held: 1, floor: Some(0), queue: Vec::new(), fenced: 0, down: false };
        vec![State {
            drives: vec![drive; usize::from(self.config.n())],
            writers: vec![None; usize::from(self.config.writers)],
            faults_left: self.config.faults_max,
            impairments_left: self.config.impairments_max,
            spread: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.writer_actions(state, actions);
        self.drive_actions(state, actions);
        self.fault_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        self.apply(&mut next, action);
        step::canonical(&mut next);
        (next != *state).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("acknowledged_never_lost", |model: &Self, s| model.acknowledged_never_lost(s)),
            Property::always("failed_write_invisible", |model: &Self, s| model.failed_write_invisible(s)),
            Property::always("list_agrees_with_reads", |model: &Self, s| model.list_agrees_with_reads(s)),
            Property::always("repair_only_acknowledged", |model: &Self, s| model.repair_only_acknowledged(s)),
            Property::always("quiet_reads_fully_held", |model: &Self, s| model.quiet_reads_fully_held(s)),
            Property::sometimes("an acknowledged write", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Acknowledged))
            }),
            Property::sometimes("a definitely failed write", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Failed))
            }),
            Property::sometimes("an unknown outcome", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Unknown))
            }),
        ]
    }
}

#[cfg(test)]
mod tests;
