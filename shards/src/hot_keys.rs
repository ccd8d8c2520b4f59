//! The keys a shard sees most often in the last minute, in bounded memory.
//!
//! A Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005) keeps
//! [`HOT_KEYS_TRACKED`] counters: a key already tracked adds one to its
//! counter; a new key takes over the smallest counter and adds one to it. Any
//! key seen more often than 1/[`HOT_KEYS_TRACKED`] of the events is tracked,
//! and a count is never below the key's true count. Two windows of
//! [`HOT_KEYS_WINDOW_MS`] rotate with the time the shard is given, and a
//! report merges both: it covers the last 30 to 60 seconds.
//!
//! Recording allocates nothing: the key bytes are copied into fixed slots
//! made when the sketch is built.

use ringlock_proto::KEY_LEN_MAX;

/// Counters per window; the report keeps at most [`HOT_KEYS_REPORTED`].
pub const HOT_KEYS_TRACKED: usize = 32;
/// Keys a report names.
pub const HOT_KEYS_REPORTED: usize = 16;
/// How long one window counts before it becomes the previous one.
pub const HOT_KEYS_WINDOW_MS: u64 = 30_000;

/// Keys with their counts, highest first: what a report lists.
pub type HotKeyCounts = Vec<(Vec<u8>, u64)>;

/// One tracked key.
#[derive(Clone)]
struct Slot {
    hash: u64,
    count: u64,
    len: u8,
    key: [u8; KEY_LEN_MAX],
}

impl Slot {
    fn key(&self) -> &[u8] {
        &self.key[..usize::from(self.len)]
    }
}

/// One window of counters.
#[derive(Clone)]
struct Window {
    slots: Vec<Slot>,
}

impl Window {
    fn new() -> Window {
        Window { slots: Vec::with_capacity(HOT_KEYS_TRACKED) }
    }

    fn record(&mut self, hash: u64, key: &[u8]) {
        if let Some(slot) = self.slots.iter_mut().find(|slot| slot.hash == hash && slot.key() == key) {
            slot.count += 1;
            return;
        }
        debug_assert!(key.len() <= KEY_LEN_MAX);
        if self.slots.len() < HOT_KEYS_TRACKED {
            // Within the capacity reserved at construction: no allocation.
            let mut slot = Slot { hash, count: 1, len: key.len() as u8, key: [0; KEY_LEN_MAX] };
            slot.key[..key.len()].copy_from_slice(key);
            self.slots.push(slot);
            return;
        }
        let smallest = self.slots.iter_mut().min_by_key(|slot| slot.count).expect("a full window has slots");
        smallest.hash = hash;
        smallest.count += 1;
        smallest.len = key.len() as u8;
        smallest.key[..key.len()].copy_from_slice(key);
    }
}

/// A two-window Space-Saving sketch. See the module documentation.
#[derive(Clone)]
pub struct HotKeys {
    current: Window,
    previous: Window,
    /// `now_ms / HOT_KEYS_WINDOW_MS` of the current window.
    window_index: u64,
    /// Events recorded since the start, so that a reader knows when the
    /// report may have changed.
    events: u64,
}

impl HotKeys {
    /// An empty sketch at time `now_ms`.
    pub fn new(now_ms: u64) -> HotKeys {
        HotKeys {
            current: Window::new(),
            previous: Window::new(),
            window_index: now_ms / HOT_KEYS_WINDOW_MS,
            events: 0,
        }
    }

    /// Counts one event on `key`, whose hash (any stable 64-bit hash) is `hash`.
    #[inline]
    pub fn record(&mut self, now_ms: u64, hash: u64, key: &[u8]) {
        self.rotate(now_ms);
        self.current.record(hash, key);
        self.events += 1;
    }

    /// Events recorded since the sketch was made.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Whether a report at `now_ms` would be empty.
    pub fn is_empty(&mut self, now_ms: u64) -> bool {
        self.rotate(now_ms);
        self.current.slots.is_empty() && self.previous.slots.is_empty()
    }

    /// The [`HOT_KEYS_REPORTED`] keys with the highest counts over both
    /// windows, highest first (ties by key), with their counts.
    pub fn top(&mut self, now_ms: u64) -> HotKeyCounts {
        self.rotate(now_ms);
        let mut merged: HotKeyCounts =
            self.current.slots.iter().map(|slot| (slot.key().to_vec(), slot.count)).collect();
        for slot in &self.previous.slots {
            match merged.iter_mut().find(|(key, _)| key == slot.key()) {
                Some((_, count)) => *count += slot.count,
                None => merged.push((slot.key().to_vec(), slot.count)),
            }
        }
        sort_and_truncate(&mut merged);
        merged
    }

    fn rotate(&mut self, now_ms: u64) {
        let index = now_ms / HOT_KEYS_WINDOW_MS;
        if index <= self.window_index {
            return;
        }
        if index == self.window_index + 1 {
            std::mem::swap(&mut self.current, &mut self.previous);
        } else {
            self.previous.slots.clear();
        }
        self.current.slots.clear();
        self.window_index = index;
    }
}

/// Orders a merged report highest count first (ties by key) and keeps the
/// first [`HOT_KEYS_REPORTED`]. Shards own disjoint keys, so reports of
/// several shards merge by concatenating them and calling this.
pub fn sort_and_truncate(report: &mut HotKeyCounts) {
    report.sort_unstable_by(|(key_a, count_a), (key_b, count_b)| count_b.cmp(count_a).then(key_a.cmp(key_b)));
    report.truncate(HOT_KEYS_REPORTED);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(key: &[u8]) -> u64 {
        key.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
    }

    fn record(sketch: &mut HotKeys, now_ms: u64, key: &str, times: u64) {
        for _ in 0..times {
            sketch.record(now_ms, hash(key.as_bytes()), key.as_bytes());
        }
    }

    #[test]
    fn the_heaviest_keys_survive_a_stream_of_distinct_keys() {
        let mut sketch = HotKeys::new(0);
        for round in 0..100 {
            record(&mut sketch, 10, "hot-a", 5);
            record(&mut sketch, 10, "hot-b", 3);
            for other in 0..10 {
                record(&mut sketch, 10, &format!("cold-{round}-{other}"), 1);
            }
        }
        let top = sketch.top(10);
        assert_eq!(top.len(), HOT_KEYS_REPORTED);
        assert_eq!(top[0].0, b"hot-a");
        assert!(top[0].1 >= 500, "a count is never below the true count");
        assert_eq!(top[1].0, b"hot-b");
        assert!(top[1].1 >= 300);
    }

    #[test]
    fn counts_are_exact_while_the_keys_fit_and_windows_age_out() {
        let mut sketch = HotKeys::new(0);
        record(&mut sketch, 1_000, "a", 3);
        record(&mut sketch, 1_000, "b", 1);
        assert_eq!(sketch.top(1_000), vec![(b"a".to_vec(), 3), (b"b".to_vec(), 1)]);
        // Next window: the previous one still counts.
        record(&mut sketch, HOT_KEYS_WINDOW_MS + 5, "b", 4);
        assert_eq!(sketch.top(HOT_KEYS_WINDOW_MS + 5), vec![(b"b".to_vec(), 5), (b"a".to_vec(), 3)]);
        // Two windows on, the first has aged out.
        assert_eq!(sketch.top(2 * HOT_KEYS_WINDOW_MS + 5), vec![(b"b".to_vec(), 4)]);
        assert!(sketch.is_empty(10 * HOT_KEYS_WINDOW_MS));
        assert_eq!(sketch.events(), 8);
    }

    #[test]
    fn the_longest_key_fits() {
        let mut sketch = HotKeys::new(0);
        let key = vec![b'k'; KEY_LEN_MAX];
        sketch.record(0, 7, &key);
        assert_eq!(sketch.top(0), vec![(key, 1)]);
    }
}
