//! The Redis Streams source: each watched stream's consumer groups, their
//! lag in messages and in exact seconds (an entry id's milliseconds on the
//! broker's `TIME`), unacknowledged work, redeliveries and dead letters, as
//! the queue family (`sources::queue`). It only reads, but for its
//! election key (`election.rs`).
//!
//! One poll is a fetch (`fetch.rs`: a few pipelined round trips, whatever
//! the number of streams) and a pure step (`observe.rs`: what the answers
//! mean), then one snapshot of series (`queue::Memory::publish`).

mod client;
pub mod config;
mod doctor;
pub mod election;
pub mod fetch;
pub mod id;
mod kind;
pub mod observe;

pub use config::RedisStreamsSpec;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tracing::warn;

use self::client::{ClientError, connect};
use self::observe::Judge;
use super::poll_loop::{PollStats, Source, SourceError};
use super::queue::Memory;
use crate::telemetry::snapshot;

pub struct RedisStreamsSource {
    spec: Arc<RedisStreamsSpec>,
    conn: Option<MultiplexedConnection>,
    judge: Judge,
    memory: Memory,
    /// The last poll's streams and groups, for `doctor`.
    last: Option<fetch::Said>,
}

impl RedisStreamsSource {
    pub fn new(spec: RedisStreamsSpec) -> RedisStreamsSource {
        RedisStreamsSource {
            memory: Memory::new(spec.status_window),
            spec: Arc::new(spec),
            conn: None,
            judge: Judge::default(),
            last: None,
        }
    }

    async fn cycle(&mut self) -> Result<PollStats, SourceError> {
        let now = Instant::now();
        let spec = self.spec.clone();
        if self.conn.is_none() {
            let conn = connect(&spec.server, spec.timeout)
                .await
                .map_err(|e| self.error(e))?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let said = match fetch::fetch(conn, &spec).await {
            Ok(said) => said,
            Err(e) => {
                self.conn = None;
                return Err(self.error(e));
            }
        };
        let (seen, warnings) = self.judge.observe(&spec, &said);
        for w in warnings {
            warn!(source = %spec.name, "{}.", capitalised(&w.to_string()));
        }
        let owner = spec.owner.clone().unwrap_or_default();
        self.memory.publish(&spec.name, &owner, &seen, now);
        // Entries read: the first undelivered ones, the pending ones scanned
        // and the ids counted for a lag Redis could not say.
        let entries = said
            .streams
            .iter()
            .flat_map(|s| &s.groups)
            .map(|g| {
                u64::from(g.next_undelivered.is_some()) + g.scanned + g.counted_after.unwrap_or(0)
            })
            .sum();
        self.last = Some(said);
        Ok(PollStats {
            rows_read: entries,
            ..PollStats::default()
        })
    }

    /// A client error as the poll loop reports it, without the password.
    fn error(&self, e: ClientError) -> SourceError {
        let server = &self.spec.server;
        match e {
            ClientError::Connect(m) => SourceError::Connect {
                dsn: server.shown(),
                message: client::scrub(&m, server),
            },
            ClientError::Command(m) if m.contains("NOAUTH") => SourceError::Connect {
                dsn: server.shown(),
                message: client::no_auth(server),
            },
            ClientError::Command(m) => SourceError::Query(client::scrub(&m, server)),
        }
    }
}

/// `text` with its first letter in capitals (log lines are sentences).
fn capitalised(text: &str) -> String {
    let mut c = text.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

impl Source for RedisStreamsSource {
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
        // Down: the series go rather than freeze.
        snapshot::clear(&self.spec.name);
        self.conn = None;
    }
}
