//! A map by event key (a SipHash of the event id, [`super::key_of`]), the
//! agent's largest structure: its maps of tracked events and unfinished
//! rows hold an entry per event (200,000 unfinished rows at 10 M rows).
//!
//! It is an open-addressing table with linear probing, in [`PARTS`] parts
//! chosen by the key's top bits, each an array of `(key, value)` slots with
//! no other overhead. A part grows by an eighth when it is [`MAX_LOAD`] full,
//! so a map that fills is between 75 and 85 % full (removals leave the slots
//! in place, as a `HashMap`'s); the parts grow one after the other, never
//! two copies of the whole map at once. A `HashMap` (SwissTable)
//! keeps a control byte per slot and doubles its size, so it is between 44
//! and 88 % full: the same entries took up to 1.8 times the memory, and one
//! doubling of the tracked events at about 230,000 set the agent's peak RSS
//! (docs/performance.md, "Memory at 200,000 unfinished rows: a leaner
//! state").
//!
//! The empty slot is key 0; the entry whose key is 0 (one event id in 2⁶⁴)
//! is kept beside the slots. A slot's home is a mix of the key (the small
//! keys of tests spread as SipHash keys do), and a removed entry is filled
//! by shifting back the entries after it that may move (no tombstones), so
//! a search ends at the first empty slot.

use std::mem;

/// How many tables a [`KeyMap`] is split into.
pub const PARTS: usize = 16;

/// A part grows when it would be more than `MAX_LOAD.0 / MAX_LOAD.1` full.
pub const MAX_LOAD: (usize, usize) = (17, 20);

/// The slots of a part that has none yet.
const FIRST_SLOTS: usize = 8;

/// A map from event key to `V`, in [`PARTS`] parts.
#[derive(Debug)]
pub struct KeyMap<V> {
    parts: Box<[Part<V>; PARTS]>,
    len: usize,
}

/// One open-addressing table.
#[derive(Debug)]
struct Part<V> {
    /// `(key, value)`; key 0 is an empty slot (its value the default).
    slots: Box<[(u64, V)]>,
    /// Occupied slots.
    used: usize,
    /// The entry with key 0.
    zero: Option<V>,
}

impl<V> Default for Part<V> {
    fn default() -> Self {
        Part {
            slots: Box::new([]),
            used: 0,
            zero: None,
        }
    }
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            parts: Box::new(std::array::from_fn(|_| Part::default())),
            len: 0,
        }
    }
}

/// The part of `key`: its top bits.
fn part(key: u64) -> usize {
    (key >> (u64::BITS - PARTS.trailing_zeros())) as usize
}

/// splitmix64's finaliser: a bijection of 64 bits whose every output bit
/// depends on every input bit.
pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where `key`'s probe starts in `n` slots: the [`mix`] of the key, scaled
/// to `n` (its high bits, which depend on every bit of the key).
fn home(key: u64, n: usize) -> usize {
    ((u128::from(mix(key)) * n as u128) >> 64) as usize
}

/// The key 0 of [`Part::zero`], to lend out as the others are.
static ZERO: u64 = 0;

impl<V: Default> Part<V> {
    /// The slot holding `key` (not 0), or the empty slot where it would go.
    fn find(&self, key: u64) -> Result<usize, usize> {
        let n = self.slots.len();
        let mut i = home(key, n);
        loop {
            match self.slots[i].0 {
                0 => return Err(i),
                k if k == key => return Ok(i),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
    }

    fn get(&self, key: u64) -> Option<&V> {
        if key == 0 {
            return self.zero.as_ref();
        }
        if self.used == 0 {
            return None;
        }
        self.find(key).ok().map(|i| &self.slots[i].1)
    }

    fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == 0 {
            return self.zero.as_mut();
        }
        if self.used == 0 {
            return None;
        }
        self.find(key).ok().map(|i| &mut self.slots[i].1)
    }

    /// Inserts `value`, returning the one it replaced.
    fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if key == 0 {
            return self.zero.replace(value);
        }
        if (self.used + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.grow();
        }
        match self.find(key) {
            Ok(i) => Some(mem::replace(&mut self.slots[i].1, value)),
            Err(i) => {
                self.slots[i] = (key, value);
                self.used += 1;
                None
            }
        }
    }

    /// Moves every entry into a table an eighth larger: each entry is
    /// moved about eight times as the map fills (twice as often as a table
    /// that doubles), for 75–85 % of the slots used instead of 44–88 %.
    fn grow(&mut self) {
        let n = self.slots.len();
        let bigger = (n + n / 8).max(n + FIRST_SLOTS);
        let old = mem::replace(
            &mut self.slots,
            std::iter::repeat_with(|| (0, V::default()))
                .take(bigger)
                .collect(),
        );
        for (k, v) in old.into_vec() {
            if k != 0 {
                let Err(i) = self.find(k) else {
                    unreachable!("each key is in one slot")
                };
                self.slots[i] = (k, v);
            }
        }
    }

    fn remove(&mut self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero.take();
        }
        if self.used == 0 {
            return None;
        }
        let mut hole = self.find(key).ok()?;
        let value = mem::take(&mut self.slots[hole].1);
        self.slots[hole].0 = 0;
        self.used -= 1;
        // Shift back each entry after the hole, up to the next empty slot,
        // whose probe passed the hole: the hole then moves to where it was.
        let n = self.slots.len();
        let mut j = hole;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let k = self.slots[j].0;
            if k == 0 {
                break;
            }
            let from_home = (j + n - home(k, n)) % n;
            let from_hole = (j + n - hole) % n;
            if from_home >= from_hole {
                self.slots.swap(hole, j);
                hole = j;
            }
        }
        Some(value)
    }

    /// Keeps the entries for which `keep` is true; returns how many it removed.
    fn retain(&mut self, keep: &mut impl FnMut(&u64, &mut V) -> bool) -> usize {
        let zero_gone = self.zero.as_mut().is_some_and(|v| !keep(&0, v));
        if zero_gone {
            self.zero = None;
        }
        let gone: Vec<u64> = self
            .slots
            .iter_mut()
            .filter(|(k, _)| *k != 0)
            .filter_map(|(k, v)| (!keep(k, v)).then_some(*k))
            .collect();
        for k in &gone {
            self.remove(*k);
        }
        gone.len() + usize::from(zero_gone)
    }

    /// Empties the part, keeping its slots for what comes next.
    fn clear(&mut self) {
        for slot in self.slots.iter_mut() {
            *slot = (0, V::default());
        }
        self.used = 0;
        self.zero = None;
    }

    fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        let zero = self.zero.as_ref().map(|v| (&ZERO, v));
        zero.into_iter().chain(
            self.slots
                .iter()
                .filter(|(k, _)| *k != 0)
                .map(|(k, v)| (k, v)),
        )
    }
}

impl<V: Default> KeyMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: &u64) -> Option<&V> {
        self.parts[part(*key)].get(*key)
    }

    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        self.parts[part(*key)].get_mut(*key)
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.get(key).is_some()
    }

    /// Inserts `value`, returning the one it replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        let old = self.parts[part(key)].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let removed = self.parts[part(*key)].remove(*key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&u64, &mut V) -> bool) {
        for p in self.parts.iter_mut() {
            self.len -= p.retain(&mut keep);
        }
    }

    /// Empties the map, keeping its memory for what comes next (as
    /// `HashMap::clear`).
    pub fn clear(&mut self) {
        for p in self.parts.iter_mut() {
            p.clear();
        }
        self.len = 0;
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.parts.iter().flat_map(Part::iter)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// The slots of all parts, full or empty: what the map's memory holds.
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.parts.iter().map(|p| p.slots.len()).sum()
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
        m.retain(|_, v| {
            *v += 1;
            true
        });
        assert_eq!(m.len(), truth.len());
        assert_eq!(m.get(&keys[2]), truth.get(&keys[2]).map(|v| v + 1).as_ref());
        m.clear();
        assert!(m.len() == 0 && m.get(&keys[2]).is_none());
    }

    /// Inserts, replacements and removals in random order, over small keys
    /// (0 among them, and many in one part) and SipHash keys, agree with a
    /// `HashMap` after every step: the shifts after a removal, across the
    /// end of a part's slots too, keep every entry findable.
    #[test]
    fn churn_agrees_with_a_hash_map() {
        let mut m = KeyMap::new();
        let mut truth = HashMap::new();
        let mut rng = fastrand::Rng::with_seed(7);
        let keys: Vec<u64> = (0..600u64)
            .chain((0..600).map(|i| super::super::key_of(&format!("evt-{i}"))))
            .collect();
        for step in 0..60_000usize {
            let k = keys[rng.usize(..keys.len())];
            match rng.u8(..10) {
                0..=5 => assert_eq!(m.insert(k, step), truth.insert(k, step)),
                6..=8 => assert_eq!(m.remove(&k), truth.remove(&k)),
                _ => {
                    let odd = rng.bool();
                    m.retain(|k, v| (*k % 2 == 1) == odd || *v % 3 != 0);
                    truth.retain(|k, v| (*k % 2 == 1) == odd || *v % 3 != 0);
                }
            }
            assert_eq!(m.len(), truth.len());
            if step % 97 == 0 {
                for k in &keys {
                    assert_eq!(m.get(k), truth.get(k), "step {step}, key {k}");
                }
                assert_eq!(m.iter().count(), truth.len());
            }
        }
        for k in &keys {
            assert_eq!(m.get(k), truth.get(k));
        }
    }

    /// Guards the memory figures (docs/performance.md, "Memory at 200,000
    /// unfinished rows: a leaner state"): at any size a map's slots are
    /// at most an eighth more than `MAX_LOAD` needs, and at least that.
    #[test]
    fn the_slots_stay_between_75_and_85_percent_full() {
        let mut m = KeyMap::new();
        for i in 0..300_000u64 {
            m.insert(super::super::key_of(&i.to_string()), ());
            let n = m.len();
            if n % 10_000 == 0 {
                let slots = m.slots();
                assert!(slots * MAX_LOAD.0 >= n * MAX_LOAD.1, "{n} in {slots}");
                assert!(
                    slots * 8 <= n * MAX_LOAD.1 / MAX_LOAD.0 * 9 + PARTS * 128,
                    "{n} in {slots}"
                );
            }
        }
        assert_eq!(size_of::<(u64, ())>(), 8);
    }
}
