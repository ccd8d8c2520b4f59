//! The io_uring ring of a shard core: how it is built, its sizes, and the
//! tags of its completions (what each is for, and for which connection).

use std::io;
use std::os::fd::RawFd;

use io_uring::types::Fd;
use io_uring::{IoUring, opcode, squeue};

/// Submission queue entries per ring.
pub(crate) const RING_ENTRIES: u32 = 4096;
/// Completion queue entries per ring: room for bursts of multishot completions.
pub(crate) const COMPLETION_ENTRIES: u32 = 16384;
/// Receive buffers per core, and their size.
pub(crate) const RECV_BUFFERS: u16 = 512;
pub(crate) const RECV_BUFFER_LEN: usize = 16 << 10;
pub(crate) const RECV_BUFFER_GROUP: u16 = 0;

/// What a completion is for, in the top byte of its user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Wake = 4,
    Ignored = 5,
}

pub(crate) fn user_data(kind: Kind, slot: u32, generation: u32) -> u64 {
    (kind as u64) << 56 | u64::from(slot) << 32 | u64::from(generation)
}

pub(crate) fn split_user_data(data: u64) -> (u8, u32, u32) {
    ((data >> 56) as u8, ((data >> 32) & 0xff_ffff) as u32, data as u32)
}

/// A `send` of `len` bytes at `pointer` on the connection in `slot`.
pub(crate) fn send_entry(fd: RawFd, pointer: *const u8, len: u32, slot: u32, generation: u32) -> squeue::Entry {
    opcode::Send::new(Fd(fd), pointer, len).flags(libc::MSG_NOSIGNAL).build().user_data(user_data(
        Kind::Send,
        slot,
        generation,
    ))
}

/// How the ring was set up, for the start-up log line.
pub fn ring_mode_name(defer_taskrun: bool) -> &'static str {
    if defer_taskrun {
        "single-issuer + defer-taskrun"
    } else {
        "plain (this kernel refused single-issuer + defer-taskrun)"
    }
}

/// Builds a ring with `SINGLE_ISSUER | DEFER_TASKRUN` where the kernel allows,
/// and a plain one otherwise. Must run on the thread that will use it.
pub fn build_ring() -> io::Result<(IoUring, bool)> {
    let mut builder = IoUring::builder();
    builder.setup_single_issuer().setup_defer_taskrun().setup_cqsize(COMPLETION_ENTRIES);
    if let Ok(ring) = builder.build(RING_ENTRIES) {
        return Ok((ring, true));
    }
    let ring = IoUring::builder().setup_cqsize(COMPLETION_ENTRIES).build(RING_ENTRIES)?;
    Ok((ring, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_splits_into_what_made_it() {
        for (kind, slot, generation) in [(Kind::Accept, 0, 0), (Kind::Recv, 0xff_ffff, u32::MAX), (Kind::Send, 7, 3)] {
            assert_eq!(split_user_data(user_data(kind, slot, generation)), (kind as u8, slot, generation));
        }
    }
}
