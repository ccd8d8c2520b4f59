//! The ringlock server, as a library its binaries and tests share.
//!
//! # Layout
//! - `server`: start-up (epoch, listeners, pinned threads) and shutdown.
//! - `config`: command-line flags and their environment variables.
//! - `auth`: client authentication: the auth file, secrets, scopes.
//! - `tls`: the client port's TLS settings (certificates, keys, client CA).
//! - `shard_core`: one shard core: its io_uring event loop, connections, parsing
//!   and routing of requests, and the mailboxes between cores.
//! - `node`: what the cores of a node share: the epoch file, token ranges,
//!   counters and the `S` reply, each core's role in a cluster.
//! - `cluster`: the cluster logic as a pure state machine, with its
//!   simulator, the epoch ballots, and the peer protocol's wire codec.
//! - `replication`: the replication core of a cluster node (glommio): peer
//!   connections, snapshots and delta streams, driving the cluster logic.
//! - `ops`: what operators see: `/metrics`, `/livez`, `/readyz`, and
//!   systemd's notifications.
//!
//! `docs/architecture.md` walks a request through these files.

pub mod address;
pub mod auth;
pub mod cluster;
pub mod config;
mod node;
mod ops;
mod replication;
pub mod server;
mod shard_core;
pub mod tls;
