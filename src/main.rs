//! The ringlock server.
//!
//! # Layout
//! - `config`: command-line flags and their environment variables.
//! - `server`: start-up (epoch, listeners, pinned threads) and shutdown.
//! - `event_loop`: one shard core's io_uring loop: its turn, waiting, stopping.
//! - `sockets`: accepting, receiving, sending, pausing and closing on the ring.
//! - `dispatch`: parsing requests, routing them to their shard, delivering replies.
//! - `connection`: one client connection's buffers and I/O state.
//! - `buf_ring`: the provided receive buffers of a ring.
//! - `router`: messages between cores, with eventfd wake-ups.
//! - `epoch`: the durable epoch file.
//! - `tokens`: token ranges for the shards under the current epoch.
//! - `stats`: the `S` reply.

mod buf_ring;
mod config;
mod connection;
mod dispatch;
mod epoch;
mod event_loop;
mod router;
mod server;
mod sockets;
mod stats;
mod tokens;

use clap::Parser;

fn main() {
    let config = config::Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level).unwrap_or_else(|error| {
        eprintln!(
            "ringlock: --log-level {:?} is not a log filter ({error}); use error, warn, info, debug or trace",
            config.log_level
        );
        std::process::exit(2);
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    if let Err(error) = server::run(config) {
        tracing::error!("{error}");
        eprintln!("ringlock: {error}");
        std::process::exit(1);
    }
}
