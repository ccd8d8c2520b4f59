//! One shard core: an io_uring event loop that accepts, reads, parses, runs
//! its shard and writes replies, and talks to the other cores by mailbox.
//!
//! # Layout
//! - `dispatcher`: the pure part: connections' sessions and their
//!   lifecycle, parsing request lines, routing them to their shard, writing
//!   replies, the rules of pausing and closing, and the core's role. No
//!   socket, ring or clock: bytes and time in, replies and effects out.
//! - `event_loop`: [`EventLoop`], the shell's turn (completions, inbox),
//!   its sleep, and stopping.
//! - `state`: `CoreState`, the shell's state: the ring, the sockets, what
//!   goes to other threads.
//! - `ring`: building the ring, its sizes, and the tags of its completions.
//! - `listener`: the clients' listening socket, and binding with retries.
//! - `sockets`: accepting, receiving, sending on the ring, and carrying out
//!   the dispatcher's socket effects (pause, resume, close).
//! - `tls`: the TLS layer of a socket (`--tls-cert`), between the ring's
//!   ciphertext and the dispatcher's plaintext.
//! - `control`: the replication core's orders to a core (serve, hold,
//!   resume, follow), token ranges, and delta reports.
//! - `client_id`: which core and connection a request came from.
//! - `mailbox`: messages between cores, with eventfd wake-ups.
//! - `per_ip`: open connections per client IP, for `--max-connections-per-ip`.

pub(crate) mod client_id;
mod control;
mod dispatcher;
mod event_loop;
pub(crate) mod listener;
pub(crate) mod mailbox;
pub(crate) mod per_ip;
mod ring;
mod sockets;
mod state;
mod tls;

pub(crate) use dispatcher::Limits;
pub use event_loop::EventLoop;
pub use ring::{build_ring, ring_mode_name};
