//! Ordering health of an inbox whose rows carry an ordering key and a
//! version (an integer per key): what the agent remembers of each key, and
//! the counters and gauges that memory gives (docs/metrics.md, "Ordering").
//!
//! A poll notes what it saw — an event's arrival (its version and
//! `received_at`), an event's success (its version and finish) — and the
//! notes are applied at the end of the poll in time order, so rows read in
//! cursor order, in pages or re-read without a cursor count as if seen in
//! the order they happened. Per key the agent keeps the versions that
//! arrived (as runs of consecutive versions), the highest version arrived
//! and the highest succeeded, with their times. At most `limit` keys are
//! kept: a new key past it makes the agent forget the least recently seen
//! one (the key whose last arrival or success was applied longest ago), and
//! that is counted.

use std::collections::{BTreeMap, HashMap, HashSet};

/// Runs of versions kept per key: past this many (a key whose versions skip
/// more than 15 times) the lowest run is forgotten, as if the key's
/// versions started above it.
pub const MAX_RUNS: usize = 16;

/// Consecutive versions `lo..=hi` that arrived, the first of them at `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    lo: i64,
    hi: i64,
    /// The earliest `received_at` among them (microseconds).
    first: i64,
}

/// A version and a time (microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    version: i64,
    at: i64,
}

/// What the agent remembers of one ordering key.
#[derive(Debug)]
struct Key {
    /// The versions that arrived, in ascending order; more than one run is
    /// a gap.
    runs: Vec<Run>,
    /// The highest version arrived, and when it first did.
    top: Option<Mark>,
    /// The highest version that succeeded, and when it first did.
    done: Option<Mark>,
    /// When the key was last seen, in applied notes: the key of the lowest
    /// is forgotten first.
    stamp: u64,
}

/// One thing a poll saw of an ordered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Note {
    /// An event arrived (`at`: its `received_at`). `counted`: a new event,
    /// not a row of the baseline, so that it can be out of order.
    Arrival {
        key: u64,
        version: i64,
        at: i64,
        counted: bool,
    },
    /// An event succeeded (`at`: its finish).
    Success { key: u64, version: i64, at: i64 },
}

impl Note {
    /// The order notes are applied in: by time, an arrival before a success
    /// at the same time.
    fn order(&self) -> (i64, u8) {
        match *self {
            Note::Arrival { at, .. } => (at, 0),
            Note::Success { at, .. } => (at, 1),
        }
    }
}

/// What applying one poll's notes counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Events that arrived after a higher version of their key had.
    pub arrivals: u64,
    /// Events that succeeded after a higher version of their key had.
    pub completions: u64,
    /// Keys forgotten to stay within the limit.
    pub evicted: u64,
}

/// The version gauges: keys with a gap, and the earliest arrival among the
/// versions above a gap (microseconds), if there is a gap.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gaps {
    pub keys: u64,
    pub oldest: Option<i64>,
}

/// The ordering keys of one source.
#[derive(Debug)]
pub struct Ordering {
    keys: HashMap<u64, Key>,
    /// Keys by stamp, least recently seen first.
    by_stamp: BTreeMap<u64, u64>,
    stamp: u64,
    limit: usize,
    /// Keys with more than one run.
    gapped: HashSet<u64>,
    notes: Vec<Note>,
}

impl Ordering {
    /// An empty memory of at most `limit` keys.
    pub fn new(limit: usize) -> Self {
        Ordering {
            keys: HashMap::new(),
            by_stamp: BTreeMap::new(),
            stamp: 0,
            limit: limit.max(1),
            gapped: HashSet::new(),
            notes: Vec::new(),
        }
    }

    /// Notes an event's arrival; `counted` for a new event (not a baseline row).
    pub fn arrival(&mut self, key: u64, version: i64, at: i64, counted: bool) {
        self.notes.push(Note::Arrival {
            key,
            version,
            at,
            counted,
        });
    }

    /// Notes an event's success.
    pub fn success(&mut self, key: u64, version: i64, at: i64) {
        self.notes.push(Note::Success { key, version, at });
    }

    /// Applies the poll's notes in time order and says what they counted.
    pub fn apply(&mut self) -> Counts {
        let mut notes = std::mem::take(&mut self.notes);
        notes.sort_by_key(Note::order);
        let mut counts = Counts::default();
        for note in &notes {
            match *note {
                Note::Arrival {
                    key,
                    version,
                    at,
                    counted,
                } => {
                    let k = self.touch(key, &mut counts);
                    if counted && k.top.is_some_and(|t| t.version > version && t.at < at) {
                        counts.arrivals += 1;
                    }
                    k.top = Some(higher(k.top, version, at));
                    add(&mut k.runs, version, at);
                    let gap = k.runs.len() > 1;
                    if gap {
                        self.gapped.insert(key);
                    } else {
                        self.gapped.remove(&key);
                    }
                }
                Note::Success { key, version, at } => {
                    let k = self.touch(key, &mut counts);
                    if k.done.is_some_and(|d| d.version > version && d.at < at) {
                        counts.completions += 1;
                    }
                    k.done = Some(higher(k.done, version, at));
                }
            }
        }
        // Keep the allocation for the next poll.
        notes.clear();
        self.notes = notes;
        counts
    }

    /// The key's memory, stamped as just seen; a new key past the limit
    /// forgets the least recently seen one first.
    fn touch(&mut self, key: u64, counts: &mut Counts) -> &mut Key {
        self.stamp += 1;
        let stamp = self.stamp;
        if let Some(k) = self.keys.get(&key) {
            self.by_stamp.remove(&k.stamp);
        } else if self.keys.len() >= self.limit
            && let Some((_, old)) = self.by_stamp.pop_first()
        {
            self.keys.remove(&old);
            self.gapped.remove(&old);
            counts.evicted += 1;
        }
        self.by_stamp.insert(stamp, key);
        let k = self.keys.entry(key).or_insert_with(|| Key {
            // Most keys keep one run: room for exactly one.
            runs: Vec::with_capacity(1),
            top: None,
            done: None,
            stamp,
        });
        k.stamp = stamp;
        k
    }

    /// The keys with a gap and the earliest arrival above one.
    pub fn gaps(&self) -> Gaps {
        let oldest = self
            .gapped
            .iter()
            .filter_map(|key| self.keys.get(key))
            .filter_map(|k| k.runs[1..].iter().map(|r| r.first).min())
            .min();
        Gaps {
            keys: self.gapped.len() as u64,
            oldest,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys.len()
    }
}

/// `mark` raised to `version` if that is higher; the earlier time of the
/// same version.
fn higher(mark: Option<Mark>, version: i64, at: i64) -> Mark {
    match mark {
        Some(m) if m.version > version => m,
        Some(m) if m.version == version => Mark {
            version,
            at: m.at.min(at),
        },
        _ => Mark { version, at },
    }
}

/// Adds a version that arrived at `at` to ascending, disjoint, non-adjacent runs.
fn add(runs: &mut Vec<Run>, version: i64, at: i64) {
    // The first run that ends at or above the version before this one.
    let i = runs.partition_point(|r| r.hi < version.saturating_sub(1));
    match runs.get_mut(i) {
        Some(r) if r.lo <= version.saturating_add(1) => {
            r.lo = r.lo.min(version);
            r.hi = r.hi.max(version);
            r.first = r.first.min(at);
            // Growing upward may have reached the next run.
            if let Some(next) = runs.get(i + 1).copied()
                && next.lo <= runs[i].hi.saturating_add(1)
            {
                runs[i].hi = runs[i].hi.max(next.hi);
                runs[i].first = runs[i].first.min(next.first);
                runs.remove(i + 1);
            }
        }
        _ => runs.insert(
            i,
            Run {
                lo: version,
                hi: version,
                first: at,
            },
        ),
    }
    if runs.len() > MAX_RUNS {
        runs.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs_of(versions: &[(i64, i64)]) -> Vec<(i64, i64, i64)> {
        let mut runs = Vec::new();
        for (v, at) in versions {
            add(&mut runs, *v, *at);
        }
        runs.iter().map(|r| (r.lo, r.hi, r.first)).collect()
    }

    #[test]
    fn versions_join_into_runs_of_consecutive_ones() {
        assert_eq!(runs_of(&[(1, 10), (2, 11), (3, 12)]), [(1, 3, 10)]);
        assert_eq!(runs_of(&[(1, 10), (3, 11)]), [(1, 1, 10), (3, 3, 11)]);
        // The missing version closes the gap; the run keeps the earliest arrival.
        assert_eq!(runs_of(&[(1, 10), (3, 11), (2, 12)]), [(1, 3, 10)]);
        // Below the lowest, above the highest, a repeat.
        assert_eq!(
            runs_of(&[(5, 10), (3, 11), (4, 12), (9, 13), (9, 5)]),
            [(3, 5, 10), (9, 9, 5)]
        );
        assert_eq!(runs_of(&[(7, 1), (5, 2), (6, 3)]), [(5, 7, 1)]);
    }

    /// Guards the memory figure of docs/metrics.md ("about 200 bytes per
    /// key"): an 88-byte bucket (key and [`Key`]) in a map between 7/16 and
    /// 7/8 full, one run on the heap (24 bytes and the allocator's 16), and
    /// an entry of the recency index (16 bytes in nodes of up to 11).
    #[test]
    fn a_key_is_80_bytes_and_its_bucket_88() {
        assert_eq!(size_of::<Key>(), 80);
        assert_eq!(size_of::<(u64, Key)>(), 88);
        assert_eq!(size_of::<Run>(), 24);
    }

    #[test]
    fn a_key_keeps_at_most_max_runs() {
        let versions: Vec<(i64, i64)> = (0..40).map(|i| (i * 2, i)).collect();
        let runs = runs_of(&versions);
        assert_eq!(runs.len(), MAX_RUNS);
        assert_eq!(
            runs[0].0,
            (40 - MAX_RUNS as i64) * 2,
            "the lowest are dropped"
        );
    }

    /// Notes of one poll are applied in time order, whatever order they
    /// were read in.
    #[test]
    fn out_of_order_arrivals_and_successes_are_counted_in_time_order() {
        let mut o = Ordering::new(10);
        // Read as 3, 1, 2; arrived as 1 (t=1), 3 (t=2), 2 (t=3): 2 is late.
        o.arrival(7, 3, 2, true);
        o.arrival(7, 1, 1, true);
        o.arrival(7, 2, 3, true);
        assert_eq!(o.apply().arrivals, 1);
        assert_eq!(o.gaps(), Gaps::default());
        // 3 succeeds at 10, then 2 at 11 (out of order), 4 at 12, 3 again at 13.
        o.success(7, 2, 11);
        o.success(7, 3, 10);
        o.success(7, 4, 12);
        o.success(7, 3, 13);
        assert_eq!(o.apply().completions, 2);
        // A success seen late that finished before the higher one is not out of order.
        o.success(8, 5, 20);
        o.apply();
        o.success(8, 4, 19);
        assert_eq!(o.apply().completions, 0);
        // Baseline rows set versions but never count.
        o.arrival(9, 5, 30, false);
        o.arrival(9, 4, 31, false);
        assert_eq!(o.apply(), Counts::default());
    }

    #[test]
    fn a_gap_is_a_later_version_waiting_for_an_earlier_one() {
        let mut o = Ordering::new(10);
        o.arrival(1, 1, 100, true);
        o.arrival(1, 3, 105, true);
        o.arrival(1, 4, 103, true);
        o.arrival(2, 1, 100, true);
        o.arrival(2, 2, 101, true);
        o.apply();
        assert_eq!(
            o.gaps(),
            Gaps {
                keys: 1,
                oldest: Some(103)
            }
        );
        o.arrival(1, 2, 110, true);
        assert_eq!(o.apply().arrivals, 1, "2 arrived after 3 and 4");
        assert_eq!(o.gaps(), Gaps::default());
    }

    #[test]
    fn the_least_recently_seen_key_is_forgotten_past_the_limit() {
        let mut o = Ordering::new(3);
        for key in 0..3 {
            o.arrival(key, 1, key as i64, true);
        }
        assert_eq!(o.apply().evicted, 0);
        // Key 0 seen again: key 1 is now the least recently seen.
        o.success(0, 1, 10);
        o.arrival(3, 1, 11, true);
        assert_eq!(o.apply().evicted, 1);
        assert_eq!(o.len(), 3);
        assert!(o.keys.contains_key(&0) && !o.keys.contains_key(&1));
        // A forgotten key starts afresh: its lower version is not out of order.
        o.arrival(1, 0, 12, true);
        let c = o.apply();
        assert_eq!((c.evicted, c.arrivals), (1, 0));
        assert!(!o.keys.contains_key(&2));
        // The gap of a forgotten key goes with it.
        let mut o = Ordering::new(1);
        o.arrival(1, 1, 1, true);
        o.arrival(1, 3, 2, true);
        o.apply();
        assert_eq!(o.gaps().keys, 1);
        o.arrival(2, 1, 3, true);
        o.apply();
        assert_eq!(o.gaps(), Gaps::default());
    }
}
