//! The unfinished rows the gauges are computed from, kept up to date from the
//! rows the tail reads, so that a poll costs O(rows changed) rather than an
//! aggregate over every unfinished row.
//!
//! The map starts from the seed query (every unfinished row) and takes each
//! tailed row's current version. Changes the tail cannot see — a deleted row,
//! a row changed without moving the change cursor, a commit later than the
//! overlap — are caught by a reconciling aggregate every `reconcile_every`
//! (default 1 min): when its result differs from the map, the map is re-read
//! from the table.
//! A backlog larger than the map's cap is not kept: the aggregate then runs
//! on every poll until the backlog fits again.
//!
//! The same map keeps, beside a row, the 8 bytes the re-read of the
//! unfinished rows keeps of it (its [`Mark`]: where its id lies, and the
//! re-read that last saw it): an unfinished row has one entry of 32 bytes
//! where the two maps took 24 and 16.

use std::collections::BTreeMap;

use super::keymap::KeyMap;

/// The gauge-relevant part of one unfinished row (24 bytes; the map keeps
/// it in 16, [`Packed`]): a backlog of 100 000 rows is held in full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unfinished {
    /// `received_at` / `created_at` (microseconds), [`NONE`] if NULL.
    born: i64,
    /// The start of a row that counts toward stuck rows (processing), [`NONE`] if none.
    stuck_from: i64,
    /// The `event_type` label id.
    label: u32,
    /// Index into [`Gauges::counts`] (the status: pending, processing, failed).
    class: u8,
}

/// A missing time in [`Unfinished`].
const NONE: i64 = i64::MIN;

impl Unfinished {
    /// An unfinished row of label `label` and status index `class`.
    pub fn new(label: usize, class: usize, born: Option<i64>, stuck_from: Option<i64>) -> Self {
        Unfinished {
            born: born.unwrap_or(NONE),
            stuck_from: stuck_from.unwrap_or(NONE),
            label: u32::try_from(label).expect("label ids are bounded by event_type_limit"),
            class: u8::try_from(class).expect("three unfinished statuses"),
        }
    }
}

impl Unfinished {
    /// The `event_type` label id.
    pub fn label(&self) -> usize {
        self.label as usize
    }

    /// `received_at` / `created_at`, if the row had one.
    pub fn born(&self) -> Option<i64> {
        (self.born != NONE).then_some(self.born)
    }

    /// The status index: 0 pending (an outbox's unpublished), 1 processing,
    /// 2 failed.
    pub fn class(&self) -> usize {
        usize::from(self.class)
    }

    /// The start of a row in processing, if it had one.
    pub fn started(&self) -> Option<i64> {
        (self.stuck_from != NONE).then_some(self.stuck_from)
    }
}

/// Gauge values of one `event_type` label.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    /// Unfinished rows by status (the outbox uses the first only).
    pub counts: [u64; 3],
    /// The oldest `born` of the unfinished rows.
    pub oldest: Option<i64>,
    /// Rows whose `stuck_from` lies before the stuck horizon.
    pub stuck: u64,
}

impl Gauges {
    /// Adds one row (or one group of `n` rows) to the values.
    pub fn add(&mut self, class: usize, n: u64, oldest: Option<i64>, stuck: u64) {
        if let Some(c) = self.counts.get_mut(class) {
            *c += n;
        }
        if let Some(o) = oldest {
            self.oldest = Some(self.oldest.map_or(o, |p| p.min(o)));
        }
        self.stuck += stuck;
    }
}

/// Gauge values by label id.
pub type GaugeMap = BTreeMap<usize, Gauges>;

/// Whether the map can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Not kept: never read, or over the cap.
    Off,
    /// A re-read of every unfinished row is under way.
    Filling,
    /// The map holds every unfinished row of the table.
    Complete,
}

/// An [`Unfinished`] in 16 bytes, as the map keeps it: `born` whole, and in
/// the second word the label (14 bits), the status index (2 bits) and the
/// start as 48 bits — its distance from `born` (within 4.4 years either
/// way), or that there is none, or that `born` is NULL and the first word
/// holds the start instead. A row that does not fit (a label id past
/// 16,383, a start further from `born`) is kept whole beside
/// ([`Backlog::rare`]), so nothing is rounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Packed {
    first: i64,
    rest: u64,
}

const LABEL_BITS: u32 = 14;
const CLASS_BITS: u32 = 2;
const START_BITS: u32 = 64 - LABEL_BITS - CLASS_BITS;
/// The start field's values, read as a signed 48-bit number: no start.
const START_NONE: i64 = -(1 << (START_BITS - 1));
/// `born` is NULL and the first word is the start.
const START_ONLY: i64 = START_NONE + 1;
/// The smallest distance kept (the largest is `2⁴⁷ − 1`).
const START_MIN: i64 = START_NONE + 2;
const START_MAX: i64 = (1 << (START_BITS - 1)) - 1;

impl Packed {
    fn pack(u: &Unfinished) -> Option<Packed> {
        let label = u64::from(u.label);
        let class = u64::from(u.class);
        // The last status index is left for [`Packed::ABSENT`].
        if label >= 1 << LABEL_BITS || class >= (1 << CLASS_BITS) - 1 {
            return None;
        }
        let (first, start) = match (u.born != NONE, u.stuck_from != NONE) {
            (_, false) => (u.born, START_NONE),
            (false, true) => (u.stuck_from, START_ONLY),
            (true, true) => {
                let d = u.stuck_from.checked_sub(u.born)?;
                if !(START_MIN..=START_MAX).contains(&d) {
                    return None;
                }
                (u.born, d)
            }
        };
        let start = (start as u64) & ((1 << START_BITS) - 1);
        Some(Packed {
            first,
            rest: label << (CLASS_BITS + START_BITS) | class << START_BITS | start,
        })
    }

    /// No row: an entry kept for its [`Mark`] alone, or a row kept whole
    /// in [`Backlog::rare`]. Its status index is one [`Packed::pack`] never
    /// gives.
    const ABSENT: Packed = Packed {
        first: 0,
        rest: ((1 << CLASS_BITS) - 1) << START_BITS,
    };

    fn is_row(&self) -> bool {
        (self.rest >> START_BITS) & ((1 << CLASS_BITS) - 1) != (1 << CLASS_BITS) - 1
    }

    fn unpack(self) -> Unfinished {
        // The start field sign-extended from 48 bits.
        let start = ((self.rest << (64 - START_BITS)) as i64) >> (64 - START_BITS);
        let (born, stuck_from) = match start {
            START_NONE => (self.first, NONE),
            START_ONLY => (NONE, self.first),
            d => (self.first, self.first + d),
        };
        Unfinished {
            born,
            stuck_from,
            label: (self.rest >> (CLASS_BITS + START_BITS)) as u32,
            class: ((self.rest >> START_BITS) & ((1 << CLASS_BITS) - 1)) as u8,
        }
    }
}

/// What the re-read of the unfinished rows keeps of a row, in 64 bits, in
/// the row's entry ([`Backlog::set_mark`]); [`NO_MARK`] is none.
pub type Mark = u64;

/// No [`Mark`].
pub const NO_MARK: Mark = u64::MAX;

/// One key's entry: the row kept for the gauges ([`Packed::ABSENT`] if
/// none) and its [`Mark`] ([`NO_MARK`] if none). An entry with neither is
/// removed.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    row: Packed,
    mark: Mark,
}

/// Unfinished rows by event key, bounded by a cap, and the re-read's marks
/// of them.
#[derive(Debug)]
pub struct Backlog {
    entries: KeyMap<Entry>,
    /// The rows that do not fit in 16 bytes (none in most tables); their
    /// entries hold no row.
    rare: KeyMap<Unfinished>,
    /// Entries holding a row.
    rows: usize,
    /// Entries holding a mark.
    marks: usize,
    cap: usize,
    fill: Fill,
}

impl Backlog {
    /// An empty map, not yet kept, holding at most `cap` rows.
    pub fn new(cap: usize) -> Self {
        Backlog {
            entries: KeyMap::new(),
            rare: KeyMap::new(),
            rows: 0,
            marks: 0,
            cap,
            fill: Fill::Off,
        }
    }

    /// Whether the gauges can come from the map.
    pub fn is_complete(&self) -> bool {
        self.fill == Fill::Complete
    }

    /// The number of unfinished rows the map may hold.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Starts a re-read of every unfinished row.
    pub fn clear(&mut self) {
        self.drop_rows(true);
        self.fill = Fill::Filling;
    }

    /// Ends a re-read: the map is complete if the read returned every row and
    /// they fit.
    pub fn filled(&mut self, all_read: bool) {
        if self.fill == Fill::Filling && all_read {
            self.fill = Fill::Complete;
        } else {
            self.drop_all();
        }
    }

    fn drop_all(&mut self) {
        self.drop_rows(false);
        self.fill = Fill::Off;
    }

    /// Drops every row, keeping the marks; `keep_memory`: the slots too,
    /// for the rows a re-read brings next.
    fn drop_rows(&mut self, keep_memory: bool) {
        if self.marks > 0 {
            self.entries.retain(|_, e| {
                e.row = Packed::ABSENT;
                e.mark != NO_MARK
            });
        } else if keep_memory {
            self.entries.clear();
        } else {
            self.entries = KeyMap::new();
        }
        if keep_memory {
            self.rare.clear();
        } else {
            self.rare = KeyMap::new();
        }
        self.rows = 0;
    }

    /// The row kept for `key`, if the map holds one.
    pub fn get(&self, key: u64) -> Option<Unfinished> {
        match self.entries.get(&key).filter(|e| e.row.is_row()) {
            Some(e) => Some(e.row.unpack()),
            None => self.rare.get(&key).copied(),
        }
    }

    /// Takes a row's current version: unfinished rows are kept, others dropped.
    pub fn update(&mut self, key: u64, row: Option<Unfinished>) {
        if self.fill == Fill::Off {
            return;
        }
        match row {
            Some(u) => {
                match Packed::pack(&u) {
                    Some(p) => {
                        self.set_row(key, p);
                        self.rare.remove(&key);
                    }
                    None => {
                        self.rare.insert(key, u);
                        self.unset_row(key);
                    }
                }
                if self.rows + self.rare.len() > self.cap {
                    // Too large to keep: the aggregate gives the gauges
                    // until a re-read finds the backlog small enough again.
                    self.drop_all();
                }
            }
            None => {
                self.unset_row(key);
                self.rare.remove(&key);
            }
        }
    }

    fn set_row(&mut self, key: u64, row: Packed) {
        match self.entries.get_mut(&key) {
            Some(e) => {
                self.rows += usize::from(!e.row.is_row());
                e.row = row;
            }
            None => {
                self.entries.insert(key, Entry { row, mark: NO_MARK });
                self.rows += 1;
            }
        }
    }

    fn unset_row(&mut self, key: u64) {
        if let Some(e) = self.entries.get_mut(&key)
            && e.row.is_row()
        {
            e.row = Packed::ABSENT;
            self.rows -= 1;
            if e.mark == NO_MARK {
                self.entries.remove(&key);
            }
        }
    }

    /// The gauges of the rows in the map; rows started before `stuck_before`
    /// count as stuck.
    pub fn gauges(&self, stuck_before: i64) -> GaugeMap {
        let mut out = GaugeMap::new();
        let rows = self
            .entries
            .values()
            .filter(|e| e.row.is_row())
            .map(|e| e.row.unpack());
        for u in rows.chain(self.rare.values().copied()) {
            let stuck = u64::from(u.stuck_from != NONE && u.stuck_from < stuck_before);
            let born = (u.born != NONE).then_some(u.born);
            out.entry(u.label as usize)
                .or_default()
                .add(usize::from(u.class), 1, born, stuck);
        }
        out
    }

    /// The mark of `key`, if it has one. Marks are kept whatever the
    /// backlog's state, and without a row.
    pub fn mark(&self, key: u64) -> Option<Mark> {
        self.entries
            .get(&key)
            .map(|e| e.mark)
            .filter(|m| *m != NO_MARK)
    }

    /// The mark of `key` to change in place, if it has one (never to
    /// [`NO_MARK`]: [`Backlog::remove_mark`] removes one).
    pub fn mark_mut(&mut self, key: u64) -> Option<&mut Mark> {
        self.entries
            .get_mut(&key)
            .map(|e| &mut e.mark)
            .filter(|m| **m != NO_MARK)
    }

    /// Sets the mark of `key` (not [`NO_MARK`]).
    pub fn set_mark(&mut self, key: u64, mark: Mark) {
        debug_assert_ne!(mark, NO_MARK);
        match self.entries.get_mut(&key) {
            Some(e) => {
                self.marks += usize::from(e.mark == NO_MARK);
                e.mark = mark;
            }
            None => {
                self.entries.insert(
                    key,
                    Entry {
                        row: Packed::ABSENT,
                        mark,
                    },
                );
                self.marks += 1;
            }
        }
    }

    /// Removes the mark of `key`; returns it if there was one.
    pub fn remove_mark(&mut self, key: u64) -> Option<Mark> {
        let e = self.entries.get_mut(&key)?;
        let mark = std::mem::replace(&mut e.mark, NO_MARK);
        if mark == NO_MARK {
            return None;
        }
        self.marks -= 1;
        if !e.row.is_row() {
            self.entries.remove(&key);
        }
        Some(mark)
    }

    /// The keys with a mark, and their marks.
    pub fn marks(&self) -> impl Iterator<Item = (u64, Mark)> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.mark != NO_MARK)
            .map(|(k, e)| (*k, e.mark))
    }

    /// The number of keys with a mark.
    pub fn marks_len(&self) -> usize {
        self.marks
    }

    /// Keeps the marks for which `keep` is true (which may change them);
    /// removes the others.
    pub fn retain_marks(&mut self, mut keep: impl FnMut(u64, &mut Mark) -> bool) {
        let marks = &mut self.marks;
        self.entries.retain(|k, e| {
            if e.mark != NO_MARK && !keep(*k, &mut e.mark) {
                e.mark = NO_MARK;
                *marks -= 1;
            }
            e.mark != NO_MARK || e.row.is_row()
        });
    }

    /// Removes every mark, and the map's memory with them if no row is kept.
    pub fn clear_marks(&mut self) {
        if self.rows == 0 {
            self.entries = KeyMap::new();
            self.marks = 0;
        } else {
            self.retain_marks(|_, _| false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: usize, class: usize, born: i64, stuck_from: Option<i64>) -> Option<Unfinished> {
        Some(Unfinished::new(label, class, Some(born), stuck_from))
    }

    #[test]
    fn gauges_follow_the_current_version_of_each_row() {
        let mut b = Backlog::new(10);
        b.clear();
        b.update(1, row(0, 0, 100, None));
        b.update(2, row(0, 1, 50, Some(60)));
        b.update(3, row(1, 2, 70, None));
        b.filled(true);
        assert!(b.is_complete());
        let g = b.gauges(1_000);
        assert_eq!(g[&0].counts, [1, 1, 0]);
        assert_eq!(g[&0].oldest, Some(50));
        assert_eq!(g[&0].stuck, 1);
        assert_eq!(g[&1].counts, [0, 0, 1]);
        // Row 2 finishes, row 1 moves to failed, a new row arrives.
        b.update(2, None);
        b.update(1, row(0, 2, 100, None));
        b.update(4, row(1, 0, 90, None));
        let g = b.gauges(1_000);
        assert_eq!(g[&0].counts, [0, 0, 1]);
        assert_eq!(g[&0].oldest, Some(100));
        assert_eq!(g[&0].stuck, 0);
        assert_eq!(g[&1].counts, [1, 0, 1]);
        assert_eq!(g[&1].oldest, Some(70));
        // Only rows started before the horizon are stuck.
        b.update(5, row(1, 1, 95, Some(500)));
        assert_eq!(b.gauges(400)[&1].stuck, 0);
        assert_eq!(b.gauges(600)[&1].stuck, 1);
    }

    /// Guards the map's slot: the key, the packed row and the mark, 32
    /// bytes.
    #[test]
    fn a_packed_row_is_16_bytes_and_its_slot_32() {
        assert_eq!(std::mem::size_of::<Packed>(), 16);
        assert_eq!(std::mem::size_of::<(u64, Entry)>(), 32);
    }

    /// Rows and marks share entries but live apart: random updates, marks
    /// set and removed, re-reads, caps passed and marks kept by a test give
    /// the same rows, marks and gauges as two maps of their own, and an
    /// entry with neither is not kept.
    #[test]
    fn rows_and_marks_live_apart_in_one_map() {
        use std::collections::HashMap;
        let mut rng = fastrand::Rng::with_seed(33);
        for round in 0..200 {
            let cap = rng.usize(5..60);
            let mut b = Backlog::new(cap);
            // The rows the backlog should hold (None: not kept), the marks.
            let mut rows: Option<HashMap<u64, Unfinished>> = None;
            let mut marks: HashMap<u64, Mark> = HashMap::new();
            let key = |rng: &mut fastrand::Rng| rng.u64(0..50);
            for step in 0..rng.usize(1..400) {
                match rng.u32(0..100) {
                    0..=2 => {
                        // A re-read: every row again, then filled.
                        b.clear();
                        let mut fresh = HashMap::new();
                        for _ in 0..rng.usize(0..cap + 5) {
                            let k = key(&mut rng);
                            let u = Unfinished::new(
                                rng.usize(0..3),
                                rng.usize(0..3),
                                Some(rng.i64(0..1_000)),
                                None,
                            );
                            b.update(k, Some(u));
                            fresh.insert(k, u);
                        }
                        let all = rng.bool();
                        b.filled(all);
                        rows = (all && fresh.len() <= cap).then_some(fresh);
                    }
                    3..=40 => {
                        let k = key(&mut rng);
                        // Some rows do not pack: a label past 14 bits.
                        let label = if rng.u32(0..10) == 0 {
                            20_000
                        } else {
                            rng.usize(0..3)
                        };
                        let started = rng.bool().then(|| rng.i64(0..1_000));
                        let u = Unfinished::new(
                            label,
                            rng.usize(0..3),
                            Some(rng.i64(0..1_000)),
                            started,
                        );
                        b.update(k, Some(u));
                        if let Some(r) = &mut rows {
                            r.insert(k, u);
                            if r.len() > cap {
                                rows = None;
                            }
                        }
                    }
                    41..=55 => {
                        let k = key(&mut rng);
                        b.update(k, None);
                        if let Some(r) = &mut rows {
                            r.remove(&k);
                        }
                    }
                    56..=74 => {
                        let (k, m) = (key(&mut rng), rng.u64(0..1 << 40));
                        b.set_mark(k, m);
                        marks.insert(k, m);
                    }
                    75..=80 => {
                        // A mark changed in place, where there is one.
                        let k = key(&mut rng);
                        let m = rng.u64(0..1 << 40);
                        if let Some(kept) = b.mark_mut(k) {
                            *kept = m;
                        }
                        if let Some(want) = marks.get_mut(&k) {
                            *want = m;
                        }
                    }
                    81..=92 => {
                        let k = key(&mut rng);
                        assert_eq!(
                            b.remove_mark(k),
                            marks.remove(&k),
                            "round {round} step {step}"
                        );
                    }
                    93..=97 => {
                        // Keep the even marks, the odd ones' keys doubled.
                        b.retain_marks(|_, m| {
                            *m *= 2;
                            *m % 4 == 0
                        });
                        marks = marks
                            .into_iter()
                            .map(|(k, m)| (k, m * 2))
                            .filter(|(_, m)| m % 4 == 0)
                            .collect();
                    }
                    _ => {
                        b.clear_marks();
                        marks.clear();
                    }
                }
                let at = format!("round {round} step {step}");
                assert_eq!(b.is_complete(), rows.is_some(), "{at}");
                for k in 0..50 {
                    let want = rows.as_ref().and_then(|r| r.get(&k).copied());
                    assert_eq!(b.get(k), want, "{at} key {k}");
                    assert_eq!(b.mark(k), marks.get(&k).copied(), "{at} key {k}");
                }
                let mut listed: Vec<(u64, Mark)> = b.marks().collect();
                listed.sort_unstable();
                let mut want: Vec<(u64, Mark)> = marks.iter().map(|(k, m)| (*k, *m)).collect();
                want.sort_unstable();
                assert_eq!(listed, want, "{at}");
                assert_eq!(b.marks_len(), marks.len(), "{at}");
                let kept = rows.as_ref().map_or(0, |r| {
                    r.keys()
                        .filter(|k| b.entries.get(k).is_some_and(|e| e.row.is_row()))
                        .count()
                });
                assert_eq!(b.rows, kept, "{at}");
                let either: std::collections::HashSet<u64> = marks
                    .keys()
                    .copied()
                    .chain((0..50).filter(|k| b.entries.get(k).is_some_and(|e| e.row.is_row())))
                    .collect();
                assert_eq!(b.entries.len(), either.len(), "{at}: no entry with neither");
                if let Some(r) = &rows {
                    let mut g = GaugeMap::new();
                    for u in r.values() {
                        let stuck = u64::from(u.started().is_some_and(|s| s < 500));
                        g.entry(u.label())
                            .or_default()
                            .add(u.class(), 1, u.born(), stuck);
                    }
                    assert_eq!(b.gauges(500), g, "{at}");
                }
            }
        }
    }

    /// Every row comes back as it went in: packed when it fits (the edges
    /// of the start's distance, a NULL `born` with a start, the largest
    /// label), kept whole beside when it does not; the gauges of a map of
    /// them equal the gauges counted from the rows themselves, and a row
    /// that moves between the two forms is counted once.
    #[test]
    fn packed_rows_keep_every_value() {
        let t = 1_700_000_000_000_000i64;
        let borns = [
            None,
            Some(0),
            Some(t),
            Some(-t),
            Some(i64::MAX),
            Some(i64::MIN + 1),
        ];
        let gaps = [
            0,
            1,
            -1,
            START_MIN,
            START_MAX,
            START_MIN - 1,
            START_MAX + 1,
            t,
            -t,
        ];
        let mut rows = Vec::new();
        for (i, born) in borns.into_iter().enumerate() {
            for label in [0, 1, 10_001, (1 << LABEL_BITS) - 1, 1 << LABEL_BITS] {
                let class = (i + label) % 3;
                rows.push(Unfinished::new(label, class, born, None));
                for gap in gaps {
                    let start = born.unwrap_or(t).checked_add(gap).filter(|s| *s != NONE);
                    rows.push(Unfinished::new(label, class, born, start));
                }
            }
        }
        let mut packed = 0;
        for u in &rows {
            if let Some(p) = Packed::pack(u) {
                packed += 1;
                assert_eq!(p.unpack(), *u);
            }
        }
        assert!(
            packed > rows.len() / 2 && packed < rows.len(),
            "both forms are tried: {packed} of {} packed",
            rows.len()
        );
        for u in &rows {
            let fits = u.label() < 1 << LABEL_BITS
                && match (u.born(), u.started()) {
                    (Some(b), Some(s)) => (START_MIN..=START_MAX).contains(&(s - b)),
                    _ => true,
                };
            assert_eq!(Packed::pack(u).is_some(), fits, "{u:?}");
        }
        let horizon = t + 5;
        let mut want = GaugeMap::new();
        for u in &rows {
            let stuck = u64::from(u.started().is_some_and(|s| s < horizon));
            want.entry(u.label())
                .or_default()
                .add(u.class(), 1, u.born(), stuck);
        }
        let mut b = Backlog::new(rows.len());
        b.clear();
        // Each key first takes another row's form (whole or packed), then its own.
        let n = rows.len() as u64;
        for (k, u) in rows.iter().enumerate() {
            b.update(k as u64, Some(rows[rows.len() - 1 - k]));
            b.update(k as u64, Some(*u));
        }
        b.filled(true);
        assert!(b.is_complete());
        assert_eq!(b.gauges(horizon), want);
        assert_eq!((b.rows + b.rare.len()) as u64, n);
        for k in 0..n {
            b.update(k, None);
        }
        assert!(b.gauges(horizon).is_empty() && b.rare.len() == 0);
    }

    #[test]
    fn a_backlog_over_the_cap_is_not_kept() {
        let mut b = Backlog::new(2);
        b.clear();
        b.update(1, row(0, 0, 1, None));
        b.update(2, row(0, 0, 2, None));
        b.filled(true);
        assert!(b.is_complete());
        b.update(3, row(0, 0, 3, None));
        assert!(!b.is_complete(), "three rows do not fit a cap of two");
        assert!(b.gauges(0).is_empty(), "nothing kept once over the cap");
        // Rows seen while incomplete are not kept: the map would be partial.
        b.update(4, row(0, 0, 4, None));
        assert!(b.gauges(0).is_empty());
        // A re-read that did not return every row leaves it incomplete.
        b.clear();
        b.update(1, row(0, 0, 1, None));
        b.filled(false);
        assert!(!b.is_complete());
    }
}
