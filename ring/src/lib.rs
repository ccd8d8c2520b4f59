//! The per-core plumbing the ringlock server and its load generator share,
//! so that the load generator needs neither the server nor its runtime.
//!
//! # Layout
//! - `buf_ring`: [`BufRing`], the provided receive buffers of an io_uring ring.
//! - `poll`: [`poll_before_sleep`], polling a ring for a moment before
//!   sleeping on it.
//! - `cpu_list`: [`CpuList`] and [`parse_cpu_list`], the CPUs threads are
//!   pinned to (`--cpus`).
//! - `socket`: [`set_nodelay`], the option set on accepted connections,
//!   and [`set_flag`], a boolean socket option.

mod buf_ring;
mod cpu_list;
mod poll;
mod socket;

pub use buf_ring::BufRing;
pub use cpu_list::{CpuList, parse_cpu_list};
pub use poll::poll_before_sleep;
pub use socket::{set_flag, set_nodelay};
