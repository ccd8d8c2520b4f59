//! What operators see of a node beside the protocol.
//!
//! # Layout
//! - `http`: the operator endpoint (`--metrics-listen`) on its own thread.
//! - `metrics`: `/metrics` in the Prometheus text format, and readiness.
//! - `sd_notify`: systemd's readiness notifications.

pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod sd_notify;
