//! What the brokers say in one cycle, asked and written down without judging
//! it: the wire requests of the Kafka source and the plain value they give,
//! [`Fetched`]. Lag, status and series are made from that value in
//! `series.rs`, which needs no broker to be tested.
//!
//! The fetcher owns what the requests need between cycles: the broker
//! addresses, open connections (reused from cycle to cycle; one a broker
//! closed while idle is opened again and the request sent once more), which
//! broker coordinates which group, and the timestamps of records already
//! read. The groups' requests are in `fetch/groups.rs`.
//!
//! A cluster is not all up or all down: a broker that does not answer makes
//! the partitions it leads unavailable for the cycle ([`Fetched::unavailable`])
//! and the groups it coordinates unreadable, while the rest of the cycle
//! completes. What a leader or coordinator change explains
//! (`NOT_LEADER_OR_FOLLOWER`, `LEADER_NOT_AVAILABLE`, `NOT_COORDINATOR`,
//! `COORDINATOR_LOAD_IN_PROGRESS`, `REQUEST_TIMED_OUT`, a broker gone) is
//! asked again once within the cycle — after fresh metadata for partitions,
//! after a fresh `FindCoordinator` for groups — while the cycle is in the
//! first half of its `timeout`; only what still fails is reported.

mod groups;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, MetadataRequest, TopicName,
    fetch_request::{FetchPartition, FetchTopic},
    list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic},
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::client::{Connection, Connector, KafkaError, error_name};
use super::config::KafkaSpec;
use super::records::{self, Found};
use super::shards::Assignment;
use crate::sources::poll_loop::SourceError;

pub use groups::Protocol;

/// Bytes asked per partition when reading the record at a committed offset:
/// a producer's default batch (16 KiB) fits; a larger batch is fetched again
/// at its size.
const READ_BYTES: i32 = 32 * 1024;
/// Partitions per read request.
const READ_CHUNK: usize = 50;
/// Largest batch the agent will fetch to read one timestamp.
const MAX_READ_BYTES: usize = 16 * 1024 * 1024;

/// One partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    pub topic: Arc<str>,
    pub index: i32,
}

/// An offset in one partition: a group's committed offset, or where the
/// record whose timestamp was read sits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Committed {
    pub partition: Partition,
    pub offset: i64,
}

/// A watched partition as the metadata describes it.
#[derive(Debug, Clone)]
pub struct PartitionMeta {
    /// Broker id of the leader; negative: none.
    pub leader: i32,
}

/// The watched topics and their partitions, from the metadata.
pub type Topics = BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>;

/// A group's offsets and members, read this cycle.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Committed offsets of watched partitions (no commit: absent); `None`:
    /// the offsets could not be read (status error).
    pub offsets: Option<Vec<Committed>>,
    /// Member count; `None`: the coordinator did not describe the group.
    pub members: Option<usize>,
    /// Watched topics the members are assigned.
    pub assigned: HashSet<Arc<str>>,
    /// The group protocol: classic, or KIP-848's consumer protocol.
    pub protocol: Protocol,
    /// The group epoch (consumer protocol only).
    pub epoch: Option<i32>,
}

/// Why something was asked again within the cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The group's coordinator moved, is loading, or timed out.
    Coordinator,
    /// The partition's leader moved, is not there, or timed out.
    Leader,
    /// The broker did not answer or closed the connection.
    Connection,
}

impl Retry {
    pub const ALL: [Retry; 3] = [Retry::Coordinator, Retry::Leader, Retry::Connection];

    pub fn as_str(self) -> &'static str {
        match self {
            Retry::Coordinator => "coordinator",
            Retry::Leader => "leader",
            Retry::Connection => "connection",
        }
    }
}

/// Groups and partitions asked again within one cycle, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries {
    pub coordinator: u64,
    pub leader: u64,
    pub connection: u64,
}

impl Retries {
    fn add(&mut self, why: Retry) {
        match why {
            Retry::Coordinator => self.coordinator += 1,
            Retry::Leader => self.leader += 1,
            Retry::Connection => self.connection += 1,
        }
    }

    pub fn of(&self, why: Retry) -> u64 {
        match why {
            Retry::Coordinator => self.coordinator,
            Retry::Leader => self.leader,
            Retry::Connection => self.connection,
        }
    }
}

/// What the brokers said in one cycle.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// Watched topics and their partitions, from the metadata.
    pub topics: Topics,
    /// High watermark of each partition whose leader answered.
    pub high_watermarks: HashMap<Partition, i64>,
    /// Watched partitions without a high watermark this cycle: no leader,
    /// the leader did not answer, or it still failed after the retry.
    pub unavailable: BTreeSet<Partition>,
    /// Watched groups by name.
    pub groups: BTreeMap<String, Group>,
    /// Timestamp (ms) of the record at each committed offset below its high
    /// watermark, where it could be read (this cycle or an earlier one).
    pub record_timestamps: HashMap<Committed, i64>,
    /// Records this cycle had to read (those not known from an earlier one).
    pub record_reads: u64,
    /// What was asked again within the cycle.
    pub retries: Retries,
}

/// One partition being read in `read_chunk`.
#[derive(Debug, Clone)]
struct Read {
    at: Committed,
    /// Where to fetch now: the committed offset, or past what did not answer.
    from: i64,
    max_bytes: i32,
}

/// The Kafka source's requests and the state they carry between cycles.
pub struct Fetcher {
    spec: Arc<KafkaSpec>,
    connector: Connector,
    /// Broker id → address, from the last metadata.
    brokers: HashMap<i32, String>,
    /// Open connections by broker id (`-1`: the bootstrap broker).
    conns: HashMap<i32, Connection>,
    /// Spare connections used for record reads, by broker id.
    read_conns: HashMap<i32, Vec<Connection>>,
    /// Spare connections used for the groups' reads, by coordinator id.
    group_conns: HashMap<i32, Vec<Connection>>,
    /// Which broker coordinates each watched group (`FindCoordinator`),
    /// kept until a request to it fails.
    coordinators: HashMap<String, i32>,
    /// The groups watched last cycle and their protocols, kept for a cycle in
    /// which a broker could not list its groups.
    known_groups: BTreeMap<String, Protocol>,
    /// The groups are the names of the `groups` patterns (the brokers do not
    /// list groups), so offsets are asked for the watched topics by name.
    named_groups: bool,
    /// Timestamp (ms) of the record at a committed offset.
    timestamps: HashMap<Committed, i64>,
    /// Brokers that did not answer in this cycle: not asked again in it.
    down: HashSet<i32>,
    /// Until when this cycle may still ask again.
    retry_until: Instant,
    /// What this cycle asked again.
    retries: Retries,
    /// The shards whose groups this agent reads (`None`: every group).
    share: Option<Assignment>,
}

impl Fetcher {
    pub fn new(spec: Arc<KafkaSpec>, connector: Connector, share: Option<Assignment>) -> Fetcher {
        Fetcher {
            spec,
            connector,
            brokers: HashMap::new(),
            conns: HashMap::new(),
            read_conns: HashMap::new(),
            group_conns: HashMap::new(),
            coordinators: HashMap::new(),
            known_groups: BTreeMap::new(),
            named_groups: false,
            timestamps: HashMap::new(),
            down: HashSet::new(),
            retry_until: Instant::now(),
            retries: Retries::default(),
            share,
        }
    }

    /// Whether group `name` is in this agent's shards.
    fn in_share(&self, name: &str) -> bool {
        self.share.as_ref().is_none_or(|s| s.owns_group(name))
    }

    /// Drops every connection and the coordinators they told; the next cycle
    /// asks again.
    pub fn disconnect(&mut self) {
        self.conns.clear();
        self.read_conns.clear();
        self.group_conns.clear();
        self.coordinators.clear();
    }

    /// One cycle's requests: metadata, high watermarks, groups with their
    /// members and offsets, and the records at committed offsets with lag.
    /// Fails only when no broker answers the metadata (or the groups cannot
    /// be known at all).
    pub async fn fetch(&mut self) -> Result<Fetched, SourceError> {
        self.down.clear();
        self.retries = Retries::default();
        self.retry_until = Instant::now() + self.spec.timeout / 2;
        let started = Instant::now();
        let mut topics = self.metadata().await?;
        let metadata = started.elapsed();
        let (high_watermarks, unavailable) = self.high_watermarks(&mut topics).await;
        let watermarks = started.elapsed();
        let groups = self.read_groups(&topics).await?;
        let group_reads = started.elapsed();
        let record_reads = self
            .read_lagging_records(&topics, &high_watermarks, &groups)
            .await;
        debug!(
            source = %self.spec.name,
            metadata_ms = metadata.as_millis() as u64,
            high_watermarks_ms = (watermarks - metadata).as_millis() as u64,
            groups_ms = (group_reads - watermarks).as_millis() as u64,
            records_ms = (started.elapsed() - group_reads).as_millis() as u64,
            groups = groups.len(),
            record_reads,
            "A cycle's requests, step by step."
        );
        Ok(Fetched {
            topics,
            high_watermarks,
            unavailable,
            groups,
            record_timestamps: self.timestamps.clone(),
            record_reads,
            retries: self.retries,
        })
    }

    /// Whether this cycle may still ask again.
    fn may_retry(&self) -> bool {
        Instant::now() < self.retry_until
    }

    /// A connection to broker `id` (`-1`: any bootstrap broker, else any
    /// broker of the last metadata).
    async fn conn(&mut self, id: i32) -> Result<&mut Connection, KafkaError> {
        if !self.conns.contains_key(&id) {
            let c = if id < 0 {
                let mut candidates = self.spec.brokers.clone();
                let mut known: Vec<&String> = self.brokers.values().collect();
                known.sort();
                for addr in known {
                    if !candidates.contains(addr) {
                        candidates.push(addr.clone());
                    }
                }
                self.connector.connect_any(&candidates).await?
            } else {
                // A broker the metadata no longer lists is down or gone.
                let addr = self
                    .brokers
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| KafkaError::Connect {
                        addr: format!("broker {id}"),
                        message: "it is not in the metadata".into(),
                    })?;
                if self.down.contains(&id) {
                    return Err(KafkaError::Connect {
                        addr,
                        message: "it did not answer earlier in this cycle".into(),
                    });
                }
                match self.connector.connect(&addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        self.down.insert(id);
                        return Err(e);
                    }
                }
            };
            self.conns.insert(id, c);
        }
        Ok(self.conns.get_mut(&id).expect("inserted"))
    }

    /// Sends a request to broker `id`. A connection kept from earlier that
    /// turns out closed (the broker closes idle ones) is opened again and
    /// the request sent once more; a failed connection is dropped so the next
    /// request reconnects.
    async fn send<R: kafka_protocol::protocol::Request>(
        &mut self,
        id: i32,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        let reused = self.conns.contains_key(&id);
        match self.send_once(id, req).await {
            Err(e) if reused && e.is_broken_connection() => {
                debug!(source = %self.spec.name, broker = id, error = %e, "Connection closed; connecting again.");
                self.send_once(id, req).await
            }
            r => r,
        }
    }

    async fn send_once<R: kafka_protocol::protocol::Request>(
        &mut self,
        id: i32,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        let conn = self.conn(id).await?;
        match conn.send(req).await {
            Ok(r) => Ok(r),
            Err(e @ KafkaError::Unsupported { .. }) => Err(e),
            Err(e) => {
                self.conns.remove(&id);
                self.read_conns.remove(&id);
                self.group_conns.remove(&id);
                if id >= 0 && e.is_connect() {
                    self.down.insert(id);
                }
                Err(e)
            }
        }
    }

    /// The brokers, and the watched topics with their partitions' leaders.
    async fn metadata(&mut self) -> Result<Topics, SourceError> {
        let meta = self
            .send(-1, &MetadataRequest::default().with_topics(None))
            .await
            .map_err(connect_error)?;
        self.brokers = meta
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let mut topics = BTreeMap::new();
        for t in &meta.topics {
            let Some(name) = &t.name else { continue };
            if t.is_internal || t.error_code != 0 || !self.spec.topics.matches(name.as_str()) {
                continue;
            }
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    (
                        p.partition_index,
                        PartitionMeta {
                            leader: p.leader_id.0,
                        },
                    )
                })
                .collect();
            topics.insert(Arc::from(name.as_str()), parts);
        }
        Ok(topics)
    }

    /// High watermarks, one request per leader; what fails is asked once
    /// more after fresh metadata (which may name new leaders). Returns the
    /// high watermarks and the partitions that still have none.
    async fn high_watermarks(
        &mut self,
        topics: &mut Topics,
    ) -> (HashMap<Partition, i64>, BTreeSet<Partition>) {
        let all: Vec<Partition> = topics
            .iter()
            .flat_map(|(t, ps)| {
                ps.keys().map(|&index| Partition {
                    topic: t.clone(),
                    index,
                })
            })
            .collect();
        let mut hwm = HashMap::new();
        let mut failed = self.latest_offsets(topics, all, &mut hwm).await;
        if !failed.is_empty() && self.may_retry() {
            for (_, why) in &failed {
                self.retries.add(*why);
            }
            match self.metadata().await {
                Ok(fresh) => *topics = fresh,
                Err(e) => debug!(source = %self.spec.name, error = %e, "Metadata not refreshed."),
            }
            let again = failed
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| {
                    topics
                        .get(&p.topic)
                        .is_some_and(|ps| ps.contains_key(&p.index))
                })
                .collect();
            failed = self.latest_offsets(topics, again, &mut hwm).await;
        }
        if !failed.is_empty() {
            debug!(source = %self.spec.name, partitions = failed.len(), "Partitions without a high watermark this cycle.");
        }
        (hwm, failed.into_iter().map(|(p, _)| p).collect())
    }

    /// The latest offsets of `partitions` into `hwm`, one request per
    /// leader; returns those that got none, and why.
    async fn latest_offsets(
        &mut self,
        topics: &Topics,
        partitions: Vec<Partition>,
        hwm: &mut HashMap<Partition, i64>,
    ) -> Vec<(Partition, Retry)> {
        let mut failed = Vec::new();
        let mut by_leader: BTreeMap<i32, BTreeMap<Arc<str>, Vec<i32>>> = BTreeMap::new();
        for p in partitions {
            let leader = topics
                .get(&p.topic)
                .and_then(|ps| ps.get(&p.index))
                .map_or(-1, |m| m.leader);
            if leader < 0 || !self.brokers.contains_key(&leader) {
                failed.push((p, Retry::Leader));
                continue;
            }
            by_leader
                .entry(leader)
                .or_default()
                .entry(p.topic)
                .or_default()
                .push(p.index);
        }
        for (leader, asked) in by_leader {
            let req = list_offsets(&asked, -1);
            let resp = match self.send(leader, &req).await {
                Ok(resp) => resp,
                Err(e) => {
                    debug!(source = %self.spec.name, broker = leader, error = %e, "No high watermarks from the leader.");
                    for (topic, ps) in asked {
                        for index in ps {
                            let p = Partition {
                                topic: topic.clone(),
                                index,
                            };
                            failed.push((p, Retry::Connection));
                        }
                    }
                    continue;
                }
            };
            let mut answered = HashSet::new();
            for t in resp.topics {
                let Some((name, _)) = asked.get_key_value(t.name.as_str()) else {
                    continue;
                };
                for p in t.partitions {
                    let partition = Partition {
                        topic: name.clone(),
                        index: p.partition_index,
                    };
                    answered.insert(partition.clone());
                    if p.error_code == 0 && p.offset >= 0 {
                        hwm.insert(partition, p.offset);
                    } else {
                        debug!(topic = %name, partition = p.partition_index, error = %error_name(p.error_code), "No high watermark.");
                        failed.push((partition, Retry::Leader));
                    }
                }
            }
            for (topic, ps) in asked {
                for index in ps {
                    let p = Partition {
                        topic: topic.clone(),
                        index,
                    };
                    if !answered.contains(&p) {
                        failed.push((p, Retry::Leader));
                    }
                }
            }
        }
        failed
    }

    /// Reads the timestamps of the records at committed offsets below their
    /// high watermark that are not known yet, and forgets those no group
    /// stands at any more. Returns how many records it had to read.
    async fn read_lagging_records(
        &mut self,
        topics: &Topics,
        high_watermarks: &HashMap<Partition, i64>,
        groups: &BTreeMap<String, Group>,
    ) -> u64 {
        let mut by_leader: BTreeMap<i32, Vec<Committed>> = BTreeMap::new();
        let mut reads = 0u64;
        let mut used: HashSet<Committed> = HashSet::new();
        for group in groups.values() {
            for at in group.offsets.iter().flatten() {
                let Some(&hwm) = high_watermarks.get(&at.partition) else {
                    // Unavailable this cycle: what is known of it stays.
                    if self.timestamps.contains_key(at) {
                        used.insert(at.clone());
                    }
                    continue;
                };
                if hwm <= at.offset {
                    continue;
                }
                if !self.timestamps.contains_key(at) && used.insert(at.clone()) {
                    let leader = topics
                        .get(&at.partition.topic)
                        .and_then(|ps| ps.get(&at.partition.index))
                        .map(|p| p.leader)
                        .unwrap_or(-1);
                    reads += 1;
                    if leader >= 0 && !self.down.contains(&leader) {
                        by_leader.entry(leader).or_default().push(at.clone());
                    }
                } else {
                    used.insert(at.clone());
                }
            }
        }
        for (at, timestamp_ms) in self.read_timestamps(by_leader).await {
            self.timestamps.insert(at, timestamp_ms);
        }
        self.timestamps.retain(|k, _| used.contains(k));
        reads
    }

    /// Reads the timestamps of the records at the given offsets, grouped by
    /// leader: batched, at most `read_concurrency` requests in flight. A
    /// kept connection found closed is opened again for its request.
    async fn read_timestamps(
        &mut self,
        by_leader: BTreeMap<i32, Vec<Committed>>,
    ) -> Vec<(Committed, i64)> {
        let sem = Arc::new(Semaphore::new(self.spec.read_concurrency));
        let mut tasks = JoinSet::new();
        for (leader, parts) in by_leader {
            let Some(addr) = self.brokers.get(&leader).cloned() else {
                continue;
            };
            // A partition appears once per request (a broker answers a
            // partition asked twice once), so groups at different offsets of
            // one partition are read in requests of their own.
            let mut layers: Vec<Vec<Committed>> = Vec::new();
            let mut times: HashMap<Partition, usize> = HashMap::new();
            for at in parts {
                let n = times.entry(at.partition.clone()).or_default();
                if layers.len() <= *n {
                    layers.push(Vec::new());
                }
                layers[*n].push(at);
                *n += 1;
            }
            for chunk in layers.iter().flat_map(|l| l.chunks(READ_CHUNK)) {
                let chunk = chunk.to_vec();
                let conn = self.read_conns.entry(leader).or_default().pop();
                let connector = self.connector.clone();
                let sem = sem.clone();
                let addr = addr.clone();
                tasks.spawn(async move {
                    let _permit = sem.acquire_owned().await;
                    let reused = conn.is_some();
                    let mut conn = match conn {
                        Some(c) => c,
                        None => match connector.connect(&addr).await {
                            Ok(c) => c,
                            Err(e) => return (leader, None, Err(e)),
                        },
                    };
                    let mut r = read_chunk(&mut conn, &chunk).await;
                    if reused && r.as_ref().is_err_and(|e| e.is_broken_connection()) {
                        conn = match connector.connect(&addr).await {
                            Ok(c) => c,
                            Err(e) => return (leader, None, Err(e)),
                        };
                        r = read_chunk(&mut conn, &chunk).await;
                    }
                    match r {
                        Ok(v) => (leader, Some(conn), Ok(v)),
                        Err(e) => (leader, None, Err(e)),
                    }
                });
            }
        }
        let mut out = Vec::new();
        while let Some(res) = tasks.join_next().await {
            let Ok((leader, conn, r)) = res else { continue };
            if let Some(c) = conn {
                self.read_conns.entry(leader).or_default().push(c);
            }
            match r {
                Ok(v) => out.extend(v),
                Err(e) => {
                    warn!(source = %self.spec.name, error = %e, "Reading records at committed offsets failed.")
                }
            }
        }
        out
    }
}

/// The committed offsets of watched topics from an OffsetFetch answer's
/// (topic, (partition, offset, error)) entries; `-1` (no commit) and errors
/// are left out.
fn committed<'a>(
    topics: &Topics,
    entries: impl Iterator<Item = (&'a str, (i32, i64, i16))>,
) -> Vec<Committed> {
    entries
        .filter(|(_, (_, offset, code))| *code == 0 && *offset >= 0)
        .filter_map(|(t, (index, offset, _))| {
            let (topic, _) = topics.get_key_value(t)?;
            let partition = Partition {
                topic: topic.clone(),
                index,
            };
            Some(Committed { partition, offset })
        })
        .collect()
}

/// A ListOffsets request for every partition of `topics` at `timestamp`
/// (-1: the latest offset, -2: the earliest).
pub(super) fn list_offsets<K: AsRef<str>>(
    topics: &BTreeMap<K, Vec<i32>>,
    timestamp: i64,
) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.as_ref().to_string())))
                        .with_partitions(
                            ps.iter()
                                .map(|p| {
                                    ListOffsetsPartition::default()
                                        .with_partition_index(*p)
                                        .with_timestamp(timestamp)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

fn fetch_request(reads: &[Read]) -> FetchRequest {
    let mut by_topic: BTreeMap<Arc<str>, Vec<FetchPartition>> = BTreeMap::new();
    let mut total = 0i32;
    for read in reads {
        total = total.saturating_add(read.max_bytes);
        by_topic
            .entry(read.at.partition.topic.clone())
            .or_default()
            .push(
                FetchPartition::default()
                    .with_partition(read.at.partition.index)
                    .with_fetch_offset(read.from)
                    .with_partition_max_bytes(read.max_bytes)
                    .with_current_leader_epoch(-1)
                    .with_log_start_offset(-1),
            );
    }
    fetch_topics(by_topic, total.max(READ_BYTES), 0)
}

/// A Fetch of `by_topic`'s partitions that does not wait, keeps no fetch
/// session on the broker and reads at `isolation` (0: uncommitted, 1:
/// committed), at most `max_bytes` in all.
pub(super) fn fetch_topics<K: AsRef<str>>(
    by_topic: BTreeMap<K, Vec<FetchPartition>>,
    max_bytes: i32,
    isolation: i8,
) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(isolation)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(t.as_ref().to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        )
}

/// Reads the records at the committed offsets of one chunk of partitions
/// (all led by the broker `conn` reaches). Returns (committed offset,
/// timestamp ms) for each it could read.
async fn read_chunk(
    conn: &mut Connection,
    chunk: &[Committed],
) -> Result<Vec<(Committed, i64)>, KafkaError> {
    let mut pending: Vec<Read> = chunk
        .iter()
        .map(|at| Read {
            at: at.clone(),
            from: at.offset,
            max_bytes: READ_BYTES,
        })
        .collect();
    let mut out = Vec::new();
    // A few rounds: a cut batch, skipped control batches or a committed
    // offset below the log start each need one more fetch.
    for _ in 0..4 {
        if pending.is_empty() {
            break;
        }
        let resp = conn.send(&fetch_request(&pending)).await?;
        let mut answers: HashMap<(String, i32), (i16, i64, Option<Bytes>)> = HashMap::new();
        for t in resp.responses {
            for p in t.partitions {
                answers.insert(
                    (t.topic.0.to_string(), p.partition_index),
                    (p.error_code, p.log_start_offset, p.records),
                );
            }
        }
        let mut next = Vec::new();
        for read in pending {
            let partition = &read.at.partition;
            let key = (partition.topic.to_string(), partition.index);
            let Some((code, log_start, records)) = answers.remove(&key) else {
                continue;
            };
            let (topic, index, from) = (&partition.topic, partition.index, read.from);
            if code == 1 {
                // OFFSET_OUT_OF_RANGE: retention removed the committed
                // record; the oldest unconsumed one is the first available.
                if log_start > from {
                    next.push(Read {
                        from: log_start,
                        ..read
                    });
                } else {
                    debug!(topic = %topic, partition = index, offset = from, "Offset out of range.");
                }
                continue;
            }
            if code != 0 {
                debug!(topic = %topic, partition = index, error = %error_name(code), "Cannot fetch.");
                continue;
            }
            let data = records.unwrap_or_default();
            if !data.has_remaining() {
                continue;
            }
            match records::first_at_or_after(&data, from) {
                Ok(Found::Record { timestamp_ms, .. }) => out.push((read.at, timestamp_ms)),
                Ok(Found::NeedBytes(n)) if n <= MAX_READ_BYTES && n as i32 > read.max_bytes => {
                    next.push(Read {
                        max_bytes: n as i32,
                        ..read
                    });
                }
                Ok(Found::NeedBytes(_)) => {
                    warn!(topic = %topic, partition = index, "Record batch too large to read its timestamp.");
                }
                Ok(Found::Nothing { next: n }) if n > from => next.push(Read { from: n, ..read }),
                Ok(Found::Nothing { .. }) => {}
                Err(e) => {
                    warn!(topic = %topic, partition = index, error = %e, "Cannot read the record at the committed offset.")
                }
            }
        }
        pending = next;
    }
    Ok(out)
}

/// Topics of a consumer-protocol assignment (version, [topic, [partition]], user data).
fn assigned_topics(assignment: &Bytes) -> Vec<String> {
    let mut b = assignment.clone();
    let mut out = Vec::new();
    if b.remaining() < 6 {
        return out;
    }
    let _version = b.get_i16();
    let n = b.get_i32();
    for _ in 0..n.max(0) {
        if b.remaining() < 2 {
            break;
        }
        let len = b.get_i16();
        if len < 0 || b.remaining() < len as usize + 4 {
            break;
        }
        let name = String::from_utf8_lossy(&b.split_to(len as usize)).to_string();
        let parts = b.get_i32();
        if parts < 0 || b.remaining() < parts as usize * 4 {
            break;
        }
        b.advance(parts as usize * 4);
        out.push(name);
    }
    out
}

fn connect_error(e: KafkaError) -> SourceError {
    if e.is_connect() {
        SourceError::Connect {
            dsn: "the Kafka brokers".into(),
            message: e.to_string(),
        }
    } else {
        SourceError::Query(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn consumer_assignments_name_their_topics() {
        let mut b = bytes::BytesMut::new();
        b.put_i16(0);
        b.put_i32(2);
        for (t, n) in [("orders", 3), ("billing", 1)] {
            b.put_i16(t.len() as i16);
            b.put_slice(t.as_bytes());
            b.put_i32(n);
            for p in 0..n {
                b.put_i32(p);
            }
        }
        b.put_i32(-1);
        assert_eq!(assigned_topics(&b.freeze()), vec!["orders", "billing"]);
        assert!(assigned_topics(&Bytes::from_static(&[0, 0, 0])).is_empty());
    }
}
