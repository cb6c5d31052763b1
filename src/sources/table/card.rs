//! The status card of an inbox or outbox source: its numbers read from the
//! values it recorded (the series `/metrics` renders of it), the dead
//! letters of the last minutes from its history, and the rows the status
//! page shows of them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::card::{Card, Part, Past, Row, Trend, against, list, text, value};
use crate::telemetry::catalogue as metric;
use crate::telemetry::values::Reading;

/// The window of "dead letters lately".
pub const RECENT: Duration = Duration::from_secs(15 * 60);
/// The window of a dead-letter burst, and the count within it above which
/// the card shows the burst in red: the floor of the paging alert
/// `InboxDeadLetterSpike`, 0.1 dead letters/s over 5 minutes.
pub const BURST: Duration = Duration::from_secs(5 * 60);
pub const BURST_THRESHOLD: f64 = 30.0;

/// The trend of dead letters: the running total the recent counts come from.
const DEAD_LETTERS: &str = "dead_letters";

/// What the card says of a table source, as numbers (`/api/v1/status`
/// `numbers`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Numbers {
    /// `inbox_oldest_unprocessed_age_seconds` (or the outbox's), the largest over event types.
    pub oldest_age_seconds: Option<f64>,
    pub oldest_age_objective_seconds: Option<f64>,
    /// Backlog by status (`pending`, `processing`, `failed`; an outbox's `unpublished`).
    pub backlog: BTreeMap<String, f64>,
    pub stuck: Option<f64>,
    /// `inbox_processing_duration_quantile_seconds{quantile="0.95"}`, the largest over event types.
    pub p95_seconds: Option<f64>,
    pub p95_objective_seconds: Option<f64>,
    pub deliveries_total: Option<f64>,
    pub duplicate_deliveries_total: Option<f64>,
    /// Duplicate deliveries over deliveries since the agent started.
    pub idempotency_hit_rate: Option<f64>,
    /// Completed events by the attempts they took (`inbox_delivery_attempts`
    /// buckets, not cumulative).
    pub retry_distribution: Vec<Bucket>,
    pub attempt_failures_total: Option<f64>,
    pub dead_letters_total: Option<f64>,
    /// Dead letters within the last 15 minutes (since the agent started, if later).
    pub dead_letters_recent: Option<f64>,
    /// The window of `dead_letters_recent`: 900, or the agent's age in seconds if less.
    pub dead_letters_recent_seconds: Option<u64>,
    /// Dead letters within the last 5 minutes (since the agent started, if
    /// later); more than [`BURST_THRESHOLD`] is a burst.
    pub dead_letters_5m: Option<f64>,
    /// The window of `dead_letters_5m`: 300, or the agent's age in seconds if less.
    pub dead_letters_5m_seconds: Option<u64>,
    pub published_total: Option<f64>,
    /// The reason most rows read lately were rejected for, when more than
    /// half were (`inboxwatch_source_degraded`).
    pub degraded: Option<String>,
}

/// Events that took at most `le` attempts and more than the bucket below.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Bucket {
    /// The bucket's bound as `/metrics` writes it (`3`, `+Inf`).
    pub le: String,
    pub events: f64,
}

/// Reads a table source's numbers (an inbox's or an outbox's: each has
/// none of the other's series).
pub fn numbers(values: &Reading<'_>, past: &dyn Past) -> Numbers {
    let sum = |name: &str| values.sum(name, &[]);
    let mut backlog = values.sum_by(metric::INBOX_BACKLOG, "status", &[]);
    if let Some(unpublished) = sum(metric::OUTBOX_BACKLOG) {
        backlog.insert("unpublished".to_string(), unpublished);
    }
    let oldest = [metric::INBOX_OLDEST_AGE, metric::OUTBOX_OLDEST_AGE]
        .into_iter()
        .filter_map(|name| values.max(name, &[]))
        .reduce(f64::max);
    let deliveries_total = sum(metric::INBOX_DELIVERIES);
    let duplicate_deliveries_total = sum(metric::INBOX_DUPLICATES);
    let dead_letters_total = values.sum(metric::INBOX_COMPLETED, &[("outcome", "dead_lettered")]);
    let mut n = Numbers {
        oldest_age_seconds: oldest,
        oldest_age_objective_seconds: values.max(metric::OBJECTIVE_OLDEST_AGE, &[]),
        backlog,
        stuck: sum(metric::INBOX_STUCK),
        p95_seconds: values.max(metric::INBOX_DURATION_QUANTILE, &[("quantile", "0.95")]),
        p95_objective_seconds: values.max(metric::OBJECTIVE_P95, &[]),
        deliveries_total,
        duplicate_deliveries_total,
        idempotency_hit_rate: match (deliveries_total, duplicate_deliveries_total) {
            (Some(d), Some(dup)) if d > 0.0 => Some(dup / d),
            _ => None,
        },
        retry_distribution: values
            .buckets(metric::INBOX_ATTEMPTS, &[])
            .into_iter()
            .map(|(bound, events)| Bucket {
                le: if bound.is_infinite() {
                    "+Inf".to_string()
                } else {
                    bound.to_string()
                },
                events: events as f64,
            })
            .collect(),
        attempt_failures_total: sum(metric::INBOX_ATTEMPT_FAILURES),
        dead_letters_total,
        published_total: sum(metric::OUTBOX_PUBLISHED),
        degraded: values
            .sum_by(metric::SOURCE_DEGRADED, "reason", &[])
            .into_iter()
            .find(|(_, v)| *v == 1.0)
            .map(|(reason, _)| reason),
        ..Numbers::default()
    };
    if let Some(total) = dead_letters_total {
        n.dead_letters_recent = Some(past.growth(DEAD_LETTERS, total, RECENT));
        n.dead_letters_recent_seconds = Some(past.window(RECENT).as_secs());
        n.dead_letters_5m = Some(past.growth(DEAD_LETTERS, total, BURST));
        n.dead_letters_5m_seconds = Some(past.window(BURST).as_secs());
    }
    n
}

/// What the history keeps of an inbox at each sample.
fn inbox_trends(n: &Numbers) -> Vec<(&'static str, Trend)> {
    let nan = f64::NAN;
    let mut trends = outbox_trends(n);
    trends.extend([
        ("stuck", Trend::Level(n.stuck.unwrap_or(nan))),
        ("p95_seconds", Trend::Level(n.p95_seconds.unwrap_or(nan))),
        (
            "duplicate_ratio",
            Trend::Share {
                part: n.duplicate_deliveries_total.unwrap_or(nan),
                whole: n.deliveries_total.unwrap_or(nan),
            },
        ),
        (
            DEAD_LETTERS,
            Trend::Total(n.dead_letters_total.unwrap_or(nan)),
        ),
    ]);
    trends
}

/// What the history keeps of an outbox at each sample.
fn outbox_trends(n: &Numbers) -> Vec<(&'static str, Trend)> {
    let backlog = if n.backlog.is_empty() {
        f64::NAN
    } else {
        n.backlog.values().sum()
    };
    vec![
        (
            "oldest_age_seconds",
            Trend::Level(n.oldest_age_seconds.unwrap_or(f64::NAN)),
        ),
        ("backlog", Trend::Level(backlog)),
    ]
}

fn row(field: &'static str, title: &str, value: Vec<Part>, spark: Option<&'static str>) -> Row {
    Row {
        field,
        title: vec![text(title)],
        value,
        spark,
    }
}

/// The rows an inbox and an outbox share: the oldest age and the backlog.
fn waiting_rows(n: &Numbers, oldest: &str) -> Vec<Row> {
    let backlog = n
        .backlog
        .iter()
        .map(|(status, v)| {
            vec![
                text(format!("{status}: ")),
                value(format!("backlog_{status}"), Some(*v)),
            ]
        })
        .collect();
    vec![
        row(
            "oldest_age_seconds",
            oldest,
            against(
                "oldest_age_seconds",
                n.oldest_age_seconds,
                n.oldest_age_objective_seconds,
                " s",
            ),
            Some("oldest_age_seconds"),
        ),
        row("backlog", "backlog", list(backlog), Some("backlog")),
    ]
}

/// The card of an outbox source.
pub fn outbox(values: &Reading<'_>, past: &dyn Past) -> Card {
    let n = numbers(values, past);
    let mut rows = waiting_rows(&n, "oldest unpublished age");
    rows.push(row(
        "published_total",
        "published since start",
        vec![value("published_total", n.published_total)],
        None,
    ));
    card(n, rows, outbox_trends)
}

/// The card of an inbox source.
pub fn inbox(values: &Reading<'_>, past: &dyn Past) -> Card {
    let n = numbers(values, past);
    let mut rows = waiting_rows(&n, "oldest unprocessed age");
    rows.extend([
        row(
            "stuck",
            "stuck rows",
            vec![value("stuck", n.stuck)],
            Some("stuck"),
        ),
        row(
            "p95_seconds",
            "P95 processing time (worst event type)",
            against("p95_seconds", n.p95_seconds, n.p95_objective_seconds, " s"),
            Some("p95_seconds"),
        ),
        row(
            "idempotency_hit_rate",
            "idempotency hit rate",
            hit_rate(&n),
            Some("duplicate_ratio"),
        ),
        row(
            "retry_distribution",
            "completed events by attempts they took",
            retries(&n.retry_distribution),
            None,
        ),
        row(
            "attempt_failures_total",
            "failed attempts since start",
            vec![value("attempt_failures_total", n.attempt_failures_total)],
            None,
        ),
        dead_letters(values.source(), &n),
    ]);
    card(n, rows, inbox_trends)
}

fn card(n: Numbers, rows: Vec<Row>, trends: fn(&Numbers) -> Vec<(&'static str, Trend)>) -> Card {
    Card {
        degraded: n.degraded.as_ref().map(|reason| {
            format!("most rows read lately were rejected ({reason}); `inboxwatch doctor` says why")
        }),
        trends: trends(&n),
        rows,
        tables: Vec::new(),
        numbers: serde_json::to_value(&n).unwrap_or_default(),
    }
}

/// `12.5% (5 duplicate of 40 deliveries since start)`.
fn hit_rate(n: &Numbers) -> Vec<Part> {
    match (
        n.idempotency_hit_rate,
        n.duplicate_deliveries_total,
        n.deliveries_total,
    ) {
        (Some(r), Some(d), Some(all)) => vec![
            Part::Number((r * 1000.0).round() / 10.0),
            text("% "),
            Part::Muted(vec![
                text("("),
                value("duplicate_deliveries_total", Some(d)),
                text(" duplicate of "),
                value("deliveries_total", Some(all)),
                text(" deliveries since start)"),
            ]),
        ],
        _ => vec![
            Part::Missing,
            text(" "),
            Part::Muted(vec![text("(no deliveries column, or none yet)")]),
        ],
    }
}

/// Each non-empty bucket by the attempts it holds: `3`, `4–5`, `more than 20`.
fn retries(buckets: &[Bucket]) -> Vec<Part> {
    let mut below = 0.0_f64;
    let mut items = Vec::new();
    for b in buckets {
        let upper: f64 = b.le.parse().unwrap_or(f64::INFINITY);
        let from = below.floor() + 1.0;
        let label = if upper.is_infinite() {
            vec![text("more than "), Part::Number(below)]
        } else if upper.floor() <= from {
            vec![Part::Number(upper)]
        } else {
            vec![Part::Number(from), text("–"), Part::Number(upper.floor())]
        };
        below = upper;
        if b.events > 0.0 {
            let mut item = label;
            item.push(text(": "));
            item.push(value(format!("attempts_le_{}", b.le), Some(b.events)));
            items.push(item);
        }
    }
    list(items)
}

/// The dead letters of the last 15 minutes (or since the agent started),
/// linked to their list, and a burst beside them.
fn dead_letters(source: &str, n: &Numbers) -> Row {
    let window = n.dead_letters_recent_seconds.unwrap_or(RECENT.as_secs());
    let title = if window >= RECENT.as_secs() {
        vec![text("dead letters, last 15 min")]
    } else {
        vec![
            text("dead letters since the agent started ("),
            Part::Span(Duration::from_secs(window)),
            text(" ago)"),
        ]
    };
    let mut shown = vec![Part::Link {
        path: "/dead-letters",
        query: vec![
            ("source", source.to_string()),
            ("since", format!("{}s", window.max(1))),
        ],
        parts: vec![value("dead_letters_recent", n.dead_letters_recent)],
    }];
    shown.extend(burst(n));
    Row {
        field: "dead_letters_recent",
        title,
        value: shown,
        spark: Some(DEAD_LETTERS),
    }
}

/// The dead letters of the last 5 minutes, red above the paging alert's
/// floor (a burst); nothing while there are none.
fn burst(n: &Numbers) -> Vec<Part> {
    let Some(count) = n.dead_letters_5m.filter(|c| *c > 0.0) else {
        return Vec::new();
    };
    let window = n.dead_letters_5m_seconds.unwrap_or(BURST.as_secs());
    let within = if window >= BURST.as_secs() {
        vec![text("in the last 5 min")]
    } else {
        vec![
            text("in the agent's first "),
            Part::Span(Duration::from_secs(window)),
        ]
    };
    let mut judged = vec![value("dead_letters_5m", Some(count)), text(" ")];
    judged.extend(within);
    vec![
        text(" · "),
        Part::Judged {
            over: count > BURST_THRESHOLD,
            field: Some("dead_letter_burst"),
            parts: judged,
        },
        text(" "),
        Part::Muted(vec![
            text("(a burst above "),
            Part::Number(BURST_THRESHOLD),
            text(": InboxDeadLetterSpike's floor)"),
        ]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::NoPast;
    use crate::telemetry::catalogue::catalogue_recorder;
    use crate::telemetry::values::Values;

    /// The card's burst threshold is the paging alert's floor: 30 dead
    /// letters in 5 minutes is `rate5m > 0.1`.
    #[test]
    fn the_burst_threshold_is_the_floor_of_the_spike_alert() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts/inboxwatch.rules.yml");
        let rules = std::fs::read_to_string(path).expect("the alert rules");
        let spike = &rules[rules
            .find("- alert: InboxDeadLetterSpike")
            .expect("the spike alert")..];
        let spike = &spike[..spike[1..].find("- alert:").map_or(spike.len(), |e| e + 1)];
        let floor = format!(
            "source:inbox_dead_letters:rate5m > {}",
            BURST_THRESHOLD / BURST.as_secs_f64()
        );
        assert!(
            spike.contains(&floor),
            "InboxDeadLetterSpike has no `{floor}`:\n{spike}"
        );
    }

    #[test]
    fn numbers_sum_backlog_take_the_worst_age_and_split_buckets() {
        let values = Values::default();
        let layer = values.layer(catalogue_recorder());
        metrics::with_local_recorder(&layer, || {
            let s = |et: &'static str| [("source", "s"), ("event_type", et)];
            let backlog = |et: &'static str, status: &'static str, v: f64| {
                let mut l = s(et).to_vec();
                l.push(("status", status));
                metrics::gauge!(metric::INBOX_BACKLOG, &l).set(v);
            };
            backlog("a", "pending", 3.0);
            backlog("b", "pending", 4.0);
            backlog("b", "failed", 1.0);
            metrics::gauge!(metric::INBOX_OLDEST_AGE, &s("a")).set(10.0);
            metrics::gauge!(metric::INBOX_OLDEST_AGE, &s("b")).set(25.0);
            metrics::counter!(metric::INBOX_DELIVERIES, &s("a")).increment(30);
            metrics::counter!(metric::INBOX_DUPLICATES, &s("a")).increment(3);
            let completed = |outcome: &'static str, n: u64| {
                let mut l = s("a").to_vec();
                l.push(("outcome", outcome));
                metrics::counter!(metric::INBOX_COMPLETED, &l).increment(n);
            };
            completed("dead_lettered", 2);
            completed("succeeded", 20);
            for (attempts, times) in [(1.0, 15), (2.0, 5), (30.0, 2)] {
                for _ in 0..times {
                    metrics::histogram!(metric::INBOX_ATTEMPTS, &s("a")).record(attempts);
                }
            }
            metrics::gauge!(metric::SOURCE_DEGRADED, "source" => "s", "reason" => "missing_event_id")
                .set(1.0);
            metrics::gauge!(metric::SOURCE_DEGRADED, "source" => "s", "reason" => "bad_status")
                .set(0.0);
        });
        let n = numbers(&values.reading("s"), &NoPast);
        assert_eq!(n.backlog["pending"], 7.0);
        assert_eq!(n.backlog["failed"], 1.0);
        assert_eq!(n.oldest_age_seconds, Some(25.0));
        assert_eq!(n.idempotency_hit_rate, Some(0.1));
        assert_eq!(n.dead_letters_total, Some(2.0));
        assert_eq!(n.dead_letters_recent, Some(2.0));
        assert_eq!(n.published_total, None);
        assert_eq!(n.degraded.as_deref(), Some("missing_event_id"));
        assert_eq!(
            n.retry_distribution
                .iter()
                .filter(|b| b.events > 0.0)
                .map(|b| (b.le.as_str(), b.events))
                .collect::<Vec<_>>(),
            vec![("1", 15.0), ("2", 5.0), ("+Inf", 2.0)]
        );
        // Nothing of a source another agent exports.
        assert_eq!(numbers(&Reading::nothing("s"), &NoPast), Numbers::default());
    }

    #[test]
    fn buckets_are_labelled_by_the_attempts_they_hold() {
        let b = |le: &str, events: f64| Bucket {
            le: le.to_string(),
            events,
        };
        let parts = retries(&[b("1", 2.0), b("3", 0.0), b("5", 1.0), b("+Inf", 4.0)]);
        let labels: Vec<String> = parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Number(v) => v.to_string(),
                Part::Value { key, value } => format!("[{key}={value}]"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            labels.concat(),
            "1: [attempts_le_1=2], 4–5: [attempts_le_5=1], more than 5: [attempts_le_+Inf=4]"
        );
    }
}
