//! One shard core: an io_uring event loop that accepts, reads, parses, runs
//! its shard and writes replies, and talks to the other cores by mailbox.
//!
//! # Layout
//! - `event_loop`: [`EventLoop`], the loop's turn (completions, inbox),
//!   its sleep, and stopping.
//! - `state`: `CoreState`, everything of a core beside its shard and buffers.
//! - `ring`: building the ring, its sizes, and the tags of its completions.
//! - `listener`: the clients' listening socket, and binding with retries.
//! - `sockets`: accepting, receiving, sending, pausing on the ring, and the
//!   end of a connection (reading no more, acknowledgements, closing).
//! - `connection`: one connection's buffers, and its lifecycle as a small
//!   state machine (reading, paused, half-closed, closing).
//! - `dispatch`: parsing request lines, routing them to their shard,
//!   delivering replies.
//! - `effects`: the shard's effects: replies out, token ranges in.
//! - `control`: the replication core's orders to a core (serve, hold,
//!   resume, follow).
//! - `client_id`: which core and connection a request came from.
//! - `mailbox`: messages between cores, with eventfd wake-ups.
//! - `per_ip`: open connections per client IP, for `--max-connections-per-ip`.

pub(crate) mod client_id;
pub(crate) mod connection;
mod control;
mod dispatch;
mod effects;
mod event_loop;
pub(crate) mod listener;
pub(crate) mod mailbox;
pub(crate) mod per_ip;
mod ring;
mod sockets;
mod state;

pub use event_loop::EventLoop;
pub use ring::{build_ring, ring_mode_name};
