//! Random seeds for the lock tables' hash.

use std::time::Instant;

/// A seed for the lock tables' hash, so clients cannot aim keys at one chain.
pub fn random_seed() -> u64 {
    let mut seed = [0u8; 8];
    // SAFETY: getrandom fills the buffer we pass.
    let filled = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 8, 0) };
    if filled == 8 {
        u64::from_ne_bytes(seed)
    } else {
        Instant::now().elapsed().as_nanos() as u64 ^ u64::from(std::process::id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ() {
        // Two draws of 64 random bits are equal once in 2^64 runs.
        assert_ne!(random_seed(), random_seed());
    }
}
