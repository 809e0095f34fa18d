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
    /// `client::put::Fanout::commit`: a commit that reached W drives but found a newer version
    /// current on some (`Superseded`) is re-stamped: committed again, under a version past the
    /// newest those drives reported, on the drives that hold it
    /// (`proto::Request::RestampCommit`), and acknowledged as that version. Off: acknowledged
    /// as it is, ordered by when its writer began (issue 37, item 9: of two overlapping PUTs,
    /// the one acknowledged last lost).
    pub restamp_superseded: bool,
}

impl Fixes {
    /// Every fix on: the protocol the product moves to.
    pub const ALL: Fixes = Fixes {
        no_rollback_when_unknown: true,
        commit_queues_no_repair: true,
        list_answers_as_reads: true,
        rollback_fences_unknown: true,
        complete_readable: true,
        restamp_superseded: true,
    };
}

/// The size of the model: shape, writers and fault bounds.
#[derive(Clone, Debug)]
pub struct Config {
    /// Data chunks per version.
    pub k: u8,
    /// Parity chunks per version; also the most drives down at once.
    pub m: u8,
    /// Writers, each doing one PUT or DELETE; at most 3 (each takes up to [`ROUNDS`] versions).
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
    /// and the tests, exhaustive in about 30 s on 2 cores (1.36 million states). A second writer
    /// multiplies the states by more than a thousand (an exhaustive run of two fills 24 GB):
    /// run two depth-bounded on a smaller set, deep enough for a re-stamp (`--writers 2 --k 1
    /// --m 1 --depth 16`: 9.5 million states, about 70 s, no counterexample).
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
    /// The first round's commits still in flight after a re-stamp began: they may land.
    pub late: u8,
    pub rollback: u8,
    pub finalize: u8,
}

/// Commit rounds a writer may take: its first commit and one re-stamp. The product allows
/// `client::put::RESTAMPS_MAX` re-stamps; one re-stamp is all that two writers need unless each
/// supersedes the other's re-stamp in turn, which the model lets run out (`Write::unordered`).
pub const ROUNDS: u8 = 2;

/// One writer's write. Round `r`'s version is `(counters[r], writer)`; the model names it
/// `writer + r × writers` (version 0 is the initial one): see [`WriteModel::version_of`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Write {
    pub op: Op,
    /// Each round's counter (0 for a round not taken).
    pub counters: [u8; ROUNDS as usize],
    /// The round being committed; once decided, the last one.
    pub round: u8,
    pub phase: Phase,
    /// Drives sent this round's commit: those up when the write began, for a re-stamp those
    /// that held the first round's version; the rest were skipped.
    pub sent: u8,
    /// Drives that replied Applied or Superseded this round.
    pub applied: u8,
    /// Drives that replied an error this round.
    pub failed: u8,
    /// Drives that replied Superseded this round (a newer version was current there).
    pub superseded: u8,
    /// The newest counter among the versions that superseded this round's.
    pub newest_seen: u8,
    /// Whether a commit of this round reached a drive yet.
    pub landed: bool,
    /// Acknowledgements decided before this round's first commit reached a drive.
    pub acks_before: u8,
    /// Once acknowledged: the round whose version was, the drives holding it (the finalize
    /// goes to them and repair to the others) and its place among all acknowledgements (from 1).
    pub acked_round: u8,
    pub acked_on: u8,
    pub ack_seq: u8,
    /// Acknowledged without the order guarantee: its re-stamp failed (the first round's
    /// version, on W drives, is what was acknowledged) or the rounds ran out.
    pub unordered: bool,
    /// The outcome of the last round's version when a failed re-stamp left it unacknowledged.
    pub restamp_outcome: Option<Outcome>,
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
    /// Writes acknowledged so far.
    pub acks: u8,
}

/// A message kind, for [`Action::Lose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Message {
    Commit,
    LateCommit,
    Rollback,
    Finalize,
}

/// A step, named after the product function that takes it (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    WriteTarget { writer: u8, op: Op, counter: u8 },
    DriveCommit { writer: u8, drive: u8, late: bool },
    DriveCommitReplyLost { writer: u8, drive: u8 },
    DriveCommitFails { writer: u8, drive: u8, late: bool },
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
pub const INVARIANTS: [&str; 6] = [
    "acknowledged_never_lost",
    "failed_write_invisible",
    "list_agrees_with_reads",
    "repair_only_acknowledged",
    "quiet_reads_fully_held",
    "acknowledged_in_order",
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
        assert!(config.n() <= 8 && config.writers >= 1 && config.writers * ROUNDS < 8, "masks are u8");
        assert!(w <= config.n() && w > config.m, "a shape whose m reaches W cannot read with m drives down");
        WriteModel { config }
    }

    fn all_drives(&self) -> u8 {
        ((1u16 << self.config.n()) - 1) as u8
    }

    /// The version `writer` commits in `round`.
    pub fn version_of(state: &State, writer: u8, round: u8) -> u8 {
        writer + round * state.writers.len() as u8
    }

    /// The writer and round of a version; `None` for version 0.
    fn writer_round(writers: usize, version: u8) -> Option<(u8, u8)> {
        let n = writers as u8;
        (version != 0).then(|| ((version - 1) % n + 1, (version - 1) / n))
    }

    fn write(state: &State, version: u8) -> Option<&Write> {
        let (writer, _) = Self::writer_round(state.writers.len(), version)?;
        state.writers[usize::from(writer - 1)].as_ref()
    }

    /// The order of versions: `(counter of its round, writer)`; version 0 is `(0, 0)`.
    fn order(state: &State, version: u8) -> (u8, u8) {
        Self::order_in(&state.writers, version)
    }

    fn order_in(writers: &[Option<Write>], version: u8) -> (u8, u8) {
        match Self::writer_round(writers.len(), version) {
            None => (0, 0),
            Some((writer, round)) => {
                writers[usize::from(writer - 1)].map_or((0, 0), |write| (write.counters[usize::from(round)], writer))
            }
        }
    }

    fn is_delete(state: &State, version: u8) -> bool {
        Self::write(state, version).is_some_and(|w| w.op == Op::Delete)
    }

    /// What became of a version: its write's outcome, except the last round's version of a
    /// write acknowledged with an earlier round (its re-stamp failed): its own. An earlier
    /// round's version of an acknowledged write is acknowledged too (W drives hold it, the
    /// same object; the later round is ordered after it).
    fn outcome(state: &State, version: u8) -> Option<Outcome> {
        let Some((_, round)) = Self::writer_round(state.writers.len(), version) else {
            return Some(Outcome::Acknowledged);
        };
        let write = Self::write(state, version)?;
        match write.phase {
            Phase::Committing => None,
            Phase::Decided(Outcome::Acknowledged) if round > write.acked_round => write.restamp_outcome,
            Phase::Decided(outcome) => Some(outcome),
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

    /// Whether `version` definitely failed and its rollbacks are settled: none is still in
    /// flight. A rollback to a drive that is down waits for it; until it lands the drive may
    /// hold the version (its commit may land first), and nothing a reader sees can tell that
    /// drive from one holding an acknowledged version.
    fn rollback_settled(state: &State, version: u8) -> bool {
        Self::outcome(state, version) == Some(Outcome::Failed)
            && Self::write(state, version).is_some_and(|w| w.net.rollback == 0)
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
        let settled_failure = |v: Option<u8>| v.is_some_and(|v| Self::rollback_settled(state, v));
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

    /// A write acknowledged after another one's acknowledgement reached it is newer: for
    /// every write Y acknowledged with its order guarantee, every write X acknowledged before
    /// Y's last round reached a drive has an older version. (A version on W drives before Y's
    /// commit arrived is on one of the W drives that applied Y's version as current: write
    /// quorums intersect.)
    fn acknowledged_in_order(&self, state: &State) -> bool {
        let acked = |writer: u8, write: &Write| {
            (write.phase == Phase::Decided(Outcome::Acknowledged))
                .then(|| Self::order(state, Self::version_of(state, writer, write.acked_round)))
        };
        let writes: Vec<(u8, &Write)> =
            state.writers.iter().enumerate().filter_map(|(i, w)| w.as_ref().map(|w| (i as u8 + 1, w))).collect();
        writes.iter().all(|&(y, wy)| {
            let Some(order_y) = acked(y, wy).filter(|_| !wy.unordered) else { return true };
            writes.iter().all(|&(x, wx)| {
                x == y || wx.ack_seq == 0 || wx.ack_seq > wy.acks_before || acked(x, wx) < Some(order_y)
            })
        })
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
        let writer = idx as u8 + 1;
        let versions: Vec<String> = (0..=w.round)
            .map(|r| {
                format!("v{} = ({}, {writer})", WriteModel::version_of(state, writer, r), w.counters[usize::from(r)])
            })
            .collect();
        let acked = if w.ack_seq > 0 {
            format!(
                " acked v{} #{}{}",
                WriteModel::version_of(state, writer, w.acked_round),
                w.ack_seq,
                if w.unordered { " unordered" } else { "" }
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "    writer {writer} ({:?}, {}): {:?}{acked} round {} sent {} applied {} superseded {} failed {} (acks before: {}); in flight: commit {} late {} rollback {} finalize {}\n",
            w.op,
            versions.join(", "),
            w.phase,
            w.round,
            set(w.sent),
            set(w.applied),
            set(w.superseded),
            set(w.failed),
            w.acks_before,
            set(n.commit),
            set(n.late),
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
            acks: 0,
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
        let mut properties = vec![
            Property::always("acknowledged_never_lost", |model: &Self, s| model.acknowledged_never_lost(s)),
            Property::always("failed_write_invisible", |model: &Self, s| model.failed_write_invisible(s)),
            Property::always("list_agrees_with_reads", |model: &Self, s| model.list_agrees_with_reads(s)),
            Property::always("repair_only_acknowledged", |model: &Self, s| model.repair_only_acknowledged(s)),
            Property::always("quiet_reads_fully_held", |model: &Self, s| model.quiet_reads_fully_held(s)),
            Property::always("acknowledged_in_order", |model: &Self, s| model.acknowledged_in_order(s)),
            Property::sometimes("an acknowledged write", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Acknowledged))
            }),
            Property::sometimes("a definitely failed write", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Failed))
            }),
            Property::sometimes("an unknown outcome", |_, s: &State| {
                s.writers.iter().flatten().any(|w| w.phase == Phase::Decided(Outcome::Unknown))
            }),
        ];
        // One writer has nobody to overlap with: only two can supersede each other.
        if self.config.writers > 1 {
            properties.push(Property::sometimes("a re-stamped write", |_, s: &State| {
                s.writers
                    .iter()
                    .flatten()
                    .any(|w| w.phase == Phase::Decided(Outcome::Acknowledged) && w.acked_round > 0)
            }));
        }
        properties
    }
}

#[cfg(test)]
mod tests;
