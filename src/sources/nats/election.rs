//! One owner per NATS source: a lease in a KV bucket of the agents' own on
//! the watched server (`election_bucket`, default `inboxwatch_election`,
//! created with one value per key and a `max_age` of [`LEASE`]). The key is
//! the source's name; its value the agent that holds it. An agent takes a
//! free lease with a create (refused while another agent's value is there),
//! and the owner renews it every heartbeat with an update that names the
//! revision it last wrote (refused if any other write came between). An
//! owner that stops renewing loses the lease when the bucket's `max_age`
//! drops its value; a leaving one (SIGTERM) deletes it at once, naming its
//! revision, so that it never deletes a successor's.
//!
//! Every write is also a reading of the server's clock ([`ServerClock`]):
//! the entry's stored time against the agent's clock around the write.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::{Client, HeaderMap};
use base64::Engine as _;
use serde::Deserialize;
use tracing::debug;

use super::client::{RequestError, SharedEvents, connect, parse_time, request};
use super::clock::ServerClock;
use super::config::NatsSpec;
use crate::coordination::{HEARTBEAT, LEASE, Lock};

/// `wrong last sequence`: another write came first.
const WRONG_LAST_SEQUENCE: u32 = 10071;
/// `stream name already in use` (with another configuration).
const STREAM_NAME_IN_USE: u32 = 10058;

pub struct NatsElection {
    spec: Arc<NatsSpec>,
    /// `KV_<bucket>`.
    stream: String,
    /// `$KV.<bucket>.<key>`.
    subject: String,
    me: String,
    client: Option<Client>,
    bucket_ready: bool,
    /// The revision of this agent's last write of its lease.
    revision: Option<u64>,
    clock: ServerClock,
}

#[derive(Deserialize)]
struct PubAck {
    seq: u64,
}

#[derive(Deserialize)]
struct Got {
    message: Stored,
}

#[derive(Deserialize)]
struct Stored {
    seq: u64,
    time: String,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    hdrs: Option<String>,
}

impl NatsElection {
    pub fn for_source(spec: Arc<NatsSpec>, clock: ServerClock) -> NatsElection {
        let bucket = &spec.election_bucket;
        NatsElection {
            stream: format!("KV_{bucket}"),
            subject: format!("$KV.{bucket}.{}", lease_key(&spec.name)),
            me: agent_id(),
            spec,
            client: None,
            bucket_ready: false,
            revision: None,
            clock,
        }
    }

    fn fail(&self, e: impl std::fmt::Display) -> String {
        format!(
            "lease of {} in KV bucket {}: {e}",
            self.spec.name, self.spec.election_bucket
        )
    }

    /// The connection, and the bucket (a KV bucket's stream: one value per
    /// key, values dropped after [`LEASE`]) created when missing.
    async fn client(&mut self) -> Result<Client, String> {
        if self.client.is_none() {
            let client = connect(&self.spec, SharedEvents::default())
                .await
                .map_err(|e| e.to_string())?;
            self.client = Some(client);
        }
        let client = self.client.clone().expect("connected");
        if !self.bucket_ready {
            let bucket = &self.spec.election_bucket;
            let config = serde_json::json!({
                "name": self.stream,
                "description": "inboxwatch: which agent owns which source",
                "subjects": [format!("$KV.{bucket}.>")],
                "retention": "limits",
                "max_msgs_per_subject": 1,
                "max_age": LEASE.as_nanos() as u64,
                "storage": "file",
                "num_replicas": 1,
                "discard": "new",
                "allow_rollup_hdrs": true,
                "deny_delete": true,
                "allow_direct": true,
                "duplicate_window": LEASE.as_nanos() as u64,
            });
            let created: Result<serde_json::Value, _> = request(
                &client,
                format!("$JS.API.STREAM.CREATE.{}", self.stream),
                config.to_string(),
            )
            .await;
            match created {
                Ok(_) => {}
                // There already, made by another agent (or another version).
                Err(RequestError::Api(e)) if e.err_code == STREAM_NAME_IN_USE => {}
                Err(e) => return Err(self.fail(format!("cannot create the bucket: {e}"))),
            }
            self.bucket_ready = true;
        }
        Ok(client)
    }

    /// Writes the lease (`expected`: the revision it replaces, 0 for none),
    /// and reads the server's clock from it; `Ok(None)` when another write
    /// came first.
    async fn write(&mut self, expected: u64) -> Result<Option<u64>, String> {
        let client = self.client().await?;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string());
        let sent = SystemTime::now();
        let reply = client
            .request_with_headers(self.subject.clone(), headers, self.me.clone().into())
            .await
            .map_err(|e| self.fail(e))?;
        let acked = SystemTime::now();
        let ack = read_answer::<PubAck>(&reply.payload);
        match ack {
            Ok(a) => {
                if let Ok(Some(stored)) = self.get(&client, Some(a.seq)).await
                    && let Some(at) = parse_time(&stored.time)
                {
                    self.clock.record(sent, acked, at);
                }
                self.revision = Some(a.seq);
                Ok(Some(a.seq))
            }
            Err(RequestError::Api(e)) if e.err_code == WRONG_LAST_SEQUENCE => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The stored message at `seq`, or the key's last one.
    async fn get(&self, client: &Client, seq: Option<u64>) -> Result<Option<Stored>, String> {
        let body = match seq {
            Some(seq) => serde_json::json!({ "seq": seq }),
            None => serde_json::json!({ "last_by_subj": self.subject }),
        };
        match request::<Got>(
            client,
            format!("$JS.API.STREAM.MSG.GET.{}", self.stream),
            body.to_string(),
        )
        .await
        {
            Ok(g) => Ok(Some(g.message)),
            Err(RequestError::Api(e)) if e.err_code == super::client::NO_MESSAGE_FOUND => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Whose lease is there (with the revision a write must name).
    async fn holder(&mut self) -> Result<Holder, String> {
        let client = self.client().await?;
        let Some(stored) = self.get(&client, None).await? else {
            return Ok(Holder::Nobody(0));
        };
        let engine = base64::engine::general_purpose::STANDARD;
        let headers = stored
            .hdrs
            .and_then(|h| engine.decode(h).ok())
            .map(|h| String::from_utf8_lossy(&h).to_string())
            .unwrap_or_default();
        if headers.contains("KV-Operation: DEL") || headers.contains("KV-Operation: PURGE") {
            return Ok(Holder::Nobody(stored.seq));
        }
        let value = stored
            .data
            .and_then(|d| engine.decode(d).ok())
            .unwrap_or_default();
        Ok(if value == self.me.as_bytes() {
            Holder::Me(stored.seq)
        } else {
            Holder::Other
        })
    }

    fn forget(&mut self) {
        self.client = None;
        self.bucket_ready = false;
    }
}

/// Who holds a lease.
enum Holder {
    /// This agent, at this revision.
    Me(u64),
    Other,
    /// Nobody: never written or expired (0), or given up (the revision of
    /// its delete marker).
    Nobody(u64),
}

/// A JetStream answer: its body or its error.
fn read_answer<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, RequestError> {
    #[derive(Deserialize)]
    struct Answer {
        #[serde(default)]
        error: Option<super::client::ApiError>,
    }
    if let Ok(Answer { error: Some(e) }) = serde_json::from_slice::<Answer>(payload) {
        return Err(RequestError::Api(e));
    }
    serde_json::from_slice(payload).map_err(|e| {
        RequestError::Other(format!(
            "an answer that cannot be read ({e}): {}",
            String::from_utf8_lossy(payload)
        ))
    })
}

impl Lock for NatsElection {
    fn source(&self) -> &str {
        &self.spec.name
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn heartbeat(&self) -> Duration {
        HEARTBEAT
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        let result = match self.holder().await {
            Ok(Holder::Me(rev) | Holder::Nobody(rev)) => self.write(rev).await,
            Ok(Holder::Other) => Ok(None),
            Err(e) => Err(e),
        };
        let result = result.inspect_err(|_| self.forget())?;
        debug!(source = %self.spec.name, won = result.is_some(), "Contested the lease.");
        Ok(result.is_some())
    }

    async fn renew(&mut self) -> Result<bool, String> {
        let Some(rev) = self.revision else {
            return Ok(false);
        };
        match self.write(rev).await {
            Ok(Some(_)) => Ok(true),
            // Another write came between: the lease expired and another
            // agent took it (or this agent's own write whose answer was lost).
            Ok(None) => match self.holder().await? {
                Holder::Me(rev) => Ok(self.write(rev).await?.is_some()),
                _ => {
                    self.revision = None;
                    Ok(false)
                }
            },
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }

    async fn abandon(&mut self) {
        // The lease may still be this agent's: the next try finds its own
        // value and renews it.
        self.forget();
    }

    async fn release(&mut self) {
        if let (Some(rev), Some(client)) = (self.revision.take(), self.client.clone()) {
            // A delete marker, only over this agent's own last write.
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Expected-Last-Subject-Sequence", rev.to_string());
            headers.insert("KV-Operation", "DEL");
            match client
                .request_with_headers(self.subject.clone(), headers, bytes::Bytes::new())
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| read_answer::<PubAck>(&r.payload).map_err(|e| e.to_string()))
            {
                Ok(_) => debug!(source = %self.spec.name, "Gave the lease up."),
                Err(e) => {
                    debug!(source = %self.spec.name, error = %e, "Giving the lease up failed.")
                }
            }
        }
        self.forget();
    }
}

/// The KV key of a source's lease: its name, base64url (a KV key takes only
/// letters, digits and `-_=/.`).
pub fn lease_key(source: &str) -> String {
    format!(
        "source.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(source.as_bytes())
    )
}

/// This agent, as its lease says: host, process and a random part (two
/// agents of one host are two holders).
fn agent_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{host}/{}/{:016x}", std::process::id(), fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_source_name_makes_a_valid_key() {
        for name in ["orders-js", "a b/c.*>", "ä"] {
            let key = super::lease_key(name);
            assert!(
                key.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_=/.".contains(c)),
                "{key}"
            );
        }
    }
}
