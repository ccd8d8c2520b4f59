//! Pairing replies with the requests in flight on one connection.
//!
//! Replies may come back in any order, but each echoes its request's
//! operation and key, and replies for the same (op, key) on one connection
//! come back in the order the requests were sent (docs/protocol.md §3). So a connection
//! keeps, for each (op, key) it has in flight, a FIFO queue of requests, and
//! a reply takes the oldest request of its (op, key).
//!
//! The table is keyed by a hash of (op, key) rather than by an owned copy of
//! the key, so that pushing a request allocates nothing in the common case;
//! requests whose (op, key) share a hash share a queue, and a reply takes
//! the oldest request in it that has exactly its (op, key).

use std::collections::VecDeque;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasher, RandomState};

use crate::proto::Op;

/// What the table needs to know of a request.
pub(crate) trait Paired {
    fn op(&self) -> Op;
    fn key(&self) -> &[u8];
}

/// The requests in flight on one connection, by (op, key).
#[derive(Debug)]
pub(crate) struct Pairing<T, S = RandomState> {
    queues: HashMap<u64, Queue<T>>,
    hasher: S,
    len: usize,
}

/// The requests of one hash, oldest first. Most of the time a key has one
/// request in flight, which needs no allocation beyond the map's slot.
#[derive(Debug)]
enum Queue<T> {
    One(T),
    Many(VecDeque<T>),
}

impl<T: Paired> Pairing<T> {
    pub(crate) fn new() -> Pairing<T> {
        Pairing::with_hasher(RandomState::new())
    }
}

impl<T: Paired, S: BuildHasher> Pairing<T, S> {
    /// A table hashing (op, key) with `hasher`.
    pub(crate) fn with_hasher(hasher: S) -> Pairing<T, S> {
        Pairing { queues: HashMap::new(), hasher, len: 0 }
    }

    /// Requests in flight.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn hash(&self, op: Op, key: &[u8]) -> u64 {
        self.hasher.hash_one((op.as_byte(), key))
    }

    /// Records `request` as sent after every request already in the table.
    pub(crate) fn push(&mut self, request: T) {
        let hash = self.hash(request.op(), request.key());
        match self.queues.entry(hash) {
            Entry::Vacant(vacant) => {
                vacant.insert(Queue::One(request));
            }
            Entry::Occupied(mut occupied) => {
                let queue = occupied.get_mut();
                if let Queue::One(_) = queue {
                    let Queue::One(first) = std::mem::replace(queue, Queue::Many(VecDeque::with_capacity(4))) else {
                        unreachable!("matched One above")
                    };
                    let Queue::Many(many) = queue else { unreachable!("just replaced") };
                    many.push_back(first);
                }
                let Queue::Many(many) = queue else { unreachable!("One was turned into Many") };
                many.push_back(request);
            }
        }
        self.len += 1;
    }

    /// Takes the oldest request in flight with this (op, key), which the
    /// reply answers; `None` if there is none (a reply nobody asked for).
    pub(crate) fn take(&mut self, op: Op, key: &[u8]) -> Option<T> {
        let hash = self.hash(op, key);
        let Entry::Occupied(mut occupied) = self.queues.entry(hash) else { return None };
        let matches = |request: &T| request.op() == op && request.key() == key;
        let taken = match occupied.get_mut() {
            Queue::One(request) => {
                if !matches(request) {
                    return None;
                }
                let Queue::One(request) = occupied.remove() else { unreachable!("matched One above") };
                request
            }
            Queue::Many(many) => {
                let position = many.iter().position(matches)?;
                let request = many.remove(position).expect("position is in the queue");
                if many.is_empty() {
                    occupied.remove();
                }
                request
            }
        };
        self.len -= 1;
        Some(taken)
    }

    /// Takes every request in flight, each (op, key) in the order sent.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut requests = Vec::with_capacity(self.len);
        for (_, queue) in self.queues.drain() {
            match queue {
                Queue::One(request) => requests.push(request),
                Queue::Many(many) => requests.extend(many),
            }
        }
        self.len = 0;
        requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Sent {
        op: Op,
        key: Vec<u8>,
        serial: usize,
    }

    impl Paired for Sent {
        fn op(&self) -> Op {
            self.op
        }
        fn key(&self) -> &[u8] {
            &self.key
        }
    }

    fn sent(op: Op, key: &[u8], serial: usize) -> Sent {
        Sent { op, key: key.to_vec(), serial }
    }

    #[test]
    fn same_op_and_key_pair_in_send_order() {
        let mut table = Pairing::new();
        table.push(sent(Op::Acquire, b"k", 1));
        table.push(sent(Op::Release, b"k", 2));
        table.push(sent(Op::Acquire, b"k", 3));
        table.push(sent(Op::Acquire, b"j", 4));
        assert_eq!(table.len(), 4);
        assert_eq!(table.take(Op::Acquire, b"k").map(|s| s.serial), Some(1));
        assert_eq!(table.take(Op::Acquire, b"j").map(|s| s.serial), Some(4));
        assert_eq!(table.take(Op::Acquire, b"k").map(|s| s.serial), Some(3));
        assert_eq!(table.take(Op::Acquire, b"k"), None);
        assert_eq!(table.take(Op::Extend, b"k"), None);
        assert_eq!(table.take(Op::Release, b"k").map(|s| s.serial), Some(2));
        assert_eq!(table.len(), 0);
        assert!(table.queues.is_empty(), "empty queues are dropped");
    }

    #[test]
    fn drain_keeps_send_order_per_op_and_key() {
        let mut table = Pairing::new();
        for serial in 0..10 {
            table.push(sent(Op::Acquire, if serial % 2 == 0 { b"a" } else { b"b" }, serial));
        }
        let drained = table.drain();
        assert_eq!(drained.len(), 10);
        assert_eq!(table.len(), 0);
        for key in [b"a", b"b"] {
            let serials: Vec<usize> = drained.iter().filter(|s| s.key == key).map(|s| s.serial).collect();
            assert!(serials.is_sorted(), "{serials:?}");
        }
    }

    /// Hashes everything to the same value, as if every (op, key) collided.
    #[derive(Clone, Default)]
    struct Colliding;

    impl BuildHasher for Colliding {
        type Hasher = Zero;
        fn build_hasher(&self) -> Zero {
            Zero
        }
    }

    struct Zero;

    impl std::hash::Hasher for Zero {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn a_shared_hash_still_pairs_by_exact_op_and_key() {
        let mut table = Pairing::with_hasher(Colliding);
        table.push(sent(Op::Acquire, b"x", 0));
        table.push(sent(Op::Acquire, b"y", 1));
        table.push(sent(Op::Release, b"x", 2));
        table.push(sent(Op::Acquire, b"x", 3));
        assert_eq!(table.queues.len(), 1);
        assert_eq!(table.take(Op::Acquire, b"y").map(|s| s.serial), Some(1));
        assert_eq!(table.take(Op::Acquire, b"z"), None);
        assert_eq!(table.take(Op::Acquire, b"x").map(|s| s.serial), Some(0));
        assert_eq!(table.take(Op::Acquire, b"x").map(|s| s.serial), Some(3));
        assert_eq!(table.take(Op::Release, b"x").map(|s| s.serial), Some(2));
        assert!(table.queues.is_empty());
    }

    proptest! {
        /// Against a model: a list of requests in send order, where a reply
        /// takes the first with its (op, key).
        #[test]
        fn agrees_with_a_list_model(actions in proptest::collection::vec((any::<bool>(), 0..3u8, 0..4u8), 0..200)) {
            let ops = [Op::Acquire, Op::Release, Op::Extend];
            let mut table = Pairing::new();
            let mut model: Vec<Sent> = Vec::new();
            for (serial, (is_push, op, key)) in actions.into_iter().enumerate() {
                let op = ops[usize::from(op)];
                let key = [b'a' + key];
                if is_push {
                    table.push(sent(op, &key, serial));
                    model.push(sent(op, &key, serial));
                } else {
                    let expected = model.iter().position(|s| s.op == op && s.key == key).map(|at| model.remove(at));
                    prop_assert_eq!(table.take(op, &key), expected);
                }
                prop_assert_eq!(table.len(), model.len());
            }
        }
    }
}
