//! What the server's answers mean, as a pure step (no server): a stream
//! entry id and whether its milliseconds are a time, each group's lag in
//! messages (Redis's own, or from ids where it cannot say) and in seconds
//! on the broker's clock, its unacknowledged work, and the growth of the
//! dead-letter streams since the last poll.
//!
//! The lag when Redis says nil (`XINFO GROUPS` `lag`: entries were deleted
//! after the group's last-delivered id, or `XGROUP SETID` forgot its read
//! counter): when the group's last-delivered id is before the stream's
//! first entry, every entry is undelivered (the stream's length); when it
//! is at or after the last entry, none is; otherwise the ids after it are
//! counted, at most `lag_count_limit` (a count cut there is that bound, and
//! said in a warning). Entries trimmed away before a group read them are
//! never delivered, so they are not lag: a group behind the first entry
//! lags by the stream's length, whatever Redis's counter says.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::config::RedisStreamsSpec;
use super::fetch::{GroupSaid, Said, StreamSaid};
use super::id::Id;
use crate::sources::queue::{Consumer, DeadLetters, Observation, Queue};

/// How a group's lag in messages was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagFrom {
    /// Redis's `lag`.
    Redis,
    /// The ids alone (before the first entry: all; at or past the last: none).
    Ids,
    /// The ids after the last-delivered one, counted.
    Counted,
    /// Counted up to `lag_count_limit`: at least this many.
    CountCut,
}

/// A group's lag in messages, and how it was found.
pub fn lag(stream: &StreamSaid, group: &GroupSaid, count_limit: usize) -> (u64, LagFrom) {
    let last = group.last_delivered;
    if stream.first_entry.is_none_or(|first| first > last) {
        return (stream.length, LagFrom::Ids);
    }
    if let Some(lag) = group.lag {
        return (lag, LagFrom::Redis);
    }
    if stream.last_entry.is_none_or(|l| l <= last) {
        return (0, LagFrom::Ids);
    }
    match group.counted_after {
        Some(n) if n as usize >= count_limit => (n, LagFrom::CountCut),
        Some(n) => (n, LagFrom::Counted),
        // The count was not read (the group went during the poll).
        None => (0, LagFrom::CountCut),
    }
}

/// What an operator is told once (per stream, or per group).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Warning {
    /// A stream whose ids are not times (explicit ids such as `1-1`).
    NotTimes { stream: String, id: String },
    /// A group whose lag was counted and cut at the bound.
    LagCut {
        stream: String,
        group: String,
        limit: usize,
    },
    /// A watched name that is no stream now.
    Missing { stream: String, why: String },
}

impl Warning {
    /// What makes two warnings the same one: a stream's ids are said once,
    /// whichever id showed it.
    fn key(&self) -> String {
        match self {
            Warning::NotTimes { stream, .. } => format!("ids {stream}"),
            Warning::LagCut { stream, group, .. } => format!("lag {stream} {group}"),
            Warning::Missing { stream, why } => format!("missing {stream} {why}"),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::NotTimes { stream, id } => write!(
                f,
                "stream \"{stream}\" has entry ids that are not times (e.g. {id}: written with explicit ids): its lag and unacknowledged ages are left out"
            ),
            Warning::LagCut {
                stream,
                group,
                limit,
            } => write!(
                f,
                "group \"{group}\" of stream \"{stream}\": Redis cannot say its lag and more than lag_count_limit = {limit} entries follow its last-delivered id: its lag is given as {limit}"
            ),
            Warning::Missing { stream, why } => {
                write!(f, "stream \"{stream}\" cannot be read: {why}")
            }
        }
    }
}

/// What a source keeps between polls for this step: the dead-letter
/// streams' last counts and the warnings already given.
#[derive(Debug, Default)]
pub struct Judge {
    dead_seen: Option<BTreeMap<String, u64>>,
    warned: BTreeSet<String>,
}

impl Judge {
    /// One poll's observation, and the warnings not given before.
    pub fn observe(&mut self, spec: &RedisStreamsSpec, said: &Said) -> (Observation, Vec<Warning>) {
        let mut warnings = Vec::new();
        let now = said.now_ms;
        let mut out = Observation {
            broker: "redis",
            queues: Vec::new(),
            consumers: Vec::new(),
            dead_letters: Vec::new(),
        };
        for (stream, why) in &said.missing {
            warnings.push(Warning::Missing {
                stream: stream.clone(),
                why: why.clone(),
            });
        }
        for s in &said.streams {
            out.queues.push(Queue {
                queue: s.name.clone(),
                messages: s.length,
                appended: s.entries_added,
                redelivered: None,
            });
            for g in &s.groups {
                let (consumer, mut said_warnings) = consumer(s, g, now, spec.lag_count_limit);
                warnings.append(&mut said_warnings);
                out.consumers.push(consumer);
            }
        }
        out.dead_letters = self.dead_letters(spec, said);
        warnings.retain(|w| self.warned.insert(w.key()));
        (out, warnings)
    }

    /// The growth of each watched stream's dead-letter stream since the
    /// last poll. The first poll sets the baselines (a dead-letter stream
    /// absent then starts at 0); a count that fell (the stream was deleted
    /// and made again) counts in full.
    fn dead_letters(&mut self, spec: &RedisStreamsSpec, said: &Said) -> Vec<DeadLetters> {
        let first = self.dead_seen.is_none();
        let seen = self.dead_seen.get_or_insert_with(BTreeMap::new);
        let mut out = Vec::new();
        for (from, to) in &spec.dead_letter_streams {
            let Some(now) = said.dead_letter_streams.get(to) else {
                continue;
            };
            let now = now.unwrap_or(0);
            let before = seen.insert(to.clone(), now);
            let count = match before {
                _ if first => 0,
                Some(b) if now >= b => now - b,
                Some(_) => now,
                None => now,
            };
            out.push(DeadLetters {
                queue: from.clone(),
                consumer: String::new(),
                reason: "dead_letter_stream",
                count,
            });
        }
        out
    }
}

/// One group as a queue consumer, and what to warn of.
fn consumer(
    s: &StreamSaid,
    g: &GroupSaid,
    now: u64,
    count_limit: usize,
) -> (Consumer, Vec<Warning>) {
    let mut warnings = Vec::new();
    let (lag_messages, from) = lag(s, g, count_limit);
    if from == LagFrom::CountCut {
        warnings.push(Warning::LagCut {
            stream: s.name.clone(),
            group: g.name.clone(),
            limit: count_limit,
        });
    }
    let mut age = |id: Option<Id>| {
        let id = id?;
        let age = id.age(now);
        if age.is_none() {
            warnings.push(Warning::NotTimes {
                stream: s.name.clone(),
                id: id.to_string(),
            });
        }
        age
    };
    let lag_seconds = if lag_messages == 0 {
        Some(0.0)
    } else {
        age(g.next_undelivered)
    };
    let oldest_unacked_age_seconds = if g.pending == 0 {
        Some(0.0)
    } else {
        age(g.smallest_pending)
    };
    // The group's reads: its counter, or what was added less what it has
    // yet to get; acknowledged is what it read less what it held at the
    // same moment (one `XINFO GROUPS` answer).
    let read = g
        .entries_read
        .or_else(|| s.entries_added.map(|a| a.saturating_sub(lag_messages)))
        .unwrap_or(0);
    let consumer = Consumer {
        queue: s.name.clone(),
        consumer: g.name.clone(),
        lag_messages,
        lag_seconds,
        unacked: Some(g.pending),
        oldest_unacked_age_seconds,
        redelivered: Some(g.redelivered),
        redelivered_scan_cut: g.scanned < g.pending,
        consumers: g.consumers,
        acknowledged: read as i64 - g.pending_with_read as i64,
    };
    (consumer, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_000_000_000;

    fn id(ms: u64, seq: u64) -> Id {
        Id { ms, seq }
    }

    fn stream(length: u64, first: Option<Id>, last: Option<Id>) -> StreamSaid {
        StreamSaid {
            name: "orders".into(),
            length,
            entries_added: Some(length),
            first_entry: first,
            last_entry: last,
            groups: Vec::new(),
        }
    }

    /// Guards the lag when Redis cannot say it: all entries before the
    /// first, none past the last, counted between, cut at the bound.
    #[test]
    fn lag_from_ids_where_redis_says_nil() {
        let s = stream(10, Some(id(NOW - 10_000, 0)), Some(id(NOW, 0)));
        let mut g = GroupSaid {
            last_delivered: id(5, 0),
            ..GroupSaid::default()
        };
        assert_eq!(lag(&s, &g, 100), (10, LagFrom::Ids));
        g.lag = Some(99);
        assert_eq!(
            lag(&s, &g, 100),
            (10, LagFrom::Ids),
            "trimmed entries are not lag"
        );
        g.last_delivered = id(NOW - 5_000, 0);
        assert_eq!(lag(&s, &g, 100), (99, LagFrom::Redis));
        g.lag = None;
        g.counted_after = Some(4);
        assert_eq!(lag(&s, &g, 100), (4, LagFrom::Counted));
        g.counted_after = Some(100);
        assert_eq!(lag(&s, &g, 100), (100, LagFrom::CountCut));
        g.last_delivered = id(NOW, 0);
        assert_eq!(lag(&s, &g, 100), (0, LagFrom::Ids));
        let empty = stream(0, None, None);
        assert_eq!(lag(&empty, &g, 100), (0, LagFrom::Ids));
    }

    /// Guards the status rules' position: what the group read less what it
    /// held in the same `XINFO GROUPS` answer. `XPENDING`, read after it,
    /// may already count a delivery made in between; taking that count made
    /// the position go back, and a consumer that only reads showed "rewind".
    #[test]
    fn acknowledged_is_read_less_pending_of_one_answer() {
        let s = stream(10, Some(id(NOW - 10_000, 0)), Some(id(NOW, 0)));
        let g = GroupSaid {
            name: "worker".into(),
            entries_read: Some(7),
            pending_with_read: 2,
            pending: 3,
            last_delivered: id(NOW - 3_000, 0),
            ..GroupSaid::default()
        };
        let (c, _) = consumer(&s, &g, NOW, 100);
        assert_eq!(c.acknowledged, 5);
        assert_eq!(c.unacked, Some(3));
    }

    /// Guards the seconds: on the broker's clock, from the first
    /// undelivered and the smallest pending ids; 0 when nothing lags or
    /// nothing is pending; absent (with one warning per stream) when the
    /// ids are not times.
    #[test]
    fn seconds_on_the_brokers_clock_and_warnings_once() {
        let mut s = stream(10, Some(id(NOW - 10_000, 0)), Some(id(NOW - 1_000, 0)));
        s.groups.push(GroupSaid {
            name: "billing".into(),
            consumers: 2,
            pending: 3,
            pending_with_read: 3,
            last_delivered: id(NOW - 4_000, 0),
            entries_read: Some(7),
            lag: Some(3),
            smallest_pending: Some(id(NOW - 8_000, 0)),
            next_undelivered: Some(id(NOW - 3_000, 0)),
            scanned: 3,
            redelivered: 1,
            counted_after: None,
        });
        let (c, w) = consumer(&s, &s.groups[0], NOW, 100);
        assert!(w.is_empty());
        assert_eq!(c.lag_messages, 3);
        assert_eq!(c.lag_seconds, Some(3.0));
        assert_eq!(c.oldest_unacked_age_seconds, Some(8.0));
        assert_eq!(c.unacked, Some(3));
        assert_eq!(c.redelivered, Some(1));
        assert!(!c.redelivered_scan_cut);
        assert_eq!(c.acknowledged, 4);
        assert_eq!(c.consumers, 2);

        let mut explicit = stream(3, Some(id(1, 1)), Some(id(1, 3)));
        explicit.name = "manual".into();
        explicit.groups.push(GroupSaid {
            name: "g".into(),
            pending: 1,
            last_delivered: id(1, 1),
            lag: Some(2),
            smallest_pending: Some(id(1, 1)),
            next_undelivered: Some(id(1, 2)),
            scanned: 0,
            ..GroupSaid::default()
        });
        let (c, w) = consumer(&explicit, &explicit.groups[0], NOW, 100);
        assert_eq!(c.lag_seconds, None);
        assert_eq!(c.oldest_unacked_age_seconds, None);
        assert!(c.redelivered_scan_cut);
        assert_eq!(w.len(), 2);
    }
}
