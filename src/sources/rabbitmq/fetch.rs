//! What one poll reads of the management API, and what it means (a pure
//! step, [`observe`]): the watched vhosts (`/api/vhosts?columns=name`), each
//! one's queues with only the columns the series need
//! (`/api/queues/<vhost>?columns=…`, one request), and, for each
//! dead-letter exchange the watched queues name, its type and the queues it
//! is bound to (`/api/exchanges/<vhost>/<x>` and `…/bindings/source`): the
//! dead-letter target queues.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use super::client::{Api, ApiError, segment};
use super::config::{RabbitSpec, StreamsUrl};
use super::streams::{self, Chunk, Conn, Start, StreamError};
use crate::sources::queue::{Consumer, DeadLetters, Observation, Queue};

/// The columns asked of every queue.
pub const COLUMNS: &str = "name,type,messages,messages_ready,messages_unacknowledged,consumers,\
head_message_timestamp,message_stats.publish,message_stats.redeliver,message_stats.ack,\
message_stats.deliver_no_ack,message_stats.get_no_ack,arguments,effective_policy_definition,\
backing_queue_status.next_seq_id";

/// One queue as the management API lists it (only the columns asked).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct QueueRow {
    pub name: String,
    /// `classic`, `quorum` or `stream`.
    #[serde(rename = "type", default)]
    pub kind: String,
    pub messages: Option<u64>,
    pub messages_ready: Option<u64>,
    pub messages_unacknowledged: Option<u64>,
    pub consumers: Option<u64>,
    /// Seconds since the epoch: the `timestamp` property of the message at
    /// the head of a classic queue, when its publisher set one.
    pub head_message_timestamp: Option<Value>,
    pub message_stats: Option<Stats>,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub effective_policy_definition: Option<Value>,
    pub backing_queue_status: Option<BackingQueue>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Stats {
    pub publish: Option<u64>,
    pub redeliver: Option<u64>,
    pub ack: Option<u64>,
    pub deliver_no_ack: Option<u64>,
    pub get_no_ack: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct BackingQueue {
    /// A classic queue's count of messages ever enqueued, whoever put them
    /// there (a publisher or dead-lettering).
    pub next_seq_id: Option<u64>,
}

impl QueueRow {
    /// The head message's timestamp in seconds, if the queue reports one.
    pub fn head_timestamp(&self) -> Option<f64> {
        match &self.head_message_timestamp {
            Some(Value::Number(n)) => n.as_f64(),
            _ => None,
        }
    }

    /// A setting of the queue: its argument `x-<name>`, else its effective
    /// policy's `<name>` (queue arguments win).
    fn setting(&self, name: &str) -> Option<String> {
        let from = |v: &Option<Value>, key: &str| {
            v.as_ref()
                .and_then(|v| v.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        from(&self.arguments, &format!("x-{name}"))
            .or_else(|| from(&self.effective_policy_definition, name))
    }

    /// The dead-letter exchange and routing key, where the queue has one.
    pub fn dead_letter(&self) -> Option<(String, Option<String>)> {
        let exchange = self.setting("dead-letter-exchange")?;
        Some((exchange, self.setting("dead-letter-routing-key")))
    }

    /// Whether its consumers are read from this listing (not a stream's).
    pub fn has_consumer_row(&self) -> bool {
        self.kind != "stream"
    }
}

impl VhostRead {
    /// The streams among the queues `queues` selects.
    pub fn watched_streams<'a>(
        &'a self,
        queues: &'a regex::Regex,
    ) -> impl Iterator<Item = &'a QueueRow> + 'a {
        self.rows
            .values()
            .filter(|r| !r.has_consumer_row() && queues.is_match(&r.name))
    }
}

/// The queues of one vhost, and where its queues' dead letters go.
#[derive(Debug, Clone, Default)]
pub struct VhostRead {
    pub vhost: String,
    /// The broker's clock when it answered (its `Date`).
    pub broker_now: Option<f64>,
    /// Every queue of the vhost (the dead-letter targets among them need
    /// not be watched), by name.
    pub rows: BTreeMap<String, QueueRow>,
    /// Per dead-letter exchange and routing key the watched queues name,
    /// the queues it delivers to; `None` when the exchange does not exist.
    pub targets: BTreeMap<(String, Option<String>), Option<Vec<String>>>,
    /// Per watched stream, what the stream protocol read (with
    /// `streams_url`).
    pub streams: BTreeMap<String, StreamRead>,
    /// Per stream, the subscriptions attached to it (the stream management
    /// plugin's list); `None` when that plugin does not answer.
    pub subscribers: Option<HashMap<String, u64>>,
}

/// One stream as the stream protocol reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamRead {
    /// Its last chunk of messages; `None`: it holds none (or none came in
    /// time: then no consumer is read either).
    pub last: Option<Chunk>,
    /// Each named consumer that stored an offset on it: the name, the
    /// offset, and the chunk holding the next offset when messages follow it.
    pub consumers: Vec<(String, u64, Option<Chunk>)>,
    /// Consumers whose next chunk did not come in time: no lag seconds.
    pub late: Vec<String>,
}

/// One read of the broker.
#[derive(Debug, Clone, Default)]
pub struct Read {
    pub vhosts: Vec<VhostRead>,
    /// Vhosts the pattern matches that the user may not read (it needs a
    /// permission entry there, empty patterns suffice): skipped.
    pub refused: Vec<String>,
    /// What the stream protocol could not read, stream by stream (refused,
    /// gone, a chunk that did not come): those streams' consumers, or
    /// consumers' lag seconds, are not exported this poll.
    pub stream_notes: Vec<String>,
}

/// The stream protocol's connections, one per vhost, kept between polls.
#[derive(Default)]
pub struct StreamConns {
    open: HashMap<String, Conn>,
}

/// Why a poll failed: the management API or the stream protocol.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Api(ApiError),
    #[error("{0}")]
    Streams(StreamError),
}

impl From<ApiError> for FetchError {
    fn from(e: ApiError) -> FetchError {
        FetchError::Api(e)
    }
}

#[derive(Deserialize)]
struct StreamConsumer {
    queue: Named,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

#[derive(Deserialize)]
struct ExchangeType {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Binding {
    destination: String,
    destination_type: String,
    #[serde(default)]
    routing_key: String,
}

/// Reads every watched vhost's queues and their dead-letter targets, and
/// with `streams_url` its streams' offsets.
pub async fn fetch(
    api: &Api,
    spec: &RabbitSpec,
    conns: &mut StreamConns,
) -> Result<Read, FetchError> {
    let vhosts: Vec<Named> = api.get("/api/vhosts?columns=name").await?;
    let mut out = Read::default();
    let mut streamed = HashSet::new();
    for vhost in vhosts.into_iter().map(|v| v.name) {
        if !spec.vhosts.is_match(&vhost) {
            continue;
        }
        let mut read = VhostRead {
            vhost: vhost.clone(),
            ..VhostRead::default()
        };
        // One request per vhost, not page by page: RabbitMQ 3.10 lists
        // and augments every queue of the vhost for each page it serves
        // (a page of 500 costs the broker about what all 10,000 cost), so
        // paging would multiply its work by the pages
        // (docs/performance-brokers.md).
        let path = format!("/api/queues/{}?columns={COLUMNS}", segment(&vhost));
        let rows: Vec<QueueRow> = match api.get_dated(&path).await {
            Ok((rows, date)) => {
                read.broker_now = date;
                rows
            }
            // The vhost was deleted since it was listed.
            Err(e) if e.is_not_found() => Vec::new(),
            Err(ApiError::Unauthorized { .. }) => {
                out.refused.push(vhost.clone());
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for row in rows {
            read.rows.insert(row.name.clone(), row);
        }
        let wanted: BTreeSet<(String, Option<String>)> = read
            .rows
            .values()
            .filter(|r| spec.queues.is_match(&r.name))
            .filter_map(QueueRow::dead_letter)
            .collect();
        for (exchange, key) in wanted {
            let targets = targets(api, &vhost, &exchange, key.as_deref()).await?;
            read.targets.insert((exchange, key), targets);
        }
        if let Some(url) = &spec.streams {
            let watched: Vec<(String, u64)> = read
                .watched_streams(&spec.queues)
                .map(|r| (r.name.clone(), r.messages.unwrap_or(0)))
                .collect();
            if !watched.is_empty() {
                // Before the agent subscribes: its own subscriptions are not
                // in the list it reads.
                read.subscribers = subscribers(api, &vhost).await?;
                if read.subscribers.is_none() {
                    out.stream_notes.push(format!(
                        "vhost \"{vhost}\": the stream management plugin does not answer (/api/stream/consumers): its streams' consumers count 0 attached, so a stalled one reads as stopped (rabbitmq-plugins enable rabbitmq_stream_management)"
                    ));
                }
                read_streams(
                    conns,
                    (url, spec),
                    &vhost,
                    &watched,
                    &mut read,
                    &mut out.stream_notes,
                )
                .await
                .map_err(FetchError::Streams)?;
                streamed.insert(vhost.clone());
            }
        }
        out.vhosts.push(read);
    }
    // A vhost with no watched stream left keeps no connection.
    conns.open.retain(|v, _| streamed.contains(v));
    Ok(out)
}

/// Per stream of `vhost`, the subscriptions attached to it (the stream
/// management plugin's list, read before the agent subscribes: its own
/// subscriptions, one at a time and ended within the poll, are not in it);
/// `None` when the plugin does not answer (404).
async fn subscribers(api: &Api, vhost: &str) -> Result<Option<HashMap<String, u64>>, ApiError> {
    let path = format!(
        "/api/stream/consumers/{}?columns=queue.name",
        segment(vhost)
    );
    let list: Vec<StreamConsumer> = match api.get(&path).await {
        Ok(l) => l,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = HashMap::new();
    for c in list {
        *out.entry(c.queue.name).or_insert(0) += 1;
    }
    Ok(Some(out))
}

/// Reads each watched stream of `vhost` over the stream protocol: its last
/// chunk of messages, each named consumer's stored offset, and the chunk
/// holding the first offset that consumer has not stored. The vhost's
/// connection is kept between polls, but taken out while in use: a poll cut
/// short by its timeout drops it rather than leave a subscription open on
/// it. One that fails is opened again once.
async fn read_streams(
    conns: &mut StreamConns,
    (url, spec): (&StreamsUrl, &RabbitSpec),
    vhost: &str,
    watched: &[(String, u64)],
    read: &mut VhostRead,
    notes: &mut Vec<String>,
) -> Result<(), StreamError> {
    // Each step well within the poll's own timeout, so that a broker that
    // stops answering is an error of this read, not a poll cut short.
    let patience = spec.timeout / 4;
    let mut retried = false;
    loop {
        let mut conn = match conns.open.remove(vhost) {
            Some(c) if !c.stale() => c,
            _ => Conn::open(url, spec, vhost, patience).await?,
        };
        let mut got = BTreeMap::new();
        let mut said = Vec::new();
        let mut failed = None;
        for (stream, messages) in watched {
            let name = label(vhost, stream);
            match read_stream(&mut conn, spec, stream, *messages).await {
                Ok(Ok(s)) => {
                    for c in &s.late {
                        said.push(format!(
                            "stream \"{name}\": consumer \"{c}\": the chunk after its stored offset did not come within {:?}; no lag seconds this poll",
                            chunk_wait(spec)
                        ));
                    }
                    got.insert(stream.clone(), s);
                }
                Ok(Err(note)) => said.push(format!("stream \"{name}\": {note}")),
                Err(e @ StreamError::Refused { .. }) => {
                    said.push(format!("stream \"{name}\": {e}"));
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => {
                conns.open.insert(vhost.to_string(), conn);
                read.streams = got;
                notes.extend(said);
                return Ok(());
            }
            // A kept connection the broker closed while idle is opened
            // again once.
            Some(_) if !retried => retried = true,
            Some(e) => return Err(e),
        }
    }
}

/// How long a subscription waits for its chunk. A chunk that exists comes
/// at once; none comes for a stream whose offsets are all offset-tracking
/// entries (its messages gone by retention), which must not hold up the
/// poll.
fn chunk_wait(spec: &RabbitSpec) -> std::time::Duration {
    (spec.timeout / 4).min(std::time::Duration::from_secs(2))
}

/// One stream, or what to say of why it was not read (gone, or a chunk that
/// did not come).
async fn read_stream(
    conn: &mut Conn,
    spec: &RabbitSpec,
    stream: &str,
    messages: u64,
) -> Result<Result<StreamRead, String>, StreamError> {
    // The management API counts a stream's offsets; a stream that holds
    // none has no chunk to wait for.
    if messages == 0 {
        return Ok(Ok(StreamRead::default()));
    }
    let wait = chunk_wait(spec);
    let last = match conn.chunk(stream, Start::Last, wait).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Ok(Err(format!(
                "no chunk of messages came within {wait:?} of subscribing to its last; its consumers are not read this poll"
            )));
        }
        Err(e) if streams::is_gone(&e) => return Ok(Err("deleted while it was read".into())),
        Err(e) => return Err(e),
    };
    let mut out = StreamRead {
        last: Some(last),
        consumers: Vec::new(),
        late: Vec::new(),
    };
    for name in &spec.stream_consumers {
        let Some(stored) = conn.query_offset(name, stream).await? else {
            continue;
        };
        let next = if stored < last.last_offset() {
            let next = conn.chunk(stream, Start::Offset(stored + 1), wait).await?;
            if next.is_none() {
                out.late.push(name.clone());
            }
            next
        } else {
            None
        };
        out.consumers.push((name.clone(), stored, next));
    }
    Ok(Ok(out))
}

/// The queues a dead-letter exchange delivers to with `key`: the queue of
/// that name for the default exchange; else the queues bound to it whose
/// binding the key matches (every bound queue for a fanout or headers
/// exchange, or when no dead-letter routing key is set: the messages keep
/// their own). `None`: the exchange does not exist.
async fn targets(
    api: &Api,
    vhost: &str,
    exchange: &str,
    key: Option<&str>,
) -> Result<Option<Vec<String>>, ApiError> {
    if exchange.is_empty() {
        return Ok(Some(key.map(|k| vec![k.to_string()]).unwrap_or_default()));
    }
    let base = format!("/api/exchanges/{}/{}", segment(vhost), segment(exchange));
    let kind: ExchangeType = match api.get(&format!("{base}?columns=type")).await {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let bindings: Vec<Binding> = match api
        .get(&format!(
            "{base}/bindings/source?columns=destination,destination_type,routing_key"
        ))
        .await
    {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out: Vec<String> = bindings
        .into_iter()
        .filter(|b| b.destination_type == "queue")
        .filter(|b| match (kind.kind.as_str(), key) {
            (_, None) => true,
            ("direct", Some(k)) => b.routing_key == k,
            ("topic", Some(k)) => topic_matches(&b.routing_key, k),
            _ => true,
        })
        .map(|b| b.destination)
        .collect();
    out.sort();
    out.dedup();
    Ok(Some(out))
}

/// AMQP topic matching: words split on `.`, `*` one word, `#` zero or more.
pub fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    };
    go(&p, &k)
}

/// The `queue` label: the queue's name in the default vhost `/`,
/// `<vhost>/<name>` in any other (names are unique only within a vhost).
pub fn label(vhost: &str, name: &str) -> String {
    if vhost == "/" {
        name.to_string()
    } else {
        format!("{vhost}/{name}")
    }
}

/// What the source keeps between reads to count dead letters: each target
/// queue's count of enqueued messages and of publishes at the last read.
#[derive(Debug, Default)]
pub struct DeadLetterMemory {
    last: HashMap<(String, String), (u64, u64)>,
}

impl DeadLetterMemory {
    /// Messages that entered the target since the last read without being
    /// published by a client: dead-lettered into it. 0 on first sight, and
    /// when either count fell (the broker restarted, its statistics were
    /// reset): never more than the broker counted.
    fn growth(&mut self, vhost: &str, target: &str, enqueued: u64, published: u64) -> u64 {
        let key = (vhost.to_string(), target.to_string());
        let grew = match self.last.get(&key) {
            Some(&(e, p)) if enqueued >= e && published >= p => {
                (enqueued - e).saturating_sub(published - p)
            }
            _ => 0,
        };
        self.last.insert(key, (enqueued, published));
        grew
    }
}

/// The observation of one read: each watched queue, its consumers' row
/// (`consumer = ""`), and what its dead-letter targets received since the
/// last read. Ages are on the broker's clock (the `Date` of its answer),
/// else on `now`, the agent's, in seconds since the epoch.
pub fn observe(
    read: &Read,
    queues: &regex::Regex,
    dead: &mut DeadLetterMemory,
    now: f64,
) -> Observation {
    let mut out = Observation {
        broker: "rabbitmq",
        ..Observation::default()
    };
    let mut targets_seen = HashMap::new();
    for vh in &read.vhosts {
        for row in vh.rows.values() {
            if !queues.is_match(&row.name) {
                continue;
            }
            // A queue whose statistics were not emitted yet (just declared,
            // or a broker that just started) says nothing this read.
            let Some(messages) = row.messages else {
                continue;
            };
            let queue = label(&vh.vhost, &row.name);
            let stats = row.message_stats.unwrap_or_default();
            if !row.has_consumer_row() {
                observe_stream(vh, row, queue, messages, now, &mut out);
                continue;
            }
            out.queues.push(Queue {
                queue: queue.clone(),
                messages,
                appended: Some(stats.publish.unwrap_or(0)),
                redelivered: Some(stats.redeliver.unwrap_or(0)),
            });
            let ready = row.messages_ready.unwrap_or(0);
            let now = vh.broker_now.unwrap_or(now);
            out.consumers.push(Consumer {
                queue: queue.clone(),
                consumer: String::new(),
                lag_messages: ready,
                lag_seconds: row.head_timestamp().map(|t| (now - t).max(0.0)),
                unacked: Some(row.messages_unacknowledged.unwrap_or(0)),
                oldest_unacked_age_seconds: None,
                redelivered: None,
                redelivered_scan_cut: false,
                consumers: row.consumers.unwrap_or(0),
                acknowledged: (stats.ack.unwrap_or(0)
                    + stats.deliver_no_ack.unwrap_or(0)
                    + stats.get_no_ack.unwrap_or(0)) as i64,
            });
            let Some(dl) = row.dead_letter() else {
                continue;
            };
            let Some(Some(targets)) = vh.targets.get(&dl) else {
                continue;
            };
            let mut count = 0;
            let mut countable = false;
            for t in targets {
                let Some(target) = vh.rows.get(t) else {
                    continue;
                };
                let Some(enqueued) = target.backing_queue_status.and_then(|b| b.next_seq_id) else {
                    continue;
                };
                countable = true;
                let published = target.message_stats.and_then(|s| s.publish).unwrap_or(0);
                let key = (vh.vhost.clone(), t.clone());
                count += *targets_seen
                    .entry(key)
                    .or_insert_with(|| dead.growth(&vh.vhost, t, enqueued, published));
            }
            if countable {
                out.dead_letters.push(DeadLetters {
                    queue,
                    consumer: String::new(),
                    reason: "dead_letter_queue",
                    count,
                });
            }
        }
    }
    dead.last.retain(|k, _| targets_seen.contains_key(k));
    out
}

/// A stream: its message count; with what the stream protocol read, its
/// offsets' growth and one row per named consumer that stored an offset:
/// lag = the last message's offset less the stored one, lag seconds = the
/// age of the chunk holding the first offset not stored (on the agent's
/// clock: the chunk's time is in milliseconds, the broker's `Date` in
/// seconds), the status rules' position = the stored offset.
fn observe_stream(
    vh: &VhostRead,
    row: &QueueRow,
    queue: String,
    messages: u64,
    now: f64,
    out: &mut Observation,
) {
    let read = vh.streams.get(&row.name);
    out.queues.push(Queue {
        queue: queue.clone(),
        messages,
        appended: read.map(|r| r.last.map_or(0, |c| c.last_offset() + 1)),
        redelivered: None,
    });
    let Some(read) = read else {
        return;
    };
    let Some(last) = read.last else {
        return;
    };
    let attached = vh
        .subscribers
        .as_ref()
        .and_then(|s| s.get(&row.name).copied())
        .unwrap_or(0);
    for (name, stored, next) in &read.consumers {
        let lag = last.last_offset().saturating_sub(*stored);
        out.consumers.push(Consumer {
            queue: queue.clone(),
            consumer: name.clone(),
            lag_messages: lag,
            lag_seconds: if lag == 0 {
                Some(0.0)
            } else {
                next.map(|c| (now - c.timestamp_ms as f64 / 1000.0).max(0.0))
            },
            unacked: None,
            oldest_unacked_age_seconds: None,
            redelivered: None,
            redelivered_scan_cut: false,
            consumers: attached,
            acknowledged: i64::try_from(*stored).unwrap_or(i64::MAX),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_as_the_broker_does() {
        for (p, k, m) in [
            ("orders.*", "orders.created", true),
            ("orders.*", "orders", false),
            ("orders.#", "orders", true),
            ("#", "", true),
            ("#.dead", "a.b.dead", true),
            ("*.dead", "a.b.dead", false),
            ("a.b", "a.b", true),
        ] {
            assert_eq!(topic_matches(p, k), m, "{p} {k}");
        }
    }

    #[test]
    fn dead_letters_count_what_entered_the_target_unpublished_and_never_more() {
        let mut m = DeadLetterMemory::default();
        assert_eq!(m.growth("/", "dlq", 10, 4), 0);
        assert_eq!(m.growth("/", "dlq", 15, 4), 5);
        // Two published by a client, three dead-lettered.
        assert_eq!(m.growth("/", "dlq", 20, 6), 3);
        // Statistics reset (a restart): a new baseline, nothing counted.
        assert_eq!(m.growth("/", "dlq", 20, 0), 0);
        assert_eq!(m.growth("/", "dlq", 21, 0), 1);
    }

    fn row(name: &str, kind: &str, json: serde_json::Value) -> QueueRow {
        let mut r: QueueRow = serde_json::from_value(json).expect("a row");
        r.name = name.into();
        r.kind = kind.into();
        r
    }

    /// Guards the pure step: a classic queue with a head timestamp (lag
    /// seconds on the broker's clock), a quorum queue without (absent), a
    /// stream (depth only), an unwatched dead-letter queue whose enqueues
    /// less its publishes are the classic queue's dead letters.
    #[test]
    fn one_read_becomes_the_queue_family() {
        let read = |dlq_seq: u64, dlq_pub: u64| {
            Read {
            vhosts: vec![VhostRead {
                vhost: "shop".into(),
                broker_now: Some(1_000.0),
                rows: [
                    row("orders", "classic", serde_json::json!({
                        "name": "", "messages": 7, "messages_ready": 5, "messages_unacknowledged": 2,
                        "consumers": 1, "head_message_timestamp": 940,
                        "message_stats": {"publish": 30, "redeliver": 3, "ack": 20, "deliver_no_ack": 1},
                        "arguments": {"x-dead-letter-exchange": ""},
                        "effective_policy_definition": {"dead-letter-routing-key": "orders.dlq"}
                    })),
                    row("orders.dlq", "classic", serde_json::json!({
                        "name": "", "messages": 3, "message_stats": {"publish": dlq_pub},
                        "backing_queue_status": {"next_seq_id": dlq_seq}
                    })),
                    row("raft", "quorum", serde_json::json!({
                        "name": "", "messages": 4, "messages_ready": 4, "consumers": 0
                    })),
                    row("log", "stream", serde_json::json!({"name": "", "messages": 100})),
                    row("fresh", "classic", serde_json::json!({"name": ""})),
                ]
                .into_iter()
                .map(|r| (r.name.clone(), r))
                .collect(),
                targets: [(("".to_string(), Some("orders.dlq".to_string())), Some(vec!["orders.dlq".to_string()]))]
                    .into_iter()
                    .collect(),
                ..VhostRead::default()
            }],
            ..Read::default()
        }
        };
        let watched = regex::Regex::new("^(?:orders|raft|log|fresh)$").unwrap();
        let mut dead = DeadLetterMemory::default();
        let seen = observe(&read(10, 1), &watched, &mut dead, 5_000.0);
        let names: Vec<&str> = seen.queues.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!(names, ["shop/log", "shop/orders", "shop/raft"]);
        let orders = &seen.consumers[0];
        assert_eq!(
            (
                orders.queue.as_str(),
                orders.lag_messages,
                orders.lag_seconds,
                orders.unacked
            ),
            ("shop/orders", 5, Some(60.0), Some(2))
        );
        assert_eq!((orders.consumers, orders.acknowledged), (1, 21));
        assert_eq!(seen.consumers[1].lag_seconds, None);
        assert_eq!(seen.consumers.len(), 2, "a stream has no consumer row here");
        assert_eq!(seen.queues[0].appended, None);
        assert_eq!(seen.queues[1].redelivered, Some(3));
        assert_eq!(seen.dead_letters[0].count, 0, "first sight");
        // 6 more enqueued, 2 of them published by a client: 4 dead letters.
        let seen = observe(&read(16, 3), &watched, &mut dead, 5_000.0);
        assert_eq!(
            (
                seen.dead_letters[0].queue.as_str(),
                seen.dead_letters[0].reason,
                seen.dead_letters[0].count
            ),
            ("shop/orders", "dead_letter_queue", 4)
        );
    }

    /// Guards the stream step: lag from the last message's offset, lag
    /// seconds from the chunk after the stored offset on the agent's clock,
    /// 0 for a consumer caught up, no row for a stream not read.
    #[test]
    fn a_stream_read_becomes_its_consumers_rows() {
        let chunk = |first_offset, records, timestamp_ms| Chunk {
            first_offset,
            records,
            timestamp_ms,
        };
        let vh = VhostRead {
            vhost: "/".into(),
            broker_now: Some(1_000.0),
            rows: [
                row(
                    "log",
                    "stream",
                    serde_json::json!({"name": "", "messages": 302}),
                ),
                row(
                    "unread",
                    "stream",
                    serde_json::json!({"name": "", "messages": 5}),
                ),
            ]
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect(),
            streams: [(
                "log".to_string(),
                StreamRead {
                    last: Some(chunk(290, 10, 1_999_000)),
                    consumers: vec![
                        ("billing".into(), 149, Some(chunk(100, 100, 1_990_500))),
                        ("done".into(), 299, None),
                    ],
                    late: Vec::new(),
                },
            )]
            .into_iter()
            .collect(),
            subscribers: Some([("log".to_string(), 2)].into_iter().collect()),
            ..VhostRead::default()
        };
        let read = Read {
            vhosts: vec![vh],
            ..Read::default()
        };
        let watched = regex::Regex::new(".*").unwrap();
        let seen = observe(&read, &watched, &mut DeadLetterMemory::default(), 2_000.0);
        assert_eq!(seen.queues[0].appended, Some(300));
        assert_eq!(seen.queues[1].appended, None, "not read: no growth");
        let rows: Vec<_> = seen
            .consumers
            .iter()
            .map(|c| {
                (
                    c.consumer.as_str(),
                    c.lag_messages,
                    c.lag_seconds,
                    c.consumers,
                    c.acknowledged,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("billing", 150, Some(9.5), 2, 149),
                ("done", 0, Some(0.0), 2, 299)
            ]
        );
    }

    #[test]
    fn arguments_win_over_the_policy() {
        let row = QueueRow {
            arguments: Some(serde_json::json!({"x-dead-letter-exchange": "dlx"})),
            effective_policy_definition: Some(serde_json::json!({
                "dead-letter-exchange": "other", "dead-letter-routing-key": "dead"
            })),
            ..QueueRow::default()
        };
        assert_eq!(row.dead_letter(), Some(("dlx".into(), Some("dead".into()))));
        let row = QueueRow {
            effective_policy_definition: Some(serde_json::json!([])),
            ..QueueRow::default()
        };
        assert_eq!(row.dead_letter(), None);
    }
}
