//! The sweep for late commits, in stripes.
//!
//! A poll's tail looks back only [`super::COMMIT_LAG`] below its high-water
//! mark, which catches ordinary commit latency. A transaction that commits
//! later still — its `updated_at` (or arrival, finish time) already below
//! that — is caught by the sweep, which re-reads the rest of the overlap
//! window: `[high − overlap, high − COMMIT_LAG)`.
//!
//! The window is cut into stripes of fixed absolute time, each re-read once
//! every `every` (a third of the overlap), so that a poll reads about one
//! stripe instead of the whole window every third of the overlap: the cost is
//! spread over the polls and no poll pays for the whole window. Each stripe
//! remembers the snapshot xmin of its last read; on PostgreSQL the next read
//! of that stripe returns only rows written by a transaction that had not
//! ended then (every other row of the stripe was read by it). A stripe never
//! read yet takes the xmin of the last poll whose tail reached down to its
//! start: that tail read every row of the stripe committed before it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// One stripe due for a read: `(start, end]`-exclusive bounds in
/// microseconds, as `start <= t < end`, and the xmin its rows are filtered by
/// (0: every row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripe {
    pub index: i64,
    pub start: i64,
    pub end: i64,
    pub seen_before: i64,
}

/// The stripes of one watermarked column.
#[derive(Debug)]
pub struct Stripes {
    /// Stripe width in microseconds.
    width: i64,
    every: Duration,
    /// Stripe index → when it was last read, and that poll's snapshot xmin.
    read: BTreeMap<i64, (Instant, i64)>,
    /// Recent polls: how far down their tail read (`low`), and their xmin.
    polls: VecDeque<(i64, i64)>,
}

/// Polls remembered at most (a day of 1 s polls is far more than any
/// overlap window needs; the oldest useful one is kept anyway).
const MAX_POLLS: usize = 100_000;

impl Stripes {
    /// Stripes over a window of `span` (overlap − COMMIT_LAG), each re-read
    /// every `every`, for polls every `poll`: about one stripe per poll.
    /// `unit` is the cursor's resolution in microseconds.
    pub fn new(span: Duration, every: Duration, poll: Duration, unit: i64) -> Stripes {
        let span = micros(span);
        let per_poll = poll.as_secs_f64() / every.as_secs_f64().max(1e-6);
        let width = ((span as f64 * per_poll.min(1.0)) as i64)
            .max(unit)
            .max(1000);
        // Whole units, so that stripe bounds are exact cursor values.
        let width = width / unit * unit;
        Stripes {
            width: width.max(unit),
            every,
            read: BTreeMap::new(),
            polls: VecDeque::new(),
        }
    }

    /// The stripes of `[low, top)` due at `now`: never read, or read at
    /// least `every` ago.
    pub fn due(&self, low: i64, top: i64, now: Instant) -> Vec<Stripe> {
        if top <= low {
            return Vec::new();
        }
        let first = low.div_euclid(self.width);
        let last = (top - 1).div_euclid(self.width);
        let mut out = Vec::new();
        for index in first..=last {
            let start = index.saturating_mul(self.width);
            let seen_before = match self.read.get(&index) {
                Some((at, _)) if now.duration_since(*at) < self.every => continue,
                Some((_, xmin)) => *xmin,
                None => self.tail_xmin(start),
            };
            out.push(Stripe {
                index,
                start,
                end: start.saturating_add(self.width),
                seen_before,
            });
        }
        out
    }

    /// The xmin of the last poll whose tail read down to `start` or below;
    /// 0 when none is remembered.
    fn tail_xmin(&self, start: i64) -> i64 {
        self.polls
            .iter()
            .rev()
            .find(|(low, _)| *low <= start)
            .map_or(0, |(_, xmin)| *xmin)
    }

    /// A stripe was read at `now` by a poll with snapshot xmin `xmin`.
    pub fn read(&mut self, index: i64, now: Instant, xmin: i64) {
        self.read.insert(index, (now, xmin));
    }

    /// Every stripe of `[low, top)` was read whole (the first poll reads the
    /// whole overlap window).
    pub fn read_all(&mut self, low: i64, top: i64, now: Instant, xmin: i64) {
        if top <= low {
            return;
        }
        for index in low.div_euclid(self.width)..=(top - 1).div_euclid(self.width) {
            self.read(index, now, xmin);
        }
    }

    /// A poll's tail read every row above `tail_low` committed before its
    /// snapshot (xmin `xmin`); stripes wholly below `window_low` have left
    /// the window and are forgotten.
    pub fn polled(&mut self, tail_low: i64, xmin: i64, window_low: i64) {
        self.polls.push_back((tail_low, xmin));
        let keep_from = window_low.saturating_sub(self.width);
        // Keep the newest poll at or below the window's lowest stripe.
        while self.polls.len() > MAX_POLLS
            || (self.polls.len() >= 2 && self.polls[1].0 <= keep_from)
        {
            self.polls.pop_front();
        }
        let first = window_low.div_euclid(self.width);
        self.read = self.read.split_off(&first);
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn stripes() -> Stripes {
        // 28 s of window, each stripe every 10 s, 1 s polls: 2.8 s stripes.
        Stripes::new(
            Duration::from_secs(28),
            Duration::from_secs(10),
            Duration::from_secs(1),
            1,
        )
    }

    #[test]
    fn a_poll_reads_about_one_stripe_once_they_are_staggered() {
        let mut s = stripes();
        assert_eq!(s.width, 2_800_000);
        let t0 = Instant::now();
        // The first poll read the whole window.
        let mut high = 1_000 * S;
        s.read_all(high - 30 * S, high, t0, 10);
        s.polled(high - 30 * S, 10, high - 30 * S);
        let mut per_poll = Vec::new();
        for p in 1..=120i64 {
            let now = t0 + Duration::from_secs(p as u64);
            high += S;
            let (low, top) = (high - 30 * S, high - 2 * S);
            let due = s.due(low, top, now);
            for st in &due {
                assert!(st.seen_before > 0, "every stripe's xmin is known");
                s.read(st.index, now, 10 + p);
            }
            s.polled(top, 10 + p, low);
            if p > 40 {
                per_poll.push(due.len());
            }
        }
        // Once the stripes read together at the start have left the window,
        // no poll reads more than two stripes, and each is read every 10 s.
        assert!(per_poll.iter().all(|n| *n <= 2), "{per_poll:?}");
        let total: usize = per_poll.iter().sum();
        assert!((60..=120).contains(&total), "{total} stripes in 80 polls");
    }

    #[test]
    fn a_new_stripe_takes_the_xmin_of_the_tail_that_reached_below_it() {
        let mut s = stripes();
        let t0 = Instant::now();
        s.polled(10 * S, 100, 0);
        s.polled(12 * S, 101, 0);
        s.polled(14 * S, 102, 0);
        // Stripe 4 starts at 11.2 s: the tail of the poll that read from 10 s.
        let due = s.due(12 * S, 13 * S, t0);
        assert_eq!((due[0].index, due[0].start), (4, 11_200_000));
        assert_eq!(due[0].seen_before, 100);
        // Stripe 5 starts at 14 s: the newest tail that reached it.
        assert_eq!(s.due(15 * S, 16 * S, t0)[0].seen_before, 102);
        // Stripe 3 starts at 8.4 s, below every remembered tail: every row.
        assert_eq!(s.due(11 * S, 12 * S, t0)[0].seen_before, 0);
    }

    #[test]
    fn a_stripe_is_due_again_after_every_and_with_its_own_xmin() {
        let mut s = stripes();
        let t0 = Instant::now();
        s.read(5, t0, 77);
        let at = |d: u64| t0 + Duration::from_secs(d);
        let low = 5 * s.width;
        assert!(s.due(low, low + 1, at(9)).is_empty());
        assert_eq!(s.due(low, low + 1, at(10))[0].seen_before, 77);
        // Stripes below the window are forgotten: stripe 5 is then as new,
        // and takes the xmin of the tail that read from 0.
        s.polled(0, 1, 6 * s.width);
        assert_eq!(s.due(low, low + 1, at(1))[0].seen_before, 1);
    }
}
