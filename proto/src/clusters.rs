//! Which of several clusters a key goes to (docs/protocol.md §4, "Several
//! clusters"): rendezvous hashing over the clusters' names, the one
//! function every client, the CLI and the load generator use, so that they
//! all send a key to the same cluster.

/// FNV-1a's 64-bit offset basis.
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// The byte between a cluster's name and the key: no UTF-8 name holds it,
/// so (name, key) pairs never run together.
const NAME_END: u8 = 0xff;

/// The score of `key` on the cluster called `name`:
/// `fmix64(fnv1a64(name ++ 0xFF ++ key))`. The key goes to the cluster
/// with the highest score.
///
/// # Examples
///
/// ```
/// // The first vector of clients/cluster-hash-vectors.json.
/// assert_eq!(ringlock_proto::cluster_score(b"only", b""), 0xae20_6364_de67_c651);
/// ```
pub fn cluster_score(name: &[u8], key: &[u8]) -> u64 {
    let mut hash = FNV_OFFSET_BASIS;
    for &byte in name.iter().chain(&[NAME_END]).chain(key) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
    }
    fmix64(hash)
}

/// MurmurHash3's 64-bit finalizer: spreads FNV's weak low bits over the
/// whole word, so that scores of similar names compare at random.
fn fmix64(mut value: u64) -> u64 {
    value ^= value >> 33;
    value = value.wrapping_mul(0xff51_afd7_ed55_8ccd);
    value ^= value >> 33;
    value = value.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    value ^ (value >> 33)
}

/// The position in `names` of the cluster `key` goes to: the highest
/// [`cluster_score`], a tie going to the name first in byte order; `None`
/// if `names` is empty.
///
/// # Examples
///
/// ```
/// use ringlock_proto::cluster_index;
///
/// let names = ["east", "west", "north"];
/// let chosen = cluster_index(&names, b"invoice-42").unwrap();
/// // The order the names are given in does not matter.
/// let reversed = ["north", "west", "east"];
/// assert_eq!(reversed[cluster_index(&reversed, b"invoice-42").unwrap()], names[chosen]);
/// ```
pub fn cluster_index<N: AsRef<[u8]>>(names: &[N], key: &[u8]) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (index, name) in names.iter().enumerate() {
        let score = cluster_score(name.as_ref(), key);
        let wins = match best {
            None => true,
            Some((best_index, best_score)) => {
                score > best_score || (score == best_score && name.as_ref() < names[best_index].as_ref())
            }
        };
        if wins {
            best = Some((index, score));
        }
    }
    best.map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tie_goes_to_the_name_first_in_byte_order() {
        // The same name twice scores the same: the first in byte order wins
        // wherever it stands (equal names are equal, so the first given).
        assert_eq!(cluster_index(&["b", "b"], b"k"), Some(0));
        assert_eq!(cluster_index::<&str>(&[], b"k"), None);
    }

    #[test]
    fn adding_a_cluster_moves_keys_only_to_it() {
        let (three, four) = (["c1", "c2", "c3"], ["c1", "c2", "c3", "c4"]);
        let mut moved = 0;
        for index in 0..20_000 {
            let key = format!("key-{index}");
            let (before, after) = (cluster_index(&three, key.as_bytes()), cluster_index(&four, key.as_bytes()));
            if before != after {
                assert_eq!(after, Some(3), "{key} moved between old clusters");
                moved += 1;
            }
        }
        // scripts/cluster-hash.py --check counts the same keys.
        assert_eq!(moved, 4_968);
    }
}
