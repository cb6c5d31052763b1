//! One owner per Kafka source: membership of a group of the agents' own on
//! the watched cluster. Every agent joins `inboxwatch-election.<source>`
//! (protocol type `inboxwatch`, never a watched group's name); the member the
//! group coordinator names leader owns the source. Heartbeats every
//! [`HEARTBEAT`] keep the membership; a member that stops answering is
//! dropped by the coordinator after [`SESSION_TIMEOUT`], and a leaving one
//! (SIGTERM) at once, which starts a rebalance in which another agent is
//! named leader. An owner whose heartbeat fails stops exporting at once,
//! well before the coordinator's session timeout lets another agent lead.

use std::time::Duration;

use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    SyncGroupRequest, join_group_request::JoinGroupRequestProtocol,
    leave_group_request::MemberIdentity, sync_group_request::SyncGroupRequestAssignment,
};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use super::client::{Connection, Connector, error_name};
use super::config::KafkaSpec;
use crate::coordination::Lock;

/// How long the coordinator keeps a member that stopped heartbeating.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a rebalance waits for the members to rejoin.
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often members heartbeat (a fifth of the session timeout).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Longest wait for a heartbeat.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

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
    leader: bool,
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
        }
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
        // The join waits for the rebalance: its own, longer, timeout.
        let addr = self.coordinator().await?.addr().to_string();
        let mut conn = self
            .join_connector
            .connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        for _ in 0..3 {
            let req = JoinGroupRequest::default()
                .with_group_id(self.group_id())
                .with_session_timeout_ms(SESSION_TIMEOUT.as_millis() as i32)
                .with_rebalance_timeout_ms(REBALANCE_TIMEOUT.as_millis() as i32)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_protocol_type(StrBytes::from_static_str(ELECTION_PROTOCOL))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(StrBytes::from_static_str("leader")),
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
                        resp.members
                            .iter()
                            .map(|m| {
                                SyncGroupRequestAssignment::default()
                                    .with_member_id(m.member_id.clone())
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
                        .with_protocol_name(Some(StrBytes::from_static_str("leader")))
                        .with_assignments(assignments);
                    let sync = sync_request(&conn, sync);
                    // Only the error code matters (the assignment is this
                    // module's own word); some coordinators send a null
                    // assignment, which a strict decoder refuses.
                    let body = conn.send_raw(&sync).await.map_err(|e| e.to_string())?;
                    let code =
                        sync_error_code(&body, conn.version::<SyncGroupRequest>().unwrap_or(0))
                            .ok_or("SyncGroup: a response too short to read")?;
                    if code == REBALANCE_IN_PROGRESS {
                        continue;
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
        Err("the election group kept rebalancing".into())
    }

    /// One heartbeat: Ok(true) in good standing, Ok(false) when a rebalance
    /// asks the members to rejoin.
    async fn heartbeat(&mut self) -> Result<bool, String> {
        let req = HeartbeatRequest::default()
            .with_group_id(self.group_id())
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()));
        // A connection kept from an earlier heartbeat may have been closed by
        // the broker since (an idle timeout, a restart, a proxy): one retry on
        // a new connection before the source is given up. The membership
        // stays valid until the group's session timeout. A broker that did
        // not answer in time is not asked again: the owner stops exporting
        // now, not a second timeout later.
        let mut retry = self.conn.is_some();
        let resp = loop {
            let conn = self.coordinator().await?;
            match conn.send(&req).await {
                Ok(r) => break r,
                Err(e) => {
                    self.conn = None;
                    if !retry || !e.is_broken_connection() {
                        return Err(e.to_string());
                    }
                    retry = false;
                    debug!(group = %self.group, error = %e, "Heartbeat failed on a kept connection; retrying on a new one.");
                }
            }
        };
        debug!(group = %self.group, code = resp.error_code, "Heartbeat.");
        match resp.error_code {
            0 => Ok(true),
            REBALANCE_IN_PROGRESS => Ok(false),
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
            Ok(true) => Ok(self.leader),
            Ok(false) => self.join().await,
            Err(_) => self.join().await,
        }
    }

    async fn renew(&mut self) -> Result<bool, String> {
        match self.heartbeat().await? {
            true => Ok(self.leader),
            // A member joined or left: rejoin; the coordinator keeps a
            // leader that rejoins, and names the new one at the same moment
            // it tells the old one.
            false => self.join().await,
        }
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
