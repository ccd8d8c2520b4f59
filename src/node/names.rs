//! The names clients authenticate as, numbered for the lock table.
//!
//! A grant records the name that took it as a [`NameId`], two bytes, so
//! that a held lock costs no more memory (see `ringlock_shards::NameId`). A
//! name keeps its number for the life of the process: numbers are given in
//! the order names are first seen (a `U` line, or a grant replicated from
//! the active) and never reused, so a reload of the auth file that reorders
//! or removes names changes no held grant's name. The number is local to
//! this process; between nodes a grant's name travels as its bytes.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use ringlock_shards::NameId;

/// The most names one process numbers: every `NameId` but
/// [`NameId::NONE`]. An auth file holds at most 10,000 names, so it takes
/// several reloads that each bring thousands of new names to reach it;
/// past it, a new name cannot authenticate until the process restarts.
pub const NAMES_MAX: usize = u16::MAX as usize;

#[derive(Default)]
struct Names {
    ids: HashMap<Arc<[u8]>, NameId>,
    /// The name of id `n` at `n - 1`.
    names: Vec<Arc<[u8]>>,
}

static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(Mutex::default);

/// The number of `name`, given now if it has none; `None` if
/// [`NAMES_MAX`] names are numbered already, or `name` is empty.
pub fn intern(name: &[u8]) -> Option<NameId> {
    if name.is_empty() {
        return None;
    }
    let mut names = NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&id) = names.ids.get(name) {
        return Some(id);
    }
    if names.names.len() >= NAMES_MAX {
        return None;
    }
    let name: Arc<[u8]> = Arc::from(name);
    names.names.push(name.clone());
    let id = NameId(names.names.len() as u16);
    names.ids.insert(name, id);
    Some(id)
}

/// The name numbered `id`, if any (none for [`NameId::NONE`]).
pub fn name_of(id: NameId) -> Option<Arc<[u8]>> {
    let index = usize::from(id.0).checked_sub(1)?;
    let names = NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    names.names.get(index).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_number_and_numbers_name_one_name_each() {
        let alpha = intern(b"names-test-alpha").unwrap();
        let beta = intern(b"names-test-beta").unwrap();
        assert_ne!(alpha, beta);
        assert_ne!(alpha, NameId::NONE);
        assert_eq!(intern(b"names-test-alpha"), Some(alpha), "seen again, the same number");
        assert_eq!(name_of(alpha).as_deref(), Some(&b"names-test-alpha"[..]));
        assert_eq!(name_of(beta).as_deref(), Some(&b"names-test-beta"[..]));
        assert_eq!(name_of(NameId::NONE), None);
        assert_eq!(intern(b""), None);
    }
}
