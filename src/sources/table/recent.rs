//! The bounded memory of recently seen events that turns rows into deltas.
//!
//! An entry is kept for every unfinished event and for every event finished
//! within `state_retention`, up to `max_tracked_events`: this map is most of
//! a busy source's memory. Its values are stored compactly (no `Option<i64>`,
//! flags in one byte; see [`Flags`]): the inbox's is 16 bytes (times in 51
//! bits, counts in 4 or 5), so a slot of the map (8-byte key and value) is 24
//! bytes, in a table ([`KeyMap`]) that grows a part at a time and stays
//! 75–85 % full as it fills (docs/performance.md, "Memory at the cap: the
//! remembered events in 16 bytes and the freed pages given back").

use std::time::{Duration, Instant};

use super::config::TableSpec;
use super::keymap::KeyMap;

/// Up to eight booleans in one byte, among them the presence of optional
/// times: an `Option<i64>` costs 16 bytes, a time and a bit 8.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(u8);

impl Flags {
    /// The flags of a byte [`Flags::bits`] gave.
    pub fn from_bits(bits: u8) -> Flags {
        Flags(bits)
    }

    /// The byte, to pack with other fields.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Whether flag `bit` (0..8) is set.
    pub fn get(self, bit: u8) -> bool {
        self.0 & (1 << bit) != 0
    }

    /// Sets flag `bit` (0..8) to `on`.
    pub fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.0 |= 1 << bit;
        } else {
            self.0 &= !(1 << bit);
        }
    }

    /// Stores an optional time: its presence in flag `bit`, the value
    /// returned (0 when absent). Every `i64` stays representable, unlike a
    /// sentinel value.
    pub fn put_time(&mut self, bit: u8, time: Option<i64>) -> i64 {
        self.set(bit, time.is_some());
        time.unwrap_or(0)
    }

    /// The optional time stored with [`Flags::put_time`].
    pub fn time(self, bit: u8, value: i64) -> Option<i64> {
        self.get(bit).then_some(value)
    }

    /// Stores a small number in the bits from `shift` (1..8) to the top,
    /// which no flag then uses.
    pub fn set_field(&mut self, shift: u8, value: u8) {
        assert!(
            u32::from(value) < 1 << (8 - shift),
            "{value} does not fit in {} bits",
            8 - shift
        );
        self.0 = (self.0 & ((1 << shift) - 1)) | (value << shift);
    }

    /// The number stored with [`Flags::set_field`].
    pub fn field(self, shift: u8) -> u8 {
        self.0 >> shift
    }
}

/// What the map needs to know of an entry to forget it safely.
pub trait Entry: Copy + Default {
    /// The row's change cursor when it was last seen (microseconds).
    fn updated_at(&self) -> i64;
    /// The time that decides whether a first-seen row is a new event
    /// (`received_at` / `created_at`, microseconds).
    fn born_at(&self) -> i64;
    /// Whether the event is finished, so forgetting it only risks missing a
    /// late duplicate, never a completion.
    fn finished(&self) -> bool;
    /// Whether the entry's times are kept elsewhere, so that
    /// [`Entry::updated_at`] and [`Entry::born_at`] are not its own: the map's
    /// owner tells them ([`Tracked::tidy`]'s `far`).
    fn far(&self) -> bool {
        false
    }
}

/// Recently seen events by key, bounded in size and age.
#[derive(Debug)]
pub struct Tracked<V> {
    map: KeyMap<V>,
    /// First-seen rows born before this are older than the agent's memory and
    /// are taken as a baseline rather than counted as new.
    floor: i64,
    /// Finished events were forgotten only if they had not changed since
    /// before this: a row finished at or after it cannot be one of them.
    forgotten_until: i64,
    cap: usize,
    last_eviction: Option<Instant>,
}

impl<V: Entry> Tracked<V> {
    /// An empty map holding at most `cap` events.
    pub fn new(cap: usize) -> Self {
        Tracked {
            map: KeyMap::new(),
            floor: i64::MIN,
            forgotten_until: i64::MIN,
            cap,
            last_eviction: None,
        }
    }

    /// Sets the floor to the agent's start: only events born since count as new.
    pub fn start(&mut self, db_now: i64) {
        self.floor = db_now;
    }

    /// Whether a first-seen row born at `born_at` is an event the agent has
    /// never known (and not one it has forgotten).
    pub fn is_new(&self, born_at: i64) -> bool {
        born_at >= self.floor
    }

    /// Whether a first-seen, finished row whose event is not new may be one
    /// the agent knew, counted and forgot: finished before the latest change
    /// time that let a finished event be forgotten (events are forgotten by
    /// the time of their last change, which is never before their finish).
    pub fn may_have_counted(&self, finished_at: i64) -> bool {
        finished_at < self.forgotten_until
    }

    pub fn get(&self, key: u64) -> Option<&V> {
        self.map.get(&key)
    }

    /// Remembers `value` (or what it converts to: the stored form) for `key`.
    pub fn insert(&mut self, key: u64, value: impl Into<V>) {
        self.map.insert(key, value.into());
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Runs [`Tracked::evict_with`] with the source's `state_retention`, at most
    /// once per poll interval (and no more than every 10 s): it walks the map.
    /// Returns whether it ran.
    /// `far` gives the change and birth times of an entry whose own are not
    /// its times ([`Entry::far`]).
    pub fn tidy(
        &mut self,
        spec: &TableSpec,
        db_now: i64,
        now: Instant,
        far: impl Fn(u64) -> (i64, i64),
    ) -> bool {
        let every = spec.poll_interval.max(Duration::from_secs(10));
        let due = self
            .last_eviction
            .is_none_or(|t| now.duration_since(t) >= every);
        if due {
            let retention = i64::try_from(spec.state_retention.as_micros()).unwrap_or(i64::MAX);
            self.evict_with(db_now.saturating_sub(retention), far);
            self.last_eviction = Some(now);
        }
        due
    }

    /// [`Tracked::evict_with`] of a map none of whose entries is far.
    #[cfg(test)]
    pub fn evict(&mut self, horizon: i64) {
        self.evict_with(horizon, |_| unreachable!("no entry is far"));
    }

    /// Forgets finished events last changed before `horizon`, then, over the
    /// cap, the least recently changed finished events, and only if those
    /// are not enough the least recently changed unfinished ones, down to 90 %
    /// of the cap whatever times they share. The floor rises past every
    /// forgotten event so that a later change to one is never taken for a new
    /// event. `far` gives the change and birth times of the entries that
    /// keep theirs elsewhere ([`Entry::far`]).
    pub fn evict_with(&mut self, horizon: i64, far: impl Fn(u64) -> (i64, i64)) {
        let times = |k: u64, v: &V| {
            if v.far() {
                far(k)
            } else {
                (v.updated_at(), v.born_at())
            }
        };
        let mut floor = self.floor;
        let mut forgotten_until = self.forgotten_until;
        self.map.retain(|k, v| {
            let (updated, born) = times(*k, v);
            let keep = !(v.finished() && updated < horizon);
            if !keep {
                floor = floor.max(born.saturating_add(1));
                forgotten_until = forgotten_until.max(horizon);
            }
            keep
        });
        if self.map.len() > self.cap {
            // Down to 90 % of the cap, so this does not run every poll.
            let keep = self.cap - self.cap / 10;
            let mut excess = self.map.len() - keep;
            // Finished events first, least recently changed first: forgetting
            // one only risks missing a late duplicate, while an unfinished
            // one's next change would be a first sight, what it showed before
            // unknown. Then, if the unfinished alone are over, the least
            // recently changed of them.
            for finished in [true, false] {
                if excess == 0 {
                    break;
                }
                let of_kind = self
                    .map
                    .values()
                    .filter(|v| v.finished() == finished)
                    .count();
                if of_kind == 0 {
                    continue;
                }
                let n = excess.min(of_kind);
                let changes = || {
                    self.map
                        .iter()
                        .filter(move |(_, v)| v.finished() == finished)
                        .map(|(k, v)| times(*k, v).0)
                };
                // The n-th least recent change: every event changed before it
                // goes, and as many of those changed at it as make n. Many
                // events share a change time (without a change cursor, the
                // poll that saw them), so the ties are cut too: keeping them
                // all kept the map over its cap.
                let Some((cut, mut ties)) = nth_least(n, changes) else {
                    continue;
                };
                self.map.retain(|k, v| {
                    if v.finished() != finished {
                        return true;
                    }
                    let (t, born) = times(*k, v);
                    let forget = t < cut || (t == cut && ties > 0);
                    if forget {
                        if t == cut {
                            ties -= 1;
                        }
                        floor = floor.max(born.saturating_add(1));
                        if finished {
                            forgotten_until = forgotten_until.max(t.saturating_add(1));
                        }
                    }
                    !forget
                });
                excess -= n;
            }
        }
        self.floor = floor;
        self.forgotten_until = forgotten_until;
    }
}

/// How many ranges [`nth_least`] counts the values in, each time.
const RANGES: usize = 1024;

/// The `n`-th least (from 1) of the values `values` yields, and how many of
/// the `n` least are equal to it; `None` if it yields fewer than `n` (or `n`
/// is 0). The values are gone through a few times rather than listed (a
/// list of every remembered event's change time was 8 bytes an event, at the
/// agent's peak, each time the cap was reached): counted in [`RANGES`]
/// ranges between the least and the greatest, then again in the range that
/// holds the n-th, and so on until that range is one value. Microsecond times within 15 minutes (the
/// default `state_retention`) take three passes after the first, within an
/// hour four; any `i64` at most seven.
fn nth_least<I: Iterator<Item = i64>>(n: usize, values: impl Fn() -> I) -> Option<(i64, usize)> {
    let (mut lo, mut hi, count) = values().fold((i64::MAX, i64::MIN, 0usize), |(lo, hi, c), v| {
        (lo.min(v), hi.max(v), c + 1)
    });
    if n == 0 || n > count {
        return None;
    }
    // The rank sought among the values in [lo, hi]: once that range is one
    // value, how many of the n least are that value.
    let mut rank = n;
    let mut counts = vec![0usize; RANGES];
    while lo < hi {
        let span = i128::from(hi) - i128::from(lo) + 1;
        let width = (span + RANGES as i128 - 1) / RANGES as i128;
        counts.fill(0);
        for v in values() {
            if v >= lo && v <= hi {
                counts[((i128::from(v) - i128::from(lo)) / width) as usize] += 1;
            }
        }
        let mut below = 0;
        for (i, c) in counts.iter().enumerate() {
            if below + c >= rank {
                rank -= below;
                let from = i128::from(lo) + i as i128 * width;
                // Both within [lo, hi], so within i64.
                hi = i64::try_from((from + width - 1).min(i128::from(hi))).unwrap_or(hi);
                lo = i64::try_from(from).unwrap_or(lo);
                break;
            }
            below += c;
        }
    }
    Some((lo, rank))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`nth_least`] against sorting, for values spread over every `i64`,
    /// over a few microseconds, and all one value, at every rank: the value
    /// and how many of the values up to that rank equal it.
    #[test]
    fn nth_least_is_what_sorting_finds() {
        let mut rng = fastrand::Rng::with_seed(7);
        for case in 0..300 {
            let n = rng.usize(1..500);
            let values: Vec<i64> = match case % 4 {
                0 => (0..n).map(|_| rng.i64(..)).collect(),
                1 => (0..n)
                    .map(|_| 1_700_000_000_000_000 + rng.i64(0..5_000))
                    .collect(),
                2 => (0..n)
                    .map(|_| [i64::MIN, -1, 0, i64::MAX][rng.usize(0..4)])
                    .collect(),
                _ => vec![42; n],
            };
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for rank in 1..=n {
                let nth = sorted[rank - 1];
                let ties = sorted[..rank].iter().filter(|v| **v == nth).count();
                assert_eq!(
                    nth_least(rank, || values.iter().copied()),
                    Some((nth, ties)),
                    "case {case}, rank {rank}"
                );
            }
            assert_eq!(nth_least(0, || values.iter().copied()), None);
            assert_eq!(nth_least(n + 1, || values.iter().copied()), None);
        }
        assert_eq!(nth_least(1, std::iter::empty), None);
    }

    #[test]
    fn flags_keep_every_optional_time() {
        let mut f = Flags::default();
        for (bit, t) in [
            (0, None),
            (1, Some(i64::MIN)),
            (2, Some(0)),
            (3, Some(-1)),
            (7, Some(i64::MAX)),
        ] {
            let v = f.put_time(bit, t);
            assert_eq!(f.time(bit, v), t, "bit {bit}");
        }
        f.set(7, false);
        assert!(!f.get(7));
        assert!(f.get(1) && f.get(2) && f.get(3) && !f.get(0));
    }

    #[derive(Clone, Copy, Debug, Default)]
    struct E {
        updated: i64,
        born: i64,
        done: bool,
    }

    impl Entry for E {
        fn updated_at(&self) -> i64 {
            self.updated
        }
        fn born_at(&self) -> i64 {
            self.born
        }
        fn finished(&self) -> bool {
            self.done
        }
    }

    /// A map of cap `cap` from its start at 0, holding an event per key of
    /// `keys`, as `event` makes it: (updated, born, finished).
    fn tracked(
        cap: usize,
        keys: std::ops::Range<u64>,
        event: impl Fn(u64) -> (i64, i64, bool),
    ) -> Tracked<E> {
        let mut t: Tracked<E> = Tracked::new(cap);
        t.start(0);
        for k in keys {
            let (updated, born, done) = event(k);
            t.insert(
                k,
                E {
                    updated,
                    born,
                    done,
                },
            );
        }
        t
    }

    #[test]
    fn finished_events_are_forgotten_after_the_horizon_and_raise_the_floor() {
        let mut t: Tracked<E> = Tracked::new(100);
        t.start(0);
        t.insert(
            1,
            E {
                updated: 10,
                born: 5,
                done: true,
            },
        );
        t.insert(
            2,
            E {
                updated: 10,
                born: 6,
                done: false,
            },
        );
        t.insert(
            3,
            E {
                updated: 30,
                born: 7,
                done: true,
            },
        );
        t.evict(20);
        assert!(t.get(1).is_none());
        assert!(t.get(2).is_some(), "unfinished events stay");
        assert!(t.get(3).is_some(), "recent events stay");
        assert!(!t.is_new(5), "a forgotten event is not new when seen again");
        assert!(t.is_new(6));
        // Event 1 (finished, last changed at 10 < 20) was forgotten: a row finished
        // before 20 may be it, one finished at 20 or later cannot.
        assert!(t.may_have_counted(19));
        assert!(!t.may_have_counted(20));
    }

    #[test]
    fn forgetting_only_unfinished_events_leaves_every_finish_countable() {
        let mut t = tracked(10, 0..20, |k| (k as i64, k as i64, false));
        t.evict(100);
        assert!(!t.may_have_counted(0), "no finished event was forgotten");
    }

    #[test]
    fn the_cap_keeps_the_most_recently_changed() {
        let mut t = tracked(10, 0..20, |k| (k as i64, k as i64, false));
        t.evict(i64::MIN);
        assert_eq!(t.len(), 9);
        assert!(t.get(19).is_some());
        assert!(t.get(10).is_none());
        assert!(!t.is_new(10));
        assert!(t.is_new(11));
    }

    /// Without a change cursor every event a poll saw shares its time: the
    /// cap still holds (it kept every tie, and the map grew past the cap to
    /// whatever `state_retention` let in).
    #[test]
    fn the_cap_holds_when_every_event_shares_its_change_time() {
        let mut t = tracked(10, 0..25, |k| (7, k as i64, k % 2 == 0));
        t.evict(i64::MIN);
        assert_eq!(t.len(), 9);
        let kept_unfinished = (0..25)
            .filter(|k| k % 2 == 1 && t.get(*k).is_some())
            .count();
        assert_eq!(
            kept_unfinished, 9,
            "the 13 finished went first, then 3 unfinished"
        );
        assert!(
            t.may_have_counted(7),
            "finished events changed at 7 were forgotten"
        );
        assert!(!t.may_have_counted(8));
    }

    /// Over the cap, finished events go before unfinished ones, however
    /// recently they changed: an unfinished event forgotten would be a first
    /// sight at its next change.
    #[test]
    fn the_cap_forgets_finished_events_first() {
        // Ten unfinished events changed long ago (a backlog seeded at start),
        // ten finished since.
        let mut t = tracked(10, 0..20, |k| (k as i64, k as i64, k >= 10));
        t.evict(i64::MIN);
        assert_eq!(t.len(), 9);
        assert!(
            (10..20).all(|k| t.get(k).is_none()),
            "every finished event went"
        );
        assert!(
            t.get(0).is_none(),
            "then the least recently changed unfinished one"
        );
        assert!((1..10).all(|k| t.get(k).is_some()));
        assert!(t.may_have_counted(19));
        assert!(!t.is_new(19), "the floor rose past every forgotten event");
        assert!(t.is_new(20));

        // Under the cap with finished events to spare, no unfinished one goes.
        let mut t = tracked(10, 0..12, |k| {
            (if k < 4 { 0 } else { 100 + k as i64 }, k as i64, k >= 4)
        });
        t.evict(i64::MIN);
        assert_eq!(t.len(), 9);
        assert!((0..4).all(|k| t.get(k).is_some()), "the unfinished stay");
        assert!(
            (4..7).all(|k| t.get(k).is_none()),
            "the 3 least recent finished go"
        );
        assert!((7..12).all(|k| t.get(k).is_some()));
    }
}
