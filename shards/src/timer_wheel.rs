//! The timer wheel of a lock shard: one timer per held lock (its lease deadline)
//! and one per waiting request that has a wait limit.
//!
//! The wheel is a pure state machine like the rest of the shard: it never reads a
//! clock. Time comes in as milliseconds through [`TimerWheel::new`] and
//! [`TimerWheel::advance`], so the same inputs always give the same outputs.
//!
//! # Layout
//!
//! - **Levels.** [`LEVELS`] = 11 levels of 64 slots. A slot of level `k` is `64^k` ms
//!   wide, so level 0 has 1 ms slots and the eleven levels together cover all 64
//!   bits of a `u64` deadline (level 10 uses only its first 16 slots). No deadline
//!   is ever "too far": there is no overflow list and no parking, every timer
//!   sits in the slot its deadline names.
//! - **Which level.** A timer with deadline `d > now` sits in level
//!   `k = (highest bit where d and now differ) / 6`, in slot `(d >> 6k) % 64`. So a
//!   level only holds timers that share every higher digit with `now`, which
//!   gives two facts the whole wheel leans on: every timer of level `k` is due
//!   before every timer of level `k + 1`, and all timers with the same deadline
//!   are in the same slot.
//! - **Cascading.** When time reaches the start of an occupied slot of level
//!   `k > 0`, its timers are moved down to the level their deadline now names
//!   (at least one level lower), or fire if their deadline is that very
//!   millisecond. A timer is moved at most ten times in its life, and only once
//!   time is within one slot width of its deadline, so a lease released well
//!   before it runs out (the common case) is never moved.
//! - **Due list.** A timer inserted with a deadline at or before `now` goes to a
//!   separate list that fires, sorted by deadline, on the next `advance`.
//! - **Occupancy.** One `u64` bitmap per level (bit `s` set iff slot `s` is not
//!   empty) and one bitmap of non-empty levels. Finding the next occupied slot is
//!   two `trailing_zeros`, so [`TimerWheel::next_deadline_ms`] is O(1) and a jump of
//!   any size visits only occupied slots, never every millisecond.
//! - **Nodes.** All timers live in one slab `Vec` with a free list. Each slot is a
//!   circular doubly linked list of `u32` slab indices (the head's `prev` is the
//!   tail), so insert and cancel are O(1) and allocate nothing once the slab has
//!   grown to the peak number of timers. A node holds the deadline (`u64`), the
//!   value, `next` and `prev` (`u32` each), the slot it is linked in (`u16`) and a
//!   generation (`u16`): **24 bytes for `T = u32`** (32 for an 8-byte `T`); a test
//!   asserts it.
//!
//! # Guarantees
//!
//! - `advance(t)` fires exactly the timers with deadline `<= t`, in non-decreasing
//!   deadline order, and timers with equal deadlines in the order they were
//!   inserted (so replicas that apply the same inputs expire the same waiters in
//!   the same order).
//! - A [`TimerHandle`] carries a 6-bit generation of its slab node: cancelling a
//!   handle whose timer already fired or was cancelled panics, even after the node
//!   was reused, except in 1 of 64 reuses where the generation wraps around.
//!
//! # Limits
//!
//! - At most [`TIMERS_MAX`] (2^26 - 1 = 67 108 863) timers at once per wheel; the shard
//!   bounds its keys and waiters below that.
//!
//! # Example
//!
//! ```
//! use ringlock_shards::timer_wheel::TimerWheel;
//!
//! let mut wheel = TimerWheel::new(1_000);
//! let lease = wheel.insert(1_000 + 30_000, "lease of key 7");
//! let _wait = wheel.insert(1_000 + 500, "wait limit of request 9");
//!
//! let mut fired = Vec::new();
//! wheel.advance(1_499, &mut fired);
//! assert!(fired.is_empty());
//! wheel.advance(1_500, &mut fired);
//! assert_eq!(fired, ["wait limit of request 9"]);
//!
//! // The lock is released before its lease runs out.
//! assert_eq!(wheel.cancel(lease), "lease of key 7");
//! assert_eq!(wheel.next_deadline_ms(), None);
//! ```

use std::fmt;

/// Bits of a deadline that one level resolves: 64 slots per level.
const SLOT_BITS: u32 = 6;
const SLOTS_PER_LEVEL: usize = 1 << SLOT_BITS;
const SLOT_DIGIT_MASK: u64 = SLOTS_PER_LEVEL as u64 - 1;

/// Levels of the wheel: enough 6-bit digits to cover every `u64` deadline.
pub const LEVELS: usize = (u64::BITS as usize).div_ceil(SLOT_BITS as usize);

/// Slots of all levels; slot ids `0..SLOTS_WHEEL` are `level * 64 + digit`.
const SLOTS_WHEEL: usize = LEVELS * SLOTS_PER_LEVEL;
/// Slot id of the due list: timers whose deadline is at or before `now`.
const SLOT_DUE: u16 = SLOTS_WHEEL as u16;
/// Slot id of a node that is on the free list.
const SLOT_FREE: u16 = u16::MAX;
/// End of a list, and an empty slot.
const NIL: u32 = u32::MAX;

/// Low bits of a handle: the slab index. High bits: the node's generation.
const HANDLE_INDEX_BITS: u32 = 26;
const HANDLE_INDEX_MASK: u32 = (1 << HANDLE_INDEX_BITS) - 1;
const GENERATION_MASK: u16 = (1 << (u32::BITS - HANDLE_INDEX_BITS)) - 1;

/// Timers one wheel can hold at once; [`TimerWheel::insert`] panics past it.
/// One index short of the handle's index bits, so that no handle is all
/// ones: a handle is stored inverted in a `NonZeroU32`, which gives
/// `Option<TimerHandle>` the size of a `u32` (the lock table's entries keep
/// their 64 bytes with a grant time beside the lease timer).
pub const TIMERS_MAX: usize = (1 << HANDLE_INDEX_BITS) - 1;

const _: () = assert!(SLOTS_WHEEL < SLOT_FREE as usize);
const _: () = assert!(LEVELS <= u16::BITS as usize);
const _: () = assert!(TIMERS_MAX <= NIL as usize);

/// Handle of a scheduled timer; valid until the timer fires or is cancelled.
///
/// It holds the timer's slab index and a 6-bit generation of that slab node, so
/// that a handle kept after its timer fired is caught (in 63 of 64 cases) rather
/// than cancelling whichever timer reused the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerHandle(std::num::NonZeroU32);

impl TimerHandle {
    fn new(index: u32, generation: u16) -> Self {
        debug_assert!((index as usize) < TIMERS_MAX);
        let packed = (u32::from(generation) << HANDLE_INDEX_BITS) | index;
        // The index is below `TIMERS_MAX`, so `packed` is never all ones.
        Self(std::num::NonZeroU32::new(!packed).expect("a timer index is below TIMERS_MAX"))
    }

    fn packed(self) -> u32 {
        !self.0.get()
    }

    fn index(self) -> u32 {
        self.packed() & HANDLE_INDEX_MASK
    }

    fn generation(self) -> u16 {
        (self.packed() >> HANDLE_INDEX_BITS) as u16
    }
}

/// One timer in the slab (24 bytes for `T = u32`), or a free node.
#[derive(Clone)]
struct TimerNode<T> {
    deadline_ms: u64,
    value: T,
    /// Next node in the slot's circular list, or the next free node.
    next: u32,
    /// Previous node in the slot's circular list (the head's is the tail).
    prev: u32,
    /// The slot id the node is linked in, `SLOT_DUE`, or `SLOT_FREE`.
    slot: u16,
    /// Bumped each time the node is freed, so that stale handles are caught.
    generation: u16,
}

/// A hierarchical timer wheel with 1 ms resolution over the whole `u64` range.
///
/// See the [module documentation](self) for the layout and the guarantees.
#[derive(Clone)]
pub struct TimerWheel<T: Copy> {
    nodes: Vec<TimerNode<T>>,
    free_head: u32,
    /// Head of each slot's list (`NIL` when empty); the last one is the due list.
    heads: [u32; SLOTS_WHEEL + 1],
    /// Per level, bit `s` is set iff slot `s` of that level is not empty.
    slots_occupied: [u64; LEVELS],
    /// Bit `k` is set iff level `k` has a non-empty slot.
    levels_occupied: u16,
    now_ms: u64,
    len: usize,
    /// At or before every deadline in the due list (exact until a due timer is
    /// cancelled); meaningful only while the due list is not empty.
    due_deadline_min_ms: u64,
    /// Kept between calls so that sorting the due list allocates nothing in
    /// steady state: (deadline, position in the list, slab index).
    due_sort_scratch: Vec<(u64, u32, u32)>,
}

impl<T: Copy> TimerWheel<T> {
    /// A wheel whose current time is `now_ms`.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let wheel = TimerWheel::<u32>::new(42);
    /// assert_eq!(wheel.now_ms(), 42);
    /// assert!(wheel.is_empty());
    /// ```
    pub fn new(now_ms: u64) -> Self {
        Self::with_capacity(now_ms, 0)
    }

    /// A wheel whose current time is `now_ms`, with room for `capacity` timers
    /// before it allocates.
    ///
    /// # Panics
    ///
    /// If `capacity` is more than [`TIMERS_MAX`].
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let wheel = TimerWheel::<u32>::with_capacity(0, 1_000_000);
    /// assert_eq!(wheel.len(), 0);
    /// ```
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        assert!(
            capacity <= TIMERS_MAX,
            "timer wheel capacity {capacity} is more than TIMERS_MAX = {TIMERS_MAX}; \
             lower the shard's key and waiter limits"
        );
        Self {
            nodes: Vec::with_capacity(capacity),
            free_head: NIL,
            heads: [NIL; SLOTS_WHEEL + 1],
            slots_occupied: [0; LEVELS],
            levels_occupied: 0,
            now_ms,
            len: 0,
            due_deadline_min_ms: 0,
            due_sort_scratch: Vec::new(),
        }
    }

    /// Timers scheduled and not yet fired or cancelled.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// wheel.insert(10, 'a');
    /// assert_eq!(wheel.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is scheduled.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// let handle = wheel.insert(10, 'a');
    /// wheel.cancel(handle);
    /// assert!(wheel.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The time the wheel has been advanced to.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::<u32>::new(5);
    /// wheel.advance(9, &mut Vec::new());
    /// assert_eq!(wheel.now_ms(), 9);
    /// ```
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Schedules `value` to fire at `deadline_ms`. A deadline at or before now
    /// fires at the next [`advance`](Self::advance). O(1); allocates only when the
    /// slab has to grow past its peak.
    ///
    /// # Panics
    ///
    /// If [`TIMERS_MAX`] timers are already scheduled.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(100);
    /// let handle = wheel.insert(50, 7u32); // in the past: fires on the next advance
    /// assert_eq!(wheel.deadline_ms(handle), 50);
    /// let mut fired = Vec::new();
    /// wheel.advance(100, &mut fired);
    /// assert_eq!(fired, [7]);
    /// ```
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerHandle {
        let index = self.allocate(deadline_ms, value);
        let slot = if deadline_ms <= self.now_ms {
            if self.heads[SLOT_DUE as usize] == NIL || deadline_ms < self.due_deadline_min_ms {
                self.due_deadline_min_ms = deadline_ms;
            }
            SLOT_DUE
        } else {
            wheel_slot(deadline_ms, self.now_ms)
        };
        self.link(index, slot);
        self.len += 1;
        TimerHandle::new(index, self.nodes[index as usize].generation)
    }

    /// Cancels a scheduled timer and gives its value back. O(1), allocates nothing.
    ///
    /// # Panics
    ///
    /// If `handle` is not scheduled: its timer already fired or was cancelled, or
    /// it comes from another wheel. That is a bug in the caller, which must drop a
    /// handle when its timer fires. (A stale handle whose slab node was reused is
    /// caught in 63 of 64 cases; see [`TimerHandle`].)
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// let handle = wheel.insert(10, 'a');
    /// assert_eq!(wheel.cancel(handle), 'a');
    /// let mut fired = Vec::new();
    /// wheel.advance(10, &mut fired);
    /// assert!(fired.is_empty());
    /// ```
    #[track_caller]
    pub fn cancel(&mut self, handle: TimerHandle) -> T {
        let index = self.scheduled_index(handle);
        self.unlink(index);
        self.release(index)
    }

    /// The deadline of a scheduled timer, as given to [`insert`](Self::insert).
    ///
    /// # Panics
    ///
    /// If `handle` is not scheduled, as for [`cancel`](Self::cancel).
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// let handle = wheel.insert(86_400_000, ());
    /// assert_eq!(wheel.deadline_ms(handle), 86_400_000);
    /// ```
    #[track_caller]
    pub fn deadline_ms(&self, handle: TimerHandle) -> u64 {
        self.nodes[self.scheduled_index(handle) as usize].deadline_ms
    }

    /// Moves the wheel to `now_ms` and appends every timer whose deadline is at or
    /// before it to `fired`, in non-decreasing deadline order (equal deadlines in
    /// insertion order), removing them. Handles of fired timers become invalid.
    ///
    /// Time never goes back: a `now_ms` at or before the wheel's time leaves the
    /// time as it is, but still fires the timers inserted since the last call
    /// with a deadline at or before the wheel's time.
    ///
    /// The cost is O(timers fired + timers cascaded + occupied slots passed),
    /// whatever the size of the jump.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// wheel.insert(1_000_000_000_000, 'b');
    /// wheel.insert(3, 'a');
    /// let mut fired = Vec::new();
    /// wheel.advance(1_000_000_000_000, &mut fired);
    /// assert_eq!(fired, ['a', 'b']);
    /// ```
    pub fn advance(&mut self, now_ms: u64, fired: &mut Vec<T>) {
        // Due timers have deadlines at or before the wheel's time, so they come
        // before every timer still in a slot.
        self.fire_due(fired);
        // The earliest occupied slot holds the earliest timers, and every timer
        // sits in a slot that starts at or before its deadline: visiting slots in
        // order of start fires timers in order of deadline.
        while let Some((slot, slot_start_ms)) = self.earliest_slot() {
            if slot_start_ms > now_ms {
                break;
            }
            self.now_ms = slot_start_ms;
            self.expire_slot(slot, fired);
        }
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// A time at or before the earliest scheduled deadline (None if empty): the
    /// caller may sleep until then. O(1).
    ///
    /// It is exact when the earliest timer is due within the current 64 ms
    /// rotation of level 0 or was inserted with a deadline in the past (unless a
    /// due timer was cancelled since). Otherwise it is the start of the slot that
    /// holds the earliest timer; advancing to it moves that timer at least one
    /// level down, so a loop `advance(next_deadline_ms())` reaches any timer in at
    /// most [`LEVELS`] steps, each of which either fires something or makes the
    /// next call return a later time.
    ///
    /// ```
    /// use ringlock_shards::timer_wheel::TimerWheel;
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// wheel.insert(40, 'a');
    /// assert_eq!(wheel.next_deadline_ms(), Some(40));
    ///
    /// let mut wheel = TimerWheel::new(0);
    /// wheel.insert(100_000, 'b');
    /// let mut fired = Vec::new();
    /// while fired.is_empty() {
    ///     let next_ms = wheel.next_deadline_ms().unwrap();
    ///     assert!(next_ms <= 100_000);
    ///     wheel.advance(next_ms, &mut fired);
    /// }
    /// assert_eq!(wheel.now_ms(), 100_000);
    /// ```
    pub fn next_deadline_ms(&self) -> Option<u64> {
        if self.heads[SLOT_DUE as usize] != NIL {
            return Some(self.due_deadline_min_ms);
        }
        self.earliest_slot().map(|(_, slot_start_ms)| slot_start_ms)
    }

    /// Takes a node from the free list, or grows the slab.
    fn allocate(&mut self, deadline_ms: u64, value: T) -> u32 {
        if self.free_head != NIL {
            let index = self.free_head;
            let node = &mut self.nodes[index as usize];
            self.free_head = node.next;
            node.deadline_ms = deadline_ms;
            node.value = value;
            index
        } else {
            let index = self.nodes.len();
            assert!(index < TIMERS_MAX, "timer wheel is full: TIMERS_MAX = {TIMERS_MAX} timers are scheduled");
            self.nodes.push(TimerNode { deadline_ms, value, next: NIL, prev: NIL, slot: SLOT_FREE, generation: 0 });
            index as u32
        }
    }

    /// Puts a scheduled node back on the free list and gives its value back.
    fn release(&mut self, index: u32) -> T {
        let node = &mut self.nodes[index as usize];
        node.slot = SLOT_FREE;
        node.generation = node.generation.wrapping_add(1) & GENERATION_MASK;
        node.next = self.free_head;
        self.free_head = index;
        self.len -= 1;
        node.value
    }

    /// The slab index of a scheduled timer; panics on any other handle.
    #[track_caller]
    fn scheduled_index(&self, handle: TimerHandle) -> u32 {
        let index = handle.index();
        match self.nodes.get(index as usize) {
            Some(node) if node.slot != SLOT_FREE && node.generation == handle.generation() => index,
            _ => not_scheduled(handle),
        }
    }

    /// Appends node `index` to the tail of `slot`'s list.
    fn link(&mut self, index: u32, slot: u16) {
        let head = self.heads[slot as usize];
        if head == NIL {
            self.heads[slot as usize] = index;
            let node = &mut self.nodes[index as usize];
            node.next = index;
            node.prev = index;
            node.slot = slot;
            if slot != SLOT_DUE {
                let (level, digit) = level_and_digit(slot);
                self.slots_occupied[level] |= 1 << digit;
                self.levels_occupied |= 1 << level;
            }
        } else {
            let tail = self.nodes[head as usize].prev;
            let node = &mut self.nodes[index as usize];
            node.next = head;
            node.prev = tail;
            node.slot = slot;
            self.nodes[tail as usize].next = index;
            self.nodes[head as usize].prev = index;
        }
    }

    /// Removes node `index` from the list of the slot it is linked in.
    fn unlink(&mut self, index: u32) {
        let TimerNode { next, prev, slot, .. } = self.nodes[index as usize];
        if next == index {
            self.heads[slot as usize] = NIL;
            if slot != SLOT_DUE {
                self.mark_slot_empty(slot);
            }
        } else {
            self.nodes[prev as usize].next = next;
            self.nodes[next as usize].prev = prev;
            if self.heads[slot as usize] == index {
                self.heads[slot as usize] = next;
            }
        }
    }

    fn mark_slot_empty(&mut self, slot: u16) {
        let (level, digit) = level_and_digit(slot);
        self.slots_occupied[level] &= !(1 << digit);
        if self.slots_occupied[level] == 0 {
            self.levels_occupied &= !(1 << level);
        }
    }

    /// The occupied slot with the earliest start, and that start.
    fn earliest_slot(&self) -> Option<(u16, u64)> {
        if self.levels_occupied == 0 {
            return None;
        }
        // Every timer of a level is due before every timer of the levels above,
        // and every occupied slot of a level lies ahead of `now` in its rotation.
        let level = self.levels_occupied.trailing_zeros() as usize;
        let digit = u64::from(self.slots_occupied[level].trailing_zeros());
        let slot = (level * SLOTS_PER_LEVEL) as u16 | digit as u16;
        Some((slot, slot_start_ms(self.now_ms, level, digit)))
    }

    /// Empties `slot`, whose start is `now`: fires the timers due now and moves the
    /// others to the lower level their deadline now names, keeping their order.
    fn expire_slot(&mut self, slot: u16, fired: &mut Vec<T>) {
        let head = self.heads[slot as usize];
        self.heads[slot as usize] = NIL;
        self.mark_slot_empty(slot);
        let mut index = head;
        loop {
            // Read the successor first: firing or moving the node rewrites it.
            let TimerNode { next, deadline_ms, .. } = self.nodes[index as usize];
            // A timer sits in a slot that starts at or before its deadline.
            assert!(deadline_ms >= self.now_ms, "timer found in a slot after its deadline");
            if deadline_ms == self.now_ms {
                fired.push(self.release(index));
            } else {
                self.link(index, wheel_slot(deadline_ms, self.now_ms));
            }
            if next == head {
                break;
            }
            index = next;
        }
    }

    /// Fires the due list in order of deadline, then of insertion.
    fn fire_due(&mut self, fired: &mut Vec<T>) {
        let head = self.heads[SLOT_DUE as usize];
        if head == NIL {
            return;
        }
        self.heads[SLOT_DUE as usize] = NIL;
        // The usual due list is a few timers inserted at `now` itself, already in
        // order: check for that before sorting.
        let mut in_order = true;
        let mut previous_deadline_ms = 0;
        let mut index = head;
        loop {
            let node = &self.nodes[index as usize];
            in_order &= node.deadline_ms >= previous_deadline_ms;
            previous_deadline_ms = node.deadline_ms;
            index = node.next;
            if index == head {
                break;
            }
        }
        if in_order {
            loop {
                let next = self.nodes[index as usize].next;
                fired.push(self.release(index));
                if next == head {
                    break;
                }
                index = next;
            }
        } else {
            let mut scratch = std::mem::take(&mut self.due_sort_scratch);
            scratch.clear();
            let mut position = 0;
            loop {
                let node = &self.nodes[index as usize];
                scratch.push((node.deadline_ms, position, index));
                position += 1;
                index = node.next;
                if index == head {
                    break;
                }
            }
            // (deadline, position) is unique, so the unstable sort (which does
            // not allocate) keeps insertion order among equal deadlines.
            scratch.sort_unstable();
            for &(_, _, index) in &scratch {
                fired.push(self.release(index));
            }
            self.due_sort_scratch = scratch;
        }
    }
}

impl<T: Copy> fmt::Debug for TimerWheel<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("TimerWheel")
            .field("now_ms", &self.now_ms)
            .field("len", &self.len)
            .field("next_deadline_ms", &self.next_deadline_ms())
            .field("slab_len", &self.nodes.len())
            .finish()
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn not_scheduled(handle: TimerHandle) -> ! {
    panic!(
        "timer handle {handle:?} is not scheduled: its timer fired or was cancelled, \
         or the handle belongs to another wheel"
    )
}

/// The slot id of a timer due at `deadline_ms`, strictly after `now_ms`.
#[inline]
fn wheel_slot(deadline_ms: u64, now_ms: u64) -> u16 {
    debug_assert!(deadline_ms > now_ms);
    let highest_differing_bit = u64::BITS - 1 - (deadline_ms ^ now_ms).leading_zeros();
    let level = highest_differing_bit / SLOT_BITS;
    let digit = (deadline_ms >> (level * SLOT_BITS)) & SLOT_DIGIT_MASK;
    (level as usize * SLOTS_PER_LEVEL) as u16 | digit as u16
}

#[inline]
fn level_and_digit(slot: u16) -> (usize, u32) {
    let slot = usize::from(slot);
    (slot / SLOTS_PER_LEVEL, (slot % SLOTS_PER_LEVEL) as u32)
}

/// The start of slot `digit` of `level` in the rotation of that level that
/// `now_ms` is in.
#[inline]
fn slot_start_ms(now_ms: u64, level: usize, digit: u64) -> u64 {
    let shift = level as u32 * SLOT_BITS;
    let rotation_mask = u64::MAX.checked_shl(shift + SLOT_BITS).unwrap_or(0);
    (now_ms & rotation_mask) | (digit << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    impl<T: Copy> TimerWheel<T> {
        /// Walks every list and checks links, bitmaps, placement and counts.
        fn check_invariants(&self) {
            let mut scheduled = 0;
            for (slot, &head) in self.heads.iter().enumerate() {
                let slot = slot as u16;
                if slot != SLOT_DUE {
                    let (level, digit) = level_and_digit(slot);
                    let bit = self.slots_occupied[level] & (1 << digit) != 0;
                    assert_eq!(bit, head != NIL, "occupancy bit of slot {slot}");
                }
                if head == NIL {
                    continue;
                }
                let mut index = head;
                loop {
                    let node = &self.nodes[index as usize];
                    assert_eq!(node.slot, slot, "node {index} is linked in another slot");
                    assert_eq!(self.nodes[node.next as usize].prev, index);
                    if slot == SLOT_DUE {
                        assert!(node.deadline_ms <= self.now_ms);
                        assert!(node.deadline_ms >= self.due_deadline_min_ms);
                    } else {
                        assert!(node.deadline_ms > self.now_ms);
                        assert_eq!(wheel_slot(node.deadline_ms, self.now_ms), slot);
                    }
                    scheduled += 1;
                    index = node.next;
                    if index == head {
                        break;
                    }
                }
            }
            for level in 0..LEVELS {
                let bit = self.levels_occupied & (1 << level) != 0;
                assert_eq!(bit, self.slots_occupied[level] != 0, "level bit {level}");
            }
            assert_eq!(scheduled, self.len);
            let mut free = 0;
            let mut index = self.free_head;
            while index != NIL {
                assert_eq!(self.nodes[index as usize].slot, SLOT_FREE);
                free += 1;
                index = self.nodes[index as usize].next;
            }
            assert_eq!(free + self.len, self.nodes.len());
        }
    }

    fn advanced<T: Copy>(wheel: &mut TimerWheel<T>, now_ms: u64) -> Vec<T> {
        let mut fired = Vec::new();
        wheel.advance(now_ms, &mut fired);
        wheel.check_invariants();
        fired
    }

    /// A small deterministic generator for the seeded tests (splitmix64).
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }
    }

    #[test]
    fn node_is_24_bytes_for_u32() {
        assert!(size_of::<TimerNode<u32>>() <= 24, "{}", size_of::<TimerNode<u32>>());
        assert_eq!(size_of::<TimerHandle>(), 4);
    }

    #[test]
    fn fires_at_the_exact_ms_not_before_not_after() {
        // Offsets on and around every level boundary, from an unaligned start.
        let start_ms = 1_000_003;
        let mut offsets_ms = vec![1, 2, 62, 63, 64, 65, 100, 86_400_000];
        for level in 1..LEVELS as u32 {
            let Some(width_ms) = 1u64.checked_shl(level * SLOT_BITS) else {
                continue;
            };
            offsets_ms.extend([width_ms - 1, width_ms, width_ms + 1]);
        }
        for offset_ms in offsets_ms {
            let deadline_ms = start_ms + offset_ms;
            let mut wheel = TimerWheel::new(start_ms);
            wheel.insert(deadline_ms, offset_ms);
            assert_eq!(advanced(&mut wheel, deadline_ms - 1), [], "offset {offset_ms}");
            assert_eq!(wheel.len(), 1);
            assert_eq!(advanced(&mut wheel, deadline_ms), [offset_ms], "offset {offset_ms}");
            assert!(wheel.is_empty());

            // Stepping one ms at a time near the deadline fires at that ms only.
            let mut wheel = TimerWheel::new(start_ms);
            wheel.insert(deadline_ms, offset_ms);
            advanced(&mut wheel, deadline_ms - 3);
            for now_ms in deadline_ms - 2..deadline_ms + 3 {
                let fired = advanced(&mut wheel, now_ms);
                let expected: &[u64] = if now_ms == deadline_ms { &[offset_ms] } else { &[] };
                assert_eq!(fired, expected, "offset {offset_ms} at {now_ms}");
            }

            // A jump past the deadline fires it in that jump.
            let mut wheel = TimerWheel::new(start_ms);
            wheel.insert(deadline_ms, offset_ms);
            assert_eq!(advanced(&mut wheel, deadline_ms + 12_345), [offset_ms]);
            assert_eq!(wheel.now_ms(), deadline_ms + 12_345);
        }
    }

    #[test]
    fn cancel_before_firing() {
        let mut wheel = TimerWheel::new(0);
        let near = wheel.insert(10, 'n');
        let far = wheel.insert(1_000_000, 'f');
        let kept = wheel.insert(500, 'k');
        assert_eq!(wheel.cancel(far), 'f');
        assert_eq!(wheel.cancel(near), 'n');
        assert_eq!(wheel.len(), 1);
        wheel.check_invariants();
        assert_eq!(advanced(&mut wheel, 2_000_000), ['k']);
        assert!(wheel.is_empty());
        let _ = kept;
    }

    #[test]
    fn cancel_after_cascade() {
        let mut wheel = TimerWheel::new(0);
        let handle = wheel.insert(5_000, 'a');
        wheel.insert(5_000, 'b');
        // On the way to 4_999 both cascade from level 2 (at 4_096) to level 1 and
        // (at 4_992) to level 0.
        assert_eq!(advanced(&mut wheel, 4_999), []);
        assert_eq!(wheel.deadline_ms(handle), 5_000);
        assert_eq!(wheel.cancel(handle), 'a');
        wheel.check_invariants();
        assert_eq!(advanced(&mut wheel, 5_000), ['b']);
    }

    #[test]
    fn cancelled_node_is_reused_and_its_old_handle_is_not() {
        let mut wheel = TimerWheel::new(0);
        let old = wheel.insert(100, 1u32);
        assert_eq!(wheel.cancel(old), 1);
        let new = wheel.insert(200, 2);
        assert_eq!(new.index(), old.index(), "the freed node is reused");
        assert_ne!(new, old, "the reused node has a new generation");
        assert_eq!(wheel.nodes.len(), 1, "no new node was allocated");
        assert_eq!(advanced(&mut wheel, 150), []);
        assert_eq!(advanced(&mut wheel, 200), [2]);
    }

    #[test]
    fn slab_does_not_grow_in_steady_state() {
        let mut wheel = TimerWheel::with_capacity(0, 1_000);
        let mut handles = Vec::new();
        for i in 0..1_000 {
            handles.push(wheel.insert(1 + i * 7, i));
        }
        let slab_capacity = wheel.nodes.capacity();
        for round in 0..100 {
            for handle in &mut handles {
                wheel.cancel(*handle);
                *handle = wheel.insert(round * 1_000 + 5, round);
            }
        }
        assert_eq!(wheel.nodes.len(), 1_000);
        assert_eq!(wheel.nodes.capacity(), slab_capacity);
        wheel.check_invariants();
    }

    #[test]
    #[should_panic(expected = "is not scheduled")]
    fn cancel_twice_panics() {
        let mut wheel = TimerWheel::new(0);
        let handle = wheel.insert(100, ());
        wheel.cancel(handle);
        wheel.cancel(handle);
    }

    #[test]
    #[should_panic(expected = "is not scheduled")]
    fn cancel_of_a_stale_handle_to_a_reused_node_panics() {
        let mut wheel = TimerWheel::new(0);
        let stale = wheel.insert(100, 'a');
        advanced(&mut wheel, 100);
        wheel.insert(200, 'b');
        wheel.cancel(stale);
    }

    #[test]
    #[should_panic(expected = "is not scheduled")]
    fn deadline_of_a_fired_timer_panics() {
        let mut wheel = TimerWheel::new(0);
        let handle = wheel.insert(1, 'a');
        advanced(&mut wheel, 1);
        wheel.deadline_ms(handle);
    }

    #[test]
    #[should_panic(expected = "is not scheduled")]
    fn cancel_of_a_handle_from_another_wheel_panics() {
        let mut other = TimerWheel::new(0);
        let handle = other.insert(1, 'a');
        TimerWheel::<char>::new(0).cancel(handle);
    }

    #[test]
    fn deadlines_in_the_past_fire_on_the_next_advance_in_order() {
        let mut wheel = TimerWheel::new(1_000);
        wheel.insert(999, 'c');
        wheel.insert(10, 'a');
        wheel.insert(1_000, 'd');
        wheel.insert(10, 'b');
        wheel.insert(1_001, 'e');
        assert_eq!(wheel.next_deadline_ms(), Some(10));
        let zero = wheel.insert(0, 'z');
        assert_eq!(wheel.deadline_ms(zero), 0);
        assert_eq!(wheel.next_deadline_ms(), Some(0));
        // The same time still fires what is due, and not what is not.
        assert_eq!(advanced(&mut wheel, 1_000), ['z', 'a', 'b', 'c', 'd']);
        assert_eq!(wheel.next_deadline_ms(), Some(1_001));
        assert_eq!(advanced(&mut wheel, 1_001), ['e']);
    }

    #[test]
    fn many_past_deadlines_fire_sorted_with_equal_ones_in_insertion_order() {
        let mut random = SplitMix(3);
        let mut wheel = TimerWheel::new(1_000_000);
        let mut expected = Vec::new();
        for i in 0..2_000u32 {
            let deadline_ms = 1_000_000 - random.below(8);
            wheel.insert(deadline_ms, i);
            expected.push((deadline_ms, i));
        }
        expected.sort();
        let expected: Vec<u32> = expected.iter().map(|&(_, i)| i).collect();
        assert_eq!(advanced(&mut wheel, 1_000_000), expected);
    }

    #[test]
    fn advance_back_in_time_keeps_the_time_and_fires_what_is_due() {
        let mut wheel = TimerWheel::new(1_000);
        wheel.insert(1_000, 'a');
        wheel.insert(1_001, 'b');
        assert_eq!(advanced(&mut wheel, 5), ['a']);
        assert_eq!(wheel.now_ms(), 1_000);
        assert_eq!(advanced(&mut wheel, 1_001), ['b']);
    }

    #[test]
    fn many_timers_with_the_same_deadline_fire_in_insertion_order() {
        let mut wheel = TimerWheel::new(7);
        let deadline_ms = 7 + 3_000_000;
        let handles: Vec<_> = (0..10_000u32).map(|i| wheel.insert(deadline_ms, i)).collect();
        for handle in handles.iter().step_by(3) {
            wheel.cancel(*handle);
        }
        let expected: Vec<u32> = (0..10_000).filter(|i| i % 3 != 0).collect();
        assert_eq!(wheel.len(), expected.len());
        assert_eq!(advanced(&mut wheel, deadline_ms - 1), []);
        assert_eq!(advanced(&mut wheel, deadline_ms), expected);
    }

    #[test]
    fn big_jump_fires_everything_due_in_order() {
        let mut random = SplitMix(7);
        let mut wheel = TimerWheel::new(0);
        let mut expected = Vec::new();
        for i in 0..50_000u32 {
            let deadline_ms = match i % 4 {
                0 => random.below(1_000),
                1 => random.below(86_400_000),
                _ => random.below(1_000_000_000_000),
            };
            wheel.insert(deadline_ms, i);
            expected.push((deadline_ms, i));
        }
        let beyond_ms = 1_000_000_000_001;
        wheel.insert(beyond_ms, u32::MAX);
        expected.sort();
        let fired = advanced(&mut wheel, 1_000_000_000_000);
        let expected: Vec<u32> = expected.iter().map(|&(_, i)| i).collect();
        assert_eq!(fired, expected);
        assert_eq!(wheel.len(), 1);
        assert_eq!(wheel.next_deadline_ms(), Some(beyond_ms));
    }

    #[test]
    fn far_future_deadlines() {
        let mut wheel = TimerWheel::new(0);
        let half = wheel.insert(u64::MAX / 2, 'h');
        wheel.insert(u64::MAX, 'm');
        wheel.insert(u64::MAX / 2 + 1, 'i');
        assert_eq!(wheel.deadline_ms(half), u64::MAX / 2);
        assert_eq!(advanced(&mut wheel, u64::MAX / 2 - 1), []);
        assert_eq!(advanced(&mut wheel, u64::MAX / 2), ['h']);
        assert_eq!(wheel.next_deadline_ms(), Some(u64::MAX / 2 + 1));
        assert_eq!(advanced(&mut wheel, u64::MAX - 1), ['i']);
        assert_eq!(advanced(&mut wheel, u64::MAX), ['m']);
        // At the end of time, everything is due at once.
        wheel.insert(u64::MAX, 'n');
        wheel.insert(3, 'o');
        assert_eq!(advanced(&mut wheel, u64::MAX), ['o', 'n']);
    }

    #[test]
    fn next_deadline_loop_reaches_far_deadlines_in_few_steps() {
        for deadline_ms in [u64::MAX / 2, u64::MAX, 86_400_000, 1 << 36, (1 << 36) - 1] {
            let mut wheel = TimerWheel::new(12_345);
            wheel.insert(deadline_ms, ());
            let mut fired = Vec::new();
            let mut steps = 0;
            while fired.is_empty() {
                let next_ms = wheel.next_deadline_ms().unwrap();
                assert!(next_ms <= deadline_ms);
                wheel.advance(next_ms, &mut fired);
                steps += 1;
            }
            assert!(steps <= LEVELS, "{steps} steps to reach {deadline_ms}");
            assert_eq!(wheel.now_ms(), deadline_ms);
        }
    }

    #[test]
    fn next_deadline_is_exact_for_near_timers() {
        let mut wheel = TimerWheel::new(1_000);
        assert_eq!(wheel.next_deadline_ms(), None);
        // 1_000 is 15 * 64 + 40: 1_001..=1_023 are in level 0's current rotation.
        for deadline_ms in [1_023, 1_010, 1_001] {
            wheel.insert(deadline_ms, deadline_ms);
            assert_eq!(wheel.next_deadline_ms(), Some(deadline_ms));
        }
        assert_eq!(advanced(&mut wheel, 1_001), [1_001]);
        assert_eq!(wheel.next_deadline_ms(), Some(1_010));
        assert_eq!(advanced(&mut wheel, 1_020), [1_010]);
        assert_eq!(wheel.next_deadline_ms(), Some(1_023));
    }

    #[test]
    fn next_deadline_makes_progress() {
        let mut wheel = TimerWheel::new(0);
        wheel.insert(100, 'a');
        // 100 is in level 1 (slot 1, starting at 64): the answer is a lower bound.
        assert_eq!(wheel.next_deadline_ms(), Some(64));
        assert_eq!(advanced(&mut wheel, 64), []);
        // Advancing to it cascaded the timer into level 0: now it is exact.
        assert_eq!(wheel.next_deadline_ms(), Some(100));
        assert_eq!(advanced(&mut wheel, 100), ['a']);
        assert_eq!(wheel.next_deadline_ms(), None);
    }

    #[test]
    fn empty_wheel_advances_its_time() {
        let mut wheel = TimerWheel::<u8>::new(0);
        assert_eq!(advanced(&mut wheel, 1_000_000_000_000), []);
        assert_eq!(wheel.now_ms(), 1_000_000_000_000);
        assert_eq!(wheel.next_deadline_ms(), None);
    }

    #[test]
    #[should_panic(expected = "more than TIMERS_MAX")]
    fn capacity_past_the_limit_panics() {
        TimerWheel::<u32>::with_capacity(0, TIMERS_MAX + 1);
    }

    /// The reference: timers keyed by (deadline, insertion sequence), which is
    /// exactly the order the wheel promises to fire them in.
    #[derive(Default)]
    struct Model {
        timers: BTreeMap<(u64, u32), u32>,
        handles: Vec<(TimerHandle, (u64, u32))>,
        sequence: u32,
    }

    impl Model {
        fn insert(&mut self, wheel: &mut TimerWheel<u32>, deadline_ms: u64) {
            let key = (deadline_ms, self.sequence);
            self.sequence += 1;
            let handle = wheel.insert(deadline_ms, key.1);
            self.timers.insert(key, key.1);
            self.handles.push((handle, key));
        }

        fn cancel(&mut self, wheel: &mut TimerWheel<u32>, pick: usize) {
            // Handles of fired timers are dropped here, lazily.
            let (handle, key) = loop {
                if self.handles.is_empty() {
                    return;
                }
                let (handle, key) = self.handles.swap_remove(pick % self.handles.len());
                if self.timers.contains_key(&key) {
                    break (handle, key);
                }
            };
            assert_eq!(wheel.deadline_ms(handle), key.0);
            assert_eq!(wheel.cancel(handle), key.1);
            self.timers.remove(&key);
        }

        /// Advances both and checks that the wheel fired exactly what was due.
        fn advance(&mut self, wheel: &mut TimerWheel<u32>, now_ms: u64) -> usize {
            let mut fired = Vec::new();
            wheel.advance(now_ms, &mut fired);
            let now_ms = wheel.now_ms();
            let still_scheduled = match now_ms.checked_add(1) {
                Some(after_ms) => self.timers.split_off(&(after_ms, 0)),
                None => BTreeMap::new(),
            };
            let due = std::mem::replace(&mut self.timers, still_scheduled);
            let expected: Vec<u32> = due.values().copied().collect();
            assert_eq!(fired, expected, "fired at {now_ms}");
            fired.len()
        }

        fn check(&self, wheel: &TimerWheel<u32>) {
            assert_eq!(wheel.len(), self.timers.len());
            match self.timers.keys().next() {
                None => assert_eq!(wheel.next_deadline_ms(), None),
                Some(&(earliest_ms, _)) => {
                    let next_ms = wheel.next_deadline_ms().expect("a timer is scheduled");
                    assert!(next_ms <= earliest_ms, "next {next_ms} after {earliest_ms}");
                }
            }
        }

        /// Follows `next_deadline_ms` until the earliest timer fires.
        fn advance_to_next_deadline(&mut self, wheel: &mut TimerWheel<u32>) {
            let Some(&(earliest_ms, _)) = self.timers.keys().next() else {
                return;
            };
            for _ in 0..LEVELS {
                let next_ms = wheel.next_deadline_ms().expect("a timer is scheduled");
                assert!(next_ms <= earliest_ms);
                if self.advance(wheel, next_ms) > 0 {
                    assert!(!self.timers.contains_key(&(earliest_ms, 0)));
                    return;
                }
            }
            panic!("the earliest timer, due at {earliest_ms}, did not fire in {LEVELS} steps");
        }
    }

    #[derive(Clone, Debug)]
    enum Operation {
        Insert { offset_ms: u64 },
        InsertInThePast { before_ms: u64 },
        Cancel { pick: usize },
        Advance { step_ms: u64 },
        AdvanceToNextDeadline,
    }

    fn operation() -> impl Strategy<Value = Operation> {
        let offset_ms = prop_oneof![Just(0u64), 0..64u64, 0..5_000u64, 0..200_000_000u64,];
        let step_ms = prop_oneof![Just(0u64), 0..70u64, 0..300_000u64, 0..250_000_000u64, 0..1_000_000_000_000u64,];
        prop_oneof![
            4 => offset_ms.prop_map(|offset_ms| Operation::Insert { offset_ms }),
            1 => (0..100_000u64).prop_map(|before_ms| Operation::InsertInThePast { before_ms }),
            2 => any::<usize>().prop_map(|pick| Operation::Cancel { pick }),
            2 => step_ms.prop_map(|step_ms| Operation::Advance { step_ms }),
            1 => Just(Operation::AdvanceToNextDeadline),
        ]
    }

    fn start_ms() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            0..1_000_000u64,
            // Just before rotations of the high levels wrap.
            ((1u64 << 36) - 100_000)..((1u64 << 36) + 100),
            ((1u64 << 48) - 300_000_000)..(1u64 << 48),
            // Near the end of time, where deadlines saturate at u64::MAX.
            (u64::MAX - 1_000_000_000)..=u64::MAX,
        ]
    }

    fn run_model(wheel: &mut TimerWheel<u32>, model: &mut Model, operation: &Operation) {
        match *operation {
            Operation::Insert { offset_ms } => {
                let deadline_ms = wheel.now_ms().saturating_add(offset_ms);
                model.insert(wheel, deadline_ms);
            }
            Operation::InsertInThePast { before_ms } => {
                let deadline_ms = wheel.now_ms().saturating_sub(before_ms);
                model.insert(wheel, deadline_ms);
            }
            Operation::Cancel { pick } => model.cancel(wheel, pick),
            Operation::Advance { step_ms } => {
                model.advance(wheel, wheel.now_ms().saturating_add(step_ms));
            }
            Operation::AdvanceToNextDeadline => model.advance_to_next_deadline(wheel),
        }
        model.check(wheel);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn wheel_matches_a_sorted_map(
            start_ms in start_ms(),
            operations in prop::collection::vec(operation(), 1..300),
        ) {
            let mut wheel = TimerWheel::new(start_ms);
            let mut model = Model::default();
            for operation in &operations {
                run_model(&mut wheel, &mut model, operation);
                wheel.check_invariants();
            }
            // Drain: everything left fires, in order, by following next_deadline_ms.
            while !model.timers.is_empty() {
                model.advance_to_next_deadline(&mut wheel);
            }
            prop_assert!(wheel.is_empty());
        }
    }

    /// Long seeded runs with many timers per slot; the seed is in every message.
    #[test]
    fn wheel_matches_a_sorted_map_on_long_seeded_runs() {
        for seed in 1..=4u64 {
            let mut random = SplitMix(seed);
            let mut wheel = TimerWheel::new(random.below(1 << 40));
            let mut model = Model::default();
            for step in 0..40_000 {
                let operation = match random.below(11) {
                    10 => Operation::InsertInThePast { before_ms: random.below(1_000) },
                    0..=4 => Operation::Insert {
                        offset_ms: match random.below(4) {
                            0 => random.below(64),
                            1 => random.below(100_000),
                            _ => random.below(200_000_000),
                        },
                    },
                    5..=6 => Operation::Cancel { pick: random.next() as usize },
                    7..=8 => Operation::Advance {
                        step_ms: match random.below(3) {
                            0 => random.below(10),
                            1 => random.below(100_000),
                            _ => random.below(50_000_000),
                        },
                    },
                    _ => Operation::AdvanceToNextDeadline,
                };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_model(&mut wheel, &mut model, &operation);
                    if step % 1_000 == 0 {
                        wheel.check_invariants();
                    }
                }));
                if let Err(panic) = result {
                    eprintln!("seed {seed}, step {step}, {operation:?}");
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}
