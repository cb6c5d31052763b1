//! A consumer's status without thresholds, judged over a sliding window of
//! its own positions and lags, in the spirit of Burrow's rules: Kafka's
//! consumer groups (per partition, the committed offset) and the queue
//! kinds' consumers (`sources::queue`: what they have acknowledged) alike.
//!
//! Per partition (or consumer), over the samples of the last `status_window`:
//! * `rewind`: the committed offset went backwards between two samples;
//! * `ok`: the current lag is 0 (caught up; an idle topic is always ok);
//! * `stop` / `stall`: lag > 0 and the committed offset has not moved for at
//!   least the window: `stop` when the group has no members (its consumers
//!   are gone), `stall` when it has members (alive but not advancing);
//! * `warn`: lag > 0 in every sample of the window, never falling, higher at
//!   the end than at the start, while the offsets move;
//! * otherwise `ok`.
//!
//! The group's status is its worst partition's, in the order
//! ok < warn < rewind < stall < stop < error; `error` means its offsets could
//! not be read this cycle.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::validation::Validator;

/// A group's status; the order is the severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Rewind,
    Stall,
    Stop,
    Error,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Ok,
        Status::Warn,
        Status::Stall,
        Status::Stop,
        Status::Rewind,
        Status::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Rewind => "rewind",
            Status::Stall => "stall",
            Status::Stop => "stop",
            Status::Error => "error",
        }
    }
}

/// `status_window`: at least two poll intervals (default `5m`).
pub fn status_window(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<&str>,
    poll_interval: Duration,
) -> Duration {
    let at = format!("{key}.status_window");
    let window = v.duration(&at, written, Duration::from_secs(300));
    if window < poll_interval * 2 {
        v.problem(&at, "must span at least two poll intervals".into());
    }
    window
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    committed: i64,
    lag: i64,
}

/// The recent history of one partition of one group.
#[derive(Debug)]
pub struct History {
    samples: VecDeque<Sample>,
    /// When the committed offset last changed (first sight counts).
    pub last_moved: Instant,
}

impl History {
    pub fn new(at: Instant, committed: i64, lag: i64) -> History {
        let mut samples = VecDeque::new();
        samples.push_back(Sample { at, committed, lag });
        History {
            samples,
            last_moved: at,
        }
    }

    /// Adds this cycle's sample and forgets those older than the window
    /// (keeping the last one before it, so the window is always spanned).
    pub fn push(&mut self, at: Instant, committed: i64, lag: i64, window: Duration) {
        if let Some(last) = self.samples.back()
            && last.committed != committed
        {
            self.last_moved = at;
        }
        self.samples.push_back(Sample { at, committed, lag });
        while self.samples.len() > 2 && self.samples[1].at + window <= at {
            self.samples.pop_front();
        }
    }

    /// When the latest sample was taken.
    pub fn last_at(&self) -> Option<Instant> {
        self.samples.back().map(|s| s.at)
    }

    /// The partition's status now.
    pub fn status(&self, now: Instant, window: Duration, has_members: bool) -> Status {
        let s = &self.samples;
        let in_window = |x: &Sample| x.at + window > now;
        let recent: Vec<&Sample> = s.iter().filter(|x| in_window(x)).collect();
        if s.iter()
            .zip(s.iter().skip(1))
            .any(|(a, b)| in_window(b) && b.committed < a.committed)
        {
            return Status::Rewind;
        }
        let Some(cur) = s.back() else {
            return Status::Ok;
        };
        if cur.lag == 0 {
            return Status::Ok;
        }
        if now.duration_since(self.last_moved) >= window {
            return if has_members {
                Status::Stall
            } else {
                Status::Stop
            };
        }
        let spans_window = s
            .front()
            .is_some_and(|f| now.duration_since(f.at) >= window);
        if spans_window
            && recent.len() >= 3
            && recent.iter().all(|x| x.lag > 0)
            && recent.windows(2).all(|w| w[1].lag >= w[0].lag)
            && recent.last().map(|x| x.lag) > recent.first().map(|x| x.lag)
            && recent.last().map(|x| x.committed) > recent.first().map(|x| x.committed)
        {
            return Status::Warn;
        }
        Status::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(10);

    fn run(samples: &[(i64, i64)], members: bool) -> Vec<Status> {
        let t0 = Instant::now();
        let mut h: Option<History> = None;
        let mut out = Vec::new();
        for (i, &(committed, lag)) in samples.iter().enumerate() {
            let at = t0 + Duration::from_secs(i as u64);
            match &mut h {
                None => h = Some(History::new(at, committed, lag)),
                Some(h) => h.push(at, committed, lag, W),
            }
            out.push(h.as_ref().unwrap().status(at, W, members));
        }
        out
    }

    #[test]
    fn a_caught_up_or_idle_group_is_ok_forever() {
        let st = run(&[(5, 0); 40], true);
        assert!(st.iter().all(|s| *s == Status::Ok), "{st:?}");
        let st = run(&[(5, 0); 40], false);
        assert!(st.iter().all(|s| *s == Status::Ok), "{st:?}");
    }

    #[test]
    fn offsets_still_with_lag_stall_or_stop_after_exactly_one_window() {
        let samples: Vec<(i64, i64)> = (0..15).map(|_| (5, 3)).collect();
        let st = run(&samples, true);
        assert!(st[..10].iter().all(|s| *s == Status::Ok), "{st:?}");
        assert!(st[10..].iter().all(|s| *s == Status::Stall), "{st:?}");
        let st = run(&samples, false);
        assert_eq!(st[9], Status::Ok);
        assert_eq!(st[10], Status::Stop);
    }

    #[test]
    fn a_consumer_that_moves_again_is_ok_again() {
        let mut samples: Vec<(i64, i64)> = (0..12).map(|_| (5, 3)).collect();
        samples.push((6, 2));
        let st = run(&samples, true);
        assert_eq!(st[11], Status::Stall);
        assert_eq!(st[12], Status::Ok);
    }

    #[test]
    fn a_backwards_offset_is_a_rewind_for_one_window() {
        let mut samples: Vec<(i64, i64)> = vec![(10, 0), (11, 0), (3, 8)];
        samples.extend((0..12).map(|i| (3 + i, 8)));
        let st = run(&samples, true);
        assert_eq!(st[2], Status::Rewind);
        assert_eq!(st[11], Status::Rewind);
        assert_eq!(st[12], Status::Ok, "{st:?}");
    }

    #[test]
    fn lag_rising_while_offsets_move_warns() {
        let samples: Vec<(i64, i64)> = (0..14).map(|i| (i, 1 + i)).collect();
        let st = run(&samples, true);
        assert!(st[..10].iter().all(|s| *s == Status::Ok), "{st:?}");
        assert!(st[10..].iter().all(|s| *s == Status::Warn), "{st:?}");
        // Rising lag with offsets standing still is not warn (it becomes stall).
        let still: Vec<(i64, i64)> = (0..9).map(|i| (3, 1 + i)).collect();
        assert!(run(&still, true).iter().all(|s| *s == Status::Ok));
        // Lag that falls once in the window is not rising.
        let mut samples = samples;
        samples[12].1 = 2;
        let st = run(&samples, true);
        assert_eq!(st[12], Status::Ok);
    }
}
