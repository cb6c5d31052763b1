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
//! first). The series exist once the audit table was read; a missing or
//! unreadable audit table is logged once and the series stay absent.

use std::collections::{HashMap, HashSet};

use sqlx::any::AnyRow;

use super::config::InboxSpec;
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
    /// Whether the audit table has been read (the baseline is taken).
    read: bool,
    /// This poll's new replays.
    new: u64,
    /// This poll's events dead again, by error class.
    again: HashMap<u8, u64>,
    /// Error classes whose series exist.
    series: HashSet<u8>,
    /// Whether the replays series exists.
    replays_series: bool,
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

    /// Takes one read's rows, or its error (logged once).
    pub fn take(&mut self, source: &str, read: Result<Vec<AnyRow>, String>) {
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
                return;
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
        self.add(replays);
    }

    /// Takes replays `(event id, at)` read from the audit table.
    fn add(&mut self, replays: Vec<(String, i64)>) {
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
            let when = self.followed.entry(id).or_insert(at);
            *when = (*when).max(at);
        }
        if latest == i64::MIN {
            return;
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
    }

    /// An event seen dead: counted if it was replayed and not yet seen
    /// finished since.
    pub fn dead(&mut self, event_id: &str, class: u8) {
        if self.followed.remove(event_id).is_some() {
            *self.again.entry(class).or_default() += 1;
        }
    }

    /// An event seen succeeded: no longer followed.
    pub fn succeeded(&mut self, event_id: &str) {
        if !self.followed.is_empty() {
            self.followed.remove(event_id);
        }
    }

    /// Records this poll's counts; a series first shows at 0, its amounts
    /// one poll later, as the other series by error class.
    pub fn flush(&mut self, source: &str, class_name: impl Fn(u8) -> String) {
        if !self.read {
            return;
        }
        let replays =
            metrics::counter!(metric::INBOX_DEAD_LETTER_REPLAYS, "source" => source.to_string());
        if self.replays_series {
            replays.increment(std::mem::take(&mut self.new));
        } else {
            self.replays_series = true;
            replays.increment(0);
        }
        let again: Vec<(u8, u64)> = self.again.drain().collect();
        for (class, n) in again {
            let c = metrics::counter!(
                metric::INBOX_DEAD_LETTERS_AFTER_REPLAY,
                "source" => source.to_string(),
                "error_class" => class_name(class)
            );
            if self.series.insert(class) {
                c.increment(0);
                self.again.insert(class, n);
            } else {
                c.increment(n);
            }
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
        p.dead("a", 3);
        p.dead("a", 3);
        p.succeeded("b");
        p.dead("b", 3);
        p.dead("old", 4);
        p.dead("never", 4);
        assert_eq!(p.again, HashMap::from([(3, 1), (4, 1)]));
        // Replayed again: followed again.
        p.add(vec![r("a", 90_000_000)]);
        p.dead("a", 3);
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
        p.dead("a", 0);
        assert!(p.again.is_empty());
    }
}
