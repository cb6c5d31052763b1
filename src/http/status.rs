//! The numbers of the status page and `/api/v1/status`, read from the very
//! text `/metrics` serves (so the page and a scrape always agree), and the
//! last hour of them kept for the sparklines.
//!
//! The history holds one sample per source every [`SAMPLE_EVERY`], at most
//! an hour of them ([`SAMPLES`]), each a few `f64`: about 8 KB per source.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::telemetry::catalogue as metric;

/// How often the history takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(30);
/// Samples kept per source: one hour.
pub const SAMPLES: usize = 120;
/// The window of "dead letters lately".
pub const RECENT: Duration = Duration::from_secs(15 * 60);
/// The window of a dead-letter burst, and the count within it above which
/// the status card shows the burst in red: the floor of the paging alert
/// `InboxDeadLetterSpike`, 0.1 dead letters/s over 5 minutes.
pub const BURST: Duration = Duration::from_secs(5 * 60);
pub const BURST_THRESHOLD: f64 = 30.0;

/// One line of the exposition text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads Prometheus text exposition (what the agent itself renders):
/// comment lines skipped, label values unescaped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut key = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i + 1);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    // A quoted value follows.
                    let (_, q) = chars.next()?;
                    if q != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next()?;
                        match c {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            c => value.push(c),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                c => key.push(c),
            }
        }
        rest = &body[end?..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// What the page says of one table or Kafka source, as numbers.
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
    /// Kafka: the groups of the cluster.
    pub groups: Vec<Group>,
}

/// Events that took at most `le` attempts and more than the bucket below.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Bucket {
    pub le: String,
    pub events: f64,
}

/// One Kafka consumer group.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Group {
    pub group: String,
    /// Summed over partitions.
    pub lag_messages: f64,
    /// The largest over partitions.
    pub lag_seconds: f64,
    pub status: Option<String>,
}

fn max_into(slot: &mut Option<f64>, v: f64) {
    if v.is_nan() {
        return;
    }
    *slot = Some(slot.map_or(v, |s| s.max(v)));
}

fn add_into(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

/// Reads the numbers of every source from the exposition text.
pub fn numbers(samples: &[Sample]) -> HashMap<String, Numbers> {
    let mut out: HashMap<String, Numbers> = HashMap::new();
    // le → cumulative count, per source.
    let mut buckets: HashMap<String, BTreeMap<String, f64>> = HashMap::new();
    let mut groups: HashMap<(String, String), Group> = HashMap::new();
    for s in samples {
        let name = s.name.as_str();
        if name.starts_with("kafka_") {
            let (Some(cluster), Some(group)) = (s.label("cluster"), s.label("group")) else {
                continue;
            };
            let g = groups
                .entry((cluster.to_string(), group.to_string()))
                .or_insert_with(|| Group {
                    group: group.to_string(),
                    ..Group::default()
                });
            match name {
                metric::KAFKA_LAG_MESSAGES => g.lag_messages += s.value,
                metric::KAFKA_LAG_SECONDS => g.lag_seconds = g.lag_seconds.max(s.value),
                metric::KAFKA_GROUP_STATUS if s.value == 1.0 => {
                    g.status = s.label("status").map(str::to_string);
                }
                _ => {}
            }
            continue;
        }
        let Some(source) = s.label("source") else {
            continue;
        };
        let n = out.entry(source.to_string()).or_default();
        match name {
            metric::INBOX_OLDEST_AGE | metric::OUTBOX_OLDEST_AGE => {
                max_into(&mut n.oldest_age_seconds, s.value)
            }
            metric::OBJECTIVE_OLDEST_AGE => n.oldest_age_objective_seconds = Some(s.value),
            metric::OBJECTIVE_P95 => n.p95_objective_seconds = Some(s.value),
            metric::INBOX_BACKLOG | metric::OUTBOX_BACKLOG => {
                let status = s.label("status").unwrap_or("unpublished").to_string();
                *n.backlog.entry(status).or_default() += s.value;
            }
            metric::INBOX_STUCK => add_into(&mut n.stuck, s.value),
            metric::INBOX_DURATION_QUANTILE if s.label("quantile") == Some("0.95") => {
                max_into(&mut n.p95_seconds, s.value)
            }
            metric::INBOX_DELIVERIES => add_into(&mut n.deliveries_total, s.value),
            metric::INBOX_DUPLICATES => add_into(&mut n.duplicate_deliveries_total, s.value),
            metric::INBOX_ATTEMPT_FAILURES => add_into(&mut n.attempt_failures_total, s.value),
            metric::INBOX_COMPLETED if s.label("outcome") == Some("dead_lettered") => {
                add_into(&mut n.dead_letters_total, s.value);
            }
            metric::OUTBOX_PUBLISHED => add_into(&mut n.published_total, s.value),
            metric::SOURCE_DEGRADED if s.value == 1.0 => {
                n.degraded = s.label("reason").map(str::to_string);
            }
            _ if name == format!("{}_bucket", metric::INBOX_ATTEMPTS) => {
                if let Some(le) = s.label("le") {
                    *buckets
                        .entry(source.to_string())
                        .or_default()
                        .entry(le.to_string())
                        .or_default() += s.value;
                }
            }
            _ => {}
        }
    }
    for (source, cumulative) in buckets {
        let mut bounds: Vec<(f64, String, f64)> = cumulative
            .into_iter()
            .map(|(le, c)| {
                let b = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                (b, le, c)
            })
            .collect();
        bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut below = 0.0;
        let n = out.entry(source).or_default();
        for (_, le, c) in bounds {
            n.retry_distribution.push(Bucket {
                le,
                events: c - below,
            });
            below = c;
        }
    }
    for n in out.values_mut() {
        if let (Some(d), Some(dup)) = (n.deliveries_total, n.duplicate_deliveries_total)
            && d > 0.0
        {
            n.idempotency_hit_rate = Some(dup / d);
        }
    }
    let mut groups: Vec<((String, String), Group)> = groups.into_iter().collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    for ((cluster, _), g) in groups {
        out.entry(cluster).or_default().groups.push(g);
    }
    out
}

/// One sample of one source: gauges as they were, counters as totals.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Seconds since the epoch.
    at: u64,
    oldest: f64,
    backlog: f64,
    stuck: f64,
    p95: f64,
    deliveries: f64,
    duplicates: f64,
    dead: f64,
    lag: f64,
}

impl Point {
    fn of(at: u64, n: &Numbers) -> Point {
        let nan = f64::NAN;
        Point {
            at,
            oldest: n.oldest_age_seconds.unwrap_or(nan),
            backlog: if n.backlog.is_empty() {
                nan
            } else {
                n.backlog.values().sum()
            },
            stuck: n.stuck.unwrap_or(nan),
            p95: n.p95_seconds.unwrap_or(nan),
            deliveries: n.deliveries_total.unwrap_or(nan),
            duplicates: n.duplicate_deliveries_total.unwrap_or(nan),
            dead: n.dead_letters_total.unwrap_or(nan),
            lag: if n.groups.is_empty() {
                nan
            } else {
                n.groups.iter().map(|g| g.lag_messages).sum()
            },
        }
    }
}

/// The last hour of every source's numbers; shared by the sampler and the pages.
#[derive(Debug, Default, Clone)]
pub struct History {
    inner: Arc<Mutex<HashMap<String, VecDeque<Point>>>>,
    /// When the agent started (seconds since the epoch; 0: long ago).
    started: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl History {
    /// An empty history of an agent starting now.
    pub fn started_now() -> History {
        History {
            started: now_secs(),
            ..History::default()
        }
    }

    /// The window "dead letters lately" covers: [`RECENT`], or the agent's
    /// age if it is younger (its counters start at 0).
    pub fn recent_window(&self) -> Duration {
        self.window(RECENT)
    }

    /// `longest`, or the agent's age if it is younger.
    pub fn window(&self, longest: Duration) -> Duration {
        Duration::from_secs(now_secs().saturating_sub(self.started)).min(longest)
    }

    /// Adds one sample of every source.
    pub fn record(&self, numbers: &HashMap<String, Numbers>) {
        self.record_at(now_secs(), numbers);
    }

    fn record_at(&self, at: u64, numbers: &HashMap<String, Numbers>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (source, n) in numbers {
            let ring = g.entry(source.clone()).or_default();
            if ring.len() >= SAMPLES {
                ring.pop_front();
            }
            ring.push_back(Point::of(at, n));
        }
    }

    /// The sparkline values of one source (oldest first, ending with `now`,
    /// the numbers of this moment), by [`SERIES`] key; NaN where a value was absent.
    pub fn series(&self, source: &str, now: &Numbers) -> BTreeMap<&'static str, Vec<f64>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut points: Vec<Point> = g
            .get(source)
            .map(|r| r.iter().copied().collect())
            .unwrap_or_default();
        points.push(Point::of(now_secs(), now));
        let mut out = BTreeMap::new();
        let diff = |f: &dyn Fn(&Point) -> f64| -> Vec<f64> {
            points
                .windows(2)
                .map(|w| (f(&w[1]) - f(&w[0])).max(0.0))
                .collect()
        };
        out.insert(
            "oldest_age_seconds",
            points.iter().map(|p| p.oldest).collect(),
        );
        out.insert("backlog", points.iter().map(|p| p.backlog).collect());
        out.insert("stuck", points.iter().map(|p| p.stuck).collect());
        out.insert("p95_seconds", points.iter().map(|p| p.p95).collect());
        let deliveries = diff(&|p| p.deliveries);
        let duplicates = diff(&|p| p.duplicates);
        out.insert(
            "duplicate_ratio",
            deliveries
                .iter()
                .zip(&duplicates)
                .map(|(d, dup)| if *d > 0.0 { dup / d } else { f64::NAN })
                .collect(),
        );
        out.insert("dead_letters", diff(&|p| p.dead));
        out.insert("kafka_lag_messages", points.iter().map(|p| p.lag).collect());
        out
    }

    /// Dead letters of one source within [`RECENT`]: its total now minus its
    /// total at the latest sample at least that old (or 0, the total when the
    /// agent started, if the history is younger).
    pub fn dead_letters_recent(&self, source: &str, total: f64) -> f64 {
        self.dead_letters_within(source, total, RECENT)
    }

    /// Dead letters of one source within `window`, as [`Self::dead_letters_recent`]
    /// counts them within [`RECENT`] (to the sample: one every [`SAMPLE_EVERY`]).
    pub fn dead_letters_within(&self, source: &str, total: f64, window: Duration) -> f64 {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = now_secs().saturating_sub(window.as_secs());
        let before = g
            .get(source)
            .and_then(|r| r.iter().rev().find(|p| p.at <= cutoff))
            .map_or(0.0, |p| if p.dead.is_nan() { 0.0 } else { p.dead });
        (total - before).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn parses_labels_with_escapes_and_special_values() {
        let text = "# HELP x y\n# TYPE x gauge\n\
                    inbox_backlog_messages{source=\"a\\\"b\",event_type=\"x\\\\y\\nz\",status=\"pending\"} 3\n\
                    inbox_processing_duration_quantile_seconds{source=\"s\",event_type=\"t\",quantile=\"0.95\"} NaN\n\
                    inbox_delivery_attempts_bucket{source=\"s\",event_type=\"t\",le=\"+Inf\"} 7\n\
                    inboxwatch_build_info{version=\"0.1.0\"} 1\nplain 2.5\n";
        let s = parse(text);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].label("source"), Some("a\"b"));
        assert_eq!(s[0].label("event_type"), Some("x\\y\nz"));
        assert_eq!(s[0].value, 3.0);
        assert!(s[1].value.is_nan());
        assert_eq!(s[2].label("le"), Some("+Inf"));
        assert_eq!(s[4].name, "plain");
        assert_eq!(s[4].value, 2.5);
    }

    #[test]
    fn numbers_sum_backlog_take_the_worst_age_and_split_buckets() {
        let text = "inbox_backlog_messages{source=\"s\",event_type=\"a\",status=\"pending\"} 3\n\
                    inbox_backlog_messages{source=\"s\",event_type=\"b\",status=\"pending\"} 4\n\
                    inbox_backlog_messages{source=\"s\",event_type=\"b\",status=\"failed\"} 1\n\
                    inbox_oldest_unprocessed_age_seconds{source=\"s\",event_type=\"a\"} 10\n\
                    inbox_oldest_unprocessed_age_seconds{source=\"s\",event_type=\"b\"} 25\n\
                    inbox_deliveries_total{source=\"s\",event_type=\"a\"} 30\n\
                    inbox_duplicate_deliveries_total{source=\"s\",event_type=\"a\"} 3\n\
                    inbox_messages_completed_total{source=\"s\",event_type=\"a\",outcome=\"dead_lettered\"} 2\n\
                    inbox_messages_completed_total{source=\"s\",event_type=\"a\",outcome=\"succeeded\"} 20\n\
                    inbox_delivery_attempts_bucket{source=\"s\",event_type=\"a\",le=\"1\"} 15\n\
                    inbox_delivery_attempts_bucket{source=\"s\",event_type=\"a\",le=\"2\"} 20\n\
                    inbox_delivery_attempts_bucket{source=\"s\",event_type=\"a\",le=\"+Inf\"} 22\n\
                    kafka_consumer_group_lag_messages{cluster=\"k\",group=\"g\",topic=\"t\",partition=\"0\"} 5\n\
                    kafka_consumer_group_lag_messages{cluster=\"k\",group=\"g\",topic=\"t\",partition=\"1\"} 6\n\
                    kafka_consumer_group_lag_seconds{cluster=\"k\",group=\"g\",topic=\"t\",partition=\"1\"} 9\n\
                    kafka_consumer_group_status{cluster=\"k\",group=\"g\",status=\"ok\"} 0\n\
                    kafka_consumer_group_status{cluster=\"k\",group=\"g\",status=\"stall\"} 1\n";
        let n = numbers(&parse(text));
        let s = &n["s"];
        assert_eq!(s.backlog["pending"], 7.0);
        assert_eq!(s.backlog["failed"], 1.0);
        assert_eq!(s.oldest_age_seconds, Some(25.0));
        assert_eq!(s.idempotency_hit_rate, Some(0.1));
        assert_eq!(s.dead_letters_total, Some(2.0));
        assert_eq!(
            s.retry_distribution
                .iter()
                .map(|b| (b.le.as_str(), b.events))
                .collect::<Vec<_>>(),
            vec![("1", 15.0), ("2", 5.0), ("+Inf", 2.0)]
        );
        let k = &n["k"].groups[0];
        assert_eq!(
            (k.lag_messages, k.lag_seconds, k.status.as_deref()),
            (11.0, 9.0, Some("stall"))
        );
    }

    #[test]
    fn recent_dead_letters_subtract_the_sample_fifteen_minutes_old_and_the_ring_is_bounded() {
        let h = History::default();
        let now = now_secs();
        let at = |dead: f64| {
            let mut m = HashMap::new();
            m.insert(
                "s".to_string(),
                Numbers {
                    dead_letters_total: Some(dead),
                    ..Numbers::default()
                },
            );
            m
        };
        // Younger than 15 minutes: everything since the start.
        h.record_at(now - 60, &at(4.0));
        assert_eq!(h.dead_letters_recent("s", 9.0), 9.0);
        h.record_at(now - 20 * 60, &at(1.0));
        h.record_at(now - 16 * 60, &at(3.0));
        assert_eq!(h.dead_letters_recent("s", 9.0), 6.0);
        // A burst: the last 5 minutes subtract the sample 5 minutes old.
        h.record_at(now - 6 * 60, &at(4.0));
        h.record_at(now - 4 * 60, &at(8.0));
        assert_eq!(h.dead_letters_within("s", 9.0, BURST), 5.0);
        for i in 0..500 {
            h.record_at(now + i, &at(5.0));
        }
        let series = h.series("s", &Numbers::default());
        assert_eq!(series["backlog"].len(), SAMPLES + 1);
    }
}
