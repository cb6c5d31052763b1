//! What the brokers said, made into series: lag in messages and seconds,
//! committed offsets, uncommitted partitions, group status, dead-letter and
//! retry counts. No requests here — the input is `fetch.rs`'s [`Fetched`] and
//! the clock — so the arithmetic is tested without a broker.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regex::Regex;

use super::config::{KafkaSpec, owner_of};
use super::fetch::{Committed, Fetched, Group, Partition};
use crate::sources::lag_status::{History, Status};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot::Labels;
#[cfg(test)]
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
    /// The source's owner, for groups no `owners` entry matches ("" without one).
    pub owner: String,
    /// `[[sources.owners]]`: group patterns and their owner.
    pub owners: Vec<(Regex, String)>,
    /// Whether this agent exports the series of topics (high watermarks,
    /// unavailable partitions, dead-letter and retry counts): false for a
    /// split source's agent that does not hold shard 0.
    pub topic_series: bool,
}

impl Settings {
    pub fn new(spec: &KafkaSpec) -> Settings {
        Settings {
            cluster: spec.name.clone(),
            per_topic: spec.per_topic,
            status_window: spec.status_window,
            dead_letter_topics: spec.dead_letter_topics.clone(),
            retry_topics: spec.retry_topics.clone(),
            owner: spec.owner.clone().unwrap_or_default(),
            owners: spec.owners.clone(),
            topic_series: true,
        }
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
    /// Records at committed offsets found stamped later than the agent's
    /// clock, already counted.
    future: HashSet<Committed>,
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
        out: &mut impl FnMut(&'static str, &Labels<'_>, f64),
    ) {
        for (name, group) in &said.groups {
            self.group(settings, said, name, group, now, wall_ms, out);
        }
        self.history.retain(|g, _| said.groups.contains_key(g));
        if !settings.topic_series {
            return;
        }
        high_watermarks(settings, &said.high_watermarks, out);
        out(
            metric::KAFKA_PARTITIONS_UNAVAILABLE,
            &[("source", &settings.cluster)],
            said.unavailable.len() as f64,
        );
        self.count_appends(settings, &said.high_watermarks, &said.unavailable);
        for (topic, n) in &self.dead_letters {
            out(
                metric::KAFKA_DEAD_LETTERS,
                &[("cluster", &settings.cluster), ("topic", topic)],
                *n as f64,
            );
        }
        for ((topic, tier), n) in &self.retries {
            out(
                metric::KAFKA_RETRIES,
                &[
                    ("cluster", &settings.cluster),
                    ("topic", topic),
                    ("tier", tier),
                ],
                *n as f64,
            );
        }
        self.counted_once = true;
    }

    /// How many records at committed offsets are newly found stamped later
    /// than `wall_ms` (a producer's clock ahead of the agent's): each is
    /// counted once, while a group stands at it. Their age is 0, never
    /// negative.
    pub fn new_future_timestamps(&mut self, said: &Fetched, wall_ms: i64) -> u64 {
        let mut new = 0;
        for (at, &timestamp_ms) in &said.record_timestamps {
            if timestamp_ms > wall_ms && self.future.insert(at.clone()) {
                new += 1;
            }
        }
        self.future
            .retain(|at| said.record_timestamps.contains_key(at));
        new
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
        out: &mut impl FnMut(&'static str, &Labels<'_>, f64),
    ) {
        let cluster = settings.cluster.as_str();
        let named: &Labels<'_> = &[("cluster", cluster), ("group", name)];
        out(
            metric::KAFKA_GROUP_INFO,
            &[
                ("cluster", cluster),
                ("group", name),
                ("owner", owner_of(&settings.owners, &settings.owner, name)),
                ("protocol", group.protocol.as_str()),
            ],
            1.0,
        );
        if let Some(n) = group.members {
            out(metric::KAFKA_GROUP_MEMBERS, named, n as f64);
        }
        let status = match &group.offsets {
            None => Status::Error,
            Some(offsets) => {
                let history = match self.history.get_mut(name) {
                    Some(h) => h,
                    None => self.history.entry(name.to_string()).or_default(),
                };
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
                    out(
                        metric::KAFKA_LAST_COMMIT_AGE,
                        named,
                        now.duration_since(last).as_secs_f64(),
                    );
                }
                status
            }
        };
        for s in Status::ALL {
            out(
                metric::KAFKA_GROUP_STATUS,
                &[
                    ("cluster", cluster),
                    ("group", name),
                    ("status", s.as_str()),
                ],
                if s == status { 1.0 } else { 0.0 },
            );
        }
    }

    /// Adds the growth of dead-letter and retry partitions' high watermarks
    /// to their topics' totals. An unavailable partition keeps its last
    /// watermark (and its topic its total), so that what was appended while
    /// its leader was away is counted once it is back, not all it holds.
    fn count_appends(
        &mut self,
        settings: &Settings,
        high_watermarks: &HashMap<Partition, i64>,
        unavailable: &BTreeSet<Partition>,
    ) {
        let mut live_dlq = HashSet::new();
        let mut live_retry = HashSet::new();
        let mut live_parts: HashSet<Partition> = unavailable
            .iter()
            .filter(|p| self.watermarks.contains_key(*p))
            .cloned()
            .collect();
        for p in &live_parts {
            live_dlq.insert(p.topic.clone());
            live_retry.extend(
                self.retries
                    .keys()
                    .filter(|(t, _)| *t == p.topic)
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
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
    out: &mut impl FnMut(&'static str, &Labels<'_>, f64),
) {
    let mut by_topic: BTreeMap<Arc<str>, f64> = BTreeMap::new();
    let cluster = settings.cluster.as_str();
    let mut index = itoa::Buffer::new();
    for (partition, hwm) in high_watermarks {
        if settings.per_topic {
            *by_topic.entry(partition.topic.clone()).or_default() += *hwm as f64;
        } else {
            out(
                metric::KAFKA_HIGH_WATERMARK,
                &[
                    ("cluster", cluster),
                    ("topic", &partition.topic),
                    ("partition", index.format(partition.index)),
                ],
                *hwm as f64,
            );
        }
    }
    for (topic, value) in by_topic {
        out(
            metric::KAFKA_HIGH_WATERMARK,
            &[("cluster", cluster), ("topic", &topic)],
            value,
        );
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
        out: &mut impl FnMut(&'static str, &Labels<'_>, f64),
    ) -> Status {
        let window = self.settings.status_window;
        let mut worst = Status::Ok;
        // Per partition, as the offsets came; per topic, summed.
        let mut series: Vec<(Partition, Lag)> = Vec::with_capacity(offsets.len());
        let mut by_topic: BTreeMap<Partition, Lag> = BTreeMap::new();
        // Partitions whose leader is away: no sample, but their history stays.
        let mut away = Vec::new();
        for at in offsets {
            let Some(&hwm) = self.said.high_watermarks.get(&at.partition) else {
                // Its leader is away this cycle: no lag series (a last value
                // would be stale), but its history stays for when it is back.
                if self.said.unavailable.contains(&at.partition) {
                    away.push(&at.partition);
                }
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
            let h = match history.get_mut(&at.partition) {
                Some(h) => {
                    h.push(self.now, at.offset, lag, window);
                    h
                }
                None => history
                    .entry(at.partition.clone())
                    .or_insert_with(|| History::new(self.now, at.offset, lag)),
            };
            worst = worst.max(h.status(self.now, window, self.has_members));
            if self.settings.per_topic {
                let key = self.settings.series_of(&at.partition);
                by_topic
                    .entry(key)
                    .or_default()
                    .add(lag, lag_seconds, at.offset);
            } else {
                let mut one = Lag::default();
                one.add(lag, lag_seconds, at.offset);
                series.push((at.partition.clone(), one));
            }
        }
        // Pushed this cycle (its last sample is now's), or its leader is away.
        history.retain(|p, h| h.last_at() == Some(self.now) || away.contains(&p));
        series.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        series.extend(by_topic);
        let cluster = self.settings.cluster.as_str();
        let mut index = itoa::Buffer::new();
        for (key, lag) in &series {
            let all: [(&'static str, &str); 4] = [
                ("cluster", cluster),
                ("group", self.name),
                ("topic", &key.topic),
                ("partition", index.format(key.index)),
            ];
            let labels = if self.settings.per_topic {
                &all[..3]
            } else {
                &all[..]
            };
            out(metric::KAFKA_LAG_MESSAGES, labels, lag.messages);
            // An unreadable record leaves its age unknown: no sample.
            if let Some(seconds) = lag.seconds {
                out(metric::KAFKA_LAG_SECONDS, labels, seconds);
            }
            out(metric::KAFKA_COMMITTED_OFFSET, labels, lag.committed);
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
    out: &mut impl FnMut(&'static str, &Labels<'_>, f64),
) {
    let mut committed: BTreeMap<&Arc<str>, HashSet<i32>> = BTreeMap::new();
    for at in offsets {
        if said.high_watermarks.contains_key(&at.partition)
            || said.unavailable.contains(&at.partition)
        {
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
        out(
            metric::KAFKA_UNCOMMITTED_PARTITIONS,
            &[
                ("cluster", &settings.cluster),
                ("group", name),
                ("topic", topic),
            ],
            missing as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::kafka::fetch::PartitionMeta;

    const WINDOW: Duration = Duration::from_secs(10);
    /// The wall clock of every test cycle, ms since the epoch.
    const WALL_MS: i64 = 1_700_000_000_000;

    fn settings(per_topic: bool) -> Settings {
        Settings {
            cluster: "main".into(),
            per_topic,
            status_window: WINDOW,
            dead_letter_topics: Regex::new(r"^(?:.*\.DLQ)$").unwrap(),
            retry_topics: Regex::new(r"^(?:.*\.retry\.(?P<tier>[0-9]+[smh]))$").unwrap(),
            owner: "team-core".into(),
            owners: vec![(
                Regex::new("^(?:billing.*)$").unwrap(),
                "team-payments".into(),
            )],
            topic_series: true,
        }
    }

    fn partition(topic: &str, index: i32) -> Partition {
        Partition {
            topic: Arc::from(topic),
            index,
        }
    }

    fn at(topic: &str, index: i32, offset: i64) -> Committed {
        Committed {
            partition: partition(topic, index),
            offset,
        }
    }

    /// A group with `members` and committed offsets (topic, partition, offset).
    fn group(members: Option<usize>, offsets: &[(&str, i32, i64)]) -> Group {
        Group {
            offsets: Some(offsets.iter().map(|&(t, p, o)| at(t, p, o)).collect()),
            members,
            ..Group::default()
        }
    }

    /// The group `billing` alone, committed on partitions 0.. of `topic`.
    fn billing(members: Option<usize>, topic: &str, offsets: &[i64]) -> Vec<(&'static str, Group)> {
        let offsets: Vec<(&str, i32, i64)> = offsets
            .iter()
            .enumerate()
            .map(|(p, &o)| (topic, p as i32, o))
            .collect();
        vec![("billing", group(members, &offsets))]
    }

    /// What the brokers said: topics with the high watermark of each
    /// partition (index = position), and groups.
    fn said(topics: &[(&str, &[i64])], groups: Vec<(&str, Group)>) -> Fetched {
        let mut fetched = Fetched::default();
        for &(topic, hwms) in topics {
            let mut parts = BTreeMap::new();
            for (index, &hwm) in hwms.iter().enumerate() {
                parts.insert(index as i32, PartitionMeta { leader: 1 });
                fetched
                    .high_watermarks
                    .insert(partition(topic, index as i32), hwm);
            }
            fetched.topics.insert(Arc::from(topic), parts);
        }
        for (name, g) in groups {
            fetched.groups.insert(name.to_string(), g);
        }
        fetched
    }

    fn run(memory: &mut Memory, settings: &Settings, said: &Fetched, now: Instant) -> Vec<Sample> {
        let mut out = Vec::new();
        memory.samples(settings, said, now, WALL_MS, &mut |name, labels, value| {
            out.push(Sample {
                name,
                labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
                value,
            })
        });
        out
    }

    /// The value of the one sample of `name` with exactly `labels`
    /// (`cluster="main"` implied).
    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<(&str, &str)> = vec![("cluster", "main")];
        want.extend_from_slice(labels);
        want.sort();
        let found: Vec<f64> = samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                let mut have: Vec<(&str, &str)> =
                    s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                have.sort();
                have == want
            })
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} twice: {found:?}");
        found.first().copied()
    }

    /// The value of a group's sample of `name` (no topic).
    fn of_group(samples: &[Sample], name: &str, group: &str) -> Option<f64> {
        value(samples, name, &[("group", group)])
    }

    fn count(samples: &[Sample], name: &str) -> usize {
        samples.iter().filter(|s| s.name == name).count()
    }

    /// The one status at 1 among the group's six status samples.
    fn status(samples: &[Sample], group: &str) -> &'static str {
        let on: Vec<&'static str> = Status::ALL
            .iter()
            .filter(|s| {
                let labels = [("group", group), ("status", s.as_str())];
                let v = value(samples, metric::KAFKA_GROUP_STATUS, &labels);
                assert!(v.is_some(), "{group}: no {} sample", s.as_str());
                v == Some(1.0)
            })
            .map(|s| s.as_str())
            .collect();
        assert_eq!(on.len(), 1, "{group}: {on:?}");
        on[0]
    }

    fn lag(samples: &[Sample], metric_name: &str, topic: &str, p: &str) -> Option<f64> {
        let labels = [("group", "billing"), ("topic", topic), ("partition", p)];
        value(samples, metric_name, &labels)
    }

    #[test]
    fn lag_is_the_high_watermark_minus_the_committed_offset_never_negative() {
        let settings = settings(false);
        let mut said = said(
            &[("orders", &[100, 50, 7, 30, 20])],
            // orders/2 is committed above its high watermark (a recreated
            // topic): lag 0.
            billing(Some(2), "orders", &[90, 50, 9, 25, 12]),
        );
        said.record_timestamps
            .insert(at("orders", 0, 90), WALL_MS - 2_500);
        // A record from the future (clock skew) is 0 seconds old.
        said.record_timestamps
            .insert(at("orders", 3, 25), WALL_MS + 4_000);
        // orders/4: its record could not be read.
        let samples = run(&mut Memory::default(), &settings, &said, Instant::now());

        let messages = metric::KAFKA_LAG_MESSAGES;
        assert_eq!(lag(&samples, messages, "orders", "0"), Some(10.0));
        assert_eq!(lag(&samples, messages, "orders", "1"), Some(0.0));
        assert_eq!(lag(&samples, messages, "orders", "2"), Some(0.0));
        assert_eq!(lag(&samples, messages, "orders", "3"), Some(5.0));
        assert_eq!(lag(&samples, messages, "orders", "4"), Some(8.0));
        let seconds = metric::KAFKA_LAG_SECONDS;
        assert_eq!(lag(&samples, seconds, "orders", "0"), Some(2.5));
        assert_eq!(lag(&samples, seconds, "orders", "1"), Some(0.0));
        assert_eq!(lag(&samples, seconds, "orders", "2"), Some(0.0));
        assert_eq!(lag(&samples, seconds, "orders", "3"), Some(0.0));
        assert_eq!(lag(&samples, seconds, "orders", "4"), None);
        let committed = metric::KAFKA_COMMITTED_OFFSET;
        assert_eq!(lag(&samples, committed, "orders", "0"), Some(90.0));
        assert_eq!(lag(&samples, committed, "orders", "2"), Some(9.0));
        assert_eq!(count(&samples, messages), 5);
        assert_eq!(count(&samples, seconds), 4);
        assert_eq!(count(&samples, committed), 5);
        let hwm = |p: &str| {
            let labels = [("topic", "orders"), ("partition", p)];
            value(&samples, metric::KAFKA_HIGH_WATERMARK, &labels)
        };
        assert_eq!((hwm("0"), hwm("2")), (Some(100.0), Some(7.0)));
        assert_eq!(count(&samples, metric::KAFKA_HIGH_WATERMARK), 5);
        let members = of_group(&samples, metric::KAFKA_GROUP_MEMBERS, "billing");
        assert_eq!(members, Some(2.0));
        assert_eq!(status(&samples, "billing"), "ok");
    }

    /// Guards clock sanity (issue 15): a record stamped after the agent's
    /// clock is 0 seconds old, also where it is the newest of a topic's
    /// partitions, and is counted once while a group stands at it — again
    /// only if a group comes back to it after leaving it.
    #[test]
    fn records_from_the_future_are_zero_seconds_old_and_counted_once() {
        let mut said = said(
            &[("orders", &[10, 10, 10])],
            billing(Some(1), "orders", &[4, 6, 8]),
        );
        said.record_timestamps
            .insert(at("orders", 0, 4), WALL_MS + 60_000);
        said.record_timestamps
            .insert(at("orders", 1, 6), WALL_MS - 1_500);
        said.record_timestamps
            .insert(at("orders", 2, 8), WALL_MS + 1);
        let mut memory = Memory::default();
        assert_eq!(memory.new_future_timestamps(&said, WALL_MS), 2);
        let samples = run(&mut memory, &settings(false), &said, Instant::now());
        let seconds = metric::KAFKA_LAG_SECONDS;
        assert_eq!(lag(&samples, seconds, "orders", "0"), Some(0.0));
        assert_eq!(lag(&samples, seconds, "orders", "1"), Some(1.5));
        assert_eq!(lag(&samples, seconds, "orders", "2"), Some(0.0));
        let per_topic = run(
            &mut Memory::default(),
            &settings(true),
            &said,
            Instant::now(),
        );
        let labels = [("group", "billing"), ("topic", "orders")];
        assert_eq!(value(&per_topic, seconds, &labels), Some(1.5));

        // The next cycles read the same records: nothing new.
        assert_eq!(memory.new_future_timestamps(&said, WALL_MS + 5), 0);
        assert_eq!(memory.new_future_timestamps(&said, WALL_MS + 60_000), 0);
        // The group moves on from orders/2 to a record stamped at the
        // agent's own millisecond (not the future), then back.
        let back = said.clone();
        said.record_timestamps.remove(&at("orders", 2, 8));
        said.record_timestamps.insert(at("orders", 2, 9), WALL_MS);
        assert_eq!(memory.new_future_timestamps(&said, WALL_MS), 0);
        assert_eq!(memory.new_future_timestamps(&back, WALL_MS), 1);
    }

    #[test]
    fn partitions_never_committed_have_no_lag_sample_and_are_counted() {
        let settings = settings(false);
        let mut billing = group(Some(1), &[("orders", 0, 5), ("orders", 2, 5)]);
        // Assigned but never committed on.
        billing.assigned.insert(Arc::from("audit"));
        let said = said(
            &[
                ("orders", &[10, 10, 10, 10]),
                ("audit", &[3, 3]),
                ("other", &[1]),
            ],
            vec![("billing", billing)],
        );
        let samples = run(&mut Memory::default(), &settings, &said, Instant::now());

        let uncommitted = |topic: &str| {
            let labels = [("group", "billing"), ("topic", topic)];
            value(&samples, metric::KAFKA_UNCOMMITTED_PARTITIONS, &labels)
        };
        assert_eq!(uncommitted("orders"), Some(2.0));
        assert_eq!(uncommitted("audit"), Some(2.0));
        assert_eq!(uncommitted("other"), None, "not consumed: not counted");
        assert_eq!(count(&samples, metric::KAFKA_UNCOMMITTED_PARTITIONS), 2);
        let messages = metric::KAFKA_LAG_MESSAGES;
        assert_eq!(lag(&samples, messages, "orders", "0"), Some(5.0));
        assert_eq!(lag(&samples, messages, "orders", "1"), None);
        assert_eq!(lag(&samples, messages, "orders", "3"), None);
        assert_eq!(count(&samples, messages), 2);
        assert_eq!(count(&samples, metric::KAFKA_COMMITTED_OFFSET), 2);
    }

    /// Runs one group on `orders` (one partition, high watermark 100) through
    /// cycles one second apart, committed offsets and lags as given, and
    /// returns its status after each.
    fn statuses(members: Option<usize>, cycles: &[(i64, i64)]) -> Vec<&'static str> {
        let settings = settings(false);
        let mut memory = Memory::default();
        let t0 = Instant::now();
        cycles
            .iter()
            .enumerate()
            .map(|(i, &(committed, hwm))| {
                let g = group(members, &[("orders", 0, committed)]);
                let mut said = said(&[("orders", &[hwm])], vec![("billing", g)]);
                said.record_timestamps
                    .insert(at("orders", 0, committed), WALL_MS - 1_000);
                let now = t0 + Duration::from_secs(i as u64);
                status(&run(&mut memory, &settings, &said, now), "billing")
            })
            .collect()
    }

    #[test]
    fn an_idle_topic_is_ok_whatever_the_members() {
        let idle = [(40, 40); 30];
        for members in [Some(0), Some(3), None] {
            let st = statuses(members, &idle);
            assert!(st.iter().all(|s| *s == "ok"), "{members:?}: {st:?}");
        }
    }

    #[test]
    fn offsets_still_with_lag_stop_without_members_and_stall_with_them() {
        let stuck = [(40, 45); 13];
        let st = statuses(Some(0), &stuck);
        assert!(st[..10].iter().all(|s| *s == "ok"), "{st:?}");
        assert!(st[10..].iter().all(|s| *s == "stop"), "{st:?}");
        let st = statuses(Some(2), &stuck);
        assert!(st[..10].iter().all(|s| *s == "ok"), "{st:?}");
        assert!(st[10..].iter().all(|s| *s == "stall"), "{st:?}");
        // Members unknown (DescribeGroups gave nothing): counted as present.
        assert_eq!(statuses(None, &stuck)[12], "stall");
    }

    #[test]
    fn a_committed_offset_going_backwards_is_a_rewind() {
        let mut cycles = vec![(40, 45), (42, 45), (30, 45)];
        cycles.extend((0..12).map(|i| (31 + i, 45)));
        let st = statuses(Some(1), &cycles);
        assert_eq!(&st[..3], ["ok", "ok", "rewind"]);
        assert_eq!(st[11], "rewind", "{st:?}");
        assert_eq!(st[12], "ok", "{st:?}");
    }

    #[test]
    fn lag_rising_while_offsets_move_warns() {
        // Committed offsets move by 1, the high watermark by 2.
        let cycles: Vec<(i64, i64)> = (0..13).map(|i| (10 + i, 12 + 2 * i)).collect();
        let st = statuses(Some(1), &cycles);
        assert!(st[..10].iter().all(|s| *s == "ok"), "{st:?}");
        assert!(st[10..].iter().all(|s| *s == "warn"), "{st:?}");
        // Lag rising over a full window in which the offset moved only at
        // its start is not warn (and a window after that move, stall).
        let mut cycles = vec![(10, 12)];
        cycles.extend((1..12).map(|i| (11, 12 + i)));
        let st = statuses(Some(1), &cycles);
        assert_eq!(&st[9..], ["ok", "ok", "stall"]);
    }

    #[test]
    fn unreadable_offsets_are_an_error_and_the_worst_partition_is_the_groups() {
        let settings = settings(false);
        let mut memory = Memory::default();
        let t0 = Instant::now();
        let broken = Group {
            offsets: None,
            members: Some(4),
            ..Group::default()
        };
        let mut samples = Vec::new();
        for i in 0..12 {
            let mixed = group(Some(1), &[("orders", 0, 10), ("orders", 1, 7)]);
            let said = said(
                &[("orders", &[10, 9])],
                vec![("broken", broken.clone()), ("mixed", mixed)],
            );
            samples = run(&mut memory, &settings, &said, t0 + Duration::from_secs(i));
        }
        assert_eq!(status(&samples, "broken"), "error");
        let members = of_group(&samples, metric::KAFKA_GROUP_MEMBERS, "broken");
        assert_eq!(members, Some(4.0));
        let broken_lags = samples.iter().filter(|s| {
            s.name != metric::KAFKA_GROUP_STATUS
                && s.name != metric::KAFKA_GROUP_MEMBERS
                && s.name != metric::KAFKA_GROUP_INFO
                && s.labels.contains(&("group", "broken".to_string()))
        });
        assert_eq!(broken_lags.count(), 0);
        // orders/0 is caught up (ok), orders/1 stands with lag 2 (stall).
        assert_eq!(status(&samples, "mixed"), "stall");
        let age = of_group(&samples, metric::KAFKA_LAST_COMMIT_AGE, "mixed");
        assert_eq!(age, Some(11.0));
    }

    /// Every group, readable or not, has one info series with its owner: the first
    /// `owners` pattern matching its whole name, else the source's owner.
    #[test]
    fn every_group_has_an_info_series_with_its_owner() {
        let settings = settings(false);
        let mut memory = Memory::default();
        let broken = Group {
            offsets: None,
            members: Some(0),
            ..Group::default()
        };
        let said = said(
            &[("orders", &[10])],
            vec![
                ("billing-eu", group(Some(1), &[("orders", 0, 10)])),
                ("orders-billing", group(Some(1), &[("orders", 0, 10)])),
                ("broken", broken),
            ],
        );
        let samples = run(&mut memory, &settings, &said, Instant::now());
        let mut info: Vec<(String, String, f64)> = samples
            .iter()
            .filter(|s| s.name == metric::KAFKA_GROUP_INFO)
            .map(|s| {
                let get = |k: &str| {
                    s.labels
                        .iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                assert_eq!(get("cluster"), "main");
                (get("group"), get("owner"), s.value)
            })
            .collect();
        info.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            info,
            [
                ("billing-eu".to_string(), "team-payments".to_string(), 1.0),
                ("broken".to_string(), "team-core".to_string(), 1.0),
                ("orders-billing".to_string(), "team-core".to_string(), 1.0),
            ]
        );
    }

    #[test]
    fn granularity_topic_sums_messages_and_offsets_and_takes_the_oldest_record() {
        let settings = settings(true);
        let mut said = said(
            &[("orders", &[100, 50, 7]), ("audit", &[20, 20])],
            vec![(
                "billing",
                group(
                    Some(1),
                    &[
                        ("orders", 0, 90),
                        ("orders", 1, 45),
                        ("orders", 2, 7),
                        ("audit", 0, 10),
                        ("audit", 1, 20),
                    ],
                ),
            )],
        );
        said.record_timestamps
            .insert(at("orders", 0, 90), WALL_MS - 4_000);
        said.record_timestamps
            .insert(at("orders", 1, 45), WALL_MS - 9_000);
        // audit/0's record could not be read: the topic's age is unknown.
        let samples = run(&mut Memory::default(), &settings, &said, Instant::now());

        let of = |name: &str, topic: &str| {
            value(&samples, name, &[("group", "billing"), ("topic", topic)])
        };
        assert_eq!(of(metric::KAFKA_LAG_MESSAGES, "orders"), Some(15.0));
        assert_eq!(of(metric::KAFKA_LAG_SECONDS, "orders"), Some(9.0));
        assert_eq!(of(metric::KAFKA_COMMITTED_OFFSET, "orders"), Some(142.0));
        assert_eq!(of(metric::KAFKA_LAG_MESSAGES, "audit"), Some(10.0));
        assert_eq!(of(metric::KAFKA_LAG_SECONDS, "audit"), None);
        assert_eq!(of(metric::KAFKA_COMMITTED_OFFSET, "audit"), Some(30.0));
        let hwm = |topic: &str| value(&samples, metric::KAFKA_HIGH_WATERMARK, &[("topic", topic)]);
        assert_eq!((hwm("orders"), hwm("audit")), (Some(157.0), Some(40.0)));
        assert_eq!(count(&samples, metric::KAFKA_HIGH_WATERMARK), 2);
        assert_eq!(count(&samples, metric::KAFKA_LAG_MESSAGES), 2);
        assert!(
            samples
                .iter()
                .all(|s| s.labels.iter().all(|(k, _)| *k != "partition"))
        );
    }

    #[test]
    fn deleted_topics_and_groups_leave_the_next_cycle() {
        let settings = settings(false);
        let mut memory = Memory::default();
        let now = Instant::now();
        let both = said(
            &[("orders", &[10]), ("audit", &[5])],
            vec![
                (
                    "billing",
                    group(Some(1), &[("orders", 0, 8), ("audit", 0, 1)]),
                ),
                ("shipping", group(Some(1), &[("orders", 0, 9)])),
            ],
        );
        let samples = run(&mut memory, &settings, &both, now);
        assert_eq!(
            lag(&samples, metric::KAFKA_LAG_MESSAGES, "audit", "0"),
            Some(4.0)
        );
        assert_eq!(status(&samples, "shipping"), "ok");

        // audit deleted, shipping deleted.
        let fewer = said(
            &[("orders", &[10])],
            vec![("billing", group(Some(1), &[("orders", 0, 8)]))],
        );
        let samples = run(&mut memory, &settings, &fewer, now + Duration::from_secs(1));
        let mentions = |label: (&str, &str)| {
            samples
                .iter()
                .filter(|s| s.labels.contains(&(label.0, label.1.to_string())))
                .count()
        };
        assert_eq!(mentions(("topic", "audit")), 0);
        assert_eq!(mentions(("group", "shipping")), 0);
        assert_eq!(
            lag(&samples, metric::KAFKA_LAG_MESSAGES, "orders", "0"),
            Some(2.0)
        );
        // Their status histories are forgotten too.
        assert_eq!(memory.history.len(), 1);
        assert_eq!(memory.history["billing"].len(), 1);
    }

    /// Guards broker loss (issue 15): a partition whose leader is away has no
    /// lag, offset or high-watermark series (never its last value), is
    /// counted unavailable, is not taken for never committed, keeps its status
    /// history, and its dead-letter appends count once when it is back.
    #[test]
    fn unavailable_partitions_are_counted_not_frozen_and_come_back_exactly() {
        let settings = settings(false);
        let mut memory = Memory::default();
        let t0 = Instant::now();
        let offsets = [("orders", 0, 4), ("orders", 1, 6), ("orders", 2, 1)];
        let all = said(
            &[("orders", &[10, 10, 10]), ("orders.DLQ", &[5, 7])],
            vec![("billing", group(Some(1), &offsets))],
        );
        let samples = run(&mut memory, &settings, &all, t0);
        let unavailable = |s: &[Sample]| {
            let found: Vec<&Sample> = s
                .iter()
                .filter(|x| x.name == metric::KAFKA_PARTITIONS_UNAVAILABLE)
                .collect();
            assert_eq!(found.len(), 1);
            assert_eq!(found[0].labels, [("source", "main".to_string())]);
            Some(found[0].value)
        };
        assert_eq!(unavailable(&samples), Some(0.0));

        // The leader of orders/1 and orders.DLQ/1 is gone; orders.DLQ/1 got 3
        // records meanwhile.
        let mut away = said(
            &[("orders", &[10, 10, 10]), ("orders.DLQ", &[6, 7])],
            vec![("billing", group(Some(1), &offsets))],
        );
        for p in [partition("orders", 1), partition("orders.DLQ", 1)] {
            away.high_watermarks.remove(&p);
            away.unavailable.insert(p);
        }
        let samples = run(&mut memory, &settings, &away, t0 + Duration::from_secs(1));
        assert_eq!(unavailable(&samples), Some(2.0));
        let messages = metric::KAFKA_LAG_MESSAGES;
        assert_eq!(lag(&samples, messages, "orders", "0"), Some(6.0));
        assert_eq!(lag(&samples, messages, "orders", "1"), None);
        assert_eq!(
            lag(&samples, metric::KAFKA_COMMITTED_OFFSET, "orders", "1"),
            None
        );
        assert_eq!(lag(&samples, messages, "orders", "2"), Some(9.0));
        let labels = [("group", "billing"), ("topic", "orders")];
        let uncommitted = value(&samples, metric::KAFKA_UNCOMMITTED_PARTITIONS, &labels);
        assert_eq!(uncommitted, Some(0.0), "committed, only unavailable");
        let dlq = [("topic", "orders.DLQ")];
        assert_eq!(value(&samples, metric::KAFKA_DEAD_LETTERS, &dlq), Some(1.0));
        assert_eq!(memory.history["billing"].len(), 3, "its history is kept");

        let mut back = said(
            &[("orders", &[10, 10, 10]), ("orders.DLQ", &[6, 10])],
            vec![("billing", group(Some(1), &offsets))],
        );
        back.unavailable.clear();
        let samples = run(&mut memory, &settings, &back, t0 + Duration::from_secs(2));
        assert_eq!(unavailable(&samples), Some(0.0));
        assert_eq!(lag(&samples, messages, "orders", "1"), Some(4.0));
        // 1 on partition 0, 3 on partition 1 while it was away: not its 10.
        assert_eq!(value(&samples, metric::KAFKA_DEAD_LETTERS, &dlq), Some(4.0));
    }

    #[test]
    fn dead_letters_and_retries_count_growth_after_the_first_cycle() {
        let settings = settings(false);
        let mut memory = Memory::default();
        let now = Instant::now();
        let dead = metric::KAFKA_DEAD_LETTERS;
        let retries = metric::KAFKA_RETRIES;
        let first = said(
            &[("orders.DLQ", &[100, 50]), ("orders.retry.5m", &[7])],
            vec![],
        );
        let samples = run(&mut memory, &settings, &first, now);
        assert_eq!(value(&samples, dead, &[("topic", "orders.DLQ")]), Some(0.0));
        let retry_5m = [("topic", "orders.retry.5m"), ("tier", "5m")];
        assert_eq!(value(&samples, retries, &retry_5m), Some(0.0));

        // +3 and +2 on the DLQ; a new retry topic counts from its first record.
        let second = said(
            &[
                ("orders.DLQ", &[103, 52]),
                ("orders.retry.5m", &[9]),
                ("orders.retry.1h", &[4]),
            ],
            vec![],
        );
        let samples = run(&mut memory, &settings, &second, now);
        assert_eq!(value(&samples, dead, &[("topic", "orders.DLQ")]), Some(5.0));
        assert_eq!(value(&samples, retries, &retry_5m), Some(2.0));
        let retry_1h = [("topic", "orders.retry.1h"), ("tier", "1h")];
        assert_eq!(value(&samples, retries, &retry_1h), Some(4.0));

        // The DLQ recreated (smaller watermarks): its records are new.
        let third = said(&[("orders.DLQ", &[1, 2])], vec![]);
        let samples = run(&mut memory, &settings, &third, now);
        assert_eq!(value(&samples, dead, &[("topic", "orders.DLQ")]), Some(8.0));
        assert_eq!(count(&samples, retries), 0, "deleted retry topics leave");
    }

    /// A split source's agent without shard 0 exports its groups' series
    /// only; the holder of shard 0 the topics' too, its dead-letter counts
    /// from its own first cycle.
    #[test]
    fn without_shard_0_the_topic_series_are_left_to_its_holder() {
        let now = Instant::now();
        let offsets = [("orders", 0, 4)];
        let cycle = |dlq: i64| {
            said(
                &[("orders", &[10]), ("orders.DLQ", &[dlq])],
                vec![("billing", group(Some(1), &offsets))],
            )
        };
        let mut other = settings(false);
        other.topic_series = false;
        let mut memory = Memory::default();
        run(&mut memory, &other, &cycle(3), now);
        let samples = run(&mut memory, &other, &cycle(5), now);
        let names: BTreeSet<&str> = samples.iter().map(|s| s.name).collect();
        assert_eq!(
            lag(&samples, metric::KAFKA_LAG_MESSAGES, "orders", "0"),
            Some(6.0)
        );
        for topic_level in [
            metric::KAFKA_HIGH_WATERMARK,
            metric::KAFKA_PARTITIONS_UNAVAILABLE,
            metric::KAFKA_DEAD_LETTERS,
        ] {
            assert!(!names.contains(topic_level), "{topic_level} in {names:?}");
        }
        let holder = settings(false);
        let mut memory = Memory::default();
        run(&mut memory, &holder, &cycle(3), now);
        let samples = run(&mut memory, &holder, &cycle(5), now);
        let dlq = [("topic", "orders.DLQ")];
        assert_eq!(value(&samples, metric::KAFKA_DEAD_LETTERS, &dlq), Some(2.0));
        assert_eq!(count(&samples, metric::KAFKA_HIGH_WATERMARK), 2);
    }
}
