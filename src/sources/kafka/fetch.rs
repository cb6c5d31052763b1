//! What the brokers say in one cycle, asked and written down without judging
//! it: the wire requests of the Kafka source and the plain value they give,
//! [`Fetched`]. Lag, status and series are made from that value in
//! `series.rs`, which needs no broker to be tested.
//!
//! The fetcher owns what the requests need between cycles: the broker
//! addresses, open connections, which broker coordinates which group, and the
//! timestamps of records already read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, FetchRequest, GroupId, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetFetchRequest, TopicName,
    fetch_request::{FetchPartition, FetchTopic},
    list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic},
    offset_fetch_request::OffsetFetchRequestGroup,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::client::{Connection, Connector, KafkaError, error_name};
use super::config::KafkaSpec;
use super::election::{ELECTION_PROTOCOL, GROUP_PREFIX};
use super::records::{self, Found};
use crate::sources::run::SourceError;

/// Bytes asked per partition when reading the record at a committed offset:
/// a producer's default batch (16 KiB) fits; a larger batch is fetched again
/// at its size.
const READ_BYTES: i32 = 32 * 1024;
/// Partitions per read request.
const READ_CHUNK: usize = 50;
/// Largest batch the agent will fetch to read one timestamp.
const MAX_READ_BYTES: usize = 16 * 1024 * 1024;
/// Groups per OffsetFetch / DescribeGroups request.
const GROUP_CHUNK: usize = 100;

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

/// A group's offsets and members, read this cycle.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Committed offsets of watched partitions (no commit: absent); `None`:
    /// the offsets could not be read (status error).
    pub offsets: Option<Vec<Committed>>,
    /// Member count; `None`: DescribeGroups gave no answer for the group.
    pub members: Option<usize>,
    /// Watched topics the members are assigned (from the consumer protocol).
    pub assigned: HashSet<Arc<str>>,
}

/// What the brokers said in one cycle.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// Watched topics and their partitions, from the metadata.
    pub topics: BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    /// High watermark of each partition whose leader answered.
    pub high_watermarks: HashMap<Partition, i64>,
    /// Watched groups by name.
    pub groups: BTreeMap<String, Group>,
    /// Timestamp (ms) of the record at each committed offset below its high
    /// watermark, where it could be read (this cycle or an earlier one).
    pub record_timestamps: HashMap<Committed, i64>,
    /// Records this cycle had to read (those not known from an earlier one).
    pub record_reads: u64,
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
    coordinators: HashMap<String, i32>,
    /// Timestamp (ms) of the record at a committed offset.
    timestamps: HashMap<Committed, i64>,
}

impl Fetcher {
    pub fn new(spec: Arc<KafkaSpec>, connector: Connector) -> Fetcher {
        Fetcher {
            spec,
            connector,
            brokers: HashMap::new(),
            conns: HashMap::new(),
            read_conns: HashMap::new(),
            coordinators: HashMap::new(),
            timestamps: HashMap::new(),
        }
    }

    /// Drops every connection and the coordinators they told; the next cycle
    /// asks again.
    pub fn disconnect(&mut self) {
        self.conns.clear();
        self.read_conns.clear();
        self.coordinators.clear();
    }

    /// One cycle's requests: metadata, high watermarks, groups with their
    /// members and offsets, and the records at committed offsets with lag.
    pub async fn fetch(&mut self) -> Result<Fetched, SourceError> {
        let topics = self.metadata().await?;
        let high_watermarks = self.high_watermarks(&topics).await?;
        let groups = self.read_groups(&topics).await?;
        let record_reads = self
            .read_lagging_records(&topics, &high_watermarks, &groups)
            .await;
        Ok(Fetched {
            topics,
            high_watermarks,
            groups,
            record_timestamps: self.timestamps.clone(),
            record_reads,
        })
    }

    /// A connection to broker `id` (`-1`: any bootstrap broker).
    async fn conn(&mut self, id: i32) -> Result<&mut Connection, KafkaError> {
        if !self.conns.contains_key(&id) {
            let c = if id < 0 {
                self.connector.connect_any(&self.spec.brokers).await?
            } else {
                let addr = self.brokers.get(&id).cloned().ok_or_else(|| {
                    KafkaError::Protocol(format!("broker {id} is not in the metadata"))
                })?;
                self.connector.connect(&addr).await?
            };
            self.conns.insert(id, c);
        }
        Ok(self.conns.get_mut(&id).expect("inserted"))
    }

    /// Sends a request to broker `id`; a failed connection is dropped so the
    /// next request reconnects.
    async fn send<R: kafka_protocol::protocol::Request>(
        &mut self,
        id: i32,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        let conn = self.conn(id).await?;
        match conn.send(req).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.conns.remove(&id);
                self.read_conns.remove(&id);
                Err(e)
            }
        }
    }

    /// The brokers, and the watched topics with their partitions' leaders.
    async fn metadata(
        &mut self,
    ) -> Result<BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>, SourceError> {
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

    /// High watermarks, one request per leader.
    async fn high_watermarks(
        &mut self,
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> Result<HashMap<Partition, i64>, SourceError> {
        let mut by_leader: BTreeMap<i32, BTreeMap<Arc<str>, Vec<i32>>> = BTreeMap::new();
        for (t, parts) in topics {
            for (p, meta) in parts {
                if meta.leader >= 0 {
                    by_leader
                        .entry(meta.leader)
                        .or_default()
                        .entry(t.clone())
                        .or_default()
                        .push(*p);
                }
            }
        }
        let mut hwm = HashMap::new();
        for (leader, ts) in by_leader {
            let req = list_offsets(&ts, -1);
            let resp = self.send(leader, &req).await.map_err(query_error)?;
            for t in resp.topics {
                let name: Arc<str> = Arc::from(t.name.as_str());
                for p in t.partitions {
                    if p.error_code == 0 && p.offset >= 0 {
                        let partition = Partition {
                            topic: name.clone(),
                            index: p.partition_index,
                        };
                        hwm.insert(partition, p.offset);
                    } else {
                        debug!(topic = %name, partition = p.partition_index, error = %error_name(p.error_code), "No high watermark.");
                    }
                }
            }
        }
        Ok(hwm)
    }

    /// Reads the timestamps of the records at committed offsets below their
    /// high watermark that are not known yet, and forgets those no group
    /// stands at any more. Returns how many records it had to read.
    async fn read_lagging_records(
        &mut self,
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
        high_watermarks: &HashMap<Partition, i64>,
        groups: &BTreeMap<String, Group>,
    ) -> u64 {
        let mut by_leader: BTreeMap<i32, Vec<Committed>> = BTreeMap::new();
        let mut reads = 0u64;
        let mut used: HashSet<Committed> = HashSet::new();
        for group in groups.values() {
            for at in group.offsets.iter().flatten() {
                let Some(&hwm) = high_watermarks.get(&at.partition) else {
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
                    if leader >= 0 {
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

    async fn read_groups(
        &mut self,
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> Result<BTreeMap<String, Group>, SourceError> {
        // Every broker lists the groups it coordinates.
        let mut names: Vec<String> = Vec::new();
        let ids: Vec<i32> = self.brokers.keys().copied().collect();
        for id in ids {
            let resp = self
                .send(id, &ListGroupsRequest::default())
                .await
                .map_err(query_error)?;
            if resp.error_code != 0 {
                return Err(SourceError::Query(format!(
                    "ListGroups on broker {id}: {}",
                    error_name(resp.error_code)
                )));
            }
            for g in resp.groups {
                let name = g.group_id.0.as_str();
                let own =
                    g.protocol_type.as_str() == ELECTION_PROTOCOL || name.starts_with(GROUP_PREFIX);
                if !own && self.spec.groups.matches(name) {
                    // The broker that lists a group coordinates it.
                    self.coordinators.insert(name.to_string(), id);
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        names.dedup();
        self.coordinators
            .retain(|g, _| names.binary_search(g).is_ok());
        let mut by_coord: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        for g in &names {
            by_coord
                .entry(self.coordinators.get(g).copied().unwrap_or(-1))
                .or_default()
                .push(g.clone());
        }
        let mut out = BTreeMap::new();
        for (coord, groups) in by_coord {
            for chunk in groups.chunks(GROUP_CHUNK) {
                self.read_group_chunk(coord, chunk, topics, &mut out).await;
            }
        }
        Ok(out)
    }

    async fn read_group_chunk(
        &mut self,
        coord: i32,
        groups: &[String],
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
        out: &mut BTreeMap<String, Group>,
    ) {
        let mut members = self.describe_groups(coord, groups, topics).await;
        let mut offsets = self.offset_fetch(coord, groups, topics).await;
        for name in groups {
            let (count, assigned) = match members.remove(name) {
                Some((count, assigned)) => (Some(count), assigned),
                None => (None, HashSet::new()),
            };
            let offsets = match offsets.remove(name) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    warn!(source = %self.spec.name, group = %name, error = %e, "Cannot read the group's offsets.");
                    // Ask again next cycle which broker coordinates it.
                    self.coordinators.remove(name);
                    None
                }
                None => None,
            };
            out.insert(
                name.clone(),
                Group {
                    offsets,
                    members: count,
                    assigned,
                },
            );
        }
    }

    /// Member count and assigned watched topics of each group that answered.
    async fn describe_groups(
        &mut self,
        coord: i32,
        groups: &[String],
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> HashMap<String, (usize, HashSet<Arc<str>>)> {
        let mut members = HashMap::new();
        let req = DescribeGroupsRequest::default().with_groups(
            groups
                .iter()
                .map(|g| GroupId(StrBytes::from_string(g.clone())))
                .collect(),
        );
        match self.send(coord, &req).await {
            Ok(resp) => {
                for g in resp.groups {
                    if g.error_code != 0 {
                        continue;
                    }
                    let mut assigned = HashSet::new();
                    for member in &g.members {
                        for t in assigned_topics(&member.member_assignment) {
                            if let Some((k, _)) = topics.get_key_value(t.as_str()) {
                                assigned.insert(k.clone());
                            }
                        }
                    }
                    members.insert(g.group_id.0.to_string(), (g.members.len(), assigned));
                }
            }
            Err(e) => debug!(error = %e, "DescribeGroups failed."),
        }
        members
    }

    /// Committed offsets: every group of the chunk in one request where the
    /// broker speaks OffsetFetch v8, else one request per group.
    async fn offset_fetch(
        &mut self,
        coord: i32,
        groups: &[String],
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> HashMap<String, Result<Vec<Committed>, String>> {
        let batched = self
            .conn(coord)
            .await
            .ok()
            .and_then(|c| c.version::<OffsetFetchRequest>().ok())
            .is_some_and(|v| v >= 8);
        let mut offsets = HashMap::new();
        if batched {
            let req = OffsetFetchRequest::default().with_groups(
                groups
                    .iter()
                    .map(|g| {
                        OffsetFetchRequestGroup::default()
                            .with_group_id(GroupId(StrBytes::from_string(g.clone())))
                            .with_topics(None)
                    })
                    .collect(),
            );
            match self.send(coord, &req).await {
                Ok(resp) => {
                    for g in resp.groups {
                        let name = g.group_id.0.to_string();
                        if g.error_code != 0 {
                            offsets.insert(name, Err(error_name(g.error_code)));
                            continue;
                        }
                        let v = committed(
                            topics,
                            g.topics.iter().flat_map(|t| {
                                t.partitions.iter().map(|p| {
                                    let o = (p.partition_index, p.committed_offset, p.error_code);
                                    (t.name.0.as_str(), o)
                                })
                            }),
                        );
                        offsets.insert(name, Ok(v));
                    }
                }
                Err(e) => {
                    for g in groups {
                        offsets.insert(g.clone(), Err(e.to_string()));
                    }
                }
            }
        } else {
            for g in groups {
                let req = OffsetFetchRequest::default()
                    .with_group_id(GroupId(StrBytes::from_string(g.clone())))
                    .with_topics(None);
                let r = match self.send(coord, &req).await {
                    Ok(resp) if resp.error_code != 0 => Err(error_name(resp.error_code)),
                    Ok(resp) => Ok(committed(
                        topics,
                        resp.topics.iter().flat_map(|t| {
                            t.partitions.iter().map(|p| {
                                let o = (p.partition_index, p.committed_offset, p.error_code);
                                (t.name.0.as_str(), o)
                            })
                        }),
                    )),
                    Err(e) => Err(e.to_string()),
                };
                offsets.insert(g.clone(), r);
            }
        }
        offsets
    }

    /// Reads the timestamps of the records at the given offsets, grouped by
    /// leader: batched, at most `read_concurrency` requests in flight.
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
            for chunk in parts.chunks(READ_CHUNK) {
                let chunk = chunk.to_vec();
                let conn = self.read_conns.entry(leader).or_default().pop();
                let connector = self.connector.clone();
                let sem = sem.clone();
                let addr = addr.clone();
                tasks.spawn(async move {
                    let _permit = sem.acquire_owned().await;
                    let mut conn = match conn {
                        Some(c) => c,
                        None => match connector.connect(&addr).await {
                            Ok(c) => c,
                            Err(e) => return (leader, None, Err(e)),
                        },
                    };
                    let r = read_chunk(&mut conn, &chunk).await;
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
    topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
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

fn query_error(e: KafkaError) -> SourceError {
    connect_error(e)
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
