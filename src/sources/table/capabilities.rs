//! What each metric of a table source will be, given its column map and
//! cursor mode — exact, bounded (and why), or not exported (and why) — as
//! `doctor` prints it and docs/metrics.md tabulates it; and which unmapped
//! optional meanings a table's columns look like.

use super::config::{Cursor, FinishedRows, InboxSpec, OutboxSpec};
use super::shape::Shape;
use crate::telemetry::catalogue as metric;

/// How far a metric can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    Exact,
    /// A bound, and why.
    Bounded(String),
    /// Not exported (or a histogram that never observes), and why.
    Absent(String),
    /// Exported, always 0, and why.
    Zero(String),
}

/// One metric and what it will be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub metric: &'static str,
    pub how: How,
}

impl Capability {
    /// The line `doctor` prints.
    pub fn line(&self) -> String {
        match &self.how {
            How::Exact => format!("{}: exact", self.metric),
            How::Bounded(why) => format!("{}: bounded — {why}", self.metric),
            How::Absent(why) => format!("{}: not exported — {why}", self.metric),
            How::Zero(why) => format!("{}: always 0 — {why}", self.metric),
        }
    }
}

const UNSEEN_DELETED: &str =
    "a row inserted and deleted between two polls is never seen (finished_rows = \"deleted\")";

/// The capabilities of an inbox source.
pub fn inbox(s: &InboxSpec) -> Vec<Capability> {
    let c = &s.columns;
    let t = &s.table;
    // An events log sees every change, deleted rows' too.
    let deleted = t.finished_rows == FinishedRows::Deleted && t.cursor != Cursor::Events;
    let cursor = t.cursor != Cursor::None;
    // An events log gives every attempt's start and every end.
    let events = t.cursor == Cursor::Events;
    let lower_if_deleted = || {
        if deleted {
            How::Bounded(format!("a lower bound: {UNSEEN_DELETED}"))
        } else {
            How::Exact
        }
    };
    let mut out = vec![
        Capability {
            metric: metric::INBOX_RECEIVED,
            how: lower_if_deleted(),
        },
        Capability {
            metric: metric::INBOX_COMPLETED,
            how: lower_if_deleted(),
        },
    ];
    let failures = match (&c.attempts, cursor) {
        _ if events => How::Exact,
        (Some(_), _) => How::Exact,
        (None, true) => How::Bounded(
            "a lower bound: without an attempts column only moves into failed are counted, \
             and several between two reads of a row count once"
                .into(),
        ),
        (None, false) => How::Bounded(
            "a lower bound: without an attempts column only moves into failed seen by a poll \
             are counted"
                .into(),
        ),
    };
    out.push(Capability {
        metric: metric::INBOX_ATTEMPT_FAILURES,
        how: failures,
    });
    for m in [metric::INBOX_DELIVERIES, metric::INBOX_DUPLICATES] {
        let how = match (&c.deliveries, cursor) {
            (None, _) => How::Absent("no deliveries column".into()),
            (Some(_), true) => How::Exact,
            (Some(_), false) => How::Bounded(
                "a lower bound: without a change cursor a delivery to a finished row changes \
                 nothing the agent reads, so only deliveries to unfinished rows count"
                    .into(),
            ),
        };
        out.push(Capability { metric: m, how });
    }
    let deleted_note = if deleted && t.deleted_durations {
        "; deleted rows are observed up to the poll that noticed them (upper bounds, \
         deleted_durations = true)"
    } else if deleted {
        "; deleted rows are not observed (deleted_durations = false)"
    } else {
        ""
    };
    let timed = |needs: &[(&str, bool)]| {
        let missing: Vec<&str> = needs
            .iter()
            .filter(|(_, mapped)| !mapped)
            .map(|(m, _)| *m)
            .collect();
        if !missing.is_empty() {
            How::Absent(format!("no {} column", missing.join(" or ")))
        } else if deleted_note.is_empty() {
            How::Exact
        } else {
            How::Bounded(format!(
                "exact for rows kept with their finished time{deleted_note}"
            ))
        }
    };
    // A deleted row gives an end (the poll that noticed it) only when its
    // durations are observed.
    let ends = c.finished_at.is_some() || (deleted && t.deleted_durations) || events;
    let processing = timed(&[
        ("started_at", c.started_at.is_some() || events),
        ("finished_at", ends),
    ]);
    out.push(Capability {
        metric: metric::INBOX_PROCESSING_DURATION,
        how: processing.clone(),
    });
    out.push(Capability {
        metric: metric::INBOX_DURATION_QUANTILE,
        how: processing,
    });
    out.push(Capability {
        metric: metric::INBOX_END_TO_END,
        how: timed(&[("finished_at", ends)]),
    });
    out.push(Capability {
        metric: metric::INBOX_ATTEMPTS,
        how: match &c.attempts {
            Some(_) if deleted => How::Bounded(
                "a deleted row is observed with the failed attempts seen before it left, plus one"
                    .into(),
            ),
            Some(_) => How::Exact,
            None => How::Bounded("no attempts column: every completion observes 1".into()),
        },
    });
    out.push(Capability {
        metric: metric::INBOX_BACKLOG,
        how: How::Exact,
    });
    out.push(Capability {
        metric: metric::INBOX_OLDEST_AGE,
        how: How::Exact,
    });
    out.push(Capability {
        metric: metric::INBOX_STUCK,
        how: if c.started_at.is_some() || events {
            How::Exact
        } else {
            How::Zero("no started_at column".into())
        },
    });
    out.extend(ordering(s, deleted));
    out
}

/// The ordering and parked series: listed only for a source that maps both
/// ordering columns or has a status meaning parked (others have none of them).
fn ordering(s: &InboxSpec, deleted: bool) -> Vec<Capability> {
    let mut out = Vec::new();
    let no_columns = || How::Absent("no ordering_key and version columns".into());
    if s.ordered() {
        out.push(Capability {
            metric: metric::INBOX_OUT_OF_ORDER_ARRIVALS,
            how: if deleted {
                How::Bounded(format!("a lower bound: {UNSEEN_DELETED}"))
            } else {
                How::Exact
            },
        });
        let completions = match (&s.columns.finished_at, deleted) {
            (_, true) => {
                How::Bounded("a lower bound: a deleted row's success shows no version".into())
            }
            (None, false) => How::Bounded(
                "no finished_at column: successes are ordered by when the agent saw them".into(),
            ),
            (Some(_), false) => How::Exact,
        };
        out.push(Capability {
            metric: metric::INBOX_OUT_OF_ORDER_COMPLETIONS,
            how: completions,
        });
        let gaps = if deleted {
            How::Bounded(format!(
                "an upper bound: a version whose row was never seen ({UNSEEN_DELETED}) \
                 stays a gap"
            ))
        } else {
            How::Exact
        };
        for m in [metric::INBOX_VERSION_GAPS, metric::INBOX_OLDEST_GAP_AGE] {
            out.push(Capability {
                metric: m,
                how: gaps.clone(),
            });
        }
        out.push(Capability {
            metric: metric::ORDERING_KEYS_EVICTED,
            how: How::Exact,
        });
    }
    if s.parks() {
        for m in [metric::INBOX_PARKED, metric::INBOX_OLDEST_PARKED_AGE] {
            out.push(Capability {
                metric: m,
                how: How::Exact,
            });
        }
        out.push(Capability {
            metric: metric::INBOX_PARKED_KEYS,
            how: if s.ordered() {
                How::Exact
            } else {
                no_columns()
            },
        });
    } else if s.ordered() {
        for m in [
            metric::INBOX_PARKED,
            metric::INBOX_PARKED_KEYS,
            metric::INBOX_OLDEST_PARKED_AGE,
        ] {
            out.push(Capability {
                metric: m,
                how: How::Absent("no status word or rule means parked".into()),
            });
        }
    }
    out
}

/// The capabilities of an outbox source.
pub fn outbox(s: &OutboxSpec) -> Vec<Capability> {
    let t = &s.table;
    let deleted = t.finished_rows == FinishedRows::Deleted;
    vec![
        Capability {
            metric: metric::OUTBOX_PUBLISHED,
            how: if deleted {
                How::Bounded(format!("a lower bound: {UNSEEN_DELETED}"))
            } else {
                How::Exact
            },
        },
        Capability {
            metric: metric::OUTBOX_PUBLISH_DELAY,
            how: match (deleted, t.deleted_durations) {
                (false, _) => How::Exact,
                (true, true) => How::Bounded(
                    "deleted rows are observed up to the poll that noticed them (upper bounds)"
                        .into(),
                ),
                (true, false) => {
                    How::Bounded("deleted rows are not observed (deleted_durations = false)".into())
                }
            },
        },
        Capability {
            metric: metric::OUTBOX_BACKLOG,
            how: How::Exact,
        },
        Capability {
            metric: metric::OUTBOX_OLDEST_AGE,
            how: How::Exact,
        },
    ]
}

/// What a column must look like to stand for a meaning: name fragments,
/// and the kind of type.
const LOOKS: [(&str, &[&str], Kind); 10] = [
    (
        "event_type",
        &[
            "event_type",
            "message_type",
            "type",
            "task",
            "job_type",
            "kind",
            "entrypoint",
            "topic",
        ],
        Kind::Text,
    ),
    (
        "started_at",
        &[
            "started",
            "start",
            "locked_at",
            "attempted_at",
            "picked",
            "lock_at",
        ],
        Kind::Time,
    ),
    (
        "finished_at",
        &[
            "finished",
            "completed",
            "processed",
            "done_at",
            "completion",
            "finalized",
            "processing_end",
            "handled",
        ],
        Kind::Time,
    ),
    (
        "attempts",
        &[
            "attempts",
            "attempt",
            "retry_count",
            "retries",
            "executions",
        ],
        Kind::Int,
    ),
    (
        "deliveries",
        &[
            "deliveries",
            "delivery_count",
            "receive_count",
            "redelivered",
        ],
        Kind::Int,
    ),
    (
        "last_error",
        &["error", "failure", "exception", "last_result", "reason"],
        Kind::Text,
    ),
    (
        "traceparent",
        &[
            "traceparent",
            "trace_context",
            "tracingspancontext",
            "trace_id",
        ],
        Kind::Text,
    ),
    (
        "updated_at",
        &["updated_at", "modified", "changed_at"],
        Kind::Time,
    ),
    (
        "ordering_key",
        &[
            "ordering_key",
            "aggregate_id",
            "partition_key",
            "message_group",
            "sequence_key",
            "stream_id",
        ],
        Kind::Text,
    ),
    (
        "version",
        &[
            "version",
            "sequence",
            "seq_no",
            "sequence_number",
            "revision",
        ],
        Kind::Int,
    ),
];

/// Meanings suggested only when a column looks like them: most tables have
/// no order to follow, and saying so on every one would be noise.
const ONLY_IF_LIKELY: [&str; 2] = ["ordering_key", "version"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Time,
    Int,
}

fn kind_of(ty: &str) -> Option<Kind> {
    if ty.contains("time") || ty.contains("date") {
        Some(Kind::Time)
    } else if ty.contains("int") || ty == "numeric" {
        Some(Kind::Int)
    } else if ty.contains("char")
        || ty.contains("text")
        || ty.contains("json")
        || ty == "user-defined"
        || ty == "uuid"
        || ty.is_empty()
    {
        Some(Kind::Text)
    } else {
        None
    }
}

/// The optional meanings a table could map and which of its columns look
/// like each (by name and type), as suggestions. `present`: (column, type).
pub(crate) fn suggestions(spec: Shape<'_>, present: &[(String, String)]) -> Vec<String> {
    let meanings = spec.mapped();
    let mapped: Vec<&str> = meanings.iter().map(|(_, c)| *c).collect();
    let optional = spec.optional_meanings();
    let is_mapped = |meaning: &str| meanings.iter().any(|(m, _)| *m == meaning);
    let mut out = Vec::new();
    for (meaning, names, kind) in LOOKS {
        if !optional.contains(&meaning) || is_mapped(meaning) {
            continue;
        }
        let like: Vec<String> = present
            .iter()
            .filter(|(col, ty)| {
                let lower = col.to_lowercase();
                !mapped.contains(&col.as_str())
                    && names.iter().any(|n| lower.contains(n))
                    && (ty.is_empty() || kind_of(ty) == Some(kind))
            })
            .map(|(col, ty)| {
                if ty.is_empty() {
                    format!("\"{col}\"")
                } else {
                    format!("\"{col}\" ({ty})")
                }
            })
            .collect();
        if like.is_empty() {
            if !ONLY_IF_LIKELY.contains(&meaning) {
                out.push(format!("{meaning} is not mapped (no column looks like it)"));
            }
        } else if meaning == "updated_at" {
            let first = present
                .iter()
                .map(|(c, _)| c)
                .find(|c| like.iter().any(|l| l.starts_with(&format!("\"{c}\""))))
                .map_or("…", |c| c.as_str());
            out.push(format!(
                "updated_at is not mapped; looks like it: {} — if the consumer sets it on every \
                 change of a row (claim, failure, retry), columns.updated_at = \"{first}\" \
                 (cursor = \"updated_at\") makes each poll read only the rows changed since the \
                 last one: no tails of the time columns, no look-ups of the rows in flight, and \
                 no re-read of the unfinished rows; most libraries' updated_at is not set on \
                 every change, and cursor = \"none\" is then the right mode",
                like.join(", ")
            ));
        } else if ONLY_IF_LIKELY.contains(&meaning) {
            out.push(format!(
                "{meaning} is not mapped; looks like it: {} — map ordering_key and version \
                 together (an integer version per key) for the ordering health series",
                like.join(", ")
            ));
        } else {
            out.push(format!(
                "{meaning} is not mapped; looks like it: {} — map it in [sources.columns] if it means that",
                like.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_sorted_into_kinds() {
        assert_eq!(kind_of("timestamp with time zone"), Some(Kind::Time));
        assert_eq!(kind_of("datetime"), Some(Kind::Time));
        assert_eq!(kind_of("smallint"), Some(Kind::Int));
        assert_eq!(kind_of("character varying"), Some(Kind::Text));
        assert_eq!(kind_of("jsonb"), Some(Kind::Text));
        assert_eq!(kind_of("bytea"), None);
    }
}
