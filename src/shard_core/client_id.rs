//! Client ids: which core, connection slot and generation a request came
//! from, in one `u64` the shards carry along with it.

use ringlock_shards::ClientId;

/// A client id: the core in the top byte, then the connection slot and its generation.
pub(crate) fn client_id(core: usize, slot: u32, generation: u32) -> ClientId {
    ClientId((core as u64) << 56 | u64::from(slot) << 32 | u64::from(generation))
}

pub(crate) fn split_client_id(client: ClientId) -> (usize, u32, u32) {
    ((client.0 >> 56) as usize, ((client.0 >> 32) & 0xff_ffff) as u32, client.0 as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_id_splits_into_what_made_it() {
        for (core, slot, generation) in [(0, 0, 0), (255, 0xff_ffff, u32::MAX), (3, 12, 7)] {
            assert_eq!(split_client_id(client_id(core, slot, generation)), (core, slot, generation));
        }
    }
}
