//! A map by event key (a SipHash of the event id, [`super::key_of`]) kept
//! in [`PARTS`] hash maps chosen by the key's top bits, so that growing it
//! never holds two copies of the whole table at once.
//!
//! A hash map grows by allocating a table twice the size and moving every
//! entry over before the old one is freed: for a moment it needs three times
//! its size. The agent's maps of tracked events and unfinished rows are most
//! of its memory (200,000 unfinished rows at 10 M rows: about 15 MB each), so
//! one growth of one map set the agent's peak RSS (docs/performance.md,
//! "Memory at 10 M rows: the maps"). Split, a growth moves one part, a
//! sixteenth of the entries; the parts fill evenly, so together they hold
//! what one map would.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// How many maps a [`KeyMap`] is split into.
pub const PARTS: usize = 16;

/// A map from event key to `V`, in [`PARTS`] parts.
#[derive(Debug)]
pub struct KeyMap<V> {
    parts: Box<[HashMap<u64, V>; PARTS]>,
    len: usize,
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            parts: Box::new(std::array::from_fn(|_| HashMap::new())),
            len: 0,
        }
    }
}

/// The part of `key`: its top bits (the low bits choose the bucket within a
/// part, so the two stay independent).
fn part(key: u64) -> usize {
    (key >> (u64::BITS - PARTS.trailing_zeros())) as usize
}

impl<V> KeyMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: &u64) -> Option<&V> {
        self.parts[part(*key)].get(key)
    }

    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        self.parts[part(*key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.parts[part(*key)].contains_key(key)
    }

    /// Inserts `value`, returning the one it replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        match self.parts[part(key)].entry(key) {
            Entry::Occupied(mut e) => Some(e.insert(value)),
            Entry::Vacant(e) => {
                e.insert(value);
                self.len += 1;
                None
            }
        }
    }

    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let removed = self.parts[part(*key)].remove(key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&u64, &mut V) -> bool) {
        for p in self.parts.iter_mut() {
            p.retain(&mut keep);
        }
        self.len = self.parts.iter().map(HashMap::len).sum();
    }

    /// Empties the map, keeping its memory for what comes next (as
    /// [`HashMap::clear`]).
    pub fn clear(&mut self) {
        for p in self.parts.iter_mut() {
            p.clear();
        }
        self.len = 0;
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.parts.iter().flat_map(HashMap::iter)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.parts.iter().flat_map(HashMap::values)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.parts.iter_mut().flat_map(HashMap::values_mut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The same operations on a `KeyMap` and a `HashMap` give the same
    /// contents, lengths and answers, with keys spread over every part.
    #[test]
    fn behaves_as_one_hash_map() {
        let mut m = KeyMap::new();
        let mut truth = HashMap::new();
        // Keys from a SipHash, as the agent's are, so every part is used.
        let keys: Vec<u64> = (0..5_000)
            .map(|i| super::super::key_of(&format!("event-{i}")))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.insert(*k, i), truth.insert(*k, i));
        }
        // Replacing does not change the length.
        assert_eq!(m.insert(keys[7], 70), truth.insert(keys[7], 70));
        assert_eq!(m.len(), truth.len());
        let used: std::collections::HashSet<usize> = keys.iter().map(|k| part(*k)).collect();
        assert_eq!(used.len(), PARTS, "SipHash keys fill every part");
        for k in keys.iter().step_by(3) {
            assert_eq!(m.remove(k), truth.remove(k));
            assert_eq!(m.remove(k), None);
        }
        m.retain(|_, v| *v % 2 == 0);
        truth.retain(|_, v| *v % 2 == 0);
        assert_eq!(m.len(), truth.len());
        if let Some(v) = m.get_mut(&keys[2]) {
            *v += 1;
        }
        if let Some(v) = truth.get_mut(&keys[2]) {
            *v += 1;
        }
        for k in &keys {
            assert_eq!(m.get(k), truth.get(k));
            assert_eq!(m.contains_key(k), truth.contains_key(k));
        }
        let mut all: Vec<(u64, usize)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        let mut want: Vec<(u64, usize)> = truth.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable();
        want.sort_unstable();
        assert_eq!(all, want);
        assert_eq!(m.values().count(), truth.len());
        for v in m.values_mut() {
            *v += 1;
        }
        assert_eq!(m.get(&keys[2]), truth.get(&keys[2]).map(|v| v + 1).as_ref());
        m.clear();
        assert!(m.len() == 0 && m.get(&keys[2]).is_none());
    }
}
