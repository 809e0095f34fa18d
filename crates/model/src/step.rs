//! The actions enabled in a state, and what each does.

use crate::{
    Action, Drive, Message, Net, Op, Outcome, Phase, ROUNDS, RepairEntry, State, Write, WriteModel, bits, count,
};

impl WriteModel {
    pub(crate) fn writer_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (idx, write) in state.writers.iter().enumerate() {
            let writer = idx as u8 + 1;
            let Some(write) = write else {
                for counter in self.counters(state) {
                    for op in [Op::Put, Op::Delete] {
                        actions.push(Action::WriteTarget { writer, op, counter });
                    }
                }
                continue;
            };
            if write.phase == Phase::Committing {
                actions.push(Action::FanoutCommit { writer });
            }
            let up = self.up(state);
            for drive in bits(write.net.commit & up) {
                actions.push(Action::DriveCommit { writer, drive, late: false });
                if state.faults_left > 0 {
                    actions.push(Action::DriveCommitFails { writer, drive, late: false });
                    if write.phase == Phase::Committing {
                        actions.push(Action::DriveCommitReplyLost { writer, drive });
                    }
                }
            }
            for drive in bits(write.net.late & up) {
                actions.push(Action::DriveCommit { writer, drive, late: true });
                if state.faults_left > 0 {
                    actions.push(Action::DriveCommitFails { writer, drive, late: true });
                }
            }
            for drive in bits(write.net.rollback & up) {
                actions.push(Action::DriveRollback { writer, drive });
            }
            for drive in bits(write.net.finalize & up) {
                actions.push(Action::DriveFinalize { writer, drive });
            }
        }
    }

    /// Whether `drive` (up) has a repair, scrub or retirement to do.
    pub(crate) fn drive_has_work(&self, state: &State, drive: u8) -> bool {
        let mut actions = Vec::new();
        self.drive_actions_of(state, drive, &mut actions);
        !actions.is_empty()
    }

    pub(crate) fn drive_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for drive in 0..state.drives.len() as u8 {
            self.drive_actions_of(state, drive, actions);
        }
    }

    fn drive_actions_of(&self, state: &State, source: u8, actions: &mut Vec<Action>) {
        let up = self.up(state);
        let drive = &state.drives[usize::from(source)];
        if drive.down {
            return;
        }
        for entry in &drive.queue {
            if drive.held & (1 << entry.version) != 0 {
                // Targets are repaired one by one in position order: another order reaches
                // the same states, only through other intermediate ones.
                if let Some(target) = bits(entry.targets & up).next() {
                    actions.push(Action::PlanAndRepair { source, version: entry.version, target });
                }
            }
        }
        if self.scrub_changes(state, source) {
            actions.push(Action::Scrub { drive: source });
        }
        if self.retirable(state, drive) != 0 {
            actions.push(Action::Retire { drive: source });
        }
    }

    pub(crate) fn fault_actions(&self, state: &State, actions: &mut Vec<Action>) {
        let down = state.drives.iter().filter(|d| d.down).count() as u8;
        for (idx, drive) in state.drives.iter().enumerate() {
            let drive_idx = idx as u8;
            if drive.down {
                actions.push(Action::DriveUp { drive: drive_idx });
            } else if down < self.config.m && state.impairments_left > 0 {
                actions.push(Action::DriveDown { drive: drive_idx });
            }
        }
        if state.faults_left == 0 {
            return;
        }
        for (idx, write) in state.writers.iter().enumerate() {
            let Some(write) = write else { continue };
            let writer = idx as u8 + 1;
            let net = write.net;
            for (message, mask) in [
                (Message::Commit, net.commit),
                (Message::LateCommit, net.late),
                (Message::Rollback, net.rollback),
                (Message::Finalize, net.finalize),
            ] {
                for drive in bits(mask) {
                    actions.push(Action::Lose { writer, message, drive });
                }
            }
        }
    }

    pub(crate) fn apply(&self, state: &mut State, action: Action) {
        match action {
            Action::WriteTarget { writer, op, counter } => self.start(state, writer, op, counter),
            Action::DriveCommit { writer, drive, late } => {
                self.drive_commit(state, writer, drive, if late { Reply::Late } else { Reply::Delivered })
            }
            Action::DriveCommitReplyLost { writer, drive } => {
                state.faults_left -= 1;
                self.drive_commit(state, writer, drive, Reply::Lost);
            }
            Action::DriveCommitFails { writer, drive, late } => {
                state.faults_left -= 1;
                let acks = state.acks;
                let write = write_mut(state, writer);
                if late {
                    write.net.late &= !(1 << drive);
                } else {
                    write.net.commit &= !(1 << drive);
                    if write.phase == Phase::Committing {
                        write.failed |= 1 << drive;
                        land(write, acks);
                    }
                }
            }
            Action::FanoutCommit { writer } => self.fanout_commit(state, writer),
            Action::DriveRollback { writer, drive } => {
                let fence = self.config.fixes.rollback_fences_unknown;
                let write = write_mut(state, writer);
                write.net.rollback &= !(1 << drive);
                // The last round's version is the one rolled back.
                let round = write.round;
                let version = Self::version_of(state, writer, round);
                let d = &mut state.drives[usize::from(drive)];
                // A drive that held the version has had its one commit: only the others fence.
                if fence && d.held & (1 << version) == 0 {
                    d.fenced |= 1 << version;
                }
                d.held &= !(1 << version);
                self.settle_rollbacks(state, writer);
            }
            Action::DriveFinalize { writer, drive } => self.drive_finalize(state, writer, drive),
            Action::PlanAndRepair { source, version, target } => self.plan_and_repair(state, source, version, target),
            Action::Scrub { drive } => self.scrub(state, drive),
            Action::Retire { drive } => {
                let retired = self.retirable(state, &state.drives[usize::from(drive)]);
                state.drives[usize::from(drive)].held &= !retired;
            }
            Action::Lose { writer, message, drive } => {
                state.faults_left -= 1;
                let net = &mut write_mut(state, writer).net;
                let bit = !(1 << drive);
                match message {
                    Message::Commit => net.commit &= bit,
                    Message::LateCommit => net.late &= bit,
                    Message::Rollback => net.rollback &= bit,
                    Message::Finalize => net.finalize &= bit,
                }
                if message == Message::Rollback {
                    self.settle_rollbacks(state, writer);
                }
            }
            Action::DriveDown { drive } => {
                state.impairments_left -= 1;
                state.drives[usize::from(drive)].down = true;
            }
            Action::DriveUp { drive } => state.drives[usize::from(drive)].down = false,
        }
    }

    fn up(&self, state: &State) -> u8 {
        (0..self.config.n()).filter(|&d| !state.drives[usize::from(d)].down).fold(0, |acc, d| acc | 1 << d)
    }

    /// `client::Client::write_target`: the counters a writer may take, one past the newest
    /// version (held or named by a floor) some W drives that are up report; with clock skew
    /// also one more. Nothing if fewer than W drives are up (`Fanout::open` fails then).
    fn counters(&self, state: &State) -> Vec<u8> {
        let (w, up) = (self.config.write_quorum(), self.up(state));
        let mut counters = Vec::new();
        for subset in 0..=self.all_drives() {
            if subset & !up != 0 || count(subset) != w {
                continue;
            }
            let newest = bits(subset)
                .flat_map(|d| {
                    let drive = &state.drives[usize::from(d)];
                    bits(drive.held).chain(drive.floor)
                })
                .map(|v| Self::order(state, v).0)
                .max()
                .unwrap_or(0);
            counters.push(newest + 1);
            if self.config.clock_skew {
                counters.push(newest + 2);
            }
        }
        counters.sort_unstable();
        counters.dedup();
        counters
    }

    fn start(&self, state: &mut State, writer: u8, op: Op, counter: u8) {
        let sent = self.up(state);
        let net = Net { commit: sent, ..Net::default() };
        let write = Write {
            op,
            counters: [counter, 0],
            round: 0,
            phase: Phase::Committing,
            sent,
            applied: 0,
            failed: 0,
            superseded: 0,
            newest_seen: 0,
            landed: false,
            acks_before: 0,
            acked_round: 0,
            acked_on: 0,
            ack_seq: 0,
            unordered: false,
            restamp_outcome: None,
            net,
        };
        state.writers[usize::from(writer - 1)] = Some(write);
    }

    /// `chunkstore::Drive::commit`: the version becomes current if newer, else retained
    /// (Superseded, with the newer version's id); either way the drive holds it and it counts
    /// toward W. A fenced version (rolled back here before its commit arrived) is refused; so
    /// is a re-stamp (`chunkstore::Drive::restamp`) of an object whose first round's data the drive does not
    /// hold (a delete marker has none to hold). The reply reaches the writer at once unless
    /// lost: a reply that comes late is one the writer decided without, which `FanoutCommit`
    /// before this step already covers. A first-round commit landing after its writer
    /// re-stamped (`Reply::Late`) is such a reply.
    fn drive_commit(&self, state: &mut State, writer: u8, drive: u8, reply: Reply) {
        let late = reply == Reply::Late;
        let acks = state.acks;
        let write = write_mut(state, writer);
        let skipped = self.all_drives() & !write.sent;
        let round = if late { 0 } else { write.round };
        if late {
            write.net.late &= !(1 << drive);
        } else {
            write.net.commit &= !(1 << drive);
        }
        let committing = write.phase == Phase::Committing;
        let needs_data = round > 0 && write.op == Op::Put;
        let version = Self::version_of(state, writer, round);
        let order = Self::order(state, version);
        let d = &state.drives[usize::from(drive)];
        let newer = Self::current(state, d).map(|c| Self::order(state, c)).filter(|&c| c > order);
        let refused = d.fenced & (1 << version) != 0
            || (needs_data && d.held & (1 << Self::version_of(state, writer, round - 1)) == 0);
        let d = &mut state.drives[usize::from(drive)];
        if !refused {
            d.held |= 1 << version;
            if !self.config.fixes.commit_queues_no_repair && skipped != 0 && !late {
                queue(d, RepairEntry { version, targets: skipped, finalizes: false });
            }
        }
        if committing && reply == Reply::Delivered {
            let write = write_mut(state, writer);
            land(write, acks);
            if refused {
                write.failed |= 1 << drive;
            } else {
                write.applied |= 1 << drive;
                if let Some((counter, _)) = newer {
                    write.superseded |= 1 << drive;
                    write.newest_seen = write.newest_seen.max(counter);
                }
            }
        }
    }

    /// `client::put::Fanout::commit` decides with the replies it has: acknowledged at W
    /// applied (Finalize to them); unknown when the drives that never answered could make up
    /// W (nothing sent); else failed (Rollback).
    ///
    /// With `Fixes::restamp_superseded`, W applied with some Superseded re-stamps instead
    /// (a round past the newest counter they reported, sent to the drives that applied this
    /// one) while rounds are left. A re-stamp that fails acknowledges the first round's
    /// version, which W drives hold (without the order guarantee), and decides about its own
    /// version as about a failed first round: unknown, or rolled back.
    fn fanout_commit(&self, state: &mut State, writer: u8) {
        let fixes = self.config.fixes;
        let w = self.config.write_quorum();
        let acks = state.acks;
        let write = write_mut(state, writer);
        let unknown = write.sent & !write.applied & !write.failed;
        let (applied, unknown_count) = (count(write.applied), count(unknown));
        if applied >= w && fixes.restamp_superseded && write.superseded != 0 && write.round + 1 < ROUNDS {
            write.round += 1;
            write.counters[usize::from(write.round)] = write.newest_seen + 1;
            // The first round's commits not answered yet may still land.
            write.net.late = write.net.commit;
            write.net.commit = write.applied;
            write.sent = write.applied;
            write.applied = 0;
            write.failed = 0;
            write.superseded = 0;
            write.newest_seen = 0;
            write.landed = false;
            return;
        }
        let outcome = if applied >= w {
            write.acked_round = write.round;
            write.acked_on = write.applied;
            write.unordered = fixes.restamp_superseded && write.superseded != 0;
            Outcome::Acknowledged
        } else if write.round > 0 {
            write.acked_round = write.round - 1;
            write.acked_on = write.sent;
            write.unordered = true;
            write.restamp_outcome = Some(if fixes.no_rollback_when_unknown && applied + unknown_count >= w {
                Outcome::Unknown
            } else {
                write.net.rollback = write.applied | if fixes.rollback_fences_unknown { unknown } else { 0 };
                Outcome::Failed
            });
            Outcome::Acknowledged
        } else if fixes.no_rollback_when_unknown && applied + unknown_count >= w {
            Outcome::Unknown
        } else {
            write.net.rollback = write.applied | if fixes.rollback_fences_unknown { unknown } else { 0 };
            Outcome::Failed
        };
        if outcome == Outcome::Acknowledged {
            write.net.finalize = write.acked_on;
            write.ack_seq = acks + 1;
            state.acks += 1;
        }
        write_mut(state, writer).phase = Phase::Decided(outcome);
    }

    /// `client::put::Fanout::commit` once its rollbacks are answered or lost: with the fix, a
    /// failure whose unconfirmed rollbacks leave as many possible holders as a read takes (drives
    /// that hold the version, or that a commit of it may still reach) is an unknown outcome.
    fn settle_rollbacks(&self, state: &mut State, writer: u8) {
        let threshold =
            |write: &Write| if write.op == Op::Delete { self.config.marker_quorum() } else { self.config.k };
        let write = write_mut(state, writer);
        let (commit, round) = (write.net.commit, write.round);
        let version = Self::version_of(state, writer, round);
        let held = state.drives.iter().enumerate().fold(0u8, |acc, (i, d)| acc | ((d.held >> version) & 1) << i);
        let may_hold = count(held | commit);
        let write = write_mut(state, writer);
        if self.config.fixes.complete_readable && write.net.rollback == 0 && may_hold >= threshold(write) {
            if write.phase == Phase::Decided(Outcome::Failed) {
                write.phase = Phase::Decided(Outcome::Unknown);
            } else if write.restamp_outcome == Some(Outcome::Failed) {
                write.restamp_outcome = Some(Outcome::Unknown);
            }
        }
    }

    /// `chunkstore::Drive::finalize`: raises the floor and queues the positions that missed
    /// the version (with the fix, the only place that queues them).
    fn drive_finalize(&self, state: &mut State, writer: u8, drive: u8) {
        let write = write_mut(state, writer);
        write.net.finalize &= !(1 << drive);
        let missing = self.all_drives() & !write.acked_on;
        let acked_round = write.acked_round;
        let version = Self::version_of(state, writer, acked_round);
        let d = &mut state.drives[usize::from(drive)];
        let order = |v| Self::order_in(&state.writers, v);
        if d.floor.is_none_or(|f| order(f) < order(version)) {
            d.floor = Some(version);
        }
        if missing != 0 {
            queue(d, RepairEntry { version, targets: missing, finalizes: true });
        }
    }

    /// `node::repair::plan_and_repair`: the holder copies the version to one target (current
    /// if newer there, else retained), setting the target's floor when the entry came from a
    /// Finalize.
    fn plan_and_repair(&self, state: &mut State, source: u8, version: u8, target: u8) {
        let source_drive = &mut state.drives[usize::from(source)];
        let idx = source_drive.queue.iter().position(|e| e.version == version).expect("the action's entry is queued");
        let entry = source_drive.queue[idx];
        source_drive.queue[idx].targets &= !(1 << target);
        if source_drive.queue[idx].targets == 0 {
            source_drive.queue.remove(idx);
        }
        state.spread |= 1 << version;
        let writers = state.writers.clone();
        let t = &mut state.drives[usize::from(target)];
        t.held |= 1 << version;
        if entry.finalizes && t.floor.is_none_or(|f| Self::order_in(&writers, f) < Self::order_in(&writers, version)) {
            t.floor = Some(version);
        }
    }

    /// What `node::scrub` of `drive`'s current version sees: (holders among the drives up,
    /// whether some drive up knows it acknowledged, peers to queue).
    fn scrub_view(&self, state: &State, drive: u8) -> Option<(u8, u8, bool, u8)> {
        let d = &state.drives[usize::from(drive)];
        let version = Self::current(state, d)?;
        let order = |v| Self::order(state, v);
        let up: Vec<(u8, &Drive)> =
            state.drives.iter().enumerate().filter(|(_, p)| !p.down).map(|(i, p)| (i as u8, p)).collect();
        let holders = up.iter().filter(|(_, p)| p.held & (1 << version) != 0).count() as u8;
        let stale = up.iter().filter_map(|(_, p)| p.floor).any(|f| order(f) > order(version));
        let named = up.iter().any(|(_, p)| p.floor == Some(version));
        let known =
            !stale && (named || holders >= self.config.write_quorum() || self.completes_on(state, version, drive));
        let lacking = up
            .iter()
            .filter(|(_, p)| Self::current(state, p).is_none_or(|c| order(c) < order(version)))
            .filter(|(_, p)| p.held & (1 << version) == 0)
            .fold(0, |acc, (i, _)| acc | 1 << i);
        // Only the lowest holder that answers queues the peers (`holders.first() == Some(position)`).
        let lowest = up.iter().find(|(_, p)| p.held & (1 << version) != 0).map(|(i, _)| *i);
        let queues = known && lowest == Some(drive);
        Some((version, holders, known, if queues { lacking } else { 0 }))
    }

    /// `node::scrub`'s readable leftover, with the fix: every drive up, as many holders as a
    /// read takes, fewer than W, no floor naming it, nothing newer held anywhere, and its writer
    /// can no longer decide (decided, rollbacks settled: the product waits longer than a writer
    /// takes). The scrubber completes it, as an acknowledged version.
    fn completes_on(&self, state: &State, version: u8, drive: u8) -> bool {
        // Its lowest holder does it, as in the product (one node per version).
        let lowest = state.drives.iter().position(|p| p.held & (1 << version) != 0);
        lowest == Some(usize::from(drive)) && self.completes(state, version)
    }

    fn completes(&self, state: &State, version: u8) -> bool {
        let Some(write) = Self::write(state, version) else { return false };
        let order = |v| Self::order(state, v);
        let threshold = if write.op == Op::Delete { self.config.marker_quorum() } else { self.config.k };
        let holders = state.drives.iter().filter(|p| p.held & (1 << version) != 0).count() as u8;
        self.config.fixes.complete_readable
            && matches!(write.phase, Phase::Decided(_))
            && write.net.rollback == 0
            && state.drives.iter().all(|p| !p.down)
            && holders >= threshold
            && holders < self.config.write_quorum()
            && state.drives.iter().all(|p| {
                p.floor.is_none_or(|f| order(f) < order(version)) && bits(p.held).all(|v| order(v) <= order(version))
            })
    }

    fn scrub_changes(&self, state: &State, drive: u8) -> bool {
        let Some((version, holders, _, lacking)) = self.scrub_view(state, drive) else { return false };
        let d = &state.drives[usize::from(drive)];
        let finalizes = (holders >= self.config.write_quorum() || self.completes_on(state, version, drive))
            && d.floor.is_none_or(|f| Self::order(state, f) < Self::order(state, version));
        let queued = d.queue.iter().find(|e| e.version == version).map_or(0, |e| e.targets);
        finalizes || lacking & !queued != 0
    }

    /// `node::scrub`: a version on W drives is finalized here (its writer's finalize may have
    /// been lost); a version known acknowledged is queued for the peers that lack it.
    fn scrub(&self, state: &mut State, drive: u8) {
        let (version, holders, _, lacking) = self.scrub_view(state, drive).expect("scrub_changes checked");
        let newer =
            state.drives[usize::from(drive)].floor.is_none_or(|f| Self::order(state, f) < Self::order(state, version));
        if self.completes_on(state, version, drive) {
            // Completed and spread in one step: the repair of a version known acknowledged,
            // one target at a time beside everything else, is modelled on the finalize path;
            // here its interleavings would multiply the states tenfold for nothing new.
            // (`repair::plan_and_repair` finalizes each target of a `Missing` entry; nothing
            // newer is held anywhere, so each floor only rises.)
            state.spread |= 1 << version;
            for (i, d) in state.drives.iter_mut().enumerate() {
                if i == usize::from(drive) || lacking & (1 << i) != 0 {
                    d.held |= 1 << version;
                    d.floor = Some(version);
                }
            }
            return;
        }
        if holders >= self.config.write_quorum() && newer {
            state.drives[usize::from(drive)].floor = Some(version);
            state.spread |= 1 << version;
        }
        if lacking != 0 {
            queue(&mut state.drives[usize::from(drive)], RepairEntry { version, targets: lacking, finalizes: false });
        }
    }

    /// Retained versions older than the drive's floor (the retire grace has passed). Not a
    /// version whose writer is still committing: the grace (10 min) outlasts a commit round
    /// (two request timeouts), so a re-stamp finds the first round's data.
    fn retirable(&self, state: &State, drive: &Drive) -> u8 {
        let (Some(floor), Some(current)) = (drive.floor, Self::current(state, drive)) else { return 0 };
        bits(drive.held)
            .filter(|&v| v != current && Self::order(state, v) < Self::order(state, floor))
            .filter(|&v| Self::write(state, v).is_none_or(|w| w.phase != Phase::Committing))
            .fold(0, |acc, v| acc | 1 << v)
    }
}

/// Records, at the first reply of a round, the acknowledgements decided before it.
fn land(write: &mut Write, acks: u8) {
    if !write.landed {
        write.landed = true;
        write.acks_before = acks;
    }
}

/// Whether a commit's reply reaches the writer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reply {
    Delivered,
    Lost,
    /// A first-round commit after its writer re-stamped: nobody waits for its reply.
    Late,
}

/// Renumbers the drives in a canonical order (drives are interchangeable: every rule treats
/// them alike), so that states equal up to renumbering are explored once. The order sorts on
/// each drive's own rows and the writers' view of it; drives that tie may keep an order that
/// another renumbering would not, which only explores more.
pub(crate) fn canonical(state: &mut State) {
    let n = state.drives.len();
    let key = |d: usize| {
        let drive = &state.drives[d];
        let queue: Vec<(u8, bool, u8)> =
            drive.queue.iter().map(|e| (e.version, e.finalizes, count(e.targets))).collect();
        let view: Vec<u16> = state
            .writers
            .iter()
            .flatten()
            .map(|w| {
                [
                    w.sent,
                    w.applied,
                    w.failed,
                    w.superseded,
                    w.acked_on,
                    w.net.commit,
                    w.net.late,
                    w.net.rollback,
                    w.net.finalize,
                ]
                .iter()
                .enumerate()
                .fold(0u16, |acc, (i, mask)| acc | u16::from((mask >> d) & 1) << i)
            })
            .collect();
        (drive.down, drive.held, drive.floor, drive.fenced, queue, view)
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&d| key(d));
    if order.iter().enumerate().all(|(i, &d)| i == d) {
        return;
    }
    let remap = |mask: u8| (0..n).filter(|&i| mask & (1 << order[i]) != 0).fold(0u8, |acc, i| acc | 1 << i);
    let mut drives: Vec<Drive> = order.iter().map(|&d| state.drives[d].clone()).collect();
    for drive in &mut drives {
        for entry in &mut drive.queue {
            entry.targets = remap(entry.targets);
        }
    }
    state.drives = drives;
    for w in state.writers.iter_mut().flatten() {
        for mask in [
            &mut w.sent,
            &mut w.applied,
            &mut w.failed,
            &mut w.superseded,
            &mut w.acked_on,
            &mut w.net.commit,
            &mut w.net.late,
            &mut w.net.rollback,
            &mut w.net.finalize,
        ] {
            *mask = remap(*mask);
        }
    }
}

fn write_mut(state: &mut State, writer: u8) -> &mut Write {
    state.writers[usize::from(writer - 1)].as_mut().expect("the writer has started")
}

/// Adds an entry, merging it with the version's entry already queued.
fn queue(drive: &mut Drive, entry: RepairEntry) {
    match drive.queue.iter_mut().find(|e| e.version == entry.version) {
        Some(e) => {
            e.targets |= entry.targets;
            e.finalizes |= entry.finalizes;
        }
        None => {
            drive.queue.push(entry);
            drive.queue.sort_unstable();
        }
    }
}
