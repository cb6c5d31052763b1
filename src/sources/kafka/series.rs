//! What the brokers said, made into series: lag in messages and seconds,
//! committed offsets, uncommitted partitions, group status, dead-letter and
//! retry counts. No requests here — the input is `fetch.rs`'s [`Fetched`] and
//! the clock — so the arithmetic is tested without a broker.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regex::Regex;

use super::config::KafkaSpec;
use super::fetch::{Committed, Fetched, Group, Partition};
use super::status::{History, Status};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot::Sample;

/// What the series depend on in a source's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `cluster` label.
    pub cluster: String,
    /// Series per topic (sums and maxima) instead of per partition.
    pub per_topic: bool,
    pub status_window: Duration,
    pub dead_letter_topics: Regex,
    pub retry_topics: Regex,
}

impl Settings {
    pub fn new(spec: &KafkaSpec) -> Settings {
        Settings {
            cluster: spec.name.clone(),
            per_topic: spec.per_topic,
            status_window: spec.status_window,
            dead_letter_topics: spec.dead_letter_topics.clone(),
            retry_topics: spec.retry_topics.clone(),
        }
    }

    /// Labels of a series of `partition` (with `group` for a group's): no
    /// `partition` label per topic.
    fn labels(&self, group: Option<&str>, partition: &Partition) -> Vec<(&'static str, String)> {
        let mut labels = vec![("cluster", self.cluster.clone())];
        if let Some(g) = group {
            labels.push(("group", g.to_string()));
        }
        labels.push(("topic", partition.topic.to_string()));
        if !self.per_topic {
            labels.push(("partition", partition.index.to_string()));
        }
        labels
    }

    fn group_labels(&self, group: &str) -> Vec<(&'static str, String)> {
        vec![
            ("cluster", self.cluster.clone()),
            ("group", group.to_string()),
        ]
    }

    /// The series a partition's numbers go to: itself, or its topic (index
    /// 0, unlabelled) per topic.
    fn series_of(&self, partition: &Partition) -> Partition {
        if self.per_topic {
            Partition {
                topic: partition.topic.clone(),
                index: 0,
            }
        } else {
            partition.clone()
        }
    }
}

/// A group's numbers for one series: one partition, or a topic's partitions.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Lag {
    /// Sum of high watermark − committed offset.
    messages: f64,
    /// Largest age of a record at a committed offset; `None`: one of them
    /// could not be read, so the age is unknown.
    seconds: Option<f64>,
    /// Sum of the committed offsets.
    committed: f64,
}

impl Default for Lag {
    fn default() -> Lag {
        Lag {
            messages: 0.0,
            seconds: Some(0.0),
            committed: 0.0,
        }
    }
}

impl Lag {
    fn add(&mut self, messages: i64, seconds: Option<f64>, committed: i64) {
        self.messages += messages as f64;
        self.committed += committed as f64;
        self.seconds = match (self.seconds, seconds) {
            (Some(cur), Some(s)) => Some(cur.max(s)),
            _ => None,
        };
    }
}

/// What the series remember between cycles.
#[derive(Debug, Default)]
pub struct Memory {
    /// Status history per group and partition.
    history: HashMap<String, HashMap<Partition, History>>,
    /// Last high watermark of dead-letter and retry partitions.
    watermarks: HashMap<Partition, i64>,
    /// Running totals of dead-letter topics, and of retry topics by tier.
    dead_letters: BTreeMap<Arc<str>, u64>,
    retries: BTreeMap<(Arc<str>, String), u64>,
    /// A cycle has been counted: partitions seen from now on are new.
    counted_once: bool,
}

impl Memory {
    /// One cycle's samples from what the brokers said, at `now` (for the
    /// status window) and `wall_ms` (ms since the epoch, for record ages).
    pub fn samples(
        &mut self,
        settings: &Settings,
        said: &Fetched,
        now: Instant,
        wall_ms: i64,
        out: &mut impl FnMut(Sample),
    ) {
        high_watermarks(settings, &said.high_watermarks, out);
        for (name, group) in &said.groups {
            self.group(settings, said, name, group, now, wall_ms, out);
        }
        self.history.retain(|g, _| said.groups.contains_key(g));
        self.count_appends(settings, &said.high_watermarks);
        for (topic, n) in &self.dead_letters {
            out(Sample {
                name: metric::KAFKA_DEAD_LETTERS,
                labels: vec![
                    ("cluster", settings.cluster.clone()),
                    ("topic", topic.to_string()),
                ],
                value: *n as f64,
            });
        }
        for ((topic, tier), n) in &self.retries {
            out(Sample {
                name: metric::KAFKA_RETRIES,
                labels: vec![
                    ("cluster", settings.cluster.clone()),
                    ("topic", topic.to_string()),
                    ("tier", tier.clone()),
                ],
                value: *n as f64,
            });
        }
        self.counted_once = true;
    }

    /// A group's members, lag, committed offsets and status.
    #[allow(clippy::too_many_arguments)]
    fn group(
        &mut self,
        settings: &Settings,
        said: &Fetched,
        name: &str,
        group: &Group,
        now: Instant,
        wall_ms: i64,
        out: &mut impl FnMut(Sample),
    ) {
        if let Some(n) = group.members {
            out(Sample {
                name: metric::KAFKA_GROUP_MEMBERS,
                labels: settings.group_labels(name),
                value: n as f64,
            });
        }
        let status = match &group.offsets {
            None => Status::Error,
            Some(offsets) => {
                let history = self.history.entry(name.to_string()).or_default();
                let lags = Lags {
                    settings,
                    said,
                    name,
                    has_members: group.members.unwrap_or(1) > 0,
                    now,
                    wall_ms,
                };
                let status = lags.partitions(history, offsets, out);
                uncommitted(settings, said, name, group, offsets, out);
                if let Some(last) = history.values().map(|h| h.last_moved).max() {
                    out(Sample {
                        name: metric::KAFKA_LAST_COMMIT_AGE,
                        labels: settings.group_labels(name),
                        value: now.duration_since(last).as_secs_f64(),
                    });
                }
                status
            }
        };
        for s in Status::ALL {
            let mut labels = settings.group_labels(name);
            labels.push(("status", s.as_str().to_string()));
            out(Sample {
                name: metric::KAFKA_GROUP_STATUS,
                labels,
                value: if s == status { 1.0 } else { 0.0 },
            });
        }
    }

    /// Adds the growth of dead-letter and retry partitions' high watermarks
    /// to their topics' totals.
    fn count_appends(&mut self, settings: &Settings, high_watermarks: &HashMap<Partition, i64>) {
        let mut live_dlq = HashSet::new();
        let mut live_retry = HashSet::new();
        let mut live_parts = HashSet::new();
        for (partition, &hwm) in high_watermarks {
            let topic = &partition.topic;
            let dead = settings.dead_letter_topics.is_match(topic);
            let tier = if dead {
                None
            } else {
                settings.retry_topics.captures(topic).map(|c| {
                    c.name("tier")
                        .map(|t| t.as_str().to_string())
                        .unwrap_or_else(|| "unknown".into())
                })
            };
            if !dead && tier.is_none() {
                continue;
            }
            live_parts.insert(partition.clone());
            // A partition seen for the first time after the first cycle is new:
            // everything in it was appended while the agent watched.
            let prev = match self.watermarks.get(partition) {
                Some(&p) => p,
                None if !self.counted_once => hwm,
                None => 0,
            };
            // A smaller watermark means the topic was recreated.
            let grown = if hwm >= prev { hwm - prev } else { hwm } as u64;
            self.watermarks.insert(partition.clone(), hwm);
            if let Some(tier) = tier {
                live_retry.insert((topic.clone(), tier.clone()));
                *self.retries.entry((topic.clone(), tier)).or_default() += grown;
            } else {
                live_dlq.insert(topic.clone());
                *self.dead_letters.entry(topic.clone()).or_default() += grown;
            }
        }
        self.watermarks.retain(|p, _| live_parts.contains(p));
        self.dead_letters.retain(|t, _| live_dlq.contains(t));
        self.retries.retain(|k, _| live_retry.contains(k));
    }
}

/// High watermarks per partition, or summed per topic.
fn high_watermarks(
    settings: &Settings,
    high_watermarks: &HashMap<Partition, i64>,
    out: &mut impl FnMut(Sample),
) {
    let mut by_topic: BTreeMap<Arc<str>, f64> = BTreeMap::new();
    for (partition, hwm) in high_watermarks {
        if settings.per_topic {
            *by_topic.entry(partition.topic.clone()).or_default() += *hwm as f64;
        } else {
            out(Sample {
                name: metric::KAFKA_HIGH_WATERMARK,
                labels: settings.labels(None, partition),
                value: *hwm as f64,
            });
        }
    }
    for (topic, value) in by_topic {
        out(Sample {
            name: metric::KAFKA_HIGH_WATERMARK,
            labels: settings.labels(None, &Partition { topic, index: 0 }),
            value,
        });
    }
}

/// What judging one group's partitions needs.
struct Lags<'a> {
    settings: &'a Settings,
    said: &'a Fetched,
    name: &'a str,
    has_members: bool,
    now: Instant,
    wall_ms: i64,
}

impl Lags<'_> {
    /// Lag and committed-offset series of a group's committed partitions, and
    /// its status: the worst of theirs. `history` keeps only the partitions
    /// committed this cycle.
    fn partitions(
        &self,
        history: &mut HashMap<Partition, History>,
        offsets: &[Committed],
        out: &mut impl FnMut(Sample),
    ) -> Status {
        let window = self.settings.status_window;
        let mut worst = Status::Ok;
        let mut series: BTreeMap<Partition, Lag> = BTreeMap::new();
        let mut present = HashSet::new();
        for at in offsets {
            let Some(&hwm) = self.said.high_watermarks.get(&at.partition) else {
                continue;
            };
            let lag = (hwm - at.offset).max(0);
            let lag_seconds = if lag == 0 {
                Some(0.0)
            } else {
                self.said
                    .record_timestamps
                    .get(at)
                    .map(|ts| ((self.wall_ms - ts).max(0) as f64) / 1000.0)
            };
            present.insert(at.partition.clone());
            match history.get_mut(&at.partition) {
                Some(h) => h.push(self.now, at.offset, lag, window),
                None => {
                    let h = History::new(self.now, at.offset, lag);
                    history.insert(at.partition.clone(), h);
                }
            }
            let status = history[&at.partition].status(self.now, window, self.has_members);
            worst = worst.max(status);
            series
                .entry(self.settings.series_of(&at.partition))
                .or_default()
                .add(lag, lag_seconds, at.offset);
        }
        history.retain(|p, _| present.contains(p));
        for (key, lag) in series {
            let labels = self.settings.labels(Some(self.name), &key);
            out(Sample {
                name: metric::KAFKA_LAG_MESSAGES,
                labels: labels.clone(),
                value: lag.messages,
            });
            // An unreadable record leaves its age unknown: no sample.
            if let Some(seconds) = lag.seconds {
                out(Sample {
                    name: metric::KAFKA_LAG_SECONDS,
                    labels: labels.clone(),
                    value: seconds,
                });
            }
            out(Sample {
                name: metric::KAFKA_COMMITTED_OFFSET,
                labels,
                value: lag.committed,
            });
        }
        worst
    }
}

/// Partitions of the topics a group consumes (committed on, or assigned)
/// that it never committed on.
fn uncommitted(
    settings: &Settings,
    said: &Fetched,
    name: &str,
    group: &Group,
    offsets: &[Committed],
    out: &mut impl FnMut(Sample),
) {
    let mut committed: BTreeMap<&Arc<str>, HashSet<i32>> = BTreeMap::new();
    for at in offsets {
        if said.high_watermarks.contains_key(&at.partition) {
            let topic = &at.partition.topic;
            committed
                .entry(topic)
                .or_default()
                .insert(at.partition.index);
        }
    }
    let consumed: BTreeSet<&Arc<str>> = committed
        .keys()
        .copied()
        .chain(group.assigned.iter())
        .collect();
    for topic in consumed {
        let Some(partitions) = said.topics.get(topic) else {
            continue;
        };
        let done = committed.get(topic);
        let missing = partitions
            .keys()
            .filter(|p| !done.is_some_and(|c| c.contains(p)))
            .count();
        out(Sample {
            name: metric::KAFKA_UNCOMMITTED_PARTITIONS,
            labels: vec![
                ("cluster", settings.cluster.clone()),
                ("group", name.to_string()),
                ("topic", topic.to_string()),
            ],
            value: missing as f64,
        });
    }
}
