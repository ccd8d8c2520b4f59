//! The cluster state machine of one member (docs/protocol.md §5): roles, heartbeats,
//! priority election, hand-off, catch-up before preemption, demotion and
//! epoch ballots.
//!
//! Every input carries `now_ms` from the caller's monotonic clock; every
//! output is an [`Effect`] queued for [`Node::poll_effect`]. The caller should
//! call [`Node::tick`] at [`Node::next_deadline_ms`] at the latest, and drain
//! the effects after every input.
//!
//! The roles, as the node moves between them:
//! - **standby**, following an active or none (start-up, failover);
//! - **promoting**: it won an election, or a hand-off was offered to it and it
//!   has applied the offered state; it waits for its new epoch to be persisted;
//! - **active**, possibly handing off (holding clients until the successor
//!   answers) or moving to a higher epoch (after learning of an epoch above
//!   its own, a rival active's for instance; clients are held meanwhile);
//! - **exiting**, after a stop, until the highest epoch it knows is persisted;
//!   then **exited**. It ignores every input but epochs from then on.

use std::collections::VecDeque;

use ringlock_shards::token::EPOCH_MAX;

use crate::cluster::next_epoch;

use super::config::ClusterConfig;
use super::effect::{Effect, ExitReason};
use super::election::{self, Candidate};
use super::message::{Heartbeat, PeerMessage, PeerRole, TableVersion};
use super::peer::PeerView;

/// Effects one input may queue: a few heartbeat rounds to at most 15 peers
/// and a handful of others. The caller drains them after every input.
const EFFECTS_QUEUED_MAX: usize = 128;

/// What `P` and `S` show of the node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Serves locks (also while it hands off or moves to a new epoch).
    pub active: bool,
    /// Active: its epoch. Standby: the epoch of the active it follows, or 0.
    pub epoch: u64,
    /// The active clients should use: this node, the one it follows, or none.
    pub active_node: Option<usize>,
}

/// Why a node that should serve cannot. It stays so until it can (an
/// operator must act: docs/operations.md says how).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// No epoch of this node's ballots is left above `highest`, the highest
    /// epoch it knows of (2^24 epochs in all): it cannot promote, or, as the
    /// active, move on when its sequences run out or a higher epoch appears.
    EpochSpaceExhausted { highest: u64 },
    /// `--min-standbys`: the active has had fewer than `needed` caught-up
    /// standbys for `--failover-ms`. It grants nothing (new acquires and
    /// extends are refused `no-standby`) until enough are back.
    NoStandby { needed: usize },
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::EpochSpaceExhausted { highest } => write!(
                f,
                "the epoch space is exhausted: no epoch of this node is left above {highest} (the largest is \
                 {EPOCH_MAX}), so it cannot become active or move to a new epoch; see \"When the epoch space runs \
                 out\" in the README"
            ),
            Blocked::NoStandby { needed } => write!(
                f,
                "--min-standbys {needed}: fewer than {needed} caught-up standbys have been heard for --failover-ms, \
                 so this active grants nothing (acquires and extends are answered no-standby) until enough are \
                 back; see \"--min-standbys\" in docs/operations.md"
            ),
        }
    }
}

/// A hand-off offered to this node by the active `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IncomingHandOff {
    from: usize,
    table: TableVersion,
    /// Past this, the node refuses rather than promote after the old active
    /// has given up (which would leave two actives).
    deadline_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutgoingState {
    /// Waiting for the runtime to stop the shards ([`Node::clients_held`]).
    Holding,
    /// The offer of `version` is out; repeated at `resend_ms` in case it was lost.
    Offered { version: u64, resend_ms: u64 },
}

/// A hand-off of the active role to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OutgoingHandOff {
    to: usize,
    deadline_ms: u64,
    state: OutgoingState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ActiveState {
    /// The epoch of every token issued now.
    epoch: u64,
    /// The epoch it became active in: the name of its delta stream.
    stream: u64,
    /// Deltas of the stream so far, as the runtime last reported.
    version: u64,
    /// A higher epoch being persisted, to move to once it is.
    bump: Option<u64>,
    /// The epoch moved up during a hand-off: a failed hand-off resumes with
    /// an `Activate` of it.
    activate_on_resume: bool,
    handoff: Option<OutgoingHandOff>,
    /// No preemptive hand-off before this (one just failed).
    handoff_retry_ms: u64,
    /// The old active and offer this node took over from, to answer its
    /// repeated offers again.
    promoted_by: Option<(usize, TableVersion)>,
    /// When it became active: with `--min-standbys`, its standbys have
    /// `failover_ms` from then to catch up before it stops granting.
    since_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RoleState {
    Standby {
        following: Option<usize>,
        incoming: Option<IncomingHandOff>,
    },
    /// Waiting for `epoch` to be persisted, then active (`handoff`: taking over from an active).
    Promoting {
        epoch: u64,
        handoff: Option<IncomingHandOff>,
    },
    Active(ActiveState),
    /// Stopped; waits for the highest epoch it knows to be persisted, then exits.
    Exiting(ExitReason),
    Exited,
}

/// One cluster member's view of the cluster and its role in it.
#[derive(Debug)]
pub struct Node {
    config: ClusterConfig,
    incarnation: u64,
    heartbeat_sequence: u64,
    now_ms: u64,
    started_ms: u64,
    /// Start-up: no promotion until one failover period has passed or every
    /// peer has been heard from.
    deciding: bool,
    stopping: bool,
    role: RoleState,
    /// The highest epoch the runtime has confirmed persisted.
    epoch_persisted: u64,
    /// The highest epoch asked to be persisted.
    epoch_requested: u64,
    /// The highest epoch learned from peers and replicated tokens.
    epoch_seen: u64,
    peers: Vec<PeerView>,
    /// The active this node followed when it exited, which `P` keeps naming
    /// until the process ends (after a hand-off: the successor).
    followed_at_exit: Option<usize>,
    /// Why it cannot serve, if it should and cannot.
    blocked: Option<Blocked>,
    /// The complete table this node holds as a standby (`None`: empty).
    table: Option<TableVersion>,
    /// The peer whose delta stream is being applied without a gap.
    stream_from: Option<usize>,
    snapshot_requested_ms: Option<u64>,
    next_heartbeat_ms: u64,
    /// A standby with `--min-standbys` applied deltas since its last
    /// heartbeat: the active waits for its word before it answers grants.
    ack_due: bool,
    /// The table a successor confirmed it holds when it took this node's
    /// role over (see [`Node::take_handed_off`]).
    handed_off: Option<TableVersion>,
    /// When a peer last refused this node's hello (its `--peers` differs):
    /// the node does not serve for a while after that.
    refused_ms: Option<u64>,
    effects: VecDeque<Effect>,
}

impl Node {
    /// A node starting at `now_ms` as a standby that knows no active, with the
    /// highest epoch of its data directory. `incarnation` must grow across
    /// restarts of this node (wall-clock microseconds at start will do).
    pub fn new(config: ClusterConfig, epoch_persisted: u64, incarnation: u64, now_ms: u64) -> Node {
        if let Err(error) = config.validate() {
            panic!("cluster settings are checked at start-up: {error}");
        }
        let mut node = Node {
            config,
            incarnation,
            heartbeat_sequence: 0,
            now_ms,
            started_ms: now_ms,
            deciding: true,
            stopping: false,
            role: RoleState::Standby { following: None, incoming: None },
            epoch_persisted,
            epoch_requested: epoch_persisted,
            epoch_seen: 0,
            peers: vec![PeerView::default(); config.nodes],
            followed_at_exit: None,
            blocked: None,
            table: None,
            stream_from: None,
            snapshot_requested_ms: None,
            next_heartbeat_ms: now_ms,
            ack_due: false,
            handed_off: None,
            refused_ms: None,
            effects: VecDeque::with_capacity(EFFECTS_QUEUED_MAX),
        };
        node.evaluate();
        node
    }

    /// The settings the node was made with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The next queued effect, in the order they were decided.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// When the node next needs a [`tick`](Node::tick) at the latest.
    pub fn next_deadline_ms(&self) -> u64 {
        if self.is_gone() {
            return u64::MAX;
        }
        let failover_ms = self.config.failover_ms;
        let mut deadline_ms = self.next_heartbeat_ms;
        if self.deciding {
            deadline_ms = deadline_ms.min(self.started_ms + failover_ms);
        }
        if self.is_refused() {
            deadline_ms = deadline_ms.min(self.refused_until_ms());
        }
        for peer in &self.peers {
            if peer.is_live(self.now_ms, failover_ms)
                && let Some(heard_ms) = peer.heard_ms
            {
                deadline_ms = deadline_ms.min(heard_ms + failover_ms);
            }
        }
        match &self.role {
            RoleState::Standby { incoming: Some(handoff), .. } => deadline_ms = deadline_ms.min(handoff.deadline_ms),
            RoleState::Active(ActiveState { handoff: Some(handoff), .. }) => {
                deadline_ms = deadline_ms.min(handoff.deadline_ms);
                if let OutgoingState::Offered { resend_ms, .. } = handoff.state {
                    deadline_ms = deadline_ms.min(resend_ms);
                }
            }
            _ => {}
        }
        if let RoleState::Active(active) = &self.role
            && self.config.min_standbys > 0
            && self.now_ms < active.since_ms + failover_ms
        {
            deadline_ms = deadline_ms.min(active.since_ms + failover_ms);
        }
        deadline_ms.max(self.now_ms)
    }

    /// What `P` and `S` should show.
    pub fn status(&self) -> Status {
        match &self.role {
            RoleState::Active(active) => {
                Status { active: true, epoch: active.epoch, active_node: Some(self.config.me) }
            }
            _ => match self.following().or(self.followed_at_exit) {
                Some(active) => Status { active: false, epoch: self.peer_epoch(active), active_node: Some(active) },
                None => Status { active: false, epoch: 0, active_node: None },
            },
        }
    }

    /// Why this node cannot serve, when it should: it won the election but
    /// cannot promote, or is active and cannot move to the new epoch it must.
    pub fn blocked(&self) -> Option<Blocked> {
        self.blocked
    }

    /// Whether the node holds a complete table: the active always does, a
    /// standby once it has applied a snapshot of its active's stream. What
    /// `/readyz` reports for a standby.
    pub fn caught_up(&self) -> bool {
        matches!(self.role, RoleState::Active(_)) || self.table.is_some()
    }

    /// How many deltas of the active's stream a standby has yet to apply,
    /// from the last heartbeats: on a standby, its own lag behind the active
    /// it follows; on the active, the largest lag among the live standbys
    /// that follow it. `None` when there is nothing to compare (no active
    /// followed, no standby, or a standby without the active's stream).
    pub fn replication_lag(&self) -> Option<u64> {
        match self.role {
            RoleState::Active(active) => {
                let me = self.config.me;
                self.live_peers()
                    .filter(|(_, heartbeat)| heartbeat.role == PeerRole::Standby && heartbeat.following == Some(me))
                    .filter_map(|(_, heartbeat)| heartbeat.table.filter(|table| table.stream == active.stream))
                    .map(|table| active.version.saturating_sub(table.version))
                    .max()
            }
            _ => {
                let active = self.following()?;
                let theirs = self.peers[active].live(self.now_ms, self.config.failover_ms)?.table?;
                let mine = self.table.filter(|table| table.stream == theirs.stream)?;
                Some(theirs.version.saturating_sub(mine.version))
            }
        }
    }

    /// Time passed; heartbeats, timeouts and elections happen here.
    pub fn tick(&mut self, now_ms: u64) {
        self.advance(now_ms);
        self.evaluate();
    }

    /// A message from peer `from` (an index the transport checked at its handshake).
    pub fn receive(&mut self, now_ms: u64, from: usize, message: PeerMessage) {
        if from >= self.config.nodes || from == self.config.me {
            return;
        }
        self.advance(now_ms);
        // An epoch no token can carry is a broken peer's, not one to learn:
        // taking it would leave no epoch to move above it. (The transport's
        // decoder refuses such frames already.)
        if !message.epochs().into_iter().flatten().all(|epoch| epoch <= EPOCH_MAX) {
            return;
        }
        self.learn_epoch(message.epoch_max());
        if self.is_gone() {
            return;
        }
        match message {
            PeerMessage::Heartbeat(heartbeat) => {
                self.peers[from].accept(now_ms, heartbeat);
            }
            PeerMessage::SnapshotRequest => {
                if matches!(self.role, RoleState::Active(_)) {
                    self.push(Effect::SendSnapshot { to: from });
                }
            }
            PeerMessage::HandOff { table, .. } => self.receive_handoff(from, table),
            PeerMessage::HandOffDone { table, epoch } => {
                if self.offered_to(from, table) {
                    // The answer says as much as a heartbeat of the new active would.
                    let peer = &mut self.peers[from];
                    if let Some(last) = &mut peer.last {
                        last.role = PeerRole::Active;
                        last.epoch = epoch;
                        last.following = None;
                        last.caught_up = true;
                        last.table = Some(TableVersion { stream: epoch, version: 0 });
                        last.handing_off_to = None;
                        peer.heard_ms = Some(now_ms);
                    }
                    self.handed_off = Some(table);
                    self.become_standby(Some(from), ExitReason::HandedOff);
                }
            }
            PeerMessage::HandOffRefused { table } => {
                if self.offered_to(from, table) {
                    self.fail_handoff();
                }
            }
        }
        self.evaluate();
    }

    /// Peer `from` refused this node's hello: the two were started with
    /// different `--peers`. Until no refusal has come for two failover
    /// periods, this node does not serve: an active steps down, a standby
    /// does not promote. Two nodes that disagree on who is who could
    /// otherwise both be active and grant the same key.
    pub fn refused_by(&mut self, now_ms: u64, from: usize) {
        self.advance(now_ms);
        if from >= self.config.nodes || from == self.config.me {
            return;
        }
        self.refused_ms = Some(now_ms);
        self.evaluate();
    }

    /// Heartbeats of peer `from` now come on a new connection: it restarted
    /// or reconnected. Its next heartbeat is taken whatever its incarnation,
    /// so that a node whose clock stepped back across a restart (a smaller
    /// incarnation) is not ignored. The transport makes sure no heartbeat of
    /// an older connection follows.
    pub fn peer_reconnected(&mut self, now_ms: u64, from: usize) {
        self.advance(now_ms);
        if let Some(peer) = self.peers.get_mut(from)
            && from != self.config.me
        {
            peer.reconnected = true;
        }
    }

    /// Ctrl+C or SIGTERM: hand the active role over if this node has it, then exit.
    pub fn stop_requested(&mut self, now_ms: u64) {
        self.advance(now_ms);
        if self.stopping || self.is_gone() {
            return;
        }
        self.stopping = true;
        match self.role {
            RoleState::Standby { .. } | RoleState::Promoting { .. } => self.exit(ExitReason::Standby),
            // A hand-off already under way decides how the node exits.
            RoleState::Active(ActiveState { handoff: Some(_), .. }) => {}
            RoleState::Active(_) => match self.successor() {
                Some(successor) => self.start_handoff(successor),
                None => self.exit(ExitReason::NoSuccessor),
            },
            RoleState::Exiting(_) | RoleState::Exited => {}
        }
        self.evaluate();
    }

    /// The runtime persisted (with fsync) every epoch up to `epoch`.
    pub fn epoch_persisted(&mut self, now_ms: u64, epoch: u64) {
        self.advance(now_ms);
        self.epoch_persisted = self.epoch_persisted.max(epoch);
        match self.role {
            RoleState::Exiting(reason) if self.epoch_persisted >= self.epoch_requested => {
                self.role = RoleState::Exited;
                self.push(Effect::Exit { reason });
            }
            RoleState::Promoting { epoch: target, handoff } if epoch >= target => {
                if self.epoch_seen > target {
                    // A higher epoch became known while this one was written:
                    // the new active epoch must be above it too.
                    self.start_promotion(handoff);
                } else {
                    self.activate(target, handoff);
                }
            }
            RoleState::Active(ActiveState { bump: Some(target), stream, handoff, .. }) if epoch >= target => {
                if self.epoch_seen > target {
                    self.start_bump();
                } else if let RoleState::Active(active) = &mut self.role {
                    active.epoch = target;
                    active.bump = None;
                    if handoff.is_some() {
                        // Activate would end the hold; it waits for the hand-off to fail.
                        active.activate_on_resume = true;
                    } else {
                        self.push(Effect::Activate { epoch: target, stream });
                    }
                    self.send_heartbeats();
                }
            }
            _ => {}
        }
        self.evaluate();
    }

    /// The active's shards are running out of sequences in this epoch (docs/protocol.md
    /// §2.6): move to a new epoch (an `Activate` follows once it is persisted).
    pub fn epoch_exhausted(&mut self, now_ms: u64) {
        self.advance(now_ms);
        if let RoleState::Active(ActiveState { bump: None, .. }) = self.role {
            self.start_bump();
        }
        self.evaluate();
    }

    /// The active's table is at `version` of its stream (reported after each
    /// batch of deltas; heartbeats carry it).
    pub fn table_changed(&mut self, now_ms: u64, version: u64) {
        self.advance(now_ms);
        if let RoleState::Active(active) = &mut self.role {
            active.version = active.version.max(version);
        }
        self.evaluate();
    }

    /// After [`Effect::Hold`]: every shard has stopped and the stream holds
    /// all their deltas, up to `version`.
    pub fn clients_held(&mut self, now_ms: u64, version: u64) {
        self.advance(now_ms);
        let epoch_seen = self.epoch_known();
        if let RoleState::Active(active) = &mut self.role
            && let Some(handoff) = &mut active.handoff
            && handoff.state == OutgoingState::Holding
        {
            assert!(version >= active.version, "the table version never goes back");
            active.version = version;
            handoff.state = OutgoingState::Offered { version, resend_ms: now_ms + self.config.heartbeat_ms };
            let to = handoff.to;
            let table = TableVersion { stream: active.stream, version };
            self.push(Effect::Send { to, message: PeerMessage::HandOff { table, epoch_seen } });
        }
        self.evaluate();
    }

    /// A full snapshot from `from` is applied: the table is complete, at
    /// `table`, and the deltas that follow come from `from`. `token_epoch_max`
    /// is the highest epoch of any token in it.
    pub fn snapshot_applied(&mut self, now_ms: u64, from: usize, table: TableVersion, token_epoch_max: u64) {
        self.advance(now_ms);
        self.learn_epoch(token_epoch_max);
        if matches!(self.role, RoleState::Standby { .. } | RoleState::Promoting { handoff: None, .. })
            && from < self.peers.len()
        {
            self.table = Some(table);
            self.stream_from = Some(from);
            self.snapshot_requested_ms = None;
            self.ack_due = self.config.min_standbys > 0;
        }
        self.evaluate();
    }

    /// Deltas from `from` are applied in order, without a gap, up to `table`;
    /// `token_epoch_max` is the highest epoch of any token applied.
    pub fn replica_applied(&mut self, now_ms: u64, from: usize, table: TableVersion, token_epoch_max: u64) {
        self.advance(now_ms);
        self.learn_epoch(token_epoch_max);
        if self.stream_from == Some(from)
            && let Some(held) = &mut self.table
            && held.stream == table.stream
        {
            held.version = held.version.max(table.version);
            self.ack_due = self.config.min_standbys > 0;
        }
        self.evaluate();
    }

    /// With `--min-standbys`, once per turn of the runtime: a standby that
    /// applied deltas since its last heartbeat sends one to its active now,
    /// which answers the grants they carry once enough standbys have.
    pub fn acknowledge(&mut self, now_ms: u64) {
        if !std::mem::take(&mut self.ack_due) {
            return;
        }
        self.advance(now_ms);
        if let RoleState::Standby { following: Some(active), .. } = self.role {
            let heartbeat = self.heartbeat();
            self.push(Effect::Send { to: active, message: PeerMessage::Heartbeat(heartbeat) });
        }
    }

    /// After a hand-off that succeeded: the table the successor confirmed it
    /// holds (every delta of this node's stream up to its version), taken
    /// once. With `--min-standbys` the replies held for those deltas may go:
    /// the new active knows them.
    pub fn take_handed_off(&mut self) -> Option<TableVersion> {
        self.handed_off.take()
    }

    /// The active's table version that `--min-standbys` live, caught-up
    /// standbys following it have all applied, from their last heartbeats:
    /// the replies of grants up to it may be sent. `None` if it is not
    /// active, the option is off, or too few standbys are caught up.
    pub fn acknowledged_version(&self) -> Option<u64> {
        let RoleState::Active(active) = self.role else { return None };
        let needed = self.config.min_standbys;
        if needed == 0 {
            return None;
        }
        let mut versions = [0u64; ringlock_proto::NODES_MAX];
        let mut count = 0;
        for version in self.standby_versions(active) {
            versions[count] = version;
            count += 1;
        }
        if count < needed {
            return None;
        }
        let versions = &mut versions[..count];
        versions.sort_unstable_by(|a, b| b.cmp(a));
        Some(versions[needed - 1])
    }

    /// The versions of the active's stream its live, caught-up standbys have applied.
    fn standby_versions(&self, active: ActiveState) -> impl Iterator<Item = u64> + '_ {
        let me = self.config.me;
        self.live_peers()
            .filter(move |(_, heartbeat)| {
                heartbeat.role == PeerRole::Standby && heartbeat.following == Some(me) && heartbeat.caught_up
            })
            .filter_map(move |(_, heartbeat)| heartbeat.table.filter(|table| table.stream == active.stream))
            .map(|table| table.version)
    }

    /// A frame of the table stream from `from` arrived (deltas, or part of a
    /// snapshot): the peer was alive to send it, as much as a heartbeat would
    /// say. Heartbeats travel behind the stream on the same connection, so a
    /// long snapshot, or a standby that reads slower than the active writes,
    /// would otherwise see a sending active as silent and take over from it.
    /// A peer not heard from before (no heartbeat yet) stays unknown.
    pub fn stream_heard(&mut self, now_ms: u64, from: usize) {
        self.advance(now_ms);
        if from == self.config.me {
            return;
        }
        if let Some(peer) = self.peers.get_mut(from)
            && peer.last.is_some()
        {
            peer.heard_ms = Some(now_ms);
        }
    }

    /// Part of a snapshot from `from` arrived (entries, or deltas made while
    /// it is sent): the snapshot asked for is on its way, so it is not
    /// asked for again until it stalls for the retry period. A large table
    /// takes longer than that to arrive.
    pub fn snapshot_progress(&mut self, now_ms: u64, from: usize) {
        self.advance(now_ms);
        if self.following() == Some(from) && self.snapshot_requested_ms.is_some() {
            self.snapshot_requested_ms = Some(now_ms);
        }
    }

    /// The stream from `from` broke (a gap, a closed connection). The table
    /// stays complete as of its last version, and a new snapshot is asked for.
    pub fn replica_broken(&mut self, now_ms: u64, from: usize) {
        self.advance(now_ms);
        if self.stream_from == Some(from) {
            self.stream_from = None;
            self.snapshot_requested_ms = None;
        }
        self.evaluate();
    }

    fn advance(&mut self, now_ms: u64) {
        assert!(now_ms >= self.now_ms, "the clock went back from {} to {now_ms}", self.now_ms);
        if now_ms - self.now_ms > self.config.stall_ms() {
            // This node was not running (SIGSTOP, a starved host): the silence
            // of its peers says nothing about them. Peers that were live keep
            // two heartbeat periods, enough to read what they sent meanwhile,
            // before anyone is declared dead.
            let failover_ms = self.config.failover_ms;
            let heard_ms = (now_ms + 2 * self.config.heartbeat_ms).saturating_sub(failover_ms);
            for peer in &mut self.peers {
                if peer.is_live(self.now_ms, failover_ms) {
                    peer.heard_ms = peer.heard_ms.max(Some(heard_ms));
                }
            }
        }
        self.now_ms = now_ms;
    }

    /// Applies every rule to the current view; called after every input.
    fn evaluate(&mut self) {
        if self.is_gone() {
            return;
        }
        if self.deciding && (self.now_ms >= self.started_ms + self.config.failover_ms || self.heard_from_every_peer()) {
            self.deciding = false;
        }
        match self.role {
            RoleState::Standby { .. } => self.evaluate_standby(),
            RoleState::Promoting { .. } => self.evaluate_promoting(),
            RoleState::Active(_) => {
                self.evaluate_active();
                // A node that just stepped down asks its new active for a snapshot now.
                if matches!(self.role, RoleState::Standby { .. }) {
                    self.evaluate_standby();
                }
            }
            RoleState::Exiting(_) | RoleState::Exited => return,
        }
        if self.is_gone() {
            return;
        }
        // The epoch a node persists is the highest it has issued or seen, so
        // that a node restarting alone still goes above every epoch it knew.
        if self.epoch_seen > self.epoch_requested {
            self.request_persist(self.epoch_seen);
        }
        if self.now_ms >= self.next_heartbeat_ms {
            self.send_heartbeats();
        }
    }

    fn evaluate_standby(&mut self) {
        let active = self.live_active();
        if self.following() != active {
            self.follow(active);
        }
        if let Some(active) = active {
            self.keep_synced(active);
            self.check_incoming_handoff();
            return;
        }
        if self.deciding || self.stopping || self.is_refused() || self.live_peer_follows_another() {
            return;
        }
        if self.election_winner() == Some(self.config.me) {
            self.start_promotion(None);
        }
    }

    fn evaluate_promoting(&mut self) {
        let RoleState::Promoting { handoff, .. } = self.role else { unreachable!() };
        if self.is_refused() {
            if let Some(handoff) = handoff {
                self.refuse(handoff);
            }
            self.role = RoleState::Standby { following: None, incoming: None };
            self.evaluate_standby();
            return;
        }
        if handoff.is_some() {
            // Taking over from an active that is holding its clients for us.
            return;
        }
        // An election promotion is dropped as soon as it is no longer right,
        // in particular when a peer with the state appears.
        if self.live_active().is_some()
            || self.live_peer_follows_another()
            || self.election_winner() != Some(self.config.me)
        {
            self.role = RoleState::Standby { following: None, incoming: None };
            self.evaluate_standby();
        }
    }

    fn evaluate_active(&mut self) {
        let me = self.config.me;
        let failover_ms = self.config.failover_ms;
        let RoleState::Active(active) = self.role else { unreachable!() };
        if self.is_refused() {
            self.become_standby(None, ExitReason::Standby);
            return;
        }
        // A successor active in a higher epoch has taken over, even if its answer was lost.
        if let Some(handoff) = active.handoff
            && let Some(heartbeat) = self.peers[handoff.to].live(self.now_ms, failover_ms)
            && heartbeat.role == PeerRole::Active
            && heartbeat.epoch > active.epoch
        {
            self.become_standby(Some(handoff.to), ExitReason::HandedOff);
            return;
        }
        // Two actives: the lower-priority one steps down and re-syncs; the
        // other moves to an epoch above the rival's (below). The old active
        // this node took over from is no rival, even if its last heartbeat
        // predates its hold (lost or reordered).
        let predecessor = active.promoted_by.map(|(from, _)| from);
        let is_rival = |index: usize, heartbeat: &Heartbeat| {
            heartbeat.role == PeerRole::Active
                && heartbeat.handing_off_to != Some(me)
                && !(Some(index) == predecessor && heartbeat.epoch < active.epoch)
        };
        // With --min-standbys, an active blocked for want of standbys
        // yields to one that is not, whatever their priorities: the other
        // has had standbys apply its grants, this one has granted nothing
        // since it was cut off, and its table may lack the other's grants.
        let semi_sync = self.config.min_standbys > 0;
        let blocked = matches!(self.blocked, Some(Blocked::NoStandby { .. }));
        let yields_to = |index: usize, heartbeat: &Heartbeat| {
            let rival_blocked = heartbeat_blocked(heartbeat);
            if semi_sync && blocked != rival_blocked { blocked } else { index < me }
        };
        let stronger_rival =
            self.live_peers().find(|(index, heartbeat)| is_rival(*index, heartbeat) && yields_to(*index, heartbeat));
        if let Some((stronger, _)) = stronger_rival {
            self.become_standby(Some(stronger), ExitReason::Standby);
            return;
        }
        // Any epoch above its own (a rival's, or one a peer has seen) means
        // tokens above this node's may exist: it holds its clients and moves
        // above it before it grants again.
        if self.epoch_seen > active.epoch.max(active.bump.unwrap_or(0)) {
            if next_epoch(self.epoch_known(), me as u64).is_ok() {
                if active.handoff.is_none() && active.bump.is_none() {
                    self.push(Effect::Hold);
                }
                self.start_bump();
            } else if !matches!(self.blocked, Some(Blocked::EpochSpaceExhausted { .. })) {
                // No epoch is left above the one seen: granting on would
                // issue tokens below tokens that may exist. It holds its
                // clients for good and says why.
                if active.handoff.is_none() && active.bump.is_none() {
                    self.push(Effect::Hold);
                }
                self.blocked = Some(Blocked::EpochSpaceExhausted { highest: self.epoch_known() });
            }
        }
        let RoleState::Active(active) = self.role else { unreachable!() };
        self.check_standbys(active);
        match active.handoff {
            Some(handoff) => self.progress_handoff(active, handoff),
            None => self.maybe_hand_off_upwards(active),
        }
    }

    /// `--min-standbys`: an active that has had fewer caught-up standbys
    /// than it needs for `failover_ms` (counted from its activation, so that
    /// they have time to catch up) grants nothing until enough are back.
    fn check_standbys(&mut self, active: ActiveState) {
        let needed = self.config.min_standbys;
        if needed == 0 || matches!(self.blocked, Some(Blocked::EpochSpaceExhausted { .. })) {
            return;
        }
        let enough = self.standby_versions(active).count() >= needed;
        let grace_over = self.now_ms >= active.since_ms + self.config.failover_ms;
        self.blocked = (!enough && grace_over).then_some(Blocked::NoStandby { needed });
    }

    /// An active's hand-off under way: it fails at its deadline, and its
    /// offer is sent again every heartbeat period until answered.
    fn progress_handoff(&mut self, active: ActiveState, handoff: OutgoingHandOff) {
        if self.now_ms >= handoff.deadline_ms {
            self.fail_handoff();
            return;
        }
        if let OutgoingState::Offered { version, resend_ms } = handoff.state
            && self.now_ms >= resend_ms
        {
            let table = TableVersion { stream: active.stream, version };
            let epoch_seen = self.epoch_known();
            self.push(Effect::Send { to: handoff.to, message: PeerMessage::HandOff { table, epoch_seen } });
            if let RoleState::Active(ActiveState { handoff: Some(handoff), .. }) = &mut self.role {
                handoff.state = OutgoingState::Offered { version, resend_ms: self.now_ms + self.config.heartbeat_ms };
            }
        }
    }

    /// A higher-priority node that came back takes over by a hand-off, once
    /// it follows this node and holds a snapshot of its stream.
    fn maybe_hand_off_upwards(&mut self, active: ActiveState) {
        let me = self.config.me;
        let top = self.live_peers().next();
        if !self.stopping
            && active.bump.is_none()
            && self.now_ms >= active.handoff_retry_ms
            && let Some((top, heartbeat)) = top
            && top < me
            && heartbeat.role == PeerRole::Standby
            && heartbeat.following == Some(me)
            && heartbeat.table.is_some_and(|table| table.stream == active.stream)
        {
            self.start_handoff(top);
        }
    }

    /// Asks the active for a snapshot until this node holds its stream.
    fn keep_synced(&mut self, active: usize) {
        let stream = self.peers[active].last.and_then(|heartbeat| heartbeat.table).map(|table| table.stream);
        let synced = self.stream_from == Some(active) && self.table.is_some_and(|table| Some(table.stream) == stream);
        if synced {
            self.snapshot_requested_ms = None;
            return;
        }
        let retry_ms = self.config.snapshot_retry_ms();
        if self.snapshot_requested_ms.is_none_or(|requested_ms| self.now_ms >= requested_ms + retry_ms) {
            self.snapshot_requested_ms = Some(self.now_ms);
            self.push(Effect::Send { to: active, message: PeerMessage::SnapshotRequest });
        }
    }

    fn check_incoming_handoff(&mut self) {
        let RoleState::Standby { following, incoming: Some(handoff) } = self.role else { return };
        if following != Some(handoff.from) || self.stopping || self.is_refused() || self.now_ms >= handoff.deadline_ms {
            self.refuse(handoff);
            self.role = RoleState::Standby { following, incoming: None };
            if following == Some(handoff.from) && self.now_ms >= handoff.deadline_ms {
                // The offered state never arrived although the active held
                // still: its stream to this node is stuck. A fresh snapshot
                // lets the next offer succeed.
                self.stream_from = None;
                self.snapshot_requested_ms = None;
            }
            return;
        }
        let applied = self.stream_from == Some(handoff.from)
            && self
                .table
                .is_some_and(|table| table.stream == handoff.table.stream && table.version >= handoff.table.version);
        if applied {
            self.start_promotion(Some(handoff));
        }
    }

    fn receive_handoff(&mut self, from: usize, table: TableVersion) {
        let deadline_ms = self.now_ms + self.config.handoff_timeout_ms() / 2;
        match &mut self.role {
            RoleState::Standby { incoming, .. } if !self.stopping => {
                if incoming.is_some_and(|handoff| handoff.from == from && handoff.table == table) {
                    return;
                }
                let replaced = incoming.replace(IncomingHandOff { from, table, deadline_ms });
                if let Some(replaced) = replaced {
                    self.refuse(replaced);
                }
            }
            RoleState::Promoting { handoff: Some(handoff), .. } if handoff.from == from && handoff.table == table => {}
            RoleState::Active(active) if active.promoted_by == Some((from, table)) => {
                let epoch = active.epoch;
                self.push(Effect::Send { to: from, message: PeerMessage::HandOffDone { table, epoch } });
            }
            _ => self.push(Effect::Send { to: from, message: PeerMessage::HandOffRefused { table } }),
        }
    }

    fn refuse(&mut self, handoff: IncomingHandOff) {
        self.push(Effect::Send { to: handoff.from, message: PeerMessage::HandOffRefused { table: handoff.table } });
    }

    /// True if this node is active and has offered `table` to `to`.
    fn offered_to(&self, to: usize, table: TableVersion) -> bool {
        match self.role {
            RoleState::Active(ActiveState {
                stream,
                handoff: Some(OutgoingHandOff { to: target, state: OutgoingState::Offered { version, .. }, .. }),
                ..
            }) => target == to && table == TableVersion { stream, version },
            _ => false,
        }
    }

    /// Chooses a new epoch above every epoch known and has it persisted.
    fn start_promotion(&mut self, handoff: Option<IncomingHandOff>) {
        match next_epoch(self.epoch_known(), self.config.me as u64) {
            Ok(epoch) => {
                self.request_persist(epoch);
                self.role = RoleState::Promoting { epoch, handoff };
            }
            Err(_) => {
                // The epoch space is used up (2^24 epochs): this node can
                // never issue a fresh token again, so it stays a standby.
                self.blocked = Some(Blocked::EpochSpaceExhausted { highest: self.epoch_known() });
                if let Some(handoff) = handoff {
                    self.refuse(handoff);
                }
                self.role = RoleState::Standby { following: self.following(), incoming: None };
            }
        }
    }

    fn activate(&mut self, epoch: u64, handoff: Option<IncomingHandOff>) {
        self.blocked = None;
        self.role = RoleState::Active(ActiveState {
            epoch,
            stream: epoch,
            version: 0,
            bump: None,
            activate_on_resume: false,
            handoff: None,
            handoff_retry_ms: 0,
            promoted_by: handoff.map(|handoff| (handoff.from, handoff.table)),
            since_ms: self.now_ms,
        });
        self.stream_from = None;
        self.snapshot_requested_ms = None;
        self.push(Effect::Activate { epoch, stream: epoch });
        if let Some(handoff) = handoff {
            let message = PeerMessage::HandOffDone { table: handoff.table, epoch };
            self.push(Effect::Send { to: handoff.from, message });
        }
        self.send_heartbeats();
    }

    /// Moves the active to an epoch above every epoch known (unless the
    /// epoch space is used up: it then keeps its epoch).
    fn start_bump(&mut self) {
        let Ok(target) = next_epoch(self.epoch_known(), self.config.me as u64) else {
            self.blocked = Some(Blocked::EpochSpaceExhausted { highest: self.epoch_known() });
            return;
        };
        self.request_persist(target);
        if let RoleState::Active(active) = &mut self.role {
            active.bump = Some(target);
        }
    }

    fn start_handoff(&mut self, to: usize) {
        let deadline_ms = self.now_ms + self.config.handoff_timeout_ms();
        if let RoleState::Active(active) = &mut self.role {
            active.handoff = Some(OutgoingHandOff { to, deadline_ms, state: OutgoingState::Holding });
            self.push(Effect::Hold);
            self.send_heartbeats();
        }
    }

    fn fail_handoff(&mut self) {
        if self.stopping {
            self.exit(ExitReason::HandOffFailed);
            return;
        }
        let retry_ms = self.now_ms + self.config.handoff_timeout_ms();
        if let RoleState::Active(active) = &mut self.role {
            active.handoff = None;
            active.handoff_retry_ms = retry_ms;
            let (epoch, stream) = (active.epoch, active.stream);
            if active.bump.is_some() {
                // Still moving to a higher epoch: its Activate ends the hold.
            } else if std::mem::take(&mut active.activate_on_resume) {
                self.push(Effect::Activate { epoch, stream });
            } else {
                self.push(Effect::Resume);
            }
            self.send_heartbeats();
        }
    }

    /// The active steps down to follow `active` (after a hand-off to it, or
    /// because it is a higher-priority active), or none (a peer refuses it).
    /// Its table stays complete; it will ask the active for a snapshot.
    fn become_standby(&mut self, active: Option<usize>, reason_if_stopping: ExitReason) {
        if let RoleState::Active(state) = self.role {
            self.table = Some(TableVersion { stream: state.stream, version: state.version });
        }
        self.stream_from = None;
        self.snapshot_requested_ms = None;
        self.role = RoleState::Standby { following: active, incoming: None };
        self.push(Effect::Follow { active });
        if active.is_some() || matches!(self.blocked, Some(Blocked::NoStandby { .. })) {
            // A standby with an active to follow has nothing to serve, and
            // a standby needs no standbys of its own.
            self.blocked = None;
        }
        if self.stopping {
            self.exit(reason_if_stopping);
        } else {
            self.send_heartbeats();
        }
    }

    fn follow(&mut self, active: Option<usize>) {
        let RoleState::Standby { incoming, .. } = self.role else { unreachable!() };
        let incoming = match incoming {
            Some(handoff) if Some(handoff.from) != active => {
                self.refuse(handoff);
                None
            }
            incoming => incoming,
        };
        if self.stream_from != active {
            self.stream_from = None;
        }
        self.snapshot_requested_ms = None;
        self.role = RoleState::Standby { following: active, incoming };
        self.push(Effect::Follow { active });
        if active.is_some() {
            self.blocked = None;
        }
        self.send_heartbeats();
    }

    fn exit(&mut self, reason: ExitReason) {
        self.followed_at_exit = self.following();
        match self.role {
            RoleState::Standby { incoming: Some(handoff), .. }
            | RoleState::Promoting { handoff: Some(handoff), .. } => self.refuse(handoff),
            _ => {}
        }
        self.role = RoleState::Exited;
        self.send_heartbeats();
        // The epochs this node learned last (the successor's, in a hand-off)
        // must survive it, or a restart alone could go below them.
        if self.epoch_seen > self.epoch_requested {
            self.request_persist(self.epoch_seen);
        }
        if self.epoch_persisted >= self.epoch_requested {
            self.push(Effect::Exit { reason });
        } else {
            self.role = RoleState::Exiting(reason);
        }
    }

    /// Notes an epoch seen. A node on its way out still persists what it
    /// learns until it exits.
    fn learn_epoch(&mut self, epoch: u64) {
        if epoch > EPOCH_MAX {
            return;
        }
        self.epoch_seen = self.epoch_seen.max(epoch);
        if matches!(self.role, RoleState::Exiting(_)) && self.epoch_seen > self.epoch_requested {
            self.request_persist(self.epoch_seen);
        }
    }

    /// A peer refused this node recently.
    fn is_refused(&self) -> bool {
        self.refused_ms.is_some() && self.now_ms < self.refused_until_ms()
    }

    fn refused_until_ms(&self) -> u64 {
        self.refused_ms.map_or(0, |refused_ms| refused_ms + 2 * self.config.failover_ms)
    }

    /// Stopped, or stopping once its epoch is persisted: it ignores every
    /// input but epochs.
    fn is_gone(&self) -> bool {
        matches!(self.role, RoleState::Exiting(_) | RoleState::Exited)
    }

    fn request_persist(&mut self, epoch: u64) {
        if epoch > self.epoch_requested {
            self.epoch_requested = epoch;
            self.push(Effect::PersistEpoch { epoch });
        }
    }

    /// The highest epoch this node has issued, persisted, asked to persist or seen.
    fn epoch_known(&self) -> u64 {
        self.epoch_seen.max(self.epoch_persisted).max(self.epoch_requested)
    }

    fn following(&self) -> Option<usize> {
        match self.role {
            RoleState::Standby { following, .. } => following,
            RoleState::Promoting { handoff: Some(handoff), .. } => Some(handoff.from),
            _ => None,
        }
    }

    fn peer_epoch(&self, peer: usize) -> u64 {
        self.peers[peer].last.map_or(0, |heartbeat| heartbeat.epoch)
    }

    fn heard_from_every_peer(&self) -> bool {
        let me = self.config.me;
        self.peers.iter().enumerate().all(|(index, peer)| index == me || peer.heard_ms.is_some())
    }

    /// Live peers in priority order.
    fn live_peers(&self) -> impl Iterator<Item = (usize, Heartbeat)> + '_ {
        let (now_ms, failover_ms) = (self.now_ms, self.config.failover_ms);
        self.peers
            .iter()
            .enumerate()
            .filter_map(move |(index, peer)| peer.live(now_ms, failover_ms).map(|h| (index, *h)))
    }

    /// The active to follow: the highest-priority live one, passing over an
    /// active that is handing off to another live active.
    fn live_active(&self) -> Option<usize> {
        let me = self.config.me;
        let is_active = |index: usize| {
            self.peers[index].live(self.now_ms, self.config.failover_ms).is_some_and(|h| h.role == PeerRole::Active)
        };
        let semi_sync = self.config.min_standbys > 0;
        let (mut yielding, mut blocked) = (None, None);
        for (index, heartbeat) in self.live_peers() {
            if heartbeat.role != PeerRole::Active {
                continue;
            }
            match heartbeat.handing_off_to {
                Some(to) if to != me && is_active(to) => yielding = yielding.or(Some(index)),
                // With --min-standbys, an active blocked for want of
                // standbys is followed only if no other is live: it yields
                // to the other (see `evaluate_active`).
                _ if semi_sync && heartbeat_blocked(&heartbeat) => blocked = blocked.or(Some(index)),
                _ => return Some(index),
            }
        }
        blocked.or(yielding)
    }

    /// A live peer follows an active this node cannot hear (a partial
    /// partition): promoting would make a second active, so wait. The peer
    /// stops saying so within a failover period if that active is gone.
    fn live_peer_follows_another(&self) -> bool {
        let me = self.config.me;
        self.live_peers().any(|(_, heartbeat)| heartbeat.following.is_some_and(|active| active != me))
    }

    fn election_winner(&self) -> Option<usize> {
        let me = Candidate { index: self.config.me, caught_up: self.table.is_some() };
        let peers = self
            .live_peers()
            .filter(|(_, heartbeat)| heartbeat.role == PeerRole::Standby)
            .map(|(index, heartbeat)| Candidate { index, caught_up: heartbeat.caught_up });
        election::winner(std::iter::once(me).chain(peers))
    }

    /// The standby to hand over to on a stop: the highest-priority live one
    /// that follows this node and holds a snapshot of its stream.
    fn successor(&self) -> Option<usize> {
        let RoleState::Active(active) = self.role else { return None };
        let me = self.config.me;
        self.live_peers()
            .find(|(_, heartbeat)| {
                heartbeat.role == PeerRole::Standby
                    && heartbeat.following == Some(me)
                    && heartbeat.table.is_some_and(|table| table.stream == active.stream)
            })
            .map(|(index, _)| index)
    }

    fn send_heartbeats(&mut self) {
        let heartbeat = self.heartbeat();
        for to in 0..self.config.nodes {
            if to != self.config.me {
                self.push(Effect::Send { to, message: PeerMessage::Heartbeat(heartbeat) });
            }
        }
        self.next_heartbeat_ms = self.now_ms + self.config.heartbeat_ms;
    }

    /// The next heartbeat: the node's role and table as of now.
    fn heartbeat(&mut self) -> Heartbeat {
        self.heartbeat_sequence += 1;
        self.ack_due = false;
        let (role, epoch, table, handing_off_to) = match self.role {
            RoleState::Active(active) => (
                PeerRole::Active,
                active.epoch,
                Some(TableVersion { stream: active.stream, version: active.version }),
                active.handoff.map(|handoff| handoff.to),
            ),
            RoleState::Exiting(_) | RoleState::Exited => (PeerRole::Leaving, 0, self.table, None),
            _ => (PeerRole::Standby, self.following().map_or(0, |active| self.peer_epoch(active)), self.table, None),
        };
        Heartbeat {
            incarnation: self.incarnation,
            sequence: self.heartbeat_sequence,
            role,
            epoch,
            epoch_seen: self.epoch_known(),
            following: if role == PeerRole::Standby { self.following() } else { None },
            // An active blocked by --min-standbys says so here.
            caught_up: match role {
                PeerRole::Active => !matches!(self.blocked, Some(Blocked::NoStandby { .. })),
                _ => table.is_some(),
            },
            table,
            handing_off_to,
        }
    }

    fn push(&mut self, effect: Effect) {
        assert!(self.effects.len() < EFFECTS_QUEUED_MAX, "effects must be drained after every input");
        self.effects.push_back(effect);
    }
}

/// Whether an active's heartbeat says it is blocked by `--min-standbys`
/// (an active's `caught_up` is false only then).
fn heartbeat_blocked(heartbeat: &Heartbeat) -> bool {
    heartbeat.role == PeerRole::Active && !heartbeat.caught_up
}
