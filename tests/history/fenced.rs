//! A resource protected by fencing tokens (docs/protocol.md §2): for each key it keeps
//! the highest token it has accepted and refuses a write with a lower token.
//! The holder of that highest token may write again, so that one holder can
//! make several writes in its critical section. It stands for the storage a
//! lock holder writes to.

use std::collections::HashMap;
use std::sync::Mutex;

use super::History;

/// What the resource did with a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Accepted,
    /// A write with token `highest`, greater than this one, was accepted before.
    Refused {
        highest: u64,
    },
}

/// The fenced resource; share it by reference between client threads.
pub struct FencedResource {
    history: History,
    highest: Mutex<HashMap<String, u64>>,
}

impl FencedResource {
    /// A resource that notes every write it decides in `history`.
    pub fn new(history: History) -> FencedResource {
        FencedResource { history, highest: Mutex::new(HashMap::new()) }
    }

    /// Writes to `key` with `token`: accepted unless a greater token was
    /// accepted for `key` before.
    pub fn write(&self, key: &str, token: u64) -> WriteOutcome {
        let mut highest = self.highest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let outcome = match highest.get(key) {
            Some(&last) if token < last => WriteOutcome::Refused { highest: last },
            _ => {
                highest.insert(key.to_string(), token);
                WriteOutcome::Accepted
            }
        };
        // Noted under the lock, so that the history has the writes in the
        // order the resource decided them.
        self.history.write(key, token, outcome == WriteOutcome::Accepted);
        outcome
    }
}
