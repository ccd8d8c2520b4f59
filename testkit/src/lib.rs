//! Test doubles for ringlock clients: a [`Proxy`] that cuts, stalls,
//! refuses, delays and reorders, and a [`FakeStandby`] that redirects. Rust
//! tests use them directly; the `ringlock-testkit` binary serves them over a
//! line-based control socket ([`control`]) for the tests of clients in other
//! languages. `testkit/README.md` describes that protocol, and
//! `clients/scenarios.json` the cases every official client runs with it.
//!
//! # Layout
//! - `proxy`: the proxy and its commands.
//! - `fake`: the fake standby.
//! - `control`: the control protocol: commands by name, on a socket.
//! - `certs`: the certificates of TLS tests (`ringlock-testkit certs DIR`).

pub mod certs;
pub mod control;
pub mod fake;
pub mod proxy;

pub use fake::{FakeStandby, Names};
pub use proxy::Proxy;

/// How long a wait for an event lasts before it fails.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);
