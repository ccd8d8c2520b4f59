//! The cluster logic of docs/protocol.md §5 as a pure state machine: roles, heartbeats,
//! priority election, hand-off, catch-up before preemption, demotion and
//! epoch ballots.
//!
//! A [`Node`] is one member's view of the cluster. Like `quinn-proto`, it
//! does no I/O and reads no clock: the replication core calls it with
//! `now_ms` and what happened (a tick, a peer's message, a persisted epoch,
//! replication progress, Ctrl+C) and drains [`Effect`]s (messages to send, an
//! epoch to persist, become active in an epoch, follow an active, send a
//! snapshot, hold or resume clients, exit). It never sees lock data: the
//! replicated table is described to it by [`TableVersion`]s, which is enough
//! to know who holds a complete table and how far a standby has caught up.
//! That is what lets the simulation in `sim_tests` drive thousands of seeded
//! clusters through crashes, partitions and pauses.
//!
//! # Layout
//! - `node`: the state machine and its inputs.
//! - `effect`: what it asks the replication core to do.
//! - `message`: the cluster protocol between peers.
//! - `wire`: the binary codec of peer connections (frames, snapshots, deltas).
//! - `config`: node index, cluster size, heartbeat and failover timings.
//! - `ballot`: epochs as ballots: a node's next epoch above all it has seen.
//! - `election`: who promotes when no active is left.
//! - `peer`: what a node knows of one peer (last heartbeat, liveness).
//! - `receive`: a standby's rules for the snapshot and delta frames of the
//!   replication stream, over any table (the mirror, or the simulator's).
//! - `node_tests`: one hand-written schedule per rule of docs/protocol.md §5.
//! - `sim`, `sim_rng`: the deterministic cluster simulator (tests only).
//! - `sim_tests`: seeded simulation runs and their invariants.

mod ballot;
mod config;
mod effect;
mod election;
mod message;
mod node;
mod peer;
pub(crate) mod receive;
pub mod wire;

#[cfg(test)]
mod node_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
pub(crate) mod sim_rng;
#[cfg(test)]
mod sim_tests;

pub use ballot::next_epoch;
pub use config::{ClusterConfig, FAILOVER_MS_DEFAULT, HEARTBEAT_MS_DEFAULT};
pub use effect::{Effect, ExitReason};
pub use message::{Heartbeat, PeerMessage, PeerRole, TableVersion};
pub use node::{Blocked, Node, Status};
pub use peer::{HeartbeatFrom, HeartbeatSource};
