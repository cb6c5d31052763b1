//! `dead-letters replay --topic`: records of a dead-letter topic sent back
//! to the topics they came from.
//!
//! Selecting reads like `dead_letters.rs` (no group, `read_committed`,
//! the source's own read credentials): `Metadata` for the dead-letter topic,
//! `ListOffsets` (log start, last stable offset) of its partitions, then
//! `Fetch`es through the range, every record decoded whole.
//!
//! Sending uses `[sources.dead_letter_actions]`'s write credentials, never
//! the agent's: `InitProducerId` first (an idempotent producer, no
//! transaction), then one `Produce` (`acks = all`) per record, a batch of
//! one record carrying the producer id, epoch and the partition's next
//! sequence number, so that a retry of the same batch within the run is
//! written once (the broker answers `DUPLICATE_SEQUENCE_NUMBER`, taken as
//! done). One record per batch also keeps each record's outcome exact.
//!
//! The partition of a record sent back is Kafka's default partitioner's
//! for a keyed record (murmur2 of the key, made positive, modulo the
//! partitions: the same partition a Java producer picks); records with a
//! null key go round-robin over the partitions, from partition 0, per
//! destination topic and run.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    InitProducerIdRequest, ListOffsetsRequest, MetadataRequest, MetadataResponse, ProduceRequest,
    ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::audit::Audit;
use super::client::{Connection, Connector, KafkaError, error_name};
use super::config::{KafkaActions, KafkaSpec};
use super::dead_letters::{
    EXCEPTION_MESSAGE_HEADERS, ORIGINAL_TOPIC_HEADERS, aborted_transactions, decode_records,
    first_header,
};
use crate::sources::kind::{
    ActionError, ActionOutcome, Answer, ReplayRecord, ReplayRun, ReplaySender, TopicSelection,
};

/// The replay headers every record sent back carries.
pub const RUN_ID_HEADER: &str = "inboxwatch-replay-run-id";
pub const OPERATOR_HEADER: &str = "inboxwatch-replay-operator";
/// `topic/partition/offset` of the dead-letter record.
pub const ORIGINAL_HEADER: &str = "inboxwatch-replay-original";

/// Bytes fetched per partition and fetch; a larger batch is fetched again
/// with its whole size, up to [`MAX_BATCH`].
const FETCH_BYTES: i32 = 1024 * 1024;
/// The largest record batch a selection reads.
const MAX_BATCH: usize = 64 * 1024 * 1024;
/// Bytes of the dead-letter topic one selection reads at most.
const MAX_SCAN: usize = 1024 * 1024 * 1024;
/// Attempts of one `Produce` (the same batch each time).
const ATTEMPTS: usize = 3;
/// `read_committed`.
const READ_COMMITTED: i8 = 1;
/// Kafka's `DUPLICATE_SEQUENCE_NUMBER`: the batch was written before.
const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
/// Kafka's `UNKNOWN_TOPIC_OR_PARTITION`.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

fn failed(e: impl std::fmt::Display) -> ActionError {
    ActionError::Failed(e.to_string())
}

fn usage(message: String) -> ActionError {
    ActionError::Refused(message)
}

/// The partitions of `topic` and their leaders, from `meta`; an error when
/// the broker does not know the topic.
fn partitions(meta: &MetadataResponse, topic: &str) -> Result<BTreeMap<i32, i32>, i16> {
    let t = meta
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic))
        .ok_or(UNKNOWN_TOPIC_OR_PARTITION)?;
    if t.error_code != 0 {
        return Err(t.error_code);
    }
    Ok(t.partitions
        .iter()
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect())
}

fn brokers(meta: &MetadataResponse) -> HashMap<i32, String> {
    meta.brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect()
}

fn metadata_of(topics: &[&str]) -> MetadataRequest {
    MetadataRequest::default()
        .with_topics(Some(
            topics
                .iter()
                .map(|t| {
                    MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
                })
                .collect(),
        ))
        .with_allow_auto_topic_creation(false)
}

/// What a topic's metadata error means to the operator.
fn topic_problem(topic: &str, code: i16) -> String {
    if code == UNKNOWN_TOPIC_OR_PARTITION {
        format!("no such topic \"{topic}\"")
    } else {
        format!("topic \"{topic}\": {}", error_name(code))
    }
}

/// Milliseconds since the epoch, `ago` before now.
fn ms_ago(ago: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.saturating_sub(ago).as_millis()).unwrap_or(i64::MAX)
}

/// The records of `selection.topic` that the selection picks (at most
/// `max + 1`), each with its destination. Bounded by the source's timeout
/// per request.
pub async fn select(
    spec: &KafkaSpec,
    selection: &TopicSelection,
) -> Result<Vec<ReplayRecord>, ActionError> {
    let topic = selection.topic.as_str();
    if !spec.dead_letter_topics.is_match(topic) || !spec.topics.matches(topic) {
        return Err(usage(format!(
            "--topic: \"{topic}\" is not a dead-letter topic of this source (its name does not \
             match {}.dead_letter_topics or is not among its topics)",
            spec.common.key
        )));
    }
    let connector = Connector::new(
        spec.client_id.clone(),
        spec.security.clone(),
        spec.timeout.min(Duration::from_secs(10)),
    );
    let mut boot = connector.connect_any(&spec.brokers).await.map_err(failed)?;
    let meta = boot.send(&metadata_of(&[topic])).await.map_err(failed)?;
    let leaders = partitions(&meta, topic)
        .map_err(|code| usage(format!("--topic: {}", topic_problem(topic, code))))?;
    let addrs = brokers(&meta);
    let chosen: Vec<i32> = match selection.partition {
        Some(p) if leaders.contains_key(&p) => vec![p],
        Some(p) => {
            return Err(usage(format!(
                "--partition: topic \"{topic}\" has no partition {p} (it has {})",
                leaders.len()
            )));
        }
        None => leaders.keys().copied().collect(),
    };
    let since = selection.since.map(ms_ago);
    let until = selection.until.map(ms_ago);
    let mut out = Vec::new();
    let mut scanned = 0usize;
    for p in chosen {
        let leader = leaders[&p];
        let addr = addrs.get(&leader).ok_or_else(|| {
            failed(format!(
                "{topic}/{p}: leader {leader} is not in the metadata"
            ))
        })?;
        let mut other;
        let conn = if addr == boot.addr() {
            &mut boot
        } else {
            other = connector.connect(addr).await.map_err(failed)?;
            &mut other
        };
        let (start, end) = bounds(conn, topic, p).await.map_err(failed)?;
        let Some((from, to)) = range(selection, topic, p, start, end)? else {
            continue;
        };
        let want = |r: &ReplayRecord| {
            since.is_none_or(|s| r.timestamp >= s)
                && until.is_none_or(|u| r.timestamp <= u)
                && selection.headers.iter().all(|(k, v)| {
                    r.headers
                        .iter()
                        .rev()
                        .find(|(name, _)| name == k)
                        .is_some_and(|(_, value)| value.as_deref() == Some(v.as_bytes()))
                })
        };
        let left = selection.max + 1 - out.len();
        let picked = read_range(conn, topic, p, from, to + 1, left, &mut scanned, want)
            .await
            .map_err(failed)?;
        out.extend(picked);
        if out.len() > selection.max {
            break;
        }
    }
    for r in &mut out {
        r.destination = match &selection.to {
            Some(to) => to.clone(),
            None if !r.destination.is_empty() => r.destination.clone(),
            None => {
                return Err(usage(format!(
                    "record {} has no original topic (none of the headers {}): give --to TOPIC",
                    r.coordinates(),
                    ORIGINAL_TOPIC_HEADERS.join(", ")
                )));
            }
        };
    }
    check_destinations(&mut boot, &out).await?;
    Ok(out)
}

/// Every destination topic exists.
async fn check_destinations(
    conn: &mut Connection,
    records: &[ReplayRecord],
) -> Result<(), ActionError> {
    let mut topics: Vec<&str> = records.iter().map(|r| r.destination.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    if topics.is_empty() {
        return Ok(());
    }
    let meta = conn.send(&metadata_of(&topics)).await.map_err(failed)?;
    for t in topics {
        if let Err(code) = partitions(&meta, t) {
            let first = records
                .iter()
                .find(|r| r.destination == t)
                .map(ReplayRecord::coordinates)
                .unwrap_or_default();
            return Err(usage(format!(
                "record {first} would go to {}: nothing was sent",
                topic_problem(t, code)
            )));
        }
    }
    Ok(())
}

/// The offsets `from..=to` a selection reads of partition `p`, whose
/// records are `start..end`; `None`: nothing to read (an empty partition,
/// no offsets given).
fn range(
    selection: &TopicSelection,
    topic: &str,
    p: i32,
    start: i64,
    end: i64,
) -> Result<Option<(i64, i64)>, ActionError> {
    let explicit = selection.from_offset.is_some() || selection.to_offset.is_some();
    if !explicit {
        return Ok((start < end).then_some((start, end - 1)));
    }
    let from = selection.from_offset.unwrap_or(start);
    let to = selection.to_offset.unwrap_or(end - 1);
    if from > to {
        return Err(usage(format!(
            "--from-offset {from} is after --to-offset {to}"
        )));
    }
    if from < start || to >= end {
        return Err(usage(format!(
            "offsets {from} to {to} are outside partition {topic}/{p}, which holds {}",
            if start < end {
                format!("offsets {start} to {}", end - 1)
            } else {
                format!("no records (its next offset is {end})")
            }
        )));
    }
    Ok(Some((from, to)))
}

/// The log start and last stable offset of partition `p`.
async fn bounds(conn: &mut Connection, topic: &str, p: i32) -> Result<(i64, i64), KafkaError> {
    let topics: BTreeMap<&str, Vec<i32>> = [(topic, vec![p])].into();
    let isolation = if conn.version::<ListOffsetsRequest>()? >= 2 {
        READ_COMMITTED
    } else {
        0
    };
    let mut at = [0i64; 2];
    for (i, (timestamp, isolation)) in [(-2, 0), (-1, isolation)].into_iter().enumerate() {
        let req = super::fetch::list_offsets(&topics, timestamp).with_isolation_level(isolation);
        let resp = conn.send(&req).await?;
        let part = resp
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .find(|q| q.partition_index == p)
            .ok_or_else(|| {
                KafkaError::Protocol(format!("ListOffsets gave no offset for {topic}/{p}"))
            })?;
        if part.error_code != 0 {
            return Err(KafkaError::Protocol(format!(
                "ListOffsets of {topic}/{p}: {}",
                error_name(part.error_code)
            )));
        }
        at[i] = part.offset;
    }
    Ok((at[0], at[1]))
}

/// The records `from..end` of partition `p` that `want` keeps, at most
/// `left`; `scanned` counts the bytes read by the whole selection.
#[allow(clippy::too_many_arguments)]
async fn read_range(
    conn: &mut Connection,
    topic: &str,
    p: i32,
    from: i64,
    end: i64,
    left: usize,
    scanned: &mut usize,
    want: impl Fn(&ReplayRecord) -> bool,
) -> Result<Vec<ReplayRecord>, KafkaError> {
    let mut out = Vec::new();
    let mut next = from;
    let mut bytes = FETCH_BYTES;
    while next < end && out.len() < left {
        let part = FetchPartition::default()
            .with_partition(p)
            .with_fetch_offset(next)
            .with_partition_max_bytes(bytes)
            .with_current_leader_epoch(-1)
            .with_log_start_offset(-1);
        let by_topic: BTreeMap<&str, Vec<FetchPartition>> = [(topic, vec![part])].into();
        let req = super::fetch::fetch_topics(by_topic, bytes, READ_COMMITTED);
        let resp = conn.send(&req).await?;
        if resp.error_code != 0 {
            return Err(KafkaError::Protocol(format!(
                "Fetch of {topic}/{p}: {}",
                error_name(resp.error_code)
            )));
        }
        let answer = resp
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|q| q.partition_index == p)
            .ok_or_else(|| {
                KafkaError::Protocol(format!(
                    "the broker did not answer the fetch of {topic}/{p}"
                ))
            })?;
        if answer.error_code != 0 {
            return Err(KafkaError::Protocol(format!(
                "Fetch of {topic}/{p} at offset {next}: {}",
                error_name(answer.error_code)
            )));
        }
        let aborted = aborted_transactions(&answer);
        let data: Bytes = answer.records.unwrap_or_default();
        let d = decode_records(&data, next, end, &aborted, |r, timestamp| {
            replay_record(topic, p, r, timestamp)
        });
        if let Some(trouble) = d.trouble {
            return Err(KafkaError::Protocol(format!("{topic}/{p}: {trouble}")));
        }
        *scanned += d.used;
        if *scanned > MAX_SCAN {
            return Err(KafkaError::Protocol(format!(
                "the selection reads more than {} MiB of \"{topic}\": narrow it with --partition \
                 and --from-offset / --to-offset",
                MAX_SCAN / 1024 / 1024
            )));
        }
        out.extend(d.records.into_iter().filter(|r| want(r)));
        if let Some(size) = d.cut
            && d.used == 0
        {
            if size > MAX_BATCH {
                return Err(KafkaError::Protocol(format!(
                    "{topic}/{p}: the record batch at offset {next} is {size} bytes, more than \
                     the {} MiB a replay reads",
                    MAX_BATCH / 1024 / 1024
                )));
            }
            bytes = i32::try_from(size).unwrap_or(i32::MAX);
            continue;
        }
        if d.next <= next {
            // Nothing more below the end (compaction, markers).
            break;
        }
        next = d.next;
    }
    out.truncate(left);
    Ok(out)
}

/// A decoded record, whole; its destination is its original topic (or ""
/// when its headers name none).
fn replay_record(topic: &str, partition: i32, r: Record, timestamp: i64) -> ReplayRecord {
    let headers: Vec<(String, Option<Vec<u8>>)> = r
        .headers
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map(|v| v.to_vec())))
        .collect();
    let flat: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
        .collect();
    ReplayRecord {
        topic: topic.to_string(),
        partition,
        offset: r.offset,
        timestamp,
        key: r.key.map(|k| k.to_vec()),
        value: r.value.map(|v| v.to_vec()),
        exception_message: first_header(&flat, EXCEPTION_MESSAGE_HEADERS),
        destination: first_header(&flat, ORIGINAL_TOPIC_HEADERS).unwrap_or_default(),
        headers,
    }
}

/// Kafka's `Utils.murmur2`: the hash its default partitioner takes of a key.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives `key` among `count`.
pub fn key_partition(key: &[u8], count: usize) -> i32 {
    let positive = (murmur2(key) & 0x7fff_ffff) as usize;
    (positive % count.max(1)) as i32
}

/// A destination topic: its partitions (in order) and their leaders.
struct Destination {
    leaders: Vec<(i32, i32)>,
    /// The next partition (index into `leaders`) of a null-key record.
    round_robin: usize,
}

/// An open run: the write connection, the producer's identity, each
/// partition's next sequence number, and the audit database.
pub struct Replayer<'a> {
    spec: &'a KafkaSpec,
    run: &'a ReplayRun,
    connector: Connector,
    /// Connections by broker node id (`-1`: the bootstrap connection).
    connections: HashMap<i32, Connection>,
    brokers: HashMap<i32, String>,
    destinations: HashMap<String, Destination>,
    producer_id: i64,
    producer_epoch: i16,
    sequences: HashMap<(String, i32), i32>,
    audit: Audit,
}

/// Opens a run: the audit table checked first, then the write connection
/// and `InitProducerId`.
pub async fn open<'a>(
    spec: &'a KafkaSpec,
    run: &'a ReplayRun,
) -> Result<Replayer<'a>, ActionError> {
    let actions: &KafkaActions = spec.actions.as_deref().ok_or(ActionError::NotConfigured)?;
    let audit = Audit::open(spec, actions).await?;
    let connector = Connector::new(
        format!("{}-replay", spec.client_id),
        actions.security.clone(),
        spec.timeout.min(Duration::from_secs(10)),
    );
    let mut boot = connector
        .connect_any(&spec.brokers)
        .await
        .map_err(|e| failed(format!("{} (write credentials): {e}", actions.key)))?;
    let init = boot
        .send(
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(-1)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )
        .await
        .map_err(failed)?;
    if init.error_code != 0 {
        return Err(failed(format!(
            "InitProducerId: {} (the write user of {} may lack the IdempotentWrite permission); \
             nothing was sent",
            error_name(init.error_code),
            actions.key
        )));
    }
    Ok(Replayer {
        spec,
        run,
        connector,
        connections: HashMap::from([(-1, boot)]),
        brokers: HashMap::new(),
        destinations: HashMap::new(),
        producer_id: init.producer_id.0,
        producer_epoch: init.producer_epoch,
        sequences: HashMap::new(),
        audit,
    })
}

impl Replayer<'_> {
    /// A connection to broker `node`, opened when first needed.
    async fn connection(&mut self, node: i32) -> Result<&mut Connection, KafkaError> {
        if !self.connections.contains_key(&node) {
            let addr = self.brokers.get(&node).cloned().ok_or_else(|| {
                KafkaError::Protocol(format!("broker {node} is not in the metadata"))
            })?;
            let conn = self.connector.connect(&addr).await?;
            self.connections.insert(node, conn);
        }
        Ok(self
            .connections
            .get_mut(&node)
            .expect("inserted just above"))
    }

    /// Reads the partitions and leaders of `topic` (again).
    async fn refresh(&mut self, topic: &str) -> Result<(), ActionError> {
        let conn = match self.connections.get_mut(&-1) {
            Some(c) => c,
            None => {
                let c = self
                    .connector
                    .connect_any(&self.spec.brokers)
                    .await
                    .map_err(failed)?;
                self.connections.entry(-1).or_insert(c)
            }
        };
        let meta = match conn.send(&metadata_of(&[topic])).await {
            Ok(m) => m,
            Err(e) => {
                self.connections.remove(&-1);
                return Err(failed(e));
            }
        };
        self.brokers.extend(brokers(&meta));
        let leaders =
            partitions(&meta, topic).map_err(|code| failed(topic_problem(topic, code)))?;
        let round_robin = self.destinations.get(topic).map_or(0, |d| d.round_robin);
        self.destinations.insert(
            topic.to_string(),
            Destination {
                leaders: leaders.into_iter().collect(),
                round_robin,
            },
        );
        Ok(())
    }

    /// The partition `r` goes to.
    async fn partition(&mut self, r: &ReplayRecord) -> Result<i32, ActionError> {
        if !self.destinations.contains_key(&r.destination) {
            self.refresh(&r.destination).await?;
        }
        let d = self
            .destinations
            .get_mut(&r.destination)
            .expect("refreshed just above");
        if d.leaders.is_empty() {
            return Err(failed(format!(
                "topic \"{}\" has no partitions",
                r.destination
            )));
        }
        let index = match &r.key {
            Some(key) => key_partition(key, d.leaders.len()) as usize,
            None => {
                let i = d.round_robin % d.leaders.len();
                d.round_robin += 1;
                i
            }
        };
        Ok(d.leaders[index].0)
    }

    /// The batch of one record sent back: its key, value and headers, the
    /// replay headers, the producer's identity and `sequence`.
    pub fn batch(&self, r: &ReplayRecord, sequence: i32) -> Result<Bytes, ActionError> {
        let replay = [
            (RUN_ID_HEADER, self.run.run_id.clone()),
            (OPERATOR_HEADER, self.run.operator.clone()),
            (ORIGINAL_HEADER, r.coordinates()),
        ];
        let headers = r
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    StrBytes::from_string(k.clone()),
                    v.as_ref().map(|v| Bytes::copy_from_slice(v)),
                )
            })
            .chain(
                replay
                    .into_iter()
                    .map(|(k, v)| (StrBytes::from_static_str(k), Some(Bytes::from(v)))),
            )
            .collect();
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence,
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            key: r.key.as_ref().map(|k| Bytes::copy_from_slice(k)),
            value: r.value.as_ref().map(|v| Bytes::copy_from_slice(v)),
            headers,
        };
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            [&record],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .map_err(|e| failed(format!("encoding the batch of {}: {e}", r.coordinates())))?;
        Ok(buf.freeze())
    }

    /// Produces `batch` to `topic`/`partition`, up to [`ATTEMPTS`] times (the
    /// same batch: the broker writes it once). The offset it got, or
    /// `None` when the broker had it already.
    pub async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<Option<i64>, ActionError> {
        let request = ProduceRequest::default()
            .with_transactional_id(None)
            .with_acks(-1)
            .with_timeout_ms(i32::try_from(self.spec.timeout.as_millis()).unwrap_or(i32::MAX))
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(batch)),
                    ]),
            ]);
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let leader = match self.destinations.get(topic).and_then(|d| {
                d.leaders
                    .iter()
                    .find(|(p, _)| *p == partition)
                    .map(|(_, l)| *l)
            }) {
                Some(l) => l,
                None => {
                    self.refresh(topic).await?;
                    continue;
                }
            };
            let conn = match self.connection(leader).await {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    self.refresh(topic).await?;
                    continue;
                }
            };
            let resp = match conn.send(&request).await {
                Ok(r) => r,
                Err(e) => {
                    // The batch may have been written: sent again, the
                    // broker answers with its sequence number's duplicate.
                    last = e.to_string();
                    self.connections.remove(&leader);
                    continue;
                }
            };
            let answer = resp
                .responses
                .iter()
                .flat_map(|t| &t.partition_responses)
                .find(|q| q.index == partition);
            let Some(answer) = answer else {
                last = format!("the broker did not answer for {topic}/{partition}");
                continue;
            };
            match answer.error_code {
                0 => return Ok(Some(answer.base_offset)),
                DUPLICATE_SEQUENCE_NUMBER => return Ok(None),
                code => {
                    last = error_name(code);
                    let retriable = kafka_protocol::ResponseError::try_from_code(code)
                        .is_some_and(|e| e.is_retriable());
                    if !retriable {
                        break;
                    }
                    self.refresh(topic).await?;
                }
            }
        }
        Err(failed(format!("Produce to {topic}/{partition}: {last}")))
    }

    /// Sends one record back and audits it.
    async fn one(&mut self, r: &ReplayRecord) -> Result<ActionOutcome, ActionError> {
        let partition = self.partition(r).await?;
        let key = (r.destination.clone(), partition);
        let sequence = self.sequences.get(&key).copied().unwrap_or(0);
        let batch = self.batch(r, sequence)?;
        let written = self
            .produce(&r.destination, partition, batch)
            .await
            .map_err(|e| {
                failed(format!(
                    "sending {} back: {e}; nothing more was sent",
                    r.coordinates()
                ))
            })?;
        self.sequences.insert(key, sequence.wrapping_add(1));
        self.audit
            .record(self.spec, self.run, r)
            .await
            .map_err(|e| {
                failed(format!(
                    "{} was sent back to {}/{} but its audit row could not be written: {e}; \
                     nothing more was sent",
                    r.coordinates(),
                    r.destination,
                    partition
                ))
            })?;
        let at = written.map_or("already written".to_string(), |o| format!("offset {o}"));
        Ok(ActionOutcome {
            event_id: r.coordinates(),
            done: true,
            line: format!(
                "replayed {} to {}/{} ({at}); audit row in \"{}\"",
                r.coordinates(),
                r.destination,
                partition,
                self.audit.table()
            ),
        })
    }
}

impl ReplaySender for Replayer<'_> {
    fn send<'a>(
        &'a mut self,
        records: &'a [ReplayRecord],
    ) -> Answer<'a, Result<Vec<ActionOutcome>, ActionError>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(records.len());
            for r in records {
                out.push(self.one(r).await?);
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the partition of a keyed record sent back: Kafka's
    /// `Utils.murmur2`, on the cases of Kafka's own `UtilsTest`.
    #[test]
    fn murmur2_is_kafkas() {
        for (key, hash) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(key), hash, "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(
            key_partition(b"foobar", 7),
            ((-790_332_482i32 & 0x7fff_ffff) % 7)
        );
    }

    fn selection() -> TopicSelection {
        TopicSelection {
            topic: "orders.DLQ".into(),
            partition: Some(0),
            max: 10,
            ..TopicSelection::default()
        }
    }

    #[test]
    fn an_offset_range_outside_the_partition_is_refused_by_name() {
        let mut s = selection();
        s.from_offset = Some(5);
        s.to_offset = Some(20);
        let e = range(&s, "orders.DLQ", 0, 0, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "offsets 5 to 20 are outside partition orders.DLQ/0, which holds offsets 0 to 9"
        );
        s.to_offset = Some(9);
        assert_eq!(range(&s, "orders.DLQ", 0, 0, 10).unwrap(), Some((5, 9)));
        s.from_offset = Some(9);
        s.to_offset = Some(3);
        assert!(range(&s, "orders.DLQ", 0, 0, 10).is_err());
        assert_eq!(
            range(&s, "t", 0, 4, 4).unwrap_err().to_string(),
            "--from-offset 9 is after --to-offset 3"
        );
        s.to_offset = Some(9);
        assert_eq!(
            range(&s, "t", 0, 4, 4).unwrap_err().to_string(),
            "offsets 9 to 9 are outside partition t/0, which holds no records (its next offset is 4)"
        );
        // Without offsets: the whole partition, or nothing of an empty one.
        assert_eq!(range(&selection(), "t", 0, 4, 10).unwrap(), Some((4, 9)));
        assert_eq!(range(&selection(), "t", 0, 4, 4).unwrap(), None);
    }
}
