//! The groups of one cycle: which are watched (`ListGroups` v5 on every
//! broker, with each group's type; the plain names of the `groups` patterns
//! where the brokers have no ListGroups), which broker coordinates each
//! (`FindCoordinator`, batched from v4, kept between cycles until a request
//! to it fails), their members (`DescribeGroups` for classic groups,
//! `ConsumerGroupDescribe` for KIP-848 `consumer` groups) and their committed
//! offsets (`OffsetFetch`, batched from v8). A group whose coordinator moved,
//! is loading or does not answer is asked again once, after a fresh
//! `FindCoordinator`; only a group that still fails is in error.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    ListGroupsRequest, OffsetFetchRequest, TopicName,
    offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    },
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use super::super::client::{Connection, Connector, KafkaError, error_name};
use super::super::election::{ELECTION_PROTOCOL, GROUP_PREFIX};
use super::{Committed, Fetcher, Group, Retry, Topics, assigned_topics, committed};
use crate::sources::poll_loop::SourceError;

/// Groups per OffsetFetch / DescribeGroups / FindCoordinator request.
const GROUP_CHUNK: usize = 100;
/// Connections per coordinator on which chunks of groups are read at once.
const GROUP_CONNECTIONS: usize = 4;

const REQUEST_TIMED_OUT: i16 = 7;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;

/// The group protocol a group uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// The classic protocol (JoinGroup / SyncGroup), described by
    /// `DescribeGroups`.
    #[default]
    Classic,
    /// KIP-848's consumer protocol (ConsumerGroupHeartbeat), described by
    /// `ConsumerGroupDescribe`.
    Consumer,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Classic => "classic",
            Protocol::Consumer => "consumer",
        }
    }

    /// The protocol of a group of ListGroups v5's `GroupType`; `None`: not
    /// a consumer group (a share group has no committed offsets).
    fn of_type(group_type: &str) -> Option<Protocol> {
        match group_type {
            "consumer" => Some(Protocol::Consumer),
            "share" => None,
            // "classic", and types this client does not know (streams groups
            // commit offsets as classic ones do).
            _ => Some(Protocol::Classic),
        }
    }
}

/// A coordinator error: the group is asked again after a fresh FindCoordinator.
fn coordinator_error(code: i16) -> bool {
    matches!(
        code,
        REQUEST_TIMED_OUT
            | COORDINATOR_LOAD_IN_PROGRESS
            | COORDINATOR_NOT_AVAILABLE
            | NOT_COORDINATOR
    )
}

/// Why a group could not be read, and whether that is worth asking again.
#[derive(Debug, Clone)]
struct Failure {
    retry: Option<Retry>,
    message: String,
}

impl Failure {
    fn of_code(code: i16) -> Failure {
        Failure {
            retry: coordinator_error(code).then_some(Retry::Coordinator),
            message: error_name(code),
        }
    }

    fn of_error(e: &KafkaError) -> Failure {
        let retry = (e.is_connect() || e.is_broken_connection()).then_some(Retry::Connection);
        Failure {
            retry,
            message: e.to_string(),
        }
    }
}

/// A coordinator FindCoordinator named.
struct Found {
    node: i32,
    addr: String,
}

/// What a describe request said of one group.
#[derive(Debug, Default)]
struct Described {
    members: usize,
    assigned: HashSet<Arc<str>>,
    epoch: Option<i32>,
}

impl Fetcher {
    /// Every watched group with its members and committed offsets.
    pub(super) async fn read_groups(
        &mut self,
        topics: &Topics,
    ) -> Result<BTreeMap<String, Group>, SourceError> {
        let listed = std::time::Instant::now();
        let watched = self.watched_groups().await?;
        debug!(source = %self.spec.name, ms = listed.elapsed().as_millis() as u64, groups = watched.len(), "Groups listed.");
        self.coordinators.retain(|g, _| watched.contains_key(g));
        let mut out = BTreeMap::new();
        let mut pending: Vec<String> = watched.keys().cloned().collect();
        let mut failures: HashMap<String, Failure> = HashMap::new();
        for round in 0..2 {
            if pending.is_empty() || (round > 0 && !self.may_retry()) {
                break;
            }
            if round > 0 {
                for g in &pending {
                    if let Some(why) = failures.get(g).and_then(|f| f.retry) {
                        self.retries.add(why);
                    }
                }
            }
            let unknown: Vec<String> = pending
                .iter()
                .filter(|g| !self.coordinators.contains_key(*g))
                .cloned()
                .collect();
            let mut failed = self.find_coordinators(&unknown).await;
            let mut by_coord: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for g in &pending {
                if let Some(&c) = self.coordinators.get(g) {
                    by_coord.entry(c).or_default().push(g.clone());
                }
            }
            for (coord, groups) in by_coord {
                self.read_coordinated(coord, &groups, &watched, topics, &mut out, &mut failed)
                    .await;
            }
            pending.clear();
            for (g, failure) in failed {
                // Ask again next time which broker coordinates it.
                self.coordinators.remove(&g);
                if failure.retry.is_some() {
                    pending.push(g.clone());
                } else {
                    out.insert(g.clone(), unreadable(watched[&g]));
                }
                failures.insert(g, failure);
            }
        }
        for g in pending {
            out.insert(g.clone(), unreadable(watched[&g]));
        }
        for (g, group) in &out {
            if group.offsets.is_none() {
                let error = failures.get(g).map_or("", |f| f.message.as_str());
                warn!(source = %self.spec.name, group = %g, error = %error, "Cannot read the group's offsets.");
            }
        }
        self.known_groups = watched;
        Ok(out)
    }

    /// The watched groups and their protocols: those the brokers list that
    /// the `groups` patterns match (without the agents' own election
    /// groups). A broker that cannot be listed this cycle keeps the groups
    /// known from the last one; brokers that have no ListGroups at all (as
    /// librdkafka's mock cluster) watch the names the patterns spell out.
    async fn watched_groups(&mut self) -> Result<BTreeMap<String, Protocol>, SourceError> {
        let mut names = BTreeMap::new();
        let (mut listed, mut unsupported, mut missed) = (0, 0, 0);
        let mut ids: Vec<i32> = self.brokers.keys().copied().collect();
        ids.sort();
        for id in ids {
            let version = match self.conn(id).await {
                Ok(c) => c.version::<ListGroupsRequest>().ok(),
                Err(e) => {
                    debug!(source = %self.spec.name, broker = id, error = %e, "Cannot list groups.");
                    missed += 1;
                    continue;
                }
            };
            let Some(version) = version else {
                unsupported += 1;
                continue;
            };
            let resp = match self.send(id, &ListGroupsRequest::default()).await {
                Ok(resp) if resp.error_code == 0 => resp,
                Ok(resp) => {
                    let error = error_name(resp.error_code);
                    debug!(source = %self.spec.name, broker = id, error = %error, "Cannot list groups.");
                    missed += 1;
                    continue;
                }
                Err(e) => {
                    debug!(source = %self.spec.name, broker = id, error = %e, "Cannot list groups.");
                    missed += 1;
                    continue;
                }
            };
            listed += 1;
            for g in resp.groups {
                let name = g.group_id.0.as_str();
                let own =
                    g.protocol_type.as_str() == ELECTION_PROTOCOL || name.starts_with(GROUP_PREFIX);
                // Share groups (KIP-932) have no committed offsets.
                let share = g.protocol_type.as_str() == "share";
                if own || share || !self.spec.groups.matches(name) || !self.in_share(name) {
                    continue;
                }
                let protocol = if version >= 5 {
                    Protocol::of_type(g.group_type.as_str())
                } else {
                    Some(Protocol::Classic)
                };
                if let Some(p) = protocol {
                    names.insert(name.to_string(), p);
                }
            }
        }
        self.named_groups = listed == 0 && unsupported > 0;
        if self.named_groups {
            let named = self.spec.groups.names();
            if named.is_empty() {
                return Err(SourceError::Query(
                    "the brokers do not answer ListGroups: name the groups to watch in groups.include (plain names, not patterns)".into(),
                ));
            }
            let protocol = |g: &String| self.known_groups.get(g).copied().unwrap_or_default();
            return Ok(named
                .iter()
                .filter(|g| self.in_share(g))
                .map(|g| (g.clone(), protocol(g)))
                .collect());
        }
        if missed > 0 {
            for (g, p) in &self.known_groups {
                names.entry(g.clone()).or_insert(*p);
            }
        }
        Ok(names)
    }

    /// Finds the coordinators of `groups` (into `self.coordinators`): every
    /// group in one request from FindCoordinator v4, else one request each.
    /// Returns the groups it found none for.
    async fn find_coordinators(&mut self, groups: &[String]) -> Vec<(String, Failure)> {
        let mut failed = Vec::new();
        if groups.is_empty() {
            return failed;
        }
        let batched = match self.conn(-1).await {
            Ok(c) => c.version::<FindCoordinatorRequest>().is_ok_and(|v| v >= 4),
            Err(e) => {
                let failure = Failure::of_error(&e);
                return groups
                    .iter()
                    .map(|g| (g.clone(), failure.clone()))
                    .collect();
            }
        };
        let mut answers: Vec<(String, Result<Found, i16>)> = Vec::new();
        if batched {
            for chunk in groups.chunks(GROUP_CHUNK) {
                let keys = chunk
                    .iter()
                    .map(|g| StrBytes::from_string(g.clone()))
                    .collect();
                let req = FindCoordinatorRequest::default().with_coordinator_keys(keys);
                match self.send(-1, &req).await {
                    Ok(resp) => {
                        for c in resp.coordinators {
                            let found = if c.error_code == 0 {
                                Ok(Found {
                                    node: c.node_id.0,
                                    addr: format!("{}:{}", c.host.as_str(), c.port),
                                })
                            } else {
                                Err(c.error_code)
                            };
                            answers.push((c.key.to_string(), found));
                        }
                    }
                    Err(e) => {
                        let failure = Failure::of_error(&e);
                        failed.extend(chunk.iter().map(|g| (g.clone(), failure.clone())));
                    }
                }
            }
        } else {
            for g in groups {
                let req =
                    FindCoordinatorRequest::default().with_key(StrBytes::from_string(g.clone()));
                match self.send(-1, &req).await {
                    Ok(resp) => {
                        let found = if resp.error_code == 0 {
                            Ok(Found {
                                node: resp.node_id.0,
                                addr: format!("{}:{}", resp.host.as_str(), resp.port),
                            })
                        } else {
                            Err(resp.error_code)
                        };
                        answers.push((g.clone(), found));
                    }
                    Err(e) => failed.push((g.clone(), Failure::of_error(&e))),
                }
            }
        }
        let mut found = HashSet::new();
        for (g, answer) in answers {
            match answer {
                Ok(Found { node, addr }) if node >= 0 => {
                    self.brokers.entry(node).or_insert(addr);
                    found.insert(g.clone());
                    self.coordinators.insert(g, node);
                }
                Ok(_) => {
                    found.insert(g.clone());
                    failed.push((g, Failure::of_code(COORDINATOR_NOT_AVAILABLE)));
                }
                Err(code) => {
                    found.insert(g.clone());
                    // Every FindCoordinator error is worth one more try.
                    let failure = Failure {
                        retry: Some(Retry::Coordinator),
                        message: format!("FindCoordinator: {}", error_name(code)),
                    };
                    failed.push((g, failure));
                }
            }
        }
        let answered: HashSet<&String> = failed.iter().map(|(g, _)| g).collect();
        let missing: Vec<String> = groups
            .iter()
            .filter(|g| !found.contains(*g) && !answered.contains(g))
            .cloned()
            .collect();
        for g in missing {
            let failure = Failure {
                retry: Some(Retry::Coordinator),
                message: "FindCoordinator did not answer for the group".into(),
            };
            failed.push((g, failure));
        }
        failed
    }

    /// Reads the groups `coord` coordinates into `out` (those that fail go to
    /// `failed`), in chunks of [`GROUP_CHUNK`] on up to
    /// [`GROUP_CONNECTIONS`] connections at once: the coordinator works on
    /// each chunk's groups apart, and its answers, not the requests, are
    /// most of a cycle at a thousand groups.
    async fn read_coordinated(
        &mut self,
        coord: i32,
        groups: &[String],
        watched: &BTreeMap<String, Protocol>,
        topics: &Topics,
        out: &mut BTreeMap<String, Group>,
        failed: &mut Vec<(String, Failure)>,
    ) {
        let Some(addr) = self.brokers.get(&coord).cloned() else {
            let e = KafkaError::Connect {
                addr: format!("broker {coord}"),
                message: "it is not in the metadata".into(),
            };
            let failure = Failure::of_error(&e);
            failed.extend(groups.iter().map(|g| (g.clone(), failure.clone())));
            return;
        };
        let chunks: Vec<&[String]> = groups.chunks(GROUP_CHUNK).collect();
        let workers = chunks.len().clamp(1, GROUP_CONNECTIONS);
        let down = self.down.contains(&coord);
        let links: Vec<Link> = (0..workers)
            .map(|w| Link {
                conn: if w == 0 {
                    self.conns.remove(&coord)
                } else {
                    self.group_conns.get_mut(&coord).and_then(Vec::pop)
                },
                addr: addr.clone(),
                connector: self.connector.clone(),
                down,
                failed: false,
            })
            .collect();
        let named = self.named_groups;
        let chunks = &chunks;
        let reads = links
            .into_iter()
            .enumerate()
            .map(|(w, mut link)| async move {
                let mut read = Vec::new();
                for chunk in chunks.iter().skip(w).step_by(workers) {
                    read.push(read_chunk(&mut link, chunk, watched, topics, named).await);
                }
                (link, read)
            });
        for (w, (link, read)) in futures_util::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            if link.down {
                self.down.insert(coord);
            }
            if link.failed {
                self.read_conns.remove(&coord);
            }
            if let Some(c) = link.conn {
                if w == 0 {
                    self.conns.insert(coord, c);
                } else {
                    self.group_conns.entry(coord).or_default().push(c);
                }
            }
            for (groups, failures) in read {
                out.extend(groups);
                failed.extend(failures);
            }
        }
    }
}

/// One connection to a group coordinator, for one worker of
/// [`Fetcher::read_coordinated`]: a kept one that turns out closed is opened
/// again and the request sent once more, as [`Fetcher::send`] does.
struct Link {
    conn: Option<Connection>,
    addr: String,
    connector: Connector,
    /// The broker did not answer a new connection (this cycle, or earlier
    /// in it): it is not asked again in it.
    down: bool,
    /// A request failed on it (the other connections to the broker are dropped).
    failed: bool,
}

impl Link {
    /// The connection, opened if there is none.
    async fn conn(&mut self) -> Result<&mut Connection, KafkaError> {
        if self.down {
            return Err(KafkaError::Connect {
                addr: self.addr.clone(),
                message: "it did not answer earlier in this cycle".into(),
            });
        }
        if self.conn.is_none() {
            match self.connector.connect(&self.addr).await {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.down = true;
                    return Err(e);
                }
            }
        }
        Ok(self.conn.as_mut().expect("set"))
    }

    async fn send<R: kafka_protocol::protocol::Request>(
        &mut self,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        let reused = self.conn.is_some();
        match self.send_once(req).await {
            Err(e) if reused && e.is_broken_connection() => {
                debug!(broker = %self.addr, error = %e, "Connection closed; connecting again.");
                self.send_once(req).await
            }
            r => r,
        }
    }

    async fn send_once<R: kafka_protocol::protocol::Request>(
        &mut self,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        match self.conn().await?.send(req).await {
            Ok(r) => Ok(r),
            Err(e @ KafkaError::Unsupported { .. }) => Err(e),
            Err(e) => {
                self.conn = None;
                self.failed = true;
                if e.is_connect() {
                    self.down = true;
                }
                Err(e)
            }
        }
    }
}

/// One chunk's groups read on `link`: those read, and those that failed.
async fn read_chunk(
    link: &mut Link,
    groups: &[String],
    watched: &BTreeMap<String, Protocol>,
    topics: &Topics,
    named: bool,
) -> (Vec<(String, Group)>, Vec<(String, Failure)>) {
    let (consumer, classic): (Vec<String>, Vec<String>) = groups
        .iter()
        .cloned()
        .partition(|g| watched[g] == Protocol::Consumer);
    let mut described = HashMap::new();
    let mut describe_failed = HashMap::new();
    if !classic.is_empty() {
        describe_classic(link, &classic, topics, &mut described, &mut describe_failed).await;
    }
    if !consumer.is_empty() {
        describe_consumer(
            link,
            &consumer,
            topics,
            &mut described,
            &mut describe_failed,
        )
        .await;
    }
    let mut offsets = offset_fetch(link, groups, topics, named).await;
    let (mut out, mut failed) = (Vec::new(), Vec::new());
    for name in groups {
        if let Some(failure) = describe_failed.remove(name) {
            failed.push((name.clone(), failure));
            continue;
        }
        let offsets = match offsets.remove(name) {
            Some(Ok(v)) => v,
            Some(Err(failure)) => {
                failed.push((name.clone(), failure));
                continue;
            }
            None => {
                let failure = Failure {
                    retry: Some(Retry::Coordinator),
                    message: "OffsetFetch did not answer for the group".into(),
                };
                failed.push((name.clone(), failure));
                continue;
            }
        };
        let d: Option<Described> = described.remove(name);
        out.push((
            name.clone(),
            Group {
                offsets: Some(offsets),
                members: d.as_ref().map(|d| d.members),
                epoch: d.as_ref().and_then(|d| d.epoch),
                assigned: d.map(|d| d.assigned).unwrap_or_default(),
                protocol: watched[name],
            },
        ));
    }
    (out, failed)
}

/// Members and assigned watched topics of classic groups.
async fn describe_classic(
    link: &mut Link,
    groups: &[String],
    topics: &Topics,
    described: &mut HashMap<String, Described>,
    failed: &mut HashMap<String, Failure>,
) {
    let req = DescribeGroupsRequest::default().with_groups(
        groups
            .iter()
            .map(|g| GroupId(StrBytes::from_string(g.clone())))
            .collect(),
    );
    let resp = match link.send(&req).await {
        Ok(resp) => resp,
        Err(e) => {
            describe_error(&e, groups, failed);
            return;
        }
    };
    for g in resp.groups {
        let name = g.group_id.0.to_string();
        if g.error_code != 0 {
            if coordinator_error(g.error_code) {
                failed.insert(name, Failure::of_code(g.error_code));
            }
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
        let d = Described {
            members: g.members.len(),
            assigned,
            epoch: None,
        };
        described.insert(name, d);
    }
}

/// Members, assigned watched topics and group epoch of KIP-848 consumer
/// groups.
async fn describe_consumer(
    link: &mut Link,
    groups: &[String],
    topics: &Topics,
    described: &mut HashMap<String, Described>,
    failed: &mut HashMap<String, Failure>,
) {
    let req = ConsumerGroupDescribeRequest::default().with_group_ids(
        groups
            .iter()
            .map(|g| GroupId(StrBytes::from_string(g.clone())))
            .collect(),
    );
    let resp = match link.send(&req).await {
        Ok(resp) => resp,
        Err(e) => {
            describe_error(&e, groups, failed);
            return;
        }
    };
    for g in resp.groups {
        let name = g.group_id.0.to_string();
        if g.error_code != 0 {
            if coordinator_error(g.error_code) {
                failed.insert(name, Failure::of_code(g.error_code));
            }
            continue;
        }
        let mut assigned = HashSet::new();
        for member in &g.members {
            for tp in &member.assignment.topic_partitions {
                if let Some((k, _)) = topics.get_key_value(tp.topic_name.0.as_str()) {
                    assigned.insert(k.clone());
                }
            }
        }
        let d = Described {
            members: g.members.len(),
            assigned,
            epoch: Some(g.group_epoch),
        };
        described.insert(name, d);
    }
}

/// Committed offsets: every group of the chunk in one request where the
/// broker speaks OffsetFetch v8, else one request per group. All of a
/// group's offsets are asked for (topics null), or, for groups named in
/// the configuration, the watched topics' partitions.
async fn offset_fetch(
    link: &mut Link,
    groups: &[String],
    topics: &Topics,
    named: bool,
) -> HashMap<String, Result<Vec<Committed>, Failure>> {
    let batched = match link.conn().await {
        Ok(c) => c.version::<OffsetFetchRequest>().is_ok_and(|v| v >= 8),
        Err(e) => {
            let failure = Failure::of_error(&e);
            return groups
                .iter()
                .map(|g| (g.clone(), Err(failure.clone())))
                .collect();
        }
    };
    let mut offsets = HashMap::new();
    if batched {
        let req = OffsetFetchRequest::default().with_groups(
            groups
                .iter()
                .map(|g| {
                    OffsetFetchRequestGroup::default()
                        .with_group_id(GroupId(StrBytes::from_string(g.clone())))
                        .with_topics(named.then(|| {
                            topics
                                .iter()
                                .map(|(t, ps)| {
                                    OffsetFetchRequestTopics::default()
                                        .with_name(topic_name(t))
                                        .with_partition_indexes(ps.keys().copied().collect())
                                })
                                .collect()
                        }))
                })
                .collect(),
        );
        match link.send(&req).await {
            Ok(resp) => {
                for g in resp.groups {
                    let name = g.group_id.0.to_string();
                    if g.error_code != 0 {
                        offsets.insert(name, Err(Failure::of_code(g.error_code)));
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
                let failure = Failure::of_error(&e);
                for g in groups {
                    offsets.insert(g.clone(), Err(failure.clone()));
                }
            }
        }
    } else {
        for g in groups {
            let req = OffsetFetchRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(g.clone())))
                .with_topics(named.then(|| {
                    topics
                        .iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopic::default()
                                .with_name(topic_name(t))
                                .with_partition_indexes(ps.keys().copied().collect())
                        })
                        .collect()
                }));
            let r = match link.send(&req).await {
                Ok(resp) if resp.error_code != 0 => Err(Failure::of_code(resp.error_code)),
                Ok(resp) => Ok(committed(
                    topics,
                    resp.topics.iter().flat_map(|t| {
                        t.partitions.iter().map(|p| {
                            let o = (p.partition_index, p.committed_offset, p.error_code);
                            (t.name.0.as_str(), o)
                        })
                    }),
                )),
                Err(e) => Err(Failure::of_error(&e)),
            };
            offsets.insert(g.clone(), r);
        }
    }
    offsets
}

/// A group whose offsets could not be read.
fn unreadable(protocol: Protocol) -> Group {
    Group {
        protocol,
        ..Group::default()
    }
}

fn topic_name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}

/// A describe request that failed as a whole: a broker gone is worth asking
/// again; an API the broker lacks leaves the members unknown.
fn describe_error(e: &KafkaError, groups: &[String], failed: &mut HashMap<String, Failure>) {
    let failure = Failure::of_error(e);
    if failure.retry.is_some() {
        for g in groups {
            failed.insert(g.clone(), failure.clone());
        }
    } else {
        debug!(error = %e, "The groups could not be described.");
    }
}
