//! The Kafka source: consumer-group lag in messages and in exact seconds,
//! group status, dead-letter and retry topics — read with the agent's own
//! client, which never joins a watched group or commits an offset.
//!
//! One cycle:
//! 1. `Metadata` for every topic (brokers, partition leaders);
//! 2. `ListOffsets` (latest) per leader broker, every watched partition in one
//!    request: the high watermarks;
//! 3. `ListGroups` per broker, `FindCoordinator` (batched where the broker
//!    can, cached), then `DescribeGroups` and `OffsetFetch` per coordinator
//!    for all its groups at once;
//! 4. for every partition with lag, the record at the committed offset is
//!    fetched (in batches per leader, at most `read_concurrency` requests in
//!    flight) and its timestamp gives the lag in seconds; the timestamp is
//!    cached per (topic, partition, committed offset);
//! 5. status, dead-letter and retry counters, and one snapshot of series.

pub mod client;
pub mod config;
pub mod records;
pub mod scram;
pub mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

use self::client::{Connection, Connector, KafkaError, error_name};
use self::config::KafkaSpec;
use self::records::Found;
use self::status::{History, Status};
use super::{PollStats, Source, SourceError};
use crate::telemetry::catalogue as m;
use crate::telemetry::snapshot::{self, Sample};

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
/// Protocol type of the agent's own election groups; never watched.
pub const ELECTION_PROTOCOL: &str = "inboxwatch";

type Tp = (Arc<str>, i32);

/// A watched partition as the metadata describes it.
struct PartitionMeta {
    leader: i32,
}

/// A group's offsets and members, read this cycle.
struct GroupRead {
    /// `None`: the offsets could not be read (status error).
    offsets: Option<Vec<(Tp, i64)>>,
    members: Option<usize>,
    /// Topics the members are assigned (from the consumer protocol).
    assigned: HashSet<Arc<str>>,
}

pub struct KafkaSource {
    spec: KafkaSpec,
    connector: Connector,
    /// Broker id → address, from the last metadata.
    brokers: HashMap<i32, String>,
    /// Open connections by broker id (`-1`: the bootstrap broker).
    conns: HashMap<i32, Connection>,
    /// Spare connections used for record reads, by broker id.
    read_conns: HashMap<i32, Vec<Connection>>,
    coordinators: HashMap<String, i32>,
    /// (topic, partition, committed offset) → timestamp (ms) of its record.
    timestamps: HashMap<(Tp, i64), i64>,
    history: HashMap<String, HashMap<Tp, History>>,
    /// Last high watermark of dead-letter and retry partitions.
    watermarks: HashMap<Tp, i64>,
    /// Running totals of dead-letter topics, and of retry topics by tier.
    dead_letters: BTreeMap<Arc<str>, u64>,
    retries: BTreeMap<(Arc<str>, String), u64>,
    first_cycle: bool,
}

impl KafkaSource {
    pub fn new(spec: KafkaSpec) -> KafkaSource {
        let connector = Connector::new(
            spec.client_id.clone(),
            spec.security.clone(),
            spec.timeout.min(Duration::from_secs(10)),
        );
        KafkaSource {
            spec,
            connector,
            brokers: HashMap::new(),
            conns: HashMap::new(),
            read_conns: HashMap::new(),
            coordinators: HashMap::new(),
            timestamps: HashMap::new(),
            history: HashMap::new(),
            watermarks: HashMap::new(),
            dead_letters: BTreeMap::new(),
            retries: BTreeMap::new(),
            first_cycle: true,
        }
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

    async fn cycle(&mut self) -> Result<PollStats, SourceError> {
        let now = Instant::now();
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let cluster = self.spec.name.clone();

        // 1. Metadata.
        let meta = self
            .send(-1, &MetadataRequest::default().with_topics(None))
            .await
            .map_err(connect_error)?;
        self.brokers = meta
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let mut topics: BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>> = BTreeMap::new();
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
        drop(meta);

        // 2. High watermarks, one request per leader.
        let hwm = self.high_watermarks(&topics).await?;

        // 3. Groups, their members and committed offsets.
        let groups = self.read_groups(&topics).await?;

        // 4. Lag, and the timestamps of the records at committed offsets.
        let mut need: Vec<(Tp, i64, i32)> = Vec::new();
        let mut used: HashSet<(Tp, i64)> = HashSet::new();
        for g in groups.values() {
            for (tp, committed) in g.offsets.iter().flatten() {
                let Some(&h) = hwm.get(tp) else { continue };
                let key = (tp.clone(), *committed);
                if h > *committed && !self.timestamps.contains_key(&key) && used.insert(key.clone())
                {
                    let leader = topics
                        .get(&tp.0)
                        .and_then(|ps| ps.get(&tp.1))
                        .map(|p| p.leader)
                        .unwrap_or(-1);
                    need.push((tp.clone(), *committed, leader));
                } else if h > *committed {
                    used.insert(key);
                }
            }
        }
        let reads = need.len() as u64;
        let read = self.read_timestamps(need).await;
        for (tp, committed, ts) in read {
            self.timestamps.insert((tp, committed), ts);
        }
        self.timestamps.retain(|k, _| used.contains(k));
        if reads > 0 {
            metrics::counter!(m::KAFKA_RECORD_READS, "source" => cluster.clone()).increment(reads);
        }

        // 5. Series.
        let mut out = snapshot::Builder::default();
        let per_topic = self.spec.per_topic;
        let label_sets = |group: Option<&str>, tp: &Tp| -> Vec<(&'static str, String)> {
            let mut l = vec![("cluster", cluster.clone())];
            if let Some(g) = group {
                l.push(("group", g.to_string()));
            }
            l.push(("topic", tp.0.to_string()));
            if !per_topic {
                l.push(("partition", tp.1.to_string()));
            }
            l
        };
        // High watermarks.
        let mut by_topic: BTreeMap<Arc<str>, f64> = BTreeMap::new();
        for (tp, h) in &hwm {
            if per_topic {
                *by_topic.entry(tp.0.clone()).or_default() += *h as f64;
            } else {
                out.push(Sample {
                    name: m::KAFKA_HIGH_WATERMARK,
                    labels: label_sets(None, tp),
                    value: *h as f64,
                });
            }
        }
        for (t, v) in by_topic {
            out.push(Sample {
                name: m::KAFKA_HIGH_WATERMARK,
                labels: label_sets(None, &(t, 0)),
                value: v,
            });
        }
        // Groups.
        let window = self.spec.status_window;
        let mut seen_groups = HashSet::new();
        for (group, g) in &groups {
            seen_groups.insert(group.clone());
            let gl = || vec![("cluster", cluster.clone()), ("group", group.clone())];
            if let Some(n) = g.members {
                out.push(Sample {
                    name: m::KAFKA_GROUP_MEMBERS,
                    labels: gl(),
                    value: n as f64,
                });
            }
            let status = match &g.offsets {
                None => Status::Error,
                Some(offsets) => {
                    let hist = self.history.entry(group.clone()).or_default();
                    let mut worst = Status::Ok;
                    let mut committed_topics: BTreeMap<Arc<str>, HashSet<i32>> = BTreeMap::new();
                    // (lag messages, lag seconds, committed) per series key.
                    let mut agg: BTreeMap<Tp, (f64, f64, f64)> = BTreeMap::new();
                    let mut present = HashSet::new();
                    for (tp, committed) in offsets {
                        let Some(&h) = hwm.get(tp) else { continue };
                        committed_topics
                            .entry(tp.0.clone())
                            .or_default()
                            .insert(tp.1);
                        let lag = (h - committed).max(0);
                        let lag_s = if lag == 0 {
                            Some(0.0)
                        } else {
                            self.timestamps
                                .get(&(tp.clone(), *committed))
                                .map(|ts| ((wall_ms - ts).max(0) as f64) / 1000.0)
                        };
                        present.insert(tp.clone());
                        match hist.get_mut(tp) {
                            Some(hh) => hh.push(now, *committed, lag, window),
                            None => {
                                hist.insert(tp.clone(), History::new(now, *committed, lag));
                            }
                        }
                        let st = hist[tp].status(now, window, g.members.unwrap_or(1) > 0);
                        worst = worst.max(st);
                        let key = if per_topic {
                            (tp.0.clone(), 0)
                        } else {
                            tp.clone()
                        };
                        let e = agg.entry(key).or_insert((0.0, 0.0, 0.0));
                        e.0 += lag as f64;
                        e.2 += *committed as f64;
                        match lag_s {
                            Some(s) if !e.1.is_nan() => e.1 = e.1.max(s),
                            Some(_) => {}
                            None => e.1 = f64::NAN,
                        }
                    }
                    hist.retain(|tp, _| present.contains(tp));
                    for (key, (lag, lag_s, committed)) in agg {
                        out.push(Sample {
                            name: m::KAFKA_LAG_MESSAGES,
                            labels: label_sets(Some(group), &key),
                            value: lag,
                        });
                        // An unreadable record leaves its age unknown: no sample.
                        if !lag_s.is_nan() {
                            out.push(Sample {
                                name: m::KAFKA_LAG_SECONDS,
                                labels: label_sets(Some(group), &key),
                                value: lag_s,
                            });
                        }
                        out.push(Sample {
                            name: m::KAFKA_COMMITTED_OFFSET,
                            labels: label_sets(Some(group), &key),
                            value: committed,
                        });
                    }
                    // Partitions of consumed topics that were never committed.
                    let consumed: HashSet<&Arc<str>> =
                        committed_topics.keys().chain(g.assigned.iter()).collect();
                    for t in consumed {
                        let Some(parts) = topics.get(t) else { continue };
                        let committed = committed_topics.get(t);
                        let missing = parts
                            .keys()
                            .filter(|p| !committed.is_some_and(|c| c.contains(p)))
                            .count();
                        out.push(Sample {
                            name: m::KAFKA_UNCOMMITTED_PARTITIONS,
                            labels: vec![
                                ("cluster", cluster.clone()),
                                ("group", group.clone()),
                                ("topic", t.to_string()),
                            ],
                            value: missing as f64,
                        });
                    }
                    if let Some(last) = hist.values().map(|h| h.last_moved).max() {
                        out.push(Sample {
                            name: m::KAFKA_LAST_COMMIT_AGE,
                            labels: gl(),
                            value: now.duration_since(last).as_secs_f64(),
                        });
                    }
                    worst
                }
            };
            for s in Status::ALL {
                let mut l = gl();
                l.push(("status", s.as_str().to_string()));
                out.push(Sample {
                    name: m::KAFKA_GROUP_STATUS,
                    labels: l,
                    value: if s == status { 1.0 } else { 0.0 },
                });
            }
        }
        self.history.retain(|g, _| seen_groups.contains(g));

        // Dead-letter and retry topics: growth of their high watermarks.
        self.count_appends(&hwm);
        for (t, n) in &self.dead_letters {
            out.push(Sample {
                name: m::KAFKA_DEAD_LETTERS,
                labels: vec![("cluster", cluster.clone()), ("topic", t.to_string())],
                value: *n as f64,
            });
        }
        for ((t, tier), n) in &self.retries {
            out.push(Sample {
                name: m::KAFKA_RETRIES,
                labels: vec![
                    ("cluster", cluster.clone()),
                    ("topic", t.to_string()),
                    ("tier", tier.clone()),
                ],
                value: *n as f64,
            });
        }
        snapshot::publish(&cluster, out);
        self.first_cycle = false;
        Ok(PollStats { rows_read: reads })
    }

    async fn high_watermarks(
        &mut self,
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> Result<HashMap<Tp, i64>, SourceError> {
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
                        hwm.insert((name.clone(), p.partition_index), p.offset);
                    } else {
                        debug!(topic = %name, partition = p.partition_index, error = %error_name(p.error_code), "No high watermark.");
                    }
                }
            }
        }
        Ok(hwm)
    }

    async fn read_groups(
        &mut self,
        topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    ) -> Result<BTreeMap<String, GroupRead>, SourceError> {
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
                let own = g.protocol_type.as_str() == ELECTION_PROTOCOL
                    || name.starts_with(crate::coordination::kafka::GROUP_PREFIX);
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
        out: &mut BTreeMap<String, GroupRead>,
    ) {
        // Members and assignments.
        let mut members: HashMap<String, (usize, HashSet<Arc<str>>)> = HashMap::new();
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
                    for mem in &g.members {
                        for t in assigned_topics(&mem.member_assignment) {
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
        // Committed offsets: every group of the chunk in one request where
        // the broker speaks OffsetFetch v8, else one request per group.
        let batched = self
            .conn(coord)
            .await
            .ok()
            .and_then(|c| c.version::<OffsetFetchRequest>().ok())
            .is_some_and(|v| v >= 8);
        let mut offsets: HashMap<String, Result<Vec<(Tp, i64)>, String>> = HashMap::new();
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
        for g in groups {
            let (n, assigned) = match members.remove(g) {
                Some((n, a)) => (Some(n), a),
                None => (None, HashSet::new()),
            };
            let offsets = match offsets.remove(g) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    warn!(source = %self.spec.name, group = %g, error = %e, "Cannot read the group's offsets.");
                    // Ask again next cycle which broker coordinates it.
                    self.coordinators.remove(g);
                    None
                }
                None => None,
            };
            out.insert(
                g.clone(),
                GroupRead {
                    offsets,
                    members: n,
                    assigned,
                },
            );
        }
    }

    /// Reads the timestamps of the records at `need`'s offsets: batched per
    /// leader, at most `read_concurrency` requests in flight.
    async fn read_timestamps(&mut self, need: Vec<(Tp, i64, i32)>) -> Vec<(Tp, i64, i64)> {
        let mut by_leader: BTreeMap<i32, Vec<(Tp, i64)>> = BTreeMap::new();
        for (tp, off, leader) in need {
            if leader >= 0 {
                by_leader.entry(leader).or_default().push((tp, off));
            }
        }
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

    fn count_appends(&mut self, hwm: &HashMap<Tp, i64>) {
        let mut live_dlq = HashSet::new();
        let mut live_retry = HashSet::new();
        let mut live_parts = HashSet::new();
        for (tp, &h) in hwm {
            let dead = self.spec.dead_letter_topics.is_match(&tp.0);
            let tier = if dead {
                None
            } else {
                self.spec.retry_topics.captures(&tp.0).map(|c| {
                    c.name("tier")
                        .map(|t| t.as_str().to_string())
                        .unwrap_or_else(|| "unknown".into())
                })
            };
            if !dead && tier.is_none() {
                continue;
            }
            live_parts.insert(tp.clone());
            // A partition seen for the first time after the first cycle is new:
            // everything in it was appended while the agent watched.
            let prev = match self.watermarks.get(tp) {
                Some(&p) => p,
                None if self.first_cycle => h,
                None => 0,
            };
            // A smaller watermark means the topic was recreated.
            let grown = if h >= prev { h - prev } else { h } as u64;
            self.watermarks.insert(tp.clone(), h);
            if let Some(tier) = tier {
                live_retry.insert((tp.0.clone(), tier.clone()));
                *self.retries.entry((tp.0.clone(), tier)).or_default() += grown;
            } else {
                live_dlq.insert(tp.0.clone());
                *self.dead_letters.entry(tp.0.clone()).or_default() += grown;
            }
        }
        self.watermarks.retain(|tp, _| live_parts.contains(tp));
        self.dead_letters.retain(|t, _| live_dlq.contains(t));
        self.retries.retain(|k, _| live_retry.contains(k));
    }
}

/// The committed offsets of watched topics from an OffsetFetch answer's
/// (topic, (partition, offset, error)) entries; `-1` (no commit) and errors
/// are left out.
fn committed<'a>(
    topics: &BTreeMap<Arc<str>, BTreeMap<i32, PartitionMeta>>,
    entries: impl Iterator<Item = (&'a str, (i32, i64, i16))>,
) -> Vec<(Tp, i64)> {
    entries
        .filter(|(_, (_, offset, code))| *code == 0 && *offset >= 0)
        .filter_map(|(t, (p, offset, _))| {
            let (k, _) = topics.get_key_value(t)?;
            Some(((k.clone(), p), offset))
        })
        .collect()
}

fn list_offsets(topics: &BTreeMap<Arc<str>, Vec<i32>>, timestamp: i64) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
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

fn fetch_request(parts: &[(Tp, i64, i32)]) -> FetchRequest {
    let mut by_topic: BTreeMap<Arc<str>, Vec<FetchPartition>> = BTreeMap::new();
    let mut total = 0i32;
    for (tp, off, bytes) in parts {
        total = total.saturating_add(*bytes);
        by_topic.entry(tp.0.clone()).or_default().push(
            FetchPartition::default()
                .with_partition(tp.1)
                .with_fetch_offset(*off)
                .with_partition_max_bytes(*bytes)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1),
        );
    }
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(total.max(READ_BYTES))
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        )
}

/// Reads the records at the committed offsets of one chunk of partitions
/// (all led by the broker `conn` reaches). Returns (partition, committed,
/// timestamp ms) for each it could read.
async fn read_chunk(
    conn: &mut Connection,
    chunk: &[(Tp, i64)],
) -> Result<Vec<(Tp, i64, i64)>, KafkaError> {
    // (partition, committed, where to fetch now, bytes to ask)
    let mut pending: Vec<(Tp, i64, i64, i32)> = chunk
        .iter()
        .map(|(tp, c)| (tp.clone(), *c, *c, READ_BYTES))
        .collect();
    let mut out = Vec::new();
    // A few rounds: a cut batch, skipped control batches or a committed
    // offset below the log start each need one more fetch.
    for _ in 0..4 {
        if pending.is_empty() {
            break;
        }
        let parts: Vec<(Tp, i64, i32)> = pending
            .iter()
            .map(|(tp, _, at, b)| (tp.clone(), *at, *b))
            .collect();
        let resp = conn.send(&fetch_request(&parts)).await?;
        let mut by_tp: HashMap<(String, i32), (i16, i64, Option<Bytes>)> = HashMap::new();
        for t in resp.responses {
            for p in t.partitions {
                by_tp.insert(
                    (t.topic.0.to_string(), p.partition_index),
                    (p.error_code, p.log_start_offset, p.records),
                );
            }
        }
        let mut next = Vec::new();
        for (tp, committed, at, bytes) in pending {
            let Some((code, log_start, records)) = by_tp.remove(&(tp.0.to_string(), tp.1)) else {
                continue;
            };
            if code == 1 {
                // OFFSET_OUT_OF_RANGE: retention removed the committed
                // record; the oldest unconsumed one is the first available.
                if log_start > at {
                    next.push((tp, committed, log_start, bytes));
                } else {
                    debug!(topic = %tp.0, partition = tp.1, offset = at, "Offset out of range.");
                }
                continue;
            }
            if code != 0 {
                debug!(topic = %tp.0, partition = tp.1, error = %error_name(code), "Cannot fetch.");
                continue;
            }
            let data = records.unwrap_or_default();
            if !data.has_remaining() {
                continue;
            }
            match records::first_at_or_after(&data, at) {
                Ok(Found::Record { timestamp_ms, .. }) => out.push((tp, committed, timestamp_ms)),
                Ok(Found::NeedBytes(n)) if n <= MAX_READ_BYTES && n as i32 > bytes => {
                    next.push((tp, committed, at, n as i32));
                }
                Ok(Found::NeedBytes(_)) => {
                    warn!(topic = %tp.0, partition = tp.1, "Record batch too large to read its timestamp.");
                }
                Ok(Found::Nothing { next: n }) if n > at => next.push((tp, committed, n, bytes)),
                Ok(Found::Nothing { .. }) => {}
                Err(e) => {
                    warn!(topic = %tp.0, partition = tp.1, error = %e, "Cannot read the record at the committed offset.")
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

impl Source for KafkaSource {
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
        // for when the cluster is back.
        snapshot::clear(&self.spec.name);
        self.conns.clear();
        self.read_conns.clear();
        self.coordinators.clear();
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
