//! Client library and wire protocol of ringlock.
//!
//! # Layout
//! - [`proto`]: the wire protocol v1, shared by client, server and load generator.

pub mod proto;
