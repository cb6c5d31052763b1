//! One owner per Redis Streams source: a key of the agents' own on the
//! watched server, `inboxwatch:election:<source>` in the source's database,
//! holding the owner's token with an expiry. An agent takes it with
//! `SET key token NX PX lease` and renews it with a compare-and-set script
//! (the expiry is pushed only while the key still holds its own token); it
//! releases it with a compare-and-delete. An owner that stops renewing loses
//! the key when it expires, after [`LEASE`]; one whose renewal fails stops
//! exporting at once, well before. This key is the only thing the agent
//! ever writes to a watched Redis.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::client::connect;
use super::config::{RedisStreamsSpec, Server};
use crate::coordination::{HEARTBEAT, LEASE, Lock};

/// The prefix of the election keys.
pub const KEY_PREFIX: &str = "inboxwatch:election:";

/// Takes the key if free, or pushes its expiry if it holds this token:
/// 1 when this agent owns the source, 0 when another does.
const TAKE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"#;

/// Pushes the expiry only while the key holds this token.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Deletes the key only while it holds this token.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Longest wait for one election command (and for connecting).
const PATIENCE: Duration = Duration::from_secs(3);

pub struct RedisElection {
    source: String,
    key: String,
    token: String,
    server: Server,
    conn: Option<MultiplexedConnection>,
}

impl RedisElection {
    pub fn for_source(spec: &RedisStreamsSpec) -> RedisElection {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        RedisElection {
            source: spec.name.clone(),
            key: format!("{KEY_PREFIX}{}", spec.name),
            token: format!("{host}:{}:{:016x}", std::process::id(), fastrand::u64(..)),
            server: spec.server.clone(),
            conn: None,
        }
    }

    /// Runs one of the scripts on the key with this agent's token.
    async fn script(&mut self, script: &str) -> Result<i64, String> {
        if self.conn.is_none() {
            let conn = connect(&self.server, PATIENCE)
                .await
                .map_err(|e| e.to_string())?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let answer = redis::cmd("EVAL")
            .arg(script)
            .arg(1)
            .arg(&self.key)
            .arg(&self.token)
            .arg(LEASE.as_millis() as u64)
            .query_async::<i64>(conn)
            .await;
        answer.map_err(|e| {
            self.conn = None;
            super::client::scrub(&e.to_string(), &self.server)
        })
    }
}

impl Lock for RedisElection {
    fn source(&self) -> &str {
        &self.source
    }

    fn patience(&self) -> Duration {
        PATIENCE * 2
    }

    fn heartbeat(&self) -> Duration {
        HEARTBEAT
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        Ok(self.script(TAKE).await? == 1)
    }

    async fn renew(&mut self) -> Result<bool, String> {
        Ok(self.script(RENEW).await? == 1)
    }

    async fn abandon(&mut self) {
        // Keep the key: if it still holds this token when the server
        // answers again, TAKE keeps it without a handover.
        self.conn = None;
    }

    async fn release(&mut self) {
        let _ = tokio::time::timeout(PATIENCE, self.script(RELEASE)).await;
        self.conn = None;
    }
}
