//! Replayed events that fail again: the agent reads the replays
//! `dead-letters replay` recorded in the source's audit table (over its own
//! read-only connection, before each poll's transaction) and counts a
//! replayed event that is dead-lettered again once per replay.
//!
//! * `inbox_dead_letter_replays_total{source}`: the replay rows recorded
//!   since the agent's start (the rows already there when it starts are its
//!   baseline: not counted, but their events are followed);
//! * `inbox_dead_letters_after_replay_total{source,error_class}`: a replayed
//!   event seen dead again, by the class of the error it died with this time.
//!
//! A replay's status change commits with its audit row, so an event the poll
//! finds dead after the replay was read died again. An event is followed
//! until it is seen succeeded or dead, or for [`FOLLOWED_FOR`] after its
//! replay, and at most [`MAX_FOLLOWED`] at once (the oldest replays go
//! first). A replay and its event's death can both land between a poll's
//! read of the audit table and its read of the rows: the poll sees the event
//! dead before it knows of the replay. So the deaths seen are kept for
//! [`RECENT_DEAD`], with the row's time (its change cursor, or finish): a
//! replay read later whose time is at or before that death counts it then.
//! The series exist once the audit table was read; a missing or unreadable
//! audit table is logged once and the series stay absent.

use std::collections::{HashMap, HashSet};

use sqlx::any::AnyRow;

use super::config::InboxSpec;
use super::error_classes::ErrorClasses;
use super::get;
use super::sql::Sql;
use crate::telemetry::catalogue as metric;

/// How long after its replay an event is followed.
pub const FOLLOWED_FOR: i64 = 7 * 24 * 3600 * 1_000_000;

/// Replayed events followed at once.
pub const MAX_FOLLOWED: usize = 1_000_000;

/// How far back each read looks past the latest replay it has seen, for
/// audit rows whose transactions commit late (microseconds).
const OVERLAP: i64 = 60 * 1_000_000;

/// How long a death seen is kept for a replay read after it (microseconds).
pub const RECENT_DEAD: i64 = 2 * OVERLAP;

/// What the agent knows of the source's replays.
#[derive(Debug, Default)]
pub struct Replays {
    /// The read, with the lower bound of `at` as parameter 1; `None` when
    /// the source has no dead-letter actions.
    query: Option<String>,
    /// The lower bound of the next read: the latest `at` seen less the
    /// overlap; `None` before the first read (which reads every row).
    since: Option<i64>,
    /// Replayed events not yet seen finished again: event id → its replay.
    followed: HashMap<String, i64>,
    /// The rows read within the overlap, so that a row read twice counts once.
    seen: HashSet<(String, i64)>,
    /// Deaths seen of events not followed: event id → (row time, class).
    recent_dead: HashMap<String, (i64, u8)>,
    /// The latest row time of a death seen.
    latest_dead: i64,
    /// Whether the audit table has been read (the baseline is taken).
    read: bool,
    /// This poll's new replays.
    new: u64,
    /// This poll's events dead again, by error class.
    again: HashMap<u8, u64>,
    /// Whether the series exist.
    series: bool,
    /// Whether a failed read was logged.
    warned: bool,
}

impl Replays {
    /// Follows the replays of `spec`'s audit table, if it has dead-letter
    /// actions.
    pub fn new(spec: &InboxSpec, sql: Sql) -> Replays {
        let query = spec.actions.as_ref().map(|a| {
            let col = |c: &str| sql.ident(c);
            format!(
                "SELECT {}, {} FROM {} WHERE {} = {} AND {} = 'replay' AND {}",
                sql.text(&col("event_id")),
                sql.micros(&col("at")),
                sql.table(&a.audit_table),
                col("source"),
                sql.literal(&spec.table.name),
                col("action"),
                sql.after(&col("at"), 1),
            )
        });
        Replays {
            query,
            ..Replays::default()
        }
    }

    /// The read of replays, and its lower bound in microseconds.
    pub fn query(&self) -> Option<(&str, i64)> {
        self.query.as_deref().map(|q| (q, self.since.unwrap_or(0)))
    }

    /// Takes one read's rows, or its error (logged once); returns the
    /// replays it found that are now followed: (event id, when replayed).
    pub fn take(&mut self, source: &str, read: Result<Vec<AnyRow>, String>) -> Vec<(String, i64)> {
        let rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(
                        source,
                        "Cannot read the replays in the dead-letter audit table: {e}; \
                         inbox_dead_letters_after_replay_total stays absent until it can \
                         (the agent's user needs SELECT on it)"
                    );
                }
                return Vec::new();
            }
        };
        let mut replays = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: Option<String> = get(row, 0, "event_id").unwrap_or_default();
            let at: Option<i64> = get(row, 1, "at").unwrap_or_default();
            if let (Some(id), Some(at)) = (id, at) {
                replays.push((id, at));
            }
        }
        self.add(replays)
    }

    /// Takes replays `(event id, at)` read from the audit table; returns
    /// those now followed.
    fn add(&mut self, replays: Vec<(String, i64)>) -> Vec<(String, i64)> {
        let mut followed = Vec::new();
        let baseline = !self.read;
        self.read = true;
        let mut latest = self.since.map_or(i64::MIN, |s| s + OVERLAP);
        for (id, at) in replays {
            latest = latest.max(at);
            if !self.seen.insert((id.clone(), at)) {
                continue;
            }
            if !baseline {
                self.new += 1;
            }
            // Dead again before this read knew of the replay.
            if let Some(&(died, class)) = self.recent_dead.get(&id)
                && died >= at
            {
                self.recent_dead.remove(&id);
                *self.again.entry(class).or_default() += 1;
                continue;
            }
            let when = self.followed.entry(id.clone()).or_insert(at);
            *when = (*when).max(at);
            followed.push((id, at));
        }
        if latest == i64::MIN {
            return followed;
        }
        let since = latest - OVERLAP;
        self.since = Some(since);
        self.seen.retain(|(_, at)| *at > since);
        self.followed.retain(|_, at| *at > latest - FOLLOWED_FOR);
        if self.followed.len() > MAX_FOLLOWED {
            let mut ats: Vec<i64> = self.followed.values().copied().collect();
            let cut = ats.len() - MAX_FOLLOWED;
            let (_, nth, _) = ats.select_nth_unstable(cut);
            let cut_at = *nth;
            self.followed.retain(|_, at| *at >= cut_at);
        }
        followed
    }

    /// An event seen dead, in a row version of time `when` (its change
    /// cursor or finish, microseconds): counted if it was replayed and not
    /// yet seen finished since; else kept a while for a replay read later.
    pub fn dead(&mut self, event_id: &str, class: u8, when: i64) {
        if self.query.is_none() && self.followed.is_empty() {
            return;
        }
        if self.followed.remove(event_id).is_some() {
            *self.again.entry(class).or_default() += 1;
            return;
        }
        self.latest_dead = self.latest_dead.max(when);
        let cut = self.latest_dead - RECENT_DEAD;
        if when > cut {
            self.recent_dead.insert(event_id.to_string(), (when, class));
        }
        if self.recent_dead.len() > MAX_FOLLOWED {
            self.recent_dead.retain(|_, (t, _)| *t > cut);
        }
    }

    /// An event seen succeeded: no longer followed.
    pub fn succeeded(&mut self, event_id: &str) {
        if !self.followed.is_empty() {
            self.followed.remove(event_id);
        }
    }

    /// Records this poll's counts. Every series exists, at 0, from the first
    /// read of the audit table on — one per error class of the source — so
    /// that the first replay and the first event dead again after one are
    /// increases however often the agent is scraped.
    pub fn flush(&mut self, source: &str, classes: &ErrorClasses) {
        let cut = self.latest_dead - RECENT_DEAD;
        self.recent_dead.retain(|_, (t, _)| *t > cut);
        if !self.read {
            return;
        }
        let replays =
            metrics::counter!(metric::INBOX_DEAD_LETTER_REPLAYS, "source" => source.to_string());
        replays.increment(std::mem::take(&mut self.new));
        let counter = |name: &str| {
            metrics::counter!(
                metric::INBOX_DEAD_LETTERS_AFTER_REPLAY,
                "source" => source.to_string(),
                "error_class" => name.to_string()
            )
        };
        if !self.series {
            self.series = true;
            for class in classes.all() {
                counter(&class.name).increment(0);
            }
        }
        for (class, n) in self.again.drain() {
            counter(&classes.get(class).name).increment(n);
        }
    }

    /// Events followed now (for tests).
    #[cfg(test)]
    fn followed(&self) -> usize {
        self.followed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: &str, at: i64) -> (String, i64) {
        (id.to_string(), at)
    }

    #[test]
    fn a_replayed_event_dead_again_counts_once_per_replay() {
        let mut p = Replays::default();
        p.add(vec![r("old", 1_000)]);
        assert_eq!(p.new, 0, "the first read is the baseline");
        p.add(vec![r("old", 1_000), r("a", 2_000), r("b", 2_000)]);
        assert_eq!(p.new, 2, "a row read again counts once");
        p.dead("a", 3, 2_500);
        p.dead("a", 3, 2_600);
        p.succeeded("b");
        p.dead("b", 3, 2_700);
        p.dead("old", 4, 2_800);
        p.dead("never", 4, 2_900);
        assert_eq!(p.again, HashMap::from([(3, 1), (4, 1)]));
        // Replayed again: followed again.
        p.add(vec![r("a", 90_000_000)]);
        p.dead("a", 3, 90_000_001);
        assert_eq!(p.again, HashMap::from([(3, 2), (4, 1)]));
        assert_eq!(p.new, 3);
    }

    #[test]
    fn reads_overlap_by_a_minute_and_forget_after_a_week() {
        let mut p = Replays::default();
        p.add(vec![r("a", 100 * 1_000_000)]);
        assert_eq!(p.since, Some(40 * 1_000_000));
        // A read that finds nothing keeps the bound.
        p.add(Vec::new());
        assert_eq!(p.since, Some(40 * 1_000_000));
        p.add(vec![r("b", FOLLOWED_FOR + 200 * 1_000_000)]);
        assert_eq!(
            p.followed(),
            1,
            "a week after its replay, a is no longer followed"
        );
        p.dead("a", 0, FOLLOWED_FOR + 300 * 1_000_000);
        assert!(p.again.is_empty());
    }

    #[test]
    fn a_death_seen_before_its_replay_is_read_counts_when_the_replay_is_read() {
        let mut p = Replays {
            query: Some(String::new()),
            ..Replays::default()
        };
        p.add(Vec::new());
        // Replayed at 10 s, dead again at 11 s, both before the audit read.
        p.dead("a", 2, 11_000_000);
        // Dead at 5 s, replayed at 10 s: that death is the old one.
        p.dead("b", 2, 5_000_000);
        assert!(p.again.is_empty());
        p.add(vec![r("a", 10_000_000), r("b", 10_000_000)]);
        assert_eq!(p.again, HashMap::from([(2, 1)]));
        assert_eq!(p.followed(), 1, "b is followed");
        // A death kept longer than RECENT_DEAD is forgotten.
        p.dead("c", 2, 20_000_000);
        p.dead("d", 2, 20_000_000 + RECENT_DEAD + 1);
        p.flush("s", &ErrorClasses::default());
        assert!(!p.recent_dead.contains_key("c") && p.recent_dead.contains_key("d"));
    }
}
