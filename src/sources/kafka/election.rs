//! One owner per Kafka source: membership of a group of the agents' own on
//! the watched cluster. Every agent joins `inboxwatch-election.<source>`
//! (protocol type `inboxwatch`, never a watched group's name); the member the
//! group coordinator names leader owns the source. Heartbeats every
//! [`HEARTBEAT`] keep the membership; a member that stops answering is
//! dropped by the coordinator after [`SESSION_TIMEOUT`], and a leaving one
//! (SIGTERM) at once, which starts a rebalance in which another agent is
//! named leader. An owner whose heartbeat fails stops exporting at once,
//! well before the coordinator's session timeout lets another agent lead.
//!
//! A source split into shards (`shards`, `shards.rs`) uses the same group
//! the way Kafka's consumers use theirs: the leader gives every member its
//! shards in the SyncGroup round, and a member owns the source while it holds
//! at least one. When the group rebalances (an agent came or went), every
//! member stops exporting before it rejoins, so no shard has two exporters.

use std::time::{Duration, Instant};

use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    SyncGroupRequest, join_group_request::JoinGroupRequestProtocol,
    leave_group_request::MemberIdentity, sync_group_request::SyncGroupRequestAssignment,
};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use super::client::{Connection, Connector, error_name};
use super::config::KafkaSpec;
use super::shards::{Assignment, Shards, Slot, assign};
use crate::coordination::Lock;

/// How long the coordinator keeps a member that stopped heartbeating.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a rebalance waits for the members to rejoin.
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often members heartbeat (a fifth of the session timeout).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Longest wait for a heartbeat.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a split source's member holds new shards before it exports
/// them: longer than the members' heartbeat and its timeout, so that a member
/// still exporting an earlier generation's shards has heard of the rebalance
/// and stopped, whether or not the coordinator waited for it to rejoin
/// (Kafka's does; tansu 0.6.0's answers a join at once).
const SETTLE: Duration = Duration::from_secs(4);

/// How long a split source's leader waits before its SyncGroup when it has
/// followers (see [`KafkaElection::join`]).
const LEADER_SYNC_PAUSE: Duration = Duration::from_millis(200);

const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const REBALANCE_IN_PROGRESS: i16 = 27;
const MEMBER_ID_REQUIRED: i16 = 79;

/// The prefix of the election groups' names.
pub const GROUP_PREFIX: &str = "inboxwatch-election.";

/// Protocol type of the agent's own election groups; never watched.
pub const ELECTION_PROTOCOL: &str = "inboxwatch";

pub struct KafkaElection {
    source: String,
    group: String,
    brokers: Vec<String>,
    connector: Connector,
    join_connector: Connector,
    conn: Option<Connection>,
    member_id: String,
    generation: i32,
    /// Whether this agent exports the source: the group's leader, or, split
    /// into shards, the holder of at least one.
    leader: bool,
    shards: Shards,
    /// This generation's shards (split sources only).
    slot: Slot,
    /// When this generation's shards may be exported ([`SETTLE`]).
    settled_at: Option<Instant>,
    /// A rebalance took this member's shards: it rejoins at once.
    rejoin: bool,
}

impl KafkaElection {
    pub fn for_source(spec: &KafkaSpec) -> KafkaElection {
        let client_id = format!("{}-election", spec.client_id);
        KafkaElection {
            source: spec.name.clone(),
            group: format!("{GROUP_PREFIX}{}", spec.name),
            brokers: spec.brokers.clone(),
            connector: Connector::new(client_id.clone(), spec.security.clone(), REQUEST_TIMEOUT),
            join_connector: Connector::new(
                client_id,
                spec.security.clone(),
                REBALANCE_TIMEOUT + REQUEST_TIMEOUT * 2,
            ),
            conn: None,
            member_id: String::new(),
            generation: -1,
            leader: false,
            shards: spec.shards,
            slot: Slot::default(),
            settled_at: None,
            rejoin: false,
        }
    }

    /// Where this election puts the shards it holds, for the source to read.
    pub fn slot(&self) -> Slot {
        self.slot.clone()
    }

    /// A split source's member told of a rebalance: it stopped exporting and
    /// must rejoin now, within the rebalance timeout.
    fn revoked(&self) -> bool {
        self.shards.is_split() && self.rejoin
    }

    /// Whether this agent exports the source now: it leads (or holds shards)
    /// and, split, has held them for [`SETTLE`].
    fn exporting(&self) -> bool {
        self.leader
            && (!self.shards.is_split() || self.settled_at.is_some_and(|t| Instant::now() >= t))
    }

    /// Drops a split source's shards; it must rejoin before it has any.
    fn drop_shards(&mut self) {
        self.generation = -1;
        self.leader = false;
        self.slot.set(None);
        self.settled_at = None;
        self.rejoin = true;
    }

    fn group_id(&self) -> GroupId {
        GroupId(StrBytes::from_string(self.group.clone()))
    }

    /// A connection to the election group's coordinator.
    async fn coordinator(&mut self) -> Result<&mut Connection, String> {
        if self.conn.is_none() {
            // A new connection the broker closes before it answers (a close
            // of every connection that caught this one between its version
            // exchange and the lookup) is tried once more; a broker that
            // closes the second too, or cannot be reached, is an error.
            let mut again = true;
            let (boot, resp, v) = loop {
                let mut boot = self
                    .connector
                    .connect_any(&self.brokers)
                    .await
                    .map_err(|e| e.to_string())?;
                let v = boot
                    .version::<FindCoordinatorRequest>()
                    .map_err(|e| e.to_string())?;
                let req = if v >= 4 {
                    FindCoordinatorRequest::default()
                        .with_coordinator_keys(vec![StrBytes::from_string(self.group.clone())])
                } else {
                    FindCoordinatorRequest::default()
                        .with_key(StrBytes::from_string(self.group.clone()))
                };
                match boot.send(&req).await {
                    Ok(resp) => break (boot, resp, v),
                    Err(e) if again && e.is_broken_connection() => {
                        again = false;
                        debug!(group = %self.group, error = %e, "The coordinator lookup's connection was closed; once more on a new one.");
                    }
                    Err(e) => return Err(e.to_string()),
                }
            };
            let (code, host, port) = match resp.coordinators.first() {
                Some(c) if v >= 4 => (c.error_code, c.host.to_string(), c.port),
                _ => (resp.error_code, resp.host.to_string(), resp.port),
            };
            if code != 0 {
                return Err(format!(
                    "no coordinator for {}: {}",
                    self.group,
                    error_name(code)
                ));
            }
            let addr = format!("{host}:{port}");
            let conn = if addr == boot.addr() {
                boot
            } else {
                self.connector
                    .connect(&addr)
                    .await
                    .map_err(|e| e.to_string())?
            };
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("set"))
    }

    fn forget(&mut self) {
        self.conn = None;
        self.member_id.clear();
        self.generation = -1;
        self.leader = false;
        self.slot.set(None);
        self.settled_at = None;
        self.rejoin = false;
    }

    /// Joins (or rejoins) the group and completes the round; true when this
    /// agent is the leader. The generation is kept only once the round is
    /// complete: a round given up halfway (an error, or the caller's patience
    /// running out before SyncGroup answers) leaves none, so the next attempt
    /// rejoins instead of heartbeating a generation whose leadership it never
    /// learned. The member id is kept: a rejoin under it needs no new member.
    async fn join(&mut self) -> Result<bool, String> {
        self.generation = -1;
        self.leader = false;
        self.slot.set(None);
        self.settled_at = None;
        self.rejoin = false;
        let protocol = self.shards.protocol();
        // The join waits for the rebalance: its own, longer, timeout.
        let addr = self.coordinator().await?.addr().to_string();
        let mut conn = self
            .join_connector
            .connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        let mut last_error = "the election group kept rebalancing".to_string();
        for _ in 0..3 {
            let req = JoinGroupRequest::default()
                .with_group_id(self.group_id())
                .with_session_timeout_ms(SESSION_TIMEOUT.as_millis() as i32)
                .with_rebalance_timeout_ms(REBALANCE_TIMEOUT.as_millis() as i32)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_protocol_type(StrBytes::from_static_str(ELECTION_PROTOCOL))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(StrBytes::from_string(protocol.clone())),
                ]);
            let resp = conn.send(&req).await.map_err(|e| e.to_string())?;
            match resp.error_code {
                0 => {
                    self.member_id = resp.member_id.to_string();
                    let generation = resp.generation_id;
                    let leader = resp.leader.as_str() == self.member_id;
                    debug!(
                        group = %self.group,
                        generation,
                        member = %self.member_id,
                        leader = %resp.leader.as_str(),
                        members = resp.members.len(),
                        "Joined the election group."
                    );
                    let assignments = if leader {
                        let ids: Vec<&str> =
                            resp.members.iter().map(|m| m.member_id.as_str()).collect();
                        let shares = assign(&ids, self.shards);
                        resp.members
                            .iter()
                            .zip(shares)
                            .map(|(m, share)| {
                                let a = SyncGroupRequestAssignment::default()
                                    .with_member_id(m.member_id.clone());
                                if self.shards.is_split() {
                                    a.with_assignment(share.encode().into())
                                } else {
                                    a
                                }
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    let sync = SyncGroupRequest::default()
                        .with_group_id(self.group_id())
                        .with_generation_id(generation)
                        .with_member_id(StrBytes::from_string(self.member_id.clone()))
                        .with_protocol_type(Some(StrBytes::from_static_str(ELECTION_PROTOCOL)))
                        .with_protocol_name(Some(StrBytes::from_string(protocol.clone())))
                        .with_assignments(assignments);
                    if leader && self.shards.is_split() && resp.members.len() > 1 {
                        // The followers send their SyncGroup as soon as they
                        // are answered; the leader's comes a moment later, so
                        // that a coordinator that wants the followers' first
                        // (librdkafka's mock) rarely makes them rejoin.
                        tokio::time::sleep(LEADER_SYNC_PAUSE).await;
                    }
                    let sync = sync_request(&conn, sync);
                    // Read by hand: some coordinators send a null assignment
                    // (an unsplit source's), which a strict decoder refuses.
                    let body = conn.send_raw(&sync).await.map_err(|e| e.to_string())?;
                    let version = conn.version::<SyncGroupRequest>().unwrap_or(0);
                    let code = sync_error_code(&body, version)
                        .ok_or("SyncGroup: a response too short to read")?;
                    if code == REBALANCE_IN_PROGRESS {
                        continue;
                    }
                    if self.shards.is_split() {
                        if code != 0 {
                            // A member without its shards holds none: it
                            // rejoins at once under its member id (the
                            // others hear of it at their next heartbeat).
                            // librdkafka's mock coordinator, for one,
                            // refuses a follower's SyncGroup that comes after
                            // the leader's (INVALID_REQUEST).
                            debug!(group = %self.group, generation, code = %error_name(code), "SyncGroup refused; rejoining.");
                            last_error = format!("SyncGroup: {}", error_name(code));
                            continue;
                        }
                        let share = sync_assignment(&body, version)
                            .and_then(|bytes| Assignment::decode(&bytes))
                            .ok_or("SyncGroup: no shards in the assignment (another version of inboxwatch leads the election group?)")?;
                        debug!(group = %self.group, generation, shards = %share.describe(), "Shards assigned.");
                        let holds = !share.mine.is_empty();
                        self.slot.set(Some(share));
                        self.generation = generation;
                        self.leader = holds;
                        self.settled_at = Some(Instant::now() + SETTLE);
                        return Ok(self.exporting());
                    }
                    if code != 0 && leader {
                        return Err(format!("SyncGroup: {}", error_name(code)));
                    }
                    if code != 0 {
                        // A follower whose sync came late: it is a member
                        // all the same, and its heartbeats say if it is not.
                        debug!(group = %self.group, code, "SyncGroup refused a follower.");
                    }
                    self.generation = generation;
                    self.leader = leader;
                    return Ok(leader);
                }
                MEMBER_ID_REQUIRED => {
                    self.member_id = resp.member_id.to_string();
                }
                code => {
                    self.member_id.clear();
                    return Err(format!("JoinGroup: {}", error_name(code)));
                }
            }
        }
        Err(last_error)
    }

    /// One heartbeat: Ok(true) in good standing, Ok(false) when a rebalance
    /// asks the members to rejoin.
    async fn heartbeat(&mut self) -> Result<bool, String> {
        let req = HeartbeatRequest::default()
            .with_group_id(self.group_id())
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()));
        // A connection may have been closed by the broker (an idle timeout, a
        // restart, a proxy; a kept one since the last heartbeat, or a new one
        // in the moment it was opened): up to two retries on a new connection
        // before the source is given up. The membership stays valid until the
        // group's session timeout. A broker that did not answer in time is
        // not asked again: the owner stops exporting now, not a second
        // timeout later.
        let mut retries = 2;
        let resp = loop {
            let conn = self.coordinator().await?;
            match conn.send(&req).await {
                Ok(r) => break r,
                Err(e) => {
                    self.conn = None;
                    if retries == 0 || !e.is_broken_connection() {
                        return Err(e.to_string());
                    }
                    retries -= 1;
                    debug!(group = %self.group, error = %e, "Heartbeat's connection was closed; retrying on a new one.");
                }
            }
        };
        debug!(group = %self.group, code = resp.error_code, "Heartbeat.");
        match resp.error_code {
            0 => Ok(true),
            REBALANCE_IN_PROGRESS => {
                if self.shards.is_split() {
                    // Shards are held for one generation: stop exporting
                    // them before rejoining (the caller rejoins at once).
                    self.drop_shards();
                }
                Ok(false)
            }
            // A split source's member left behind by a generation that went
            // on without it (a coordinator that did not wait for its rejoin,
            // or a session that ended): its shards are someone else's now.
            ILLEGAL_GENERATION | UNKNOWN_MEMBER_ID if self.shards.is_split() => {
                if resp.error_code == UNKNOWN_MEMBER_ID {
                    self.member_id.clear();
                }
                self.drop_shards();
                Ok(false)
            }
            code => {
                let e = format!("Heartbeat: {}", error_name(code));
                self.forget();
                Err(e)
            }
        }
    }
}

/// The error code of a SyncGroup response (v0: first field; v1+: after the
/// throttle time).
fn sync_error_code(body: &bytes::Bytes, version: i16) -> Option<i16> {
    let at = if version >= 1 { 4 } else { 0 };
    let b = body.get(at..at + 2)?;
    Some(i16::from_be_bytes([b[0], b[1]]))
}

/// The assignment of a SyncGroup response (v0: after the error code; v1–v3:
/// after the throttle time too; v4: compact bytes; v5: after the compact
/// protocol type and name); `None` when null or unreadable.
fn sync_assignment(body: &bytes::Bytes, version: i16) -> Option<Vec<u8>> {
    fn uvarint(b: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let b = body.as_ref();
    let mut at = if version >= 1 { 6 } else { 2 };
    if version < 4 {
        let len = i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        let len = usize::try_from(len).ok()?;
        return b.get(at..at + len).map(<[u8]>::to_vec);
    }
    if version >= 5 {
        for _ in 0..2 {
            // Compact nullable strings: length + 1, 0 for null.
            let n = uvarint(b, &mut at)? as usize;
            at += n.saturating_sub(1);
        }
    }
    let n = uvarint(b, &mut at)? as usize;
    let len = n.checked_sub(1)?;
    b.get(at..at + len).map(<[u8]>::to_vec)
}

/// SyncGroup before v5 has no protocol type and name: clear them there.
fn sync_request(conn: &Connection, req: SyncGroupRequest) -> SyncGroupRequest {
    match conn.version::<SyncGroupRequest>() {
        Ok(v) if v >= 5 => req,
        _ => req.with_protocol_type(None).with_protocol_name(None),
    }
}

impl Lock for KafkaElection {
    fn source(&self) -> &str {
        &self.source
    }

    fn patience(&self) -> Duration {
        REBALANCE_TIMEOUT + REQUEST_TIMEOUT * 4
    }

    fn heartbeat(&self) -> Duration {
        HEARTBEAT
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        if self.member_id.is_empty() || self.generation < 0 {
            return self.join().await;
        }
        match self.heartbeat().await {
            Ok(true) => Ok(self.exporting()),
            Ok(false) => self.join().await,
            Err(_) => self.join().await,
        }
    }

    async fn renew(&mut self) -> Result<bool, String> {
        match self.heartbeat().await? {
            true => Ok(self.leader),
            // Shards are given anew each generation: the heartbeat dropped
            // this one's; the caller stops exporting, then rejoins at once.
            false if self.shards.is_split() => Ok(false),
            // A member joined or left: rejoin; the coordinator keeps a
            // leader that rejoins, and names the new one at the same moment
            // it tells the old one.
            false => self.join().await,
        }
    }

    fn rejoin_now(&self) -> bool {
        self.revoked()
    }

    async fn abandon(&mut self) {
        // Keep the membership: a rejoin with the same member id is quicker
        // and causes no extra rebalance; the coordinator says if it is stale.
        self.conn = None;
    }

    async fn release(&mut self) {
        if self.member_id.is_empty() {
            self.conn = None;
            return;
        }
        if let Some(conn) = self.conn.as_mut() {
            let member = StrBytes::from_string(self.member_id.clone());
            let group = GroupId(StrBytes::from_string(self.group.clone()));
            // v0–2 name the member directly, which every coordinator reads;
            // only a broker that dropped them gets the v3+ member list.
            let sent = match (
                conn.broker_min::<LeaveGroupRequest>(),
                conn.version::<LeaveGroupRequest>(),
            ) {
                (Some(min), Ok(v)) if min <= 2 => {
                    let req = LeaveGroupRequest::default()
                        .with_group_id(group)
                        .with_member_id(member);
                    conn.send_at(&req, v.min(2)).await.map(|r| r.error_code)
                }
                _ => {
                    let req = LeaveGroupRequest::default()
                        .with_group_id(group)
                        .with_members(vec![MemberIdentity::default().with_member_id(member)]);
                    conn.send(&req).await.map(|r| r.error_code)
                }
            };
            match sent {
                Ok(code) => debug!(group = %self.group, code, "Left the election group."),
                Err(e) => {
                    debug!(group = %self.group, error = %e, "Leaving the election group failed.")
                }
            }
        }
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::SyncGroupResponse;
    use kafka_protocol::protocol::Encodable;

    /// The assignment is read out of SyncGroup responses of every version
    /// as kafka-protocol encodes them (v5 with its protocol type and name
    /// before it), and a null one is none.
    #[test]
    fn the_assignment_is_read_from_every_sync_group_version() {
        let bytes = vec![0u8, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 3];
        for version in 0..=5i16 {
            let resp = SyncGroupResponse::default()
                .with_throttle_time_ms(7)
                .with_protocol_type(Some(StrBytes::from_static_str(ELECTION_PROTOCOL)))
                .with_protocol_name(Some(StrBytes::from_static_str("shards-4")))
                .with_assignment(bytes.clone().into());
            let mut buf = bytes::BytesMut::new();
            resp.encode(&mut buf, version).expect("encodes");
            let body = buf.freeze();
            assert_eq!(sync_error_code(&body, version), Some(0), "v{version}");
            let got = sync_assignment(&body, version);
            assert_eq!(got.as_deref(), Some(bytes.as_slice()), "v{version}");
            let share = Assignment::decode(&got.unwrap()).expect("decodes");
            assert_eq!(share.describe(), "shards 1, 3 of 4");
        }
        // v4 with a null assignment (compact length 0).
        let null = bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(sync_assignment(&null, 4), None);
    }
}
