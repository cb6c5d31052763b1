//! The one family of series every broker kind but Kafka exports (`queue_*`:
//! NATS JetStream, Redis Streams, RabbitMQ), so that one dashboard and one
//! set of alerts serve them all.
//!
//! A broker kind reads its broker into an [`Observation`] — its streams or
//! queues, its consumers, the dead letters since its last poll — and hands
//! it to its [`Memory`], which keeps what series need across polls (the
//! counters' baselines, each consumer's status history) and publishes the
//! whole family as one snapshot, replaced every poll, so that a consumer
//! that is gone simply has no series in the next one. The status card of
//! every queue kind is [`card`].
//!
//! Labels: `source`, `broker`, `queue` (the stream or queue), `consumer`
//! (the durable consumer or consumer group; "" for a RabbitMQ queue's
//! consumers), with `status` and `reason` where the family has them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::card::{Card, Part, Past, Row, Table, TableRow, Trend, against, text, value};
use crate::sources::common::Common;
use crate::sources::lag_status::{History, Status};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot::{self, Sample};
use crate::telemetry::values::Reading;

pub use crate::sources::lag_status::status_window;

/// One stream or queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Queue {
    pub queue: String,
    /// Messages the broker holds in it (`queue_messages`).
    pub messages: u64,
    /// A count the broker keeps of the messages ever appended (NATS
    /// `state.last_seq`, Redis `entries-added`, RabbitMQ
    /// `message_stats.publish`): its growth is
    /// `queue_messages_published_total`. A drop means the stream was
    /// recreated: its new value then counts as growth.
    pub appended: Option<u64>,
    /// A count the broker keeps of redeliveries (RabbitMQ
    /// `message_stats.redeliver`): its growth is `queue_redeliveries_total`.
    pub redelivered: Option<u64>,
}

/// One consumer of a stream or queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Consumer {
    pub queue: String,
    /// The durable consumer or group; "" for a RabbitMQ queue's consumers.
    pub consumer: String,
    /// Messages it has not been delivered yet.
    pub lag_messages: u64,
    /// Age of the oldest of them on the broker's clock; `None` where the
    /// broker keeps no time for it (never estimated). Published as 0
    /// whenever `lag_messages` is 0.
    pub lag_seconds: Option<f64>,
    /// Delivered and not acknowledged; `None` for a consumer that does not
    /// acknowledge.
    pub unacked: Option<u64>,
    /// Age of the oldest of those; published as 0 when none is unacked.
    pub oldest_unacked_age_seconds: Option<f64>,
    /// Awaiting acknowledgement and delivered more than once.
    pub redelivered: Option<u64>,
    /// The scan that counted `redelivered` stopped at its bound.
    pub redelivered_scan_cut: bool,
    /// Consumers attached: more than 0 tells a stalled consumer from a
    /// stopped one.
    pub consumers: u64,
    /// A number that grows with every acknowledgement (NATS
    /// `ack_floor.stream_seq`, Redis what the group read minus its pending,
    /// RabbitMQ `message_stats.ack`): the status rules' position.
    pub acknowledged: i64,
}

/// Messages a broker gave up on since the last poll.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetters {
    pub queue: String,
    pub consumer: String,
    /// `max_deliveries`, `terminated`, `dead_letter_stream` or `dead_letter_queue`.
    pub reason: &'static str,
    pub count: u64,
}

/// What one poll read of a broker.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// `nats`, `redis` or `rabbitmq`: the `broker` label.
    pub broker: &'static str,
    pub queues: Vec<Queue>,
    pub consumers: Vec<Consumer>,
    pub dead_letters: Vec<DeadLetters>,
}

/// A running total made from the growth of a count the broker keeps.
#[derive(Debug, Clone, Copy)]
struct Growth {
    last: u64,
    total: u64,
    /// When the queue was last in a poll's answer.
    seen: Instant,
}

/// How long a running total outlives its queue's absence: a queue missing
/// from a few polls (a broker restarting, a stream being recreated) keeps
/// counting where it was; one gone for longer is forgotten (auto-deleted
/// queues would otherwise pile up).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

impl Growth {
    /// Starts at 0 on first sight; a count that fell (the stream was
    /// recreated, the broker's statistics were reset) counts its new value.
    fn first(at: u64, now: Instant) -> Growth {
        Growth {
            last: at,
            total: 0,
            seen: now,
        }
    }

    fn see(&mut self, count: u64, now: Instant) {
        self.total += if count >= self.last {
            count - self.last
        } else {
            count
        };
        self.last = count;
        self.seen = now;
    }
}

/// What a source keeps between polls.
#[derive(Debug)]
pub struct Memory {
    window: Duration,
    appended: HashMap<String, Growth>,
    redelivered: HashMap<String, Growth>,
    dead: BTreeMap<(String, String, &'static str), u64>,
    histories: HashMap<(String, String), History>,
}

impl Memory {
    pub fn new(status_window: Duration) -> Memory {
        Memory {
            window: status_window,
            appended: HashMap::new(),
            redelivered: HashMap::new(),
            dead: BTreeMap::new(),
            histories: HashMap::new(),
        }
    }

    /// Publishes the whole family of `source` from what one poll `seen`,
    /// and keeps beside it what the card reads ([`Consumers`]).
    pub fn publish(&mut self, source: &str, owner: &str, seen: &Observation, now: Instant) {
        let mut out = snapshot::Builder::default();
        let mut kept = Consumers::default();
        self.samples(source, owner, seen, now, &mut |s| {
            kept.add(&s);
            out.push(s);
        });
        out.keep(kept);
        snapshot::publish(source, out);
    }

    /// The samples of one poll, in catalogue order within each queue and
    /// consumer; a pure step but for the memory it updates.
    pub fn samples(
        &mut self,
        source: &str,
        owner: &str,
        seen: &Observation,
        now: Instant,
        emit: &mut dyn FnMut(Sample),
    ) {
        let broker = seen.broker;
        let q_labels = |queue: &str| {
            vec![
                ("source", source.to_string()),
                ("broker", broker.to_string()),
                ("queue", queue.to_string()),
            ]
        };
        for q in &seen.queues {
            emit(Sample {
                name: metric::QUEUE_MESSAGES,
                labels: q_labels(&q.queue),
                value: q.messages as f64,
            });
            for (count, totals, name) in [
                (q.appended, &mut self.appended, metric::QUEUE_PUBLISHED),
                (
                    q.redelivered,
                    &mut self.redelivered,
                    metric::QUEUE_REDELIVERIES,
                ),
            ] {
                let Some(count) = count else { continue };
                let g = totals
                    .entry(q.queue.clone())
                    .and_modify(|g| g.see(count, now))
                    .or_insert_with(|| Growth::first(count, now));
                emit(Sample {
                    name,
                    labels: q_labels(&q.queue),
                    value: g.total as f64,
                });
            }
        }
        // A queue missing from this answer keeps its total, and its next
        // count is growth from its last (a recreated stream's new messages);
        // one missing for an hour is forgotten.
        self.appended
            .retain(|_, g| now.duration_since(g.seen) < FORGET_AFTER);
        self.redelivered
            .retain(|_, g| now.duration_since(g.seen) < FORGET_AFTER);

        for d in &seen.dead_letters {
            *self
                .dead
                .entry((d.queue.clone(), d.consumer.clone(), d.reason))
                .or_default() += d.count;
        }

        let mut consumers_seen = HashSet::new();
        for c in &seen.consumers {
            let key = (c.queue.clone(), c.consumer.clone());
            consumers_seen.insert(key.clone());
            let labels = || {
                let mut l = q_labels(&c.queue);
                l.push(("consumer", c.consumer.clone()));
                l
            };
            let mut gauge = |name, value: f64| {
                emit(Sample {
                    name,
                    labels: labels(),
                    value,
                })
            };
            gauge(metric::QUEUE_LAG_MESSAGES, c.lag_messages as f64);
            if c.lag_messages == 0 {
                gauge(metric::QUEUE_LAG_SECONDS, 0.0);
            } else if let Some(s) = c.lag_seconds {
                gauge(metric::QUEUE_LAG_SECONDS, s.max(0.0));
            }
            if let Some(unacked) = c.unacked {
                gauge(metric::QUEUE_UNACKED, unacked as f64);
                let age = if unacked == 0 {
                    Some(0.0)
                } else {
                    c.oldest_unacked_age_seconds
                };
                if let Some(age) = age {
                    gauge(metric::QUEUE_OLDEST_UNACKED_AGE, age.max(0.0));
                }
            }
            if let Some(r) = c.redelivered {
                gauge(metric::QUEUE_REDELIVERED, r as f64);
                gauge(
                    metric::QUEUE_REDELIVERED_SCAN_CUT,
                    if c.redelivered_scan_cut { 1.0 } else { 0.0 },
                );
            }
            gauge(metric::QUEUE_CONSUMERS, c.consumers as f64);

            let outstanding = (c.lag_messages + c.unacked.unwrap_or(0)) as i64;
            let history = self
                .histories
                .entry(key.clone())
                .and_modify(|h| h.push(now, c.acknowledged, outstanding, self.window))
                .or_insert_with(|| History::new(now, c.acknowledged, outstanding));
            let status = history.status(now, self.window, c.consumers > 0);
            for s in Status::ALL {
                let mut l = labels();
                l.push(("status", s.as_str().to_string()));
                emit(Sample {
                    name: metric::QUEUE_CONSUMER_STATUS,
                    labels: l,
                    value: if s == status { 1.0 } else { 0.0 },
                });
            }
            let mut l = labels();
            l.push(("owner", owner.to_string()));
            emit(Sample {
                name: metric::QUEUE_CONSUMER_INFO,
                labels: l,
                value: 1.0,
            });
        }
        self.histories.retain(|k, _| consumers_seen.contains(k));

        // Dead letters of every consumer seen, each reason from its first
        // count on (a reason never counted has no series yet).
        for ((queue, consumer, reason), total) in &self.dead {
            let mut l = q_labels(queue);
            l.push(("consumer", consumer.clone()));
            l.push(("reason", (*reason).to_string()));
            emit(Sample {
                name: metric::QUEUE_DEAD_LETTERS,
                labels: l,
                value: *total as f64,
            });
        }
    }
}

/// Exports the source's objective of the oldest age (the lag seconds its
/// consumers are held to), as every kind with objectives does at start.
pub fn export_objectives(common: &Common) {
    if let Some(age) = common.objectives.oldest_age {
        metrics::gauge!(metric::OBJECTIVE_OLDEST_AGE, "source" => common.name.clone())
            .set(age.as_secs_f64());
    }
}

/// What the card says of a queue source, as numbers (`/api/v1/status`
/// `numbers`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Numbers {
    pub consumers: Vec<ConsumerNumbers>,
    /// The source's objective of the oldest age, in seconds.
    pub oldest_age_objective_seconds: Option<f64>,
}

/// One consumer on the card.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ConsumerNumbers {
    pub queue: String,
    pub consumer: String,
    pub lag_messages: f64,
    pub lag_seconds: Option<f64>,
    pub unacked: Option<f64>,
    pub status: Option<String>,
}

/// The consumers of one poll's samples, as published: kept beside the
/// snapshot.
#[derive(Debug, Clone, Default)]
pub struct Consumers {
    by_key: BTreeMap<(String, String), ConsumerNumbers>,
}

impl Consumers {
    fn add(&mut self, s: &Sample) {
        let label = |k: &str| {
            s.labels
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
        };
        let (Some(queue), Some(consumer)) = (label("queue"), label("consumer")) else {
            return;
        };
        if s.name == metric::QUEUE_DEAD_LETTERS {
            return;
        }
        let c = self
            .by_key
            .entry((queue.clone(), consumer.clone()))
            .or_insert_with(|| ConsumerNumbers {
                queue,
                consumer,
                ..ConsumerNumbers::default()
            });
        match s.name {
            metric::QUEUE_LAG_MESSAGES => c.lag_messages = s.value,
            metric::QUEUE_LAG_SECONDS => c.lag_seconds = Some(s.value),
            metric::QUEUE_UNACKED => c.unacked = Some(s.value),
            metric::QUEUE_CONSUMER_STATUS if s.value == 1.0 => c.status = label("status"),
            _ => {}
        }
    }
}

/// The card of a queue source: its consumers with their lag, unacked work
/// and status, the worst lag in seconds against the objective.
pub fn card(values: &Reading<'_>, _past: &dyn Past) -> Card {
    let consumers: Vec<ConsumerNumbers> = values
        .kept::<Consumers>()
        .map(|c| c.by_key.values().cloned().collect())
        .unwrap_or_default();
    let objective = values.max(metric::OBJECTIVE_OLDEST_AGE, &[]);
    let total: f64 = consumers.iter().map(|c| c.lag_messages).sum();
    let worst = consumers
        .iter()
        .filter_map(|c| c.lag_seconds)
        .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))));
    let cell = |v: Option<f64>, key: &str| vec![value(key, v)];
    let table = Table {
        rows_are: "consumer",
        columns: vec![
            ("lag_messages", "lag (messages)"),
            ("lag_seconds", "lag (seconds)"),
            ("unacked", "unacknowledged"),
            ("consumer_status", "status"),
        ],
        rows: consumers
            .iter()
            .map(|c| TableRow {
                key: if c.consumer.is_empty() {
                    c.queue.clone()
                } else {
                    format!("{}/{}", c.queue, c.consumer)
                },
                cells: vec![
                    cell(Some(c.lag_messages), "lag_messages"),
                    cell(c.lag_seconds, "lag_seconds"),
                    cell(c.unacked, "unacked"),
                    vec![c.status.clone().map_or(Part::Missing, Part::Text)],
                ],
            })
            .collect(),
        empty: "no consumer watched yet",
    };
    let none = consumers.is_empty();
    Card {
        trends: vec![
            (
                "queue_lag_messages",
                Trend::Level(if none { f64::NAN } else { total }),
            ),
            ("queue_lag_seconds", Trend::Level(worst.unwrap_or(f64::NAN))),
        ],
        rows: vec![
            Row {
                field: "queue_lag_messages",
                title: vec![text("total lag (messages)")],
                value: vec![value("queue_lag_messages", (!none).then_some(total))],
                spark: Some("queue_lag_messages"),
            },
            Row {
                field: "queue_lag_seconds",
                title: vec![text("worst lag")],
                value: against("queue_lag_seconds", worst, objective, "s"),
                spark: Some("queue_lag_seconds"),
            },
        ],
        tables: vec![table],
        degraded: None,
        numbers: serde_json::to_value(Numbers {
            consumers,
            oldest_age_objective_seconds: objective,
        })
        .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::NoPast;
    use crate::telemetry::values::Values;

    fn consumer(lag: u64, unacked: u64, acknowledged: i64, consumers: u64) -> Consumer {
        Consumer {
            queue: "orders".into(),
            consumer: "billing".into(),
            lag_messages: lag,
            lag_seconds: Some(12.5),
            unacked: Some(unacked),
            oldest_unacked_age_seconds: Some(30.0),
            redelivered: Some(2),
            redelivered_scan_cut: false,
            consumers,
            acknowledged,
        }
    }

    fn poll(m: &mut Memory, seen: &Observation, at: Instant) -> Vec<Sample> {
        let mut out = Vec::new();
        m.samples("src", "team", seen, at, &mut |s| out.push(s));
        out
    }

    fn one(samples: &[Sample], name: &str, extra: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<f64> = samples
            .iter()
            .filter(|s| {
                s.name == name
                    && extra
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(n, x)| n == k && x == v))
            })
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} {extra:?}: {found:?}");
        found.first().copied()
    }

    fn status(samples: &[Sample]) -> String {
        samples
            .iter()
            .find(|s| s.name == metric::QUEUE_CONSUMER_STATUS && s.value == 1.0)
            .and_then(|s| s.labels.iter().find(|(k, _)| *k == "status"))
            .map(|(_, v)| v.clone())
            .expect("one status at 1")
    }

    #[test]
    fn counters_grow_from_first_sight_and_count_a_recreated_stream_anew() {
        let mut m = Memory::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let seen = |appended, redelivered| Observation {
            broker: "nats",
            queues: vec![Queue {
                queue: "orders".into(),
                messages: 7,
                appended: Some(appended),
                redelivered,
            }],
            ..Observation::default()
        };
        let s = poll(&mut m, &seen(100, None), t0);
        assert_eq!(
            one(&s, metric::QUEUE_MESSAGES, &[("broker", "nats")]),
            Some(7.0)
        );
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(0.0));
        assert_eq!(one(&s, metric::QUEUE_REDELIVERIES, &[]), None);
        let s = poll(&mut m, &seen(130, Some(4)), t0);
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(30.0));
        assert_eq!(one(&s, metric::QUEUE_REDELIVERIES, &[]), Some(0.0));
        // Deleted and recreated with 5 messages since: 5 more.
        let s = poll(&mut m, &seen(5, Some(9)), t0);
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(35.0));
        assert_eq!(one(&s, metric::QUEUE_REDELIVERIES, &[]), Some(5.0));
        // Missing from a poll (a broker restarting): no series meanwhile, the
        // total kept, and the next count is growth from the last one.
        let s = poll(
            &mut m,
            &Observation {
                broker: "nats",
                ..Observation::default()
            },
            t0 + Duration::from_secs(1),
        );
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), None);
        let s = poll(&mut m, &seen(8, None), t0 + Duration::from_secs(2));
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(38.0));
        // Restarted statistics (the count fell to 0): the total stays.
        let s = poll(&mut m, &seen(0, None), t0 + Duration::from_secs(3));
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(38.0));
        // Gone for over an hour: forgotten, and counted from its next sight.
        poll(
            &mut m,
            &Observation {
                broker: "nats",
                ..Observation::default()
            },
            t0 + Duration::from_secs(3) + FORGET_AFTER,
        );
        let s = poll(
            &mut m,
            &seen(50, None),
            t0 + Duration::from_secs(4) + FORGET_AFTER,
        );
        assert_eq!(one(&s, metric::QUEUE_PUBLISHED, &[]), Some(0.0));
    }

    #[test]
    fn lag_zero_means_zero_seconds_and_unknown_seconds_stay_absent() {
        let mut m = Memory::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let mut c = consumer(0, 0, 5, 1);
        c.lag_seconds = None;
        let seen = Observation {
            broker: "redis",
            consumers: vec![c.clone()],
            ..Observation::default()
        };
        let s = poll(&mut m, &seen, t0);
        assert_eq!(one(&s, metric::QUEUE_LAG_SECONDS, &[]), Some(0.0));
        assert_eq!(one(&s, metric::QUEUE_OLDEST_UNACKED_AGE, &[]), Some(0.0));
        c.lag_messages = 3;
        c.unacked = None;
        let seen = Observation {
            broker: "redis",
            consumers: vec![c],
            ..Observation::default()
        };
        let s = poll(&mut m, &seen, t0);
        assert_eq!(one(&s, metric::QUEUE_LAG_MESSAGES, &[]), Some(3.0));
        assert_eq!(one(&s, metric::QUEUE_LAG_SECONDS, &[]), None);
        assert_eq!(one(&s, metric::QUEUE_UNACKED, &[]), None);
        assert_eq!(one(&s, metric::QUEUE_OLDEST_UNACKED_AGE, &[]), None);
        assert_eq!(
            one(
                &s,
                metric::QUEUE_CONSUMER_INFO,
                &[("owner", "team"), ("consumer", "billing")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn unacknowledged_work_that_stays_still_stalls_or_stops_after_the_window() {
        let w = Duration::from_secs(10);
        let t0 = Instant::now();
        for (members, expected) in [(1, "stall"), (0, "stop")] {
            let mut m = Memory::new(w);
            let mut last = String::new();
            for i in 0..12u64 {
                // Nothing left to deliver, 4 held unacked, nothing acknowledged.
                let seen = Observation {
                    broker: "nats",
                    consumers: vec![consumer(0, 4, 20, members)],
                    ..Observation::default()
                };
                last = status(&poll(&mut m, &seen, t0 + Duration::from_secs(i)));
                if i < 10 {
                    assert_eq!(last, "ok", "at {i}");
                }
            }
            assert_eq!(last, expected);
            // It acknowledges again: ok.
            let seen = Observation {
                broker: "nats",
                consumers: vec![consumer(0, 3, 21, members)],
                ..Observation::default()
            };
            assert_eq!(
                status(&poll(&mut m, &seen, t0 + Duration::from_secs(12))),
                "ok"
            );
        }
        // Idle with nothing outstanding: ok for ever.
        let mut m = Memory::new(w);
        for i in 0..30u64 {
            let seen = Observation {
                broker: "nats",
                consumers: vec![consumer(0, 0, 20, 0)],
                ..Observation::default()
            };
            assert_eq!(
                status(&poll(&mut m, &seen, t0 + Duration::from_secs(i))),
                "ok"
            );
        }
    }

    #[test]
    fn dead_letters_add_up_per_consumer_and_reason() {
        let mut m = Memory::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let dead = |n| Observation {
            broker: "nats",
            dead_letters: vec![DeadLetters {
                queue: "orders".into(),
                consumer: "billing".into(),
                reason: "max_deliveries",
                count: n,
            }],
            ..Observation::default()
        };
        poll(&mut m, &dead(3), t0);
        poll(
            &mut m,
            &Observation {
                broker: "nats",
                ..Observation::default()
            },
            t0,
        );
        let s = poll(&mut m, &dead(2), t0);
        assert_eq!(
            one(
                &s,
                metric::QUEUE_DEAD_LETTERS,
                &[("reason", "max_deliveries")]
            ),
            Some(5.0)
        );
    }

    #[test]
    fn the_card_lists_consumers_with_the_worst_lag_against_the_objective() {
        let mut m = Memory::new(Duration::from_secs(10));
        let mut other = consumer(4, 1, 0, 1);
        other.consumer = "audit".into();
        other.lag_seconds = Some(40.0);
        let seen = Observation {
            broker: "redis",
            consumers: vec![consumer(2, 1, 0, 1), other],
            ..Observation::default()
        };
        m.publish("queue-card", "team", &seen, Instant::now());
        let values = Values::default();
        let card = card(&values.reading("queue-card"), &NoPast);
        snapshot::clear("queue-card");
        assert_eq!(
            card.numbers,
            serde_json::json!({
                "consumers": [
                    {"queue": "orders", "consumer": "audit", "lag_messages": 4.0,
                     "lag_seconds": 40.0, "unacked": 1.0, "status": "ok"},
                    {"queue": "orders", "consumer": "billing", "lag_messages": 2.0,
                     "lag_seconds": 12.5, "unacked": 1.0, "status": "ok"},
                ],
                "oldest_age_objective_seconds": null,
            })
        );
        assert_eq!(
            card.trends,
            vec![
                ("queue_lag_messages", Trend::Level(6.0)),
                ("queue_lag_seconds", Trend::Level(40.0)),
            ]
        );
    }
}
