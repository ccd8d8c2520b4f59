//! A provided-buffer ring: receive buffers the kernel picks from for every
//! multishot `recv`, so that idle connections own no receive buffer at all.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::IoUring;
use io_uring::types::BufRingEntry;

/// Buffers registered with one ring, all of one size.
pub struct BufRing {
    entries: NonNull<BufRingEntry>,
    entries_len: usize,
    buffers: Box<[u8]>,
    buffer_len: usize,
    count: u16,
    tail: u16,
}

impl BufRing {
    /// Registers `count` buffers (a power of two, at most 32768) of
    /// `buffer_len` bytes as buffer group `group` of `ring`.
    pub fn register(ring: &IoUring, group: u16, count: u16, buffer_len: usize) -> io::Result<BufRing> {
        assert!(count.is_power_of_two() && count <= 32768);
        let entries_len = usize::from(count) * size_of::<BufRingEntry>();
        // The kernel wants the entries page-aligned: mmap gives that.
        // SAFETY: an anonymous private mapping, checked for failure below.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                entries_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let entries = NonNull::new(address.cast::<BufRingEntry>()).expect("mmap gave a null address");
        let mut ring_buffers = BufRing {
            entries,
            entries_len,
            buffers: vec![0u8; usize::from(count) * buffer_len].into_boxed_slice(),
            buffer_len,
            count,
            tail: 0,
        };
        // SAFETY: the entries stay mapped until `Drop`, after the ring that
        // uses them is gone (the event loop drops the ring first).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(address as u64, count, group, 0)?;
        }
        for id in 0..count {
            ring_buffers.push(id);
        }
        ring_buffers.publish();
        Ok(ring_buffers)
    }

    /// The bytes the kernel received into buffer `id`.
    pub fn get(&self, id: u16, len: usize) -> &[u8] {
        let start = usize::from(id) * self.buffer_len;
        &self.buffers[start..start + len.min(self.buffer_len)]
    }

    /// Gives buffer `id` back to the kernel; visible after [`BufRing::publish`].
    pub fn push(&mut self, id: u16) {
        assert!(id < self.count);
        let index = usize::from(self.tail & (self.count - 1));
        let address = self.buffers.as_ptr() as u64 + (usize::from(id) * self.buffer_len) as u64;
        // SAFETY: `index` is within the mapped entries.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(address);
        entry.set_len(self.buffer_len as u32);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the buffers pushed so far available to the kernel.
    pub fn publish(&mut self) {
        // SAFETY: the tail field lives in the first entry, which is mapped.
        let tail = unsafe { &*(BufRingEntry::tail(self.entries.as_ptr()) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `register`.
        unsafe {
            libc::munmap(self.entries.as_ptr().cast(), self.entries_len);
        }
    }
}
