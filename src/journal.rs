//! The retry trajectories of recent failed and dead-lettered events, as
//! `/events/{id}` and `/dead-letters` show them: every attempt the agent
//! observed (start, end, outcome, error class, the start of the error), kept
//! in memory for the most recently changed events only.
//!
//! Bounded twice: at most [`EVENTS`] events (the least recently changed one
//! is forgotten first), and per event at most [`ATTEMPTS`] attempts (the
//! first ones and the latest ones; the ones between are counted, not kept).
//! An event enters the journal with its first failed attempt; an event that
//! succeeds at once never does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Events remembered, across sources.
pub const EVENTS: usize = 2_000;
/// Attempts remembered per event: the first [`FIRST_KEPT`] and the latest ones.
pub const ATTEMPTS: usize = 12;
/// Attempts always kept from the start of an event's trajectory.
pub const FIRST_KEPT: usize = 4;
/// Characters of an error kept per attempt.
pub const ERROR_KEPT: usize = 200;

/// How an observed attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Failed and left for another attempt.
    Failed,
    /// The last attempt: the event succeeded.
    Succeeded,
    /// The last attempt: the event was dead-lettered.
    DeadLettered,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Failed => "failed",
            Outcome::Succeeded => "succeeded",
            Outcome::DeadLettered => "dead_lettered",
        }
    }
}

/// One attempt as the agent saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// The attempt's number (1 for the first), when the table counts them.
    pub number: u32,
    /// False for an attempt the table's counts show but no poll saw: it
    /// started and failed between two polls.
    pub observed: bool,
    /// Microseconds since the epoch, when the table says.
    pub started: Option<i64>,
    /// Microseconds since the epoch: when the row showed the attempt's end.
    pub ended: Option<i64>,
    pub outcome: Outcome,
    pub error_class: Option<Arc<str>>,
    /// The first [`ERROR_KEPT`] characters of the error.
    pub error: Option<String>,
}

/// What the journal keeps of one event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trail {
    pub event_type: Option<String>,
    /// Microseconds since the epoch.
    pub received: Option<i64>,
    /// The kept attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Attempts dropped from the middle of a long trajectory.
    pub elided: u32,
}

impl Trail {
    fn push(&mut self, a: Attempt) {
        // The same attempt seen again (a re-read row) replaces the earlier view.
        if let Some(last) = self.attempts.last_mut()
            && last.number == a.number
            && a.number > 0
        {
            *last = a;
            return;
        }
        if self.attempts.len() >= ATTEMPTS {
            self.attempts.remove(FIRST_KEPT);
            self.elided += 1;
        }
        self.attempts.push(a);
    }

    /// The number of the latest attempt kept.
    pub fn last_number(&self) -> u32 {
        self.attempts.last().map_or(0, |a| a.number)
    }

    /// When the event's first attempt failed (microseconds since the epoch),
    /// if the agent saw it end: the first attempt kept is attempt 1, observed,
    /// and not a success. `None` when it failed between two polls or before
    /// the agent watched it.
    pub fn first_failure(&self) -> Option<i64> {
        let first = self.attempts.first()?;
        if first.number <= 1 && first.observed && first.outcome != Outcome::Succeeded {
            first.ended
        } else {
            None
        }
    }
}

type Key = (Arc<str>, String);

#[derive(Default)]
struct Inner {
    /// Key → (its place in `order`, its trail).
    events: HashMap<Key, (u64, Trail)>,
    /// Place → key, oldest change first.
    order: BTreeMap<u64, Key>,
    next: u64,
}

/// The agent's journal of recent failed events; cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Journal {
    inner: Arc<Mutex<Inner>>,
    capacity: Option<usize>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("events", &self.len())
            .finish()
    }
}

impl Journal {
    /// A journal that keeps at most `capacity` events (tests; the agent's
    /// holds [`EVENTS`]).
    pub fn with_capacity(capacity: usize) -> Journal {
        Journal {
            capacity: Some(capacity),
            ..Journal::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the journal holds this event (so that its success is worth recording).
    pub fn holds(&self, source: &Arc<str>, event_id: &str) -> bool {
        self.lock()
            .events
            .contains_key(&(source.clone(), event_id.to_string()))
    }

    /// Records what a poll saw of one event: `missed` attempts the counts
    /// show but no poll saw (numbered before `attempt`), then `attempt`.
    /// Only a failed or dead-lettered attempt adds an event that is not held.
    pub fn record(
        &self,
        source: &Arc<str>,
        event_id: &str,
        event_type: Option<&str>,
        received: Option<i64>,
        missed: std::ops::Range<u32>,
        attempt: Attempt,
    ) {
        let mut g = self.lock();
        let key = (source.clone(), event_id.to_string());
        let inner = &mut *g;
        let place = inner.next;
        inner.next += 1;
        let trail = match inner.events.get_mut(&key) {
            Some((old, trail)) => {
                inner.order.remove(old);
                *old = place;
                trail
            }
            None => {
                if attempt.outcome == Outcome::Succeeded {
                    return;
                }
                let capacity = self.capacity.unwrap_or(EVENTS);
                while inner.events.len() >= capacity {
                    let Some((_, oldest)) = inner.order.pop_first() else {
                        break;
                    };
                    inner.events.remove(&oldest);
                }
                &mut inner
                    .events
                    .entry(key.clone())
                    .or_insert((place, Trail::default()))
                    .1
            }
        };
        inner.order.insert(place, key);
        if trail.event_type.is_none() {
            trail.event_type = event_type.map(str::to_string);
        }
        if trail.received.is_none() {
            trail.received = received;
        }
        let from = missed.start.max(trail.last_number() + 1);
        // Far more missed attempts than are kept: only the ones that would
        // stay are pushed, the rest counted.
        let count = missed.end.saturating_sub(from) as usize;
        let skip = count.saturating_sub(ATTEMPTS) as u32;
        trail.elided += skip;
        let keep_first = (from..missed.end).take(FIRST_KEPT.min(count));
        let rest =
            (from + FIRST_KEPT as u32 + skip).max(from + FIRST_KEPT.min(count) as u32)..missed.end;
        for number in keep_first.chain(rest) {
            trail.push(Attempt {
                number,
                observed: false,
                started: None,
                ended: None,
                outcome: Outcome::Failed,
                error_class: None,
                error: None,
            });
        }
        let mut attempt = attempt;
        if let Some(e) = &mut attempt.error
            && e.chars().count() > ERROR_KEPT
        {
            *e = e.chars().take(ERROR_KEPT).collect();
        }
        trail.push(attempt);
    }

    /// The trails of one event id, by source.
    pub fn get(&self, event_id: &str) -> Vec<(Arc<str>, Trail)> {
        let g = self.lock();
        let mut out: Vec<(Arc<str>, Trail)> = g
            .events
            .iter()
            .filter(|((_, id), _)| id == event_id)
            .map(|((s, _), (_, t))| (s.clone(), t.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The trail of one event of one source.
    pub fn trail(&self, source: &str, event_id: &str) -> Option<Trail> {
        let g = self.lock();
        g.events
            .get(&(Arc::from(source), event_id.to_string()))
            .map(|(_, t)| t.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(n: u32, err: &str) -> Attempt {
        Attempt {
            number: n,
            observed: true,
            started: Some(i64::from(n) * 10),
            ended: Some(i64::from(n) * 10 + 5),
            outcome: Outcome::Failed,
            error_class: Some(Arc::from("timeout")),
            error: Some(err.to_string()),
        }
    }

    #[test]
    fn missed_attempts_are_marked_and_a_reread_replaces_the_same_attempt() {
        let j = Journal::default();
        let s: Arc<str> = Arc::from("orders");
        j.record(&s, "e1", Some("t"), Some(1), 1..3, failed(3, "boom"));
        j.record(&s, "e1", Some("t"), Some(1), 1..3, failed(3, "boom again"));
        let t = j.trail("orders", "e1").unwrap();
        let seen: Vec<(u32, bool)> = t.attempts.iter().map(|a| (a.number, a.observed)).collect();
        assert_eq!(seen, vec![(1, false), (2, false), (3, true)]);
        assert_eq!(t.attempts[2].error.as_deref(), Some("boom again"));
    }

    #[test]
    fn a_success_alone_is_not_kept_and_a_success_after_failures_is() {
        let j = Journal::default();
        let s: Arc<str> = Arc::from("orders");
        let ok = Attempt {
            outcome: Outcome::Succeeded,
            ..failed(1, "")
        };
        j.record(&s, "fine", None, None, 1..1, ok.clone());
        assert!(j.is_empty());
        j.record(&s, "e", None, None, 1..1, failed(1, "x"));
        j.record(&s, "e", None, None, 2..2, Attempt { number: 2, ..ok });
        let outcomes: Vec<Outcome> = j
            .trail("orders", "e")
            .unwrap()
            .attempts
            .iter()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(outcomes, vec![Outcome::Failed, Outcome::Succeeded]);
    }

    #[test]
    fn the_first_failure_is_known_only_when_attempt_one_was_seen_ending() {
        let j = Journal::default();
        let s: Arc<str> = Arc::from("orders");
        j.record(&s, "seen", None, None, 1..1, failed(1, "x"));
        j.record(&s, "seen", None, None, 2..2, failed(2, "y"));
        assert_eq!(j.trail("orders", "seen").unwrap().first_failure(), Some(15));
        // Attempts 1 and 2 failed between two polls: their times are unknown.
        j.record(&s, "missed", None, None, 1..3, failed(3, "z"));
        assert_eq!(j.trail("orders", "missed").unwrap().first_failure(), None);
    }

    #[test]
    fn a_huge_jump_in_attempts_is_counted_not_pushed() {
        let j = Journal::default();
        let s: Arc<str> = Arc::from("orders");
        j.record(&s, "e", None, None, 1..1_000_000, failed(1_000_000, "x"));
        let t = j.trail("orders", "e").unwrap();
        assert_eq!(t.attempts.len(), ATTEMPTS);
        assert_eq!(
            t.attempts.len() as u32 + t.elided,
            1_000_000,
            "every attempt is kept or counted"
        );
        assert_eq!(t.attempts[0].number, 1);
        assert_eq!(t.attempts.last().unwrap().number, 1_000_000);
    }

    #[test]
    fn events_and_attempts_stay_bounded() {
        let j = Journal::with_capacity(3);
        let s: Arc<str> = Arc::from("orders");
        for i in 0..10 {
            j.record(&s, &format!("e{i}"), None, None, 1..1, failed(1, "x"));
        }
        assert_eq!(j.len(), 3);
        // The least recently changed go first: e7, e8, e9 remain.
        for i in 7..10 {
            assert!(j.holds(&s, &format!("e{i}")), "e{i}");
        }
        for n in 1..=30 {
            j.record(&s, "e9", None, None, n..n, failed(n, &"y".repeat(500)));
        }
        let t = j.trail("orders", "e9").unwrap();
        assert_eq!(t.attempts.len(), ATTEMPTS);
        assert_eq!(t.elided, 30 - ATTEMPTS as u32);
        let numbers: Vec<u32> = t.attempts.iter().map(|a| a.number).collect();
        let mut expected: Vec<u32> = (1..=FIRST_KEPT as u32).collect();
        expected.extend(30 - (ATTEMPTS - FIRST_KEPT) as u32 + 1..=30);
        assert_eq!(numbers, expected);
        assert_eq!(
            t.attempts
                .last()
                .unwrap()
                .error
                .as_ref()
                .unwrap()
                .chars()
                .count(),
            ERROR_KEPT
        );
    }
}
