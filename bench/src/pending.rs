//! The requests one connection has in flight, found by (operation, key).
//!
//! ringlock may answer out of order, but every reply names its operation and
//! key, and replies for one (op, key) on one connection keep the order of the
//! requests. So each connection keeps, per (op, key) it has in flight, a FIFO
//! of the lanes that sent it: an open-addressing table of list heads, the
//! lists threaded through the lanes themselves. Nothing is allocated after
//! the table is built; it never holds more entries than the connection has
//! lanes, and it is sized for a load of at most one half.

/// No lane: the end of a list.
pub const NO_LANE: u32 = u32::MAX;

/// What a lane is waiting for the answer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PendingOp {
    Acquire = 1,
    Release = 2,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// `op << 60 | key + 1`; 0 marks an empty slot.
    tag: u64,
    head: u32,
    tail: u32,
}

const EMPTY: Entry = Entry { tag: 0, head: NO_LANE, tail: NO_LANE };

/// The largest key number a tag can hold.
pub const KEY_ID_MAX: u64 = (1 << 60) - 2;

fn tag(op: PendingOp, key: u64) -> u64 {
    debug_assert!(key <= KEY_ID_MAX);
    (op as u64) << 60 | (key + 1)
}

/// The FIFOs of one connection; `next` is the per-lane link array.
pub struct PendingTable {
    entries: Box<[Entry]>,
    mask: usize,
    shift: u32,
}

impl PendingTable {
    /// A table for a connection with `lanes` lanes.
    pub fn new(lanes: usize) -> PendingTable {
        let size = (lanes * 2).next_power_of_two().max(16);
        PendingTable {
            entries: vec![EMPTY; size].into_boxed_slice(),
            mask: size - 1,
            shift: 64 - size.trailing_zeros(),
        }
    }

    fn home(&self, tag: u64) -> usize {
        (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    fn find(&self, tag: u64) -> Result<usize, usize> {
        let mut index = self.home(tag);
        loop {
            let entry = &self.entries[index];
            if entry.tag == tag {
                return Ok(index);
            }
            if entry.tag == 0 {
                return Err(index);
            }
            index = (index + 1) & self.mask;
        }
    }

    /// Appends `lane` to the FIFO of (op, key).
    pub fn push(&mut self, op: PendingOp, key: u64, lane: u32, next: &mut [u32]) {
        let tag = tag(op, key);
        next[lane as usize] = NO_LANE;
        match self.find(tag) {
            Ok(index) => {
                let entry = &mut self.entries[index];
                next[entry.tail as usize] = lane;
                entry.tail = lane;
            }
            Err(index) => self.entries[index] = Entry { tag, head: lane, tail: lane },
        }
    }

    /// Takes the first lane of the FIFO of (op, key), if any.
    pub fn pop(&mut self, op: PendingOp, key: u64, next: &[u32]) -> Option<u32> {
        let index = self.find(tag(op, key)).ok()?;
        let entry = &mut self.entries[index];
        let lane = entry.head;
        entry.head = next[lane as usize];
        if entry.head == NO_LANE {
            self.remove_at(index);
        }
        Some(lane)
    }

    /// Backward-shift deletion: entries after the hole that would no longer
    /// be reachable from their home slot move into it.
    fn remove_at(&mut self, mut hole: usize) {
        let mut index = hole;
        loop {
            index = (index + 1) & self.mask;
            let entry = self.entries[index];
            if entry.tag == 0 {
                break;
            }
            let home = self.home(entry.tag);
            // The entry may fill the hole if its home is not in (hole, index].
            let distance_to_entry = index.wrapping_sub(home) & self.mask;
            let distance_to_hole = index.wrapping_sub(hole) & self.mask;
            if distance_to_entry >= distance_to_hole {
                self.entries[hole] = entry;
                hole = index;
            }
        }
        self.entries[hole] = EMPTY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    #[test]
    fn fifo_per_op_and_key() {
        let mut next = vec![NO_LANE; 8];
        let mut table = PendingTable::new(8);
        table.push(PendingOp::Acquire, 5, 0, &mut next);
        table.push(PendingOp::Acquire, 5, 1, &mut next);
        table.push(PendingOp::Release, 5, 2, &mut next);
        table.push(PendingOp::Acquire, 6, 3, &mut next);
        assert_eq!(table.pop(PendingOp::Acquire, 5, &next), Some(0));
        assert_eq!(table.pop(PendingOp::Release, 5, &next), Some(2));
        assert_eq!(table.pop(PendingOp::Acquire, 5, &next), Some(1));
        assert_eq!(table.pop(PendingOp::Acquire, 5, &next), None);
        assert_eq!(table.pop(PendingOp::Acquire, 6, &next), Some(3));
    }

    #[test]
    fn agrees_with_a_model_under_churn() {
        // Every lane has at most one request in flight, as in the load generator.
        let lanes = 64;
        let mut next = vec![NO_LANE; lanes];
        let mut table = PendingTable::new(lanes);
        let mut model: HashMap<(u8, u64), VecDeque<u32>> = HashMap::new();
        let mut busy: Vec<Option<(PendingOp, u64)>> = vec![None; lanes];
        let mut state = 0x1234_5678_u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200_000 {
            let lane = (random() % lanes as u64) as usize;
            match busy[lane] {
                None => {
                    let op = if random() % 2 == 0 { PendingOp::Acquire } else { PendingOp::Release };
                    let key = random() % 40;
                    table.push(op, key, lane as u32, &mut next);
                    model.entry((op as u8, key)).or_default().push_back(lane as u32);
                    busy[lane] = Some((op, key));
                }
                Some((op, key)) => {
                    let expected = model.get_mut(&(op as u8, key)).and_then(VecDeque::pop_front);
                    let got = table.pop(op, key, &next);
                    assert_eq!(got, expected);
                    busy[got.unwrap() as usize] = None;
                }
            }
        }
    }
}
