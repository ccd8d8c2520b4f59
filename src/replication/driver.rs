//! The replication loop: drives the cluster logic with what the shards and
//! the peers report, and carries out what it decides.
//!
//! One turn, about every millisecond: handle what peers sent, take the
//! shards' deltas into the mirror and the pending batch, send the batch to
//! every standby that streams, tick the cluster logic, and carry out its
//! effects. Everything runs on this one thread, so the mirror, the stream
//! versions and the effects are always seen in one order.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::cluster::receive::{Break, Received, StreamReceiver};
use crate::cluster::wire::{self, ENTRIES_PER_FRAME_MAX, Frame, Hello, PROTOCOL_VERSION, SnapshotEntry};
use crate::cluster::{
    self, Blocked, ExitReason, HeartbeatFrom, HeartbeatSource, Node, PeerMessage, PeerRole, TableVersion,
};
use crate::config::PeerAddress;
use crate::node::epoch::EpochStore;
use crate::node::role::{Control, NodeStatus, Report};
use crate::node::shared::Shared;
use crate::shard_core::mailbox::CoreMessage;

use super::mirror::{Mirror, OutOfOrder};
use super::peers::{Events, Outboxes, PeerEvent, PeerLinks};

/// The longest pause between two turns: the time bound of a delta batch.
pub const TURN_MS: u64 = 1;

/// A batch buffer's first size: a millisecond of deltas at a high rate.
const BATCH_BYTES_INITIAL: usize = 64 << 10;

/// After [`cluster::Effect::Exit`], how long the last messages may take to leave.
const EXIT_FLUSH: Duration = Duration::from_millis(500);

/// How long to wait before trying again to persist an epoch that failed.
const PERSIST_RETRY_MS: u64 = 100;
/// While an epoch cannot be persisted, its error is logged this often.
const PERSIST_LOG_INTERVAL_MS: u64 = 5_000;

/// Table entries (deltas, snapshot entries) a turn takes in from the peers,
/// and again from the shards, before it goes on to heartbeats and sending:
/// a backlog is worked off over several turns, so that it never holds the
/// heartbeats back for long (at a few hundred ns an entry, some 20 ms).
const ENTRIES_PER_TURN_MAX: usize = 65_536;

/// Snapshot entries sent to one standby per turn: a slice of a few
/// milliseconds' work, so that heartbeats and deltas keep flowing.
const SNAPSHOT_SLICE_ENTRIES: usize = 32_768;

/// A standby's snapshot gets its next slice only while fewer bytes than this
/// wait in its outbox: the snapshot goes at the pace the standby reads.
const SNAPSHOT_OUTBOX_BYTES_MAX: usize = 8 << 20;

/// A peer that keeps refusing this node is named in the log at most this often.
const REFUSAL_LOG_INTERVAL_MS: u64 = 10_000;

/// A node that cannot serve says so this often while it lasts.
const BLOCKED_LOG_INTERVAL_MS: u64 = 10_000;

/// A stream of deltas to one standby, valid while its connection lasts.
#[derive(Clone, Copy, Debug)]
struct Stream {
    connection: u64,
    /// While its snapshot is being sent: the mirror slot the next slice
    /// starts at.
    snapshot_next_slot: Option<usize>,
}

pub struct ReplicationCore {
    node: Node,
    peers: Vec<PeerAddress>,
    shared: Arc<Shared>,
    store: EpochStore,
    reports: Receiver<Report>,
    events: Events,
    outboxes: Outboxes,
    hello: Rc<Cell<Hello>>,
    mirror: Mirror,
    /// Active: the stream the shards' deltas belong to, and its version.
    serving: Option<TableVersion>,
    /// The cores serve (they were sent an Activate since the last Follow).
    cores_active: bool,
    /// Deltas applied to the mirror and not yet sent, encoded as frames
    /// already, so that each delta moves into the mirror without a copy.
    batch: Vec<u8>,
    streams: Vec<Option<Stream>>,
    /// The last turn left events or reports for the next one.
    backlog: bool,
    /// A standby's side of the stream: the snapshot under way, the stream applied.
    receiver: StreamReceiver<Mirror>,
    /// Cores that still owe a [`Report::Held`] after a hold.
    holding: Option<Vec<bool>>,
    /// Controls each core's full inbox refused, sent again next turn, in order.
    controls: Vec<VecDeque<Control>>,
    persist_retry: Option<(u64, u64)>,
    /// While persisting fails: how many tries failed, and when that was
    /// last logged.
    persist_failures: Option<(u64, Option<u64>)>,
    status: NodeStatus,
    stop_asked: bool,
    /// `--max-keys`: a snapshot or stream that would make the table hold
    /// more is dropped (a peer cannot make this node hold more than its
    /// shards could).
    keys_max: usize,
    /// Per peer: the connection its heartbeats are taken from. Heartbeats
    /// of older connections are late messages of a previous life, dropped
    /// while that connection is open and speaking.
    heartbeat_sources: Vec<HeartbeatSource>,
    /// Per peer: when its refusal of this node was last logged.
    refusal_logged_ms: Vec<Option<u64>>,
    /// Why this node cannot serve, and when that was last logged.
    blocked: Option<(Blocked, u64)>,
    /// Since when the cores hold their clients (a hand-off or an epoch
    /// move), and whether that was logged as too long.
    held_since_ms: Option<u64>,
    held_logged: bool,
    /// How long a hold may last before it is logged: the hand-off timeout.
    hold_warn_ms: u64,
    /// With `--min-standbys`: which reports of the shards' deltas the
    /// standbys have applied, for the cores that hold the replies of grants.
    acks: Option<Acks>,
}

/// `--min-standbys` on the active: the shards' reports of deltas, by the
/// stream version that contains each, until enough standbys have applied
/// it; and whether the node may grant.
struct Acks {
    /// Reports of deltas received per core (each core numbers its own from 1).
    reports: Vec<u64>,
    /// Reports not yet acknowledged, in stream order: the version that
    /// contains the report, its core, its number.
    pending: VecDeque<(u64, usize, u64)>,
    /// Whether the cores were last told that the node may grant.
    granting: bool,
}

impl ReplicationCore {
    pub fn new(
        node: Node,
        peers: Vec<PeerAddress>,
        shared: Arc<Shared>,
        store: EpochStore,
        reports: Receiver<Report>,
        links: PeerLinks,
        keys_max: usize,
    ) -> ReplicationCore {
        let PeerLinks { events, outboxes, hello, .. } = links;
        let nodes = peers.len();
        let cores = shared.mailboxes.len();
        let hold_warn_ms = node.config().handoff_timeout_ms();
        let acks = (node.config().min_standbys > 0).then(|| Acks {
            reports: vec![0; cores],
            pending: VecDeque::new(),
            granting: true,
        });
        ReplicationCore {
            node,
            peers,
            shared,
            store,
            reports,
            events,
            outboxes,
            hello,
            mirror: Mirror::new(),
            backlog: false,
            receiver: StreamReceiver::default(),
            serving: None,
            cores_active: false,
            batch: Vec::with_capacity(BATCH_BYTES_INITIAL),
            streams: vec![None; nodes],
            holding: None,
            controls: (0..cores).map(|_| VecDeque::new()).collect(),
            persist_retry: None,
            persist_failures: None,
            status: NodeStatus::default(),
            stop_asked: false,
            keys_max,
            heartbeat_sources: vec![HeartbeatSource::default(); nodes],
            refusal_logged_ms: vec![None; nodes],
            blocked: None,
            held_since_ms: None,
            held_logged: false,
            hold_warn_ms,
            acks,
        }
    }

    /// Runs turns until the cluster logic says to exit.
    pub async fn run(mut self, now_ms: impl Fn() -> u64) -> ExitReason {
        loop {
            let now = now_ms();
            if let Some(reason) = self.turn(now) {
                self.flush_outboxes().await;
                return reason;
            }
            if self.backlog {
                // Let the peer tasks move bytes, then go on at once.
                futures_lite::future::yield_now().await;
            } else {
                glommio::timer::sleep(Duration::from_millis(TURN_MS)).await;
            }
        }
    }

    /// One turn; `Some` once the node has exited.
    ///
    /// The cluster logic's effects are carried out after every input, so
    /// that no number of peer frames in one turn can pile them up.
    fn turn(&mut self, now_ms: u64) -> Option<ExitReason> {
        self.backlog = false;
        let mut exit = None;
        let mut entries = 0;
        while entries < ENTRIES_PER_TURN_MAX {
            let event = self.events.borrow_mut().pop();
            let Some(event) = event else { break };
            entries += match &event {
                PeerEvent::Frame { frame: Frame::Deltas { deltas, .. }, .. } => deltas.len().max(1),
                PeerEvent::Frame { frame: Frame::SnapshotChunk(chunk), .. } => chunk.len().max(1),
                _ => 1,
            };
            self.peer_event(now_ms, event);
            exit = exit.or(self.effects(now_ms));
        }
        self.backlog |= !self.events.borrow().is_empty();
        let mut entries = 0;
        while entries < ENTRIES_PER_TURN_MAX {
            let Ok(report) = self.reports.try_recv() else { break };
            entries += match &report {
                Report::Deltas { deltas, .. } => deltas.len(),
                Report::Held { .. } => 1,
            };
            self.report(now_ms, report);
            exit = exit.or(self.effects(now_ms));
        }
        self.backlog |= !self.reports.is_empty();
        self.check_streams();
        self.send_batch(now_ms);
        self.send_snapshot_slices(now_ms);
        if self.shared.authority.take_exhausted() {
            self.node.epoch_exhausted(now_ms);
            exit = exit.or(self.effects(now_ms));
        }
        if !self.stop_asked && self.shared.cluster.as_ref().is_some_and(|link| link.stop.load(Ordering::SeqCst)) {
            self.stop_asked = true;
            self.node.stop_requested(now_ms);
            exit = exit.or(self.effects(now_ms));
        }
        if let Some((epoch, at_ms)) = self.persist_retry
            && now_ms >= at_ms
        {
            self.persist_retry = None;
            self.persist(now_ms, epoch);
            exit = exit.or(self.effects(now_ms));
        }
        if now_ms >= self.node.next_deadline_ms() {
            self.node.tick(now_ms);
            exit = exit.or(self.effects(now_ms));
        }
        if self.acks.is_some() {
            self.node.acknowledge(now_ms);
            exit = exit.or(self.effects(now_ms));
            self.acknowledge();
        }
        self.check_hold(now_ms);
        self.send_controls();
        self.publish_blocked(now_ms);
        self.publish_status();
        exit
    }

    /// Logs a hold of the clients that lasts past the hand-off timeout: the
    /// node is active but answers nobody until it ends.
    fn check_hold(&mut self, now_ms: u64) {
        if let Some(since_ms) = self.held_since_ms
            && !self.held_logged
            && now_ms >= since_ms + self.hold_warn_ms
        {
            self.held_logged = true;
            tracing::warn!(
                held_ms = now_ms - since_ms,
                status = ?self.node.status(),
                "the cores have held client requests for longer than the hand-off timeout; they wait for a \
                 hand-off's answer or for a new epoch to be persisted"
            );
        }
    }

    fn set_held(&mut self, held: bool, now_ms: u64) {
        if held {
            self.held_since_ms = self.held_since_ms.or(Some(now_ms));
        } else {
            self.held_since_ms = None;
            self.held_logged = false;
        }
    }

    fn effects(&mut self, now_ms: u64) -> Option<ExitReason> {
        while let Some(effect) = self.node.poll_effect() {
            match effect {
                cluster::Effect::Send { to, message } => self.send_message(to, &message),
                cluster::Effect::PersistEpoch { epoch } => self.persist(now_ms, epoch),
                cluster::Effect::Activate { epoch, stream } => {
                    self.set_held(false, now_ms);
                    self.activate(now_ms, epoch, stream);
                }
                cluster::Effect::Follow { active } => {
                    self.set_held(false, now_ms);
                    if let Some(table) = self.node.take_handed_off()
                        && self.serving.is_some_and(|serving| serving.stream == table.stream)
                    {
                        // The successor holds every delta of the hand-off:
                        // the replies held for them go before the Follow.
                        self.acknowledge_up_to(table.version);
                    }
                    self.follow(active);
                }
                cluster::Effect::SendSnapshot { to } => self.send_snapshot(now_ms, to),
                cluster::Effect::Hold => {
                    self.set_held(true, now_ms);
                    self.holding = Some(vec![true; self.controls.len()]);
                    self.control_every_core(|| Control::Hold);
                }
                cluster::Effect::Resume => {
                    self.set_held(false, now_ms);
                    self.control_every_core(|| Control::Resume);
                }
                cluster::Effect::Exit { reason } => {
                    tracing::info!(?reason, "leaving the cluster");
                    return Some(reason);
                }
            }
        }
        None
    }

    fn persist(&mut self, now_ms: u64, epoch: u64) {
        match self.store.persist(epoch) {
            Ok(()) => {
                if let Some((failures, _)) = self.persist_failures.take() {
                    tracing::info!(epoch, failures, "epoch persisted after failed tries");
                }
                self.node.epoch_persisted(now_ms, epoch)
            }
            Err(error) => {
                // No token of this epoch may be issued until it is durable:
                // the node waits and tries again, and says why (at once,
                // then every PERSIST_LOG_INTERVAL_MS while it fails).
                let (failures, logged_ms) = self.persist_failures.get_or_insert((0, None));
                *failures += 1;
                if logged_ms.is_none_or(|logged_ms| now_ms >= logged_ms + PERSIST_LOG_INTERVAL_MS) {
                    *logged_ms = Some(now_ms);
                    tracing::error!(
                        epoch,
                        %error,
                        failures = *failures,
                        "cannot persist the epoch; retrying every {PERSIST_RETRY_MS} ms (no grant until it is written)"
                    );
                }
                self.persist_retry = Some((epoch, now_ms + PERSIST_RETRY_MS));
            }
        }
    }

    fn activate(&mut self, now_ms: u64, epoch: u64, stream: u64) {
        self.shared.authority.activate(epoch);
        let new_stream = self.serving.is_none_or(|serving| serving.stream != stream);
        if new_stream {
            if let Some(link) = &self.shared.cluster {
                link.activations.fetch_add(1, Ordering::Relaxed);
            }
            // A new activation: the table is this node's mirror, its deltas
            // are numbered from 1 again, and every standby starts over from
            // a snapshot.
            self.serving = Some(TableVersion { stream, version: 0 });
            if let Some(acks) = &mut self.acks {
                acks.pending.clear();
            }
            self.batch.clear();
            self.streams.iter_mut().for_each(|stream| *stream = None);
            self.receiver.clear();
        }
        self.holding = None;
        if self.cores_active {
            // The same table in a higher epoch: fresh token ranges only.
            self.control_every_core(|| Control::Activate { restore: Vec::new() });
        } else {
            self.mirror.drop_expired(now_ms);
            let lists = self.mirror.restore_lists(now_ms, self.controls.len());
            tracing::info!(epoch, held = self.mirror.len(), "active: serving the replicated table");
            for (core, restore) in lists.into_iter().enumerate() {
                self.control_core(core, Control::Activate { restore });
            }
            self.cores_active = true;
        }
        self.update_hello(PeerRole::Active, epoch);
    }

    fn follow(&mut self, active: Option<usize>) {
        self.shared.authority.deactivate();
        if self.serving.take().is_some() {
            tracing::info!(active = ?active, "no longer active");
        }
        self.cores_active = false;
        self.holding = None;
        self.batch.clear();
        self.streams.iter_mut().for_each(|stream| *stream = None);
        let address = active.map(|index| self.peers[index].client.to_string());
        self.control_every_core(|| Control::Follow { active: address.clone() });
        self.update_hello(PeerRole::Standby, 0);
    }

    fn update_hello(&mut self, role: PeerRole, epoch: u64) {
        let mut hello = self.hello.get();
        hello.role = role;
        hello.epoch = epoch;
        self.hello.set(hello);
    }

    /// A shard's report, in the order that shard made it.
    fn report(&mut self, now_ms: u64, report: Report) {
        match report {
            Report::Deltas { core, mut deltas } => {
                let report = self.acks.as_mut().map(|acks| {
                    acks.reports[core] += 1;
                    acks.reports[core]
                });
                // Deltas made before a Follow reach this loop after it: the
                // table they change belongs to the new active now.
                if let Some(serving) = &mut self.serving {
                    for chunk in deltas.chunks(ENTRIES_PER_FRAME_MAX) {
                        wire::encode_deltas(serving.stream, serving.version + 1, chunk, &mut self.batch);
                        serving.version += chunk.len() as u64;
                    }
                    if let (Some(acks), Some(report)) = (&mut self.acks, report) {
                        acks.pending.push_back((serving.version, core, report));
                    }
                    for delta in deltas.drain(..) {
                        if let Err(error) = self.mirror.apply(now_ms, delta) {
                            // The shards' own tokens only grow: this is a bug.
                            tracing::error!(%error, "a shard reported a token out of order");
                            debug_assert!(false, "a shard reported a token out of order: {error}");
                        }
                    }
                }
                if let Some(link) = &self.shared.cluster {
                    link.recycle(deltas);
                }
            }
            Report::Held { core } => {
                let Some(holding) = &mut self.holding else { return };
                holding[core] = false;
                if holding.iter().all(|owed| !owed) {
                    self.holding = None;
                    self.send_batch(now_ms);
                    let version = self.serving.map_or(0, |serving| serving.version);
                    self.node.clients_held(now_ms, version);
                }
            }
        }
    }

    /// Drops the streams whose connection ended.
    fn check_streams(&mut self) {
        for (to, stream) in self.streams.iter_mut().enumerate() {
            if let Some(current) = stream
                && self.outboxes[to].borrow().connection() != Some(current.connection)
            {
                *stream = None;
            }
        }
    }

    /// Sends the pending deltas to every streaming standby and tells the
    /// cluster logic how far the table is.
    fn send_batch(&mut self, now_ms: u64) {
        let Some(serving) = self.serving else { return };
        if self.batch.is_empty() {
            return;
        }
        for to in 0..self.streams.len() {
            if self.streams[to].is_some() && !self.outboxes[to].borrow_mut().push(&self.batch) {
                self.streams[to] = None;
            }
        }
        self.batch.clear();
        self.node.table_changed(now_ms, serving.version);
    }

    fn send_message(&mut self, to: usize, message: &PeerMessage) {
        let mut bytes = Vec::with_capacity(96);
        wire::encode_message(message, &mut bytes);
        self.outboxes[to].borrow_mut().push(&bytes);
    }

    /// Starts a snapshot for `to`: from here on the standby gets the deltas,
    /// and between them, a slice per turn, the table's current entries
    /// (see [`ReplicationCore::send_snapshot_slices`]).
    fn send_snapshot(&mut self, now_ms: u64, to: usize) {
        let Some(_) = self.serving else { return };
        // Every delta so far goes to the standbys that stream already, not
        // to this one, whose snapshot starts after them.
        self.send_batch(now_ms);
        let Some(serving) = self.serving else { return };
        let Some(connection) = self.outboxes[to].borrow().connection() else { return };
        if let Some(stream) = self.streams[to]
            && stream.connection == connection
            && (stream.snapshot_next_slot.is_some() || !self.outboxes[to].borrow().is_flushed())
        {
            // The snapshot sent on this connection is still on its way.
            return;
        }
        let mut bytes = Vec::new();
        wire::encode(&Frame::SnapshotBegin { table: serving }, &mut bytes);
        if self.outboxes[to].borrow_mut().push(&bytes) {
            tracing::info!(peer = to, grants = self.mirror.len(), version = serving.version, "snapshot started");
            self.streams[to] = Some(Stream { connection, snapshot_next_slot: Some(0) });
        }
    }

    /// Sends the next slice of every snapshot under way, and the end of
    /// those that are through the table.
    ///
    /// A slice holds each key's state as of now, after every delta already
    /// sent, and the deltas made later follow it: the standby applies both
    /// in that order, and a key changed or dropped while the walk goes on
    /// ends up as on the active. Keys added behind the walk come as deltas.
    fn send_snapshot_slices(&mut self, now_ms: u64) {
        // The slices must not show a change before its delta is sent.
        self.send_batch(now_ms);
        let Some(serving) = self.serving else { return };
        let mut entries: Vec<SnapshotEntry> = Vec::new();
        let mut bytes = Vec::new();
        for to in 0..self.streams.len() {
            let Some(Stream { connection, snapshot_next_slot: Some(first_slot) }) = self.streams[to] else {
                continue;
            };
            if self.outboxes[to].borrow().queued_bytes() > SNAPSHOT_OUTBOX_BYTES_MAX {
                continue;
            }
            entries.clear();
            bytes.clear();
            let next_slot = self.mirror.entries_from(first_slot, now_ms, SNAPSHOT_SLICE_ENTRIES, &mut entries);
            for chunk in entries.chunks(ENTRIES_PER_FRAME_MAX) {
                wire::encode_snapshot_chunk(chunk, &mut bytes);
            }
            if next_slot.is_none() {
                wire::encode(&Frame::SnapshotEnd { table: serving }, &mut bytes);
            }
            if !self.outboxes[to].borrow_mut().push(&bytes) {
                self.streams[to] = None;
                continue;
            }
            self.streams[to] = Some(Stream { connection, snapshot_next_slot: next_slot });
            if next_slot.is_none() {
                tracing::info!(peer = to, grants = self.mirror.len(), version = serving.version, "snapshot sent");
            }
        }
    }

    fn peer_event(&mut self, now_ms: u64, event: PeerEvent) {
        match event {
            // A peer may have several connections open for a moment (it
            // restarted, or its old connection is not seen closed yet), and
            // anyone who can reach the peer port may open one in its name:
            // a new connection changes nothing by itself. Control messages
            // count from any of them; a stream, only from the connection it
            // started on, and it ends with that connection.
            PeerEvent::Opened { from, connection } => {
                tracing::debug!(peer = from, connection, "peer connection opened");
            }
            PeerEvent::Closed { from, connection } => self.connection_closed(now_ms, from, connection),
            PeerEvent::Frame { from, connection, frame } => self.frame(now_ms, from, connection, frame),
            PeerEvent::Refused { from, refusal } => {
                let log =
                    self.refusal_logged_ms[from].is_none_or(|logged_ms| now_ms >= logged_ms + REFUSAL_LOG_INTERVAL_MS);
                if log {
                    self.refusal_logged_ms[from] = Some(now_ms);
                    tracing::error!(
                        peer = from,
                        address = %self.peers[from].peer,
                        "peer refuses this node: {refusal}; this node does not serve while a peer refuses it; \
                         give every node the same --peers, in the same order, and its own --node"
                    );
                }
                self.node.refused_by(now_ms, from);
            }
        }
    }

    fn connection_closed(&mut self, now_ms: u64, from: usize, connection: u64) {
        self.heartbeat_sources[from].closed(connection);
        if self.receiver.connection_closed(from, connection) {
            self.node.replica_broken(now_ms, from);
        }
    }

    fn frame(&mut self, now_ms: u64, from: usize, connection: u64, frame: Frame) {
        let serving = self.serving.is_some();
        let received = match frame {
            // A hello and the peer secret's frames come only first, and a
            // refusal only to the connector: the transport takes them all.
            Frame::Hello(_)
            | Frame::HelloRefused(_)
            | Frame::Challenge { .. }
            | Frame::ChallengeAnswer { .. }
            | Frame::Proof(_) => return,
            Frame::Message(message) => return self.message(now_ms, from, connection, message),
            Frame::SnapshotBegin { table } => self.receiver.snapshot_begin(from, connection, table, serving),
            Frame::SnapshotChunk(entries) => {
                self.receiver.snapshot_chunk(now_ms, from, connection, entries, self.keys_max)
            }
            Frame::SnapshotEnd { table } => {
                self.receiver.snapshot_end(from, connection, table, serving, &mut self.mirror)
            }
            Frame::Deltas { stream, first_version, deltas } => self.receiver.deltas(
                now_ms,
                from,
                connection,
                stream,
                first_version,
                deltas,
                self.keys_max,
                &mut self.mirror,
            ),
        };
        // Any stream frame shows its sender alive.
        self.node.stream_heard(now_ms, from);
        self.received(now_ms, from, received);
    }

    /// A control message of the cluster protocol, for the cluster logic.
    fn message(&mut self, now_ms: u64, from: usize, connection: u64, message: PeerMessage) {
        if let PeerMessage::Heartbeat(_) = message {
            let quiet_ms = self.node.config().heartbeat_quiet_ms();
            match self.heartbeat_sources[from].heartbeat(now_ms, connection, quiet_ms) {
                HeartbeatFrom::Current => {}
                HeartbeatFrom::Switched => self.node.peer_reconnected(now_ms, from),
                HeartbeatFrom::Stale => return,
            }
        }
        self.node.receive(now_ms, from, message)
    }

    /// Tells the cluster logic what a table frame from `from` did.
    fn received(&mut self, now_ms: u64, from: usize, received: Received<OutOfOrder>) {
        match received {
            Received::Ignored | Received::SnapshotBegun => {}
            Received::SnapshotProgress => self.node.snapshot_progress(now_ms, from),
            Received::SnapshotApplied { table, grants, token_epoch_max } => {
                tracing::info!(peer = from, grants, version = table.version, "snapshot applied");
                self.node.snapshot_applied(now_ms, from, table, token_epoch_max);
            }
            Received::Applied { table, token_epoch_max } => {
                self.node.replica_applied(now_ms, from, table, token_epoch_max)
            }
            Received::Broken(broken) => {
                match broken {
                    Break::SnapshotOutOfOrder { stream, first_version } => {
                        tracing::warn!(peer = from, stream, first_version, "snapshot stream out of order; asking again")
                    }
                    Break::Gap { stream, first_version } => {
                        tracing::warn!(peer = from, stream, first_version, "gap in the replication stream")
                    }
                    Break::OutOfOrder(error) => tracing::warn!(
                        peer = from,
                        %error,
                        "replication stream out of order; asking for a snapshot"
                    ),
                    Break::Overflow { what } => tracing::warn!(
                        peer = from,
                        keys_max = self.keys_max,
                        "the {what} from this peer holds more locks than --max-keys; dropping it (give every node \
                         the same --max-keys)"
                    ),
                }
                self.node.replica_broken(now_ms, from);
            }
        }
    }

    /// `--min-standbys` on the active: tells each core how far enough
    /// standbys have applied its reports, so that it sends the replies it
    /// held for them; and every core whether the node may grant.
    fn acknowledge(&mut self) {
        let Some(acks) = &mut self.acks else { return };
        let granting = !matches!(self.node.blocked(), Some(Blocked::NoStandby { .. }));
        let granting_changed = std::mem::replace(&mut acks.granting, granting) != granting;
        if !granting {
            // The cores answer what they held `no-standby` and hold nothing
            // new while they may not grant: no report needs following, and
            // a long block under releases and expiries does not pile them
            // up. (An acknowledgement covers a core's earlier reports too.)
            acks.pending.clear();
        }
        if granting_changed {
            self.control_every_core(|| Control::Granting(granting));
        }
        if let Some(version) = self.node.acknowledged_version() {
            self.acknowledge_up_to(version);
        }
    }

    /// Tells each core how far its reports contained in the stream up to
    /// `version` go.
    fn acknowledge_up_to(&mut self, version: u64) {
        let Some(acks) = &mut self.acks else { return };
        let mut acknowledged: Vec<Option<u64>> = Vec::new();
        while let Some(&(contained_in, core, report)) = acks.pending.front() {
            if contained_in > version {
                break;
            }
            acks.pending.pop_front();
            if acknowledged.is_empty() {
                acknowledged.resize(acks.reports.len(), None);
            }
            acknowledged[core] = Some(report);
        }
        for (core, reports) in acknowledged.into_iter().enumerate() {
            if let Some(reports) = reports {
                self.control_core(core, Control::Acknowledged { reports });
            }
        }
    }

    fn control_every_core(&mut self, control: impl Fn() -> Control) {
        for core in 0..self.controls.len() {
            self.control_core(core, control());
        }
    }

    fn control_core(&mut self, core: usize, control: Control) {
        self.controls[core].push_back(control);
    }

    /// Sends the queued controls, in order; a full inbox keeps the rest for
    /// the next turn.
    fn send_controls(&mut self) {
        for (core, queue) in self.controls.iter_mut().enumerate() {
            while let Some(control) = queue.pop_front() {
                if let Err(mut refused) = self.shared.mailboxes[core].send(vec![CoreMessage::Control(control)]) {
                    if let Some(CoreMessage::Control(control)) = refused.pop() {
                        queue.push_front(control);
                    }
                    break;
                }
            }
        }
    }

    fn publish_status(&mut self) {
        if let Some(link) = &self.shared.cluster {
            let table = self.serving.or(self.receiver.replica_table());
            let table = table.unwrap_or(TableVersion { stream: 0, version: 0 });
            link.table_stream.store(table.stream, Ordering::Relaxed);
            link.table_version.store(table.version, Ordering::Relaxed);
            link.caught_up.store(self.node.caught_up(), Ordering::Relaxed);
            let lag = self.node.replication_lag().unwrap_or(crate::node::role::LAG_UNKNOWN);
            link.replication_lag.store(lag, Ordering::Relaxed);
        }
        let status = self.node.status();
        let next = NodeStatus {
            active: status.active,
            epoch: status.epoch,
            active_address: status.active_node.map(|index| self.peers[index].client.to_string()),
        };
        if next != self.status {
            tracing::info!(
                role = if next.active { "active" } else { "standby" },
                epoch = next.epoch,
                active = next.active_address.as_deref().unwrap_or("-"),
                "role"
            );
            if let Some(link) = &self.shared.cluster
                && let Ok(mut published) = link.status.lock()
            {
                *published = next.clone();
            }
            self.status = next;
        }
    }

    /// Publishes why the node cannot serve, if it cannot, and says so in
    /// the log at once and again every [`BLOCKED_LOG_INTERVAL_MS`] while it
    /// lasts: a cluster where no node can become active must not be quiet.
    fn publish_blocked(&mut self, now: u64) {
        let blocked = self.node.blocked();
        let changed = blocked != self.blocked.map(|(blocked, _)| blocked);
        match blocked {
            Some(reason)
                if changed || now >= self.blocked.map_or(0, |(_, logged)| logged) + BLOCKED_LOG_INTERVAL_MS =>
            {
                tracing::error!("this node cannot serve: {reason}");
                self.blocked = Some((reason, now));
            }
            Some(_) => {}
            None if changed => {
                tracing::info!("this node can serve again");
                self.blocked = None;
            }
            None => {}
        }
        if changed
            && let Some(link) = &self.shared.cluster
            && let Ok(mut published) = link.blocked.lock()
        {
            *published = blocked;
        }
    }

    /// Gives the writers a moment to send the last messages (a hand-off's
    /// answer, the final heartbeats).
    async fn flush_outboxes(&self) {
        let deadline = std::time::Instant::now() + EXIT_FLUSH;
        while std::time::Instant::now() < deadline {
            if self.outboxes.iter().all(|outbox| outbox.borrow().is_flushed()) {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(TURN_MS)).await;
        }
    }
}

/// The hello this node sends on every new peer connection.
pub fn hello(me: usize, nodes: usize, incarnation: u64, peers_fingerprint: u64) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        nodes,
        node: me,
        incarnation,
        epoch: 0,
        role: PeerRole::Standby,
        peers_fingerprint,
    }
}
