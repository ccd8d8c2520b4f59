//! The ringlock server, as a library the binary and the load generator share.
//!
//! # Layout
//! - `cluster`: the cluster logic as a pure state machine, with its simulator,
//!   and the peer protocol's wire codec.
//! - `config`: command-line flags and their environment variables.
//! - `server`: start-up (epoch, listeners, pinned threads) and shutdown.
//! - `event_loop`: one shard core's io_uring loop: its turn, waiting, stopping.
//! - `sockets`: accepting, receiving, sending, pausing and closing on the ring.
//! - `dispatch`: parsing requests, routing them to their shard, delivering replies.
//! - `connection`: one client connection's buffers and I/O state.
//! - `per_ip`: open connections per client IP address, for `--max-connections-per-ip`.
//! - `replication`: the replication core of a cluster node (glommio): peer
//!   connections, snapshots and delta streams, driving the cluster logic.
//! - `role`: a shard core's role in a cluster (serve, hold, redirect) and its reports.
//! - `router`: messages between cores, with eventfd wake-ups.
//! - `epoch`: the durable epoch file.
//! - `tokens`: token ranges for the shards under the current epoch.
//! - `stats`: the `S` reply, and the counters cores publish for it and `/metrics`.
//! - `metrics`: `/metrics` in the Prometheus text format, and readiness.
//! - `ops_http`: the operator endpoint (`--metrics-listen`) on its own thread.
//! - `sd_notify`: systemd's readiness notifications.

pub mod cluster;
pub mod config;
mod connection;
mod dispatch;
pub mod epoch;
mod event_loop;
mod metrics;
mod ops_http;
mod per_ip;
mod replication;
mod role;
mod router;
mod sd_notify;
pub mod server;
mod sockets;
mod stats;
mod tokens;
