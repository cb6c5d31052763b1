//! The NATS JetStream source: each durable consumer's lag in messages and
//! in exact seconds, its unacknowledged work and its age, redeliveries,
//! dead letters (max-delivery and terminated advisories), and its status —
//! the `queue_*` family every broker kind but Kafka exports
//! ([`crate::sources::queue`]). Read with the agent's own connection, which
//! never pulls, acknowledges or creates a watched consumer.
//!
//! One poll:
//! 1. `$JS.API.STREAM.LIST`, 256 streams to a page: each stream's messages
//!    and last sequence;
//! 2. `$JS.API.CONSUMER.LIST.<stream>` per watched stream (at most
//!    [`IN_FLIGHT`] at once): each consumer's pending, ack-pending and
//!    redelivered counts, its delivered and acknowledged positions, its
//!    waiting pulls or push binding;
//! 3. for a consumer with pending messages, the stored time of the next one
//!    it has not been delivered (`$JS.API.STREAM.MSG.GET` with
//!    `next_by_subj`: the first message at or after its delivered stream
//!    sequence + 1 on its filter subject); for one with unacknowledged
//!    messages, that of the first message above its ack floor — each read
//!    once per position (cached while the position stays);
//! 4. the advisories counted since the last poll, and one snapshot.
//!
//! No read grows with a stream's length. Ages are on the server's clock
//! (`clock.rs`).

mod advisories;
mod client;
pub mod clock;
pub mod config;
mod doctor;
pub mod election;
mod kind;

pub use config::NatsSpec;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_nats::Client;
use tokio::task::JoinSet;
use tracing::warn;

use self::advisories::Listener;
use self::client::{ConsumerInfo, RequestError, SharedEvents, StreamInfo};
use self::clock::{ServerClock, age};
use super::poll_loop::{PollStats, Source, SourceError};
use super::queue::{Consumer, DeadLetters, Memory, Observation, Queue};
use crate::telemetry::snapshot;

/// Requests of one poll in flight at once.
const IN_FLIGHT: usize = 32;

/// Reads past messages a consumer gave up on before the oldest
/// unacknowledged age is left unsaid.
const MAX_SKIPS: u64 = 8;

/// The `broker` label.
pub const BROKER: &str = "nats";

/// Which of a consumer's two times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Which {
    /// The next message not delivered.
    Undelivered,
    /// The first message above the ack floor.
    Unacked,
}

/// A stored time read at a position: kept while the position and the
/// stream stay.
#[derive(Debug, Clone)]
struct Read {
    /// The stream's creation time (a recreated stream reads again).
    stream_created: String,
    /// The sequence the read started from.
    from: u64,
    /// The message found, and its stored time.
    found: Option<(u64, SystemTime)>,
}

pub struct NatsSource {
    spec: Arc<NatsSpec>,
    clock: ServerClock,
    client: Option<Client>,
    events: SharedEvents,
    listener: Option<Listener>,
    /// Since when the advisories are not listened to (this term), if not.
    unheard_since: Option<SystemTime>,
    memory: Memory,
    reads: HashMap<(String, String, Which), Read>,
    /// Consumers with `ack_policy = none`, warned of once.
    warned: HashSet<(String, String)>,
    /// The last poll's streams and consumers (for `doctor`).
    seen: (usize, usize),
}

impl NatsSource {
    pub fn new(spec: Arc<NatsSpec>, clock: ServerClock) -> NatsSource {
        if spec.dead_letter_advisories {
            advisories::register_gaps(&spec.name);
        }
        NatsSource {
            memory: Memory::new(spec.status_window),
            spec,
            clock,
            client: None,
            events: SharedEvents::default(),
            listener: None,
            unheard_since: None,
            reads: HashMap::new(),
            warned: HashSet::new(),
            seen: (0, 0),
        }
    }

    /// The connection, made (with the advisories' subscriptions) when missing.
    async fn client(&mut self) -> Result<Client, SourceError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        self.events = SharedEvents::default();
        let client = client::connect(&self.spec, self.events.clone()).await?;
        if self.spec.dead_letter_advisories {
            let listener = Listener::subscribe(&client)
                .await
                .map_err(SourceError::Query)?;
            if let Some(from) = self.unheard_since.take() {
                advisories::record_gap(&self.spec.name, from, SystemTime::now());
            }
            self.listener = Some(listener);
        }
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Records the connection's outages while the advisories were listened to.
    fn record_outages(&self) {
        let outages = std::mem::take(
            &mut self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .outages,
        );
        for (from, to) in outages {
            advisories::record_gap(&self.spec.name, from, to);
        }
    }

    async fn cycle(&mut self) -> Result<PollStats, SourceError> {
        let now = Instant::now();
        let client = self.client().await?;
        let own_bucket = format!("KV_{}", self.spec.election_bucket);
        let streams: Vec<StreamInfo> = client::streams(&client)
            .await
            .map_err(query)?
            .into_iter()
            .filter(|s| s.config.name != own_bucket && self.spec.streams.is_match(&s.config.name))
            .collect();
        let consumers = self.consumers(&client, &streams).await?;
        let reads = self.times(&client, &streams, &consumers).await?;
        let server_now = self.clock.now();
        if self.listener.is_some() {
            self.record_outages();
        }
        let dead = self.listener.as_ref().map(|l| l.take()).unwrap_or_default();

        let mut seen = Observation {
            broker: BROKER,
            ..Observation::default()
        };
        for s in &streams {
            seen.queues.push(Queue {
                queue: s.config.name.clone(),
                messages: s.state.messages,
                appended: Some(s.state.last_seq),
                redelivered: None,
            });
        }
        let watched: HashSet<(&str, &str)> = consumers
            .iter()
            .map(|c| (c.stream_name.as_str(), c.name.as_str()))
            .collect();
        for c in &consumers {
            let key = (c.stream_name.clone(), c.name.clone());
            let time = |which| {
                self.reads
                    .get(&(key.0.clone(), key.1.clone(), which))
                    .and_then(|r| r.found)
                    .map(|(_, t)| t)
            };
            let acks = c.config.ack_policy != "none";
            if !acks && !self.warned.contains(&key) {
                warn!(
                    source = %self.spec.name,
                    stream = %c.stream_name,
                    consumer = %c.name,
                    "The consumer has ack_policy none: it has no unacknowledged messages to count."
                );
                self.warned.insert(key.clone());
            }
            let lag_seconds = match (server_now, time(Which::Undelivered)) {
                (Some(n), Some(t)) => Some(age(n, t)),
                _ => None,
            };
            let oldest_unacked = match (server_now, time(Which::Unacked)) {
                (Some(n), Some(t)) if acks => Some(age(n, t)),
                _ => None,
            };
            seen.consumers.push(Consumer {
                queue: c.stream_name.clone(),
                consumer: c.name.clone(),
                lag_messages: c.num_pending,
                lag_seconds,
                unacked: acks.then_some(c.num_ack_pending),
                oldest_unacked_age_seconds: oldest_unacked,
                redelivered: Some(c.num_redelivered),
                redelivered_scan_cut: false,
                consumers: if c.config.deliver_subject.is_some() {
                    u64::from(c.push_bound)
                } else {
                    c.num_waiting
                },
                acknowledged: c.ack_floor.stream_seq as i64,
            });
        }
        for ((stream, consumer, reason), count) in dead {
            if watched.contains(&(stream.as_str(), consumer.as_str())) {
                seen.dead_letters.push(DeadLetters {
                    queue: stream,
                    consumer,
                    reason,
                    count,
                });
            }
        }
        self.memory.publish(
            &self.spec.name,
            self.spec.owner.as_deref().unwrap_or_default(),
            &seen,
            now,
        );
        self.seen = (streams.len(), consumers.len());
        Ok(PollStats {
            rows_read: reads,
            ..PollStats::default()
        })
    }

    /// The watched durable consumers of every watched stream.
    async fn consumers(
        &self,
        client: &Client,
        streams: &[StreamInfo],
    ) -> Result<Vec<ConsumerInfo>, SourceError> {
        let mut tasks = JoinSet::new();
        let mut out = Vec::new();
        let mut next = streams.iter().filter(|s| s.state.consumer_count > 0);
        loop {
            while tasks.len() < IN_FLIGHT {
                let Some(s) = next.next() else { break };
                let (client, name) = (client.clone(), s.config.name.clone());
                tasks.spawn(async move { client::consumers(&client, &name).await });
            }
            let Some(done) = tasks.join_next().await else {
                break;
            };
            match done.map_err(|e| SourceError::Query(e.to_string()))? {
                Ok(list) => out.extend(list),
                // Deleted since it was listed: it is not in the next poll.
                Err(RequestError::Api(e)) if e.err_code == client::STREAM_NOT_FOUND => {}
                Err(e) => return Err(query(e)),
            }
        }
        out.retain(|c| c.config.durable_name.is_some() && self.spec.consumers.is_match(&c.name));
        out.sort_by(|a, b| (&a.stream_name, &a.name).cmp(&(&b.stream_name, &b.name)));
        Ok(out)
    }

    /// Reads the stored times whose positions moved since they were read;
    /// returns how many reads it made.
    async fn times(
        &mut self,
        client: &Client,
        streams: &[StreamInfo],
        consumers: &[ConsumerInfo],
    ) -> Result<u64, SourceError> {
        let created: HashMap<&str, &str> = streams
            .iter()
            .map(|s| (s.config.name.as_str(), s.created.as_str()))
            .collect();
        let mut wanted = Vec::new();
        let mut keep = HashSet::new();
        for c in consumers {
            let stream_created = created.get(c.stream_name.as_str()).copied().unwrap_or("");
            let subject = c
                .config
                .filter_subject
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| ">".into());
            // What the consumer gave up on above its ack floor is no longer
            // pending (a 2.9 server's floor stays behind a message that
            // reached max_deliver): the oldest unacknowledged is past them.
            let given_up = self
                .listener
                .as_ref()
                .map(|l| l.given_up_above(&c.stream_name, &c.name, c.ack_floor.stream_seq))
                .unwrap_or_default();
            for (which, wants, from) in [
                (
                    Which::Undelivered,
                    c.num_pending > 0,
                    c.delivered.stream_seq + 1,
                ),
                (
                    Which::Unacked,
                    c.num_ack_pending > 0,
                    c.ack_floor.stream_seq + 1,
                ),
            ] {
                if !wants {
                    continue;
                }
                let skip = match which {
                    Which::Unacked => given_up.clone(),
                    Which::Undelivered => BTreeSet::new(),
                };
                let key = (c.stream_name.clone(), c.name.clone(), which);
                keep.insert(key.clone());
                let fresh = self.reads.get(&key).is_some_and(|r| {
                    r.from == from
                        && r.stream_created == stream_created
                        && r.found.is_some_and(|(seq, _)| !skip.contains(&seq))
                });
                if !fresh {
                    wanted.push((key, stream_created.to_string(), from, subject.clone(), skip));
                }
            }
        }
        self.reads.retain(|k, _| keep.contains(k));
        let mut count = 0;
        let mut tasks = JoinSet::new();
        let mut next = wanted.into_iter();
        loop {
            while tasks.len() < IN_FLIGHT {
                let Some((key, stream_created, from, subject, skip)) = next.next() else {
                    break;
                };
                let client = client.clone();
                tasks.spawn(async move {
                    let mut at = from;
                    let mut reads = 0;
                    let found = loop {
                        reads += 1;
                        match client::first_at_or_after(&client, &key.0, at, &subject).await {
                            Ok(Some((seq, _))) if skip.contains(&seq) => {
                                if reads == MAX_SKIPS {
                                    // Cannot say: never a wrong age.
                                    break Ok(None);
                                }
                                at = seq + 1;
                            }
                            other => break other,
                        }
                    };
                    (key, stream_created, from, found, reads)
                });
            }
            let Some(done) = tasks.join_next().await else {
                break;
            };
            let (key, stream_created, from, found, reads) =
                done.map_err(|e| SourceError::Query(e.to_string()))?;
            count += reads;
            match found {
                Ok(found) => {
                    self.reads.insert(
                        key,
                        Read {
                            stream_created,
                            from,
                            found,
                        },
                    );
                }
                Err(RequestError::Api(e)) if e.err_code == client::STREAM_NOT_FOUND => {}
                Err(e) => return Err(query(e)),
            }
        }
        Ok(count)
    }
}

fn query(e: RequestError) -> SourceError {
    SourceError::Query(e.to_string())
}

impl Source for NatsSource {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn poll_interval(&self) -> Duration {
        self.spec.poll_interval
    }

    fn timeout(&self) -> Duration {
        self.spec.timeout
    }

    async fn poll(&mut self) -> Result<PollStats, SourceError> {
        self.cycle().await
    }

    fn reset(&mut self) {
        // Down: the series go rather than freeze; the counters' totals stay
        // for when the server is back.
        snapshot::clear(&self.spec.name);
        if self.listener.take().is_some() {
            self.record_outages();
            let since = self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .down_since
                .unwrap_or_else(SystemTime::now);
            self.unheard_since.get_or_insert(since);
        }
        self.client = None;
    }
}
