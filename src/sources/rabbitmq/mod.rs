//! The RabbitMQ source: classic and quorum queues read through the
//! management HTTP API, exported as the `queue_*` family of every broker
//! kind (`sources::queue`) with `broker="rabbitmq"`.
//!
//! One poll is a fetch (`fetch.rs`: what the broker says, one request per vhost with
//! only the columns needed) and a pure step (`fetch::observe`: what it
//! means), handed to the shared [`Memory`], which publishes the family as
//! one snapshot:
//! * `queue_messages` = `messages`; `queue_messages_published_total` and
//!   `queue_redeliveries_total` the growth of `message_stats.publish` and
//!   `message_stats.redeliver`;
//! * one consumer row per queue (`consumer=""`: RabbitMQ's queue consumers
//!   have no shared name): lag = `messages_ready`, lag seconds = the
//!   broker's now (its answer's `Date`) −
//!   `head_message_timestamp` where the queue reports it (classic queues
//!   whose publishers set the `timestamp` property; never estimated): the
//!   age of the oldest message the queue holds, ready or delivered and not
//!   yet acknowledged (RabbitMQ's head includes its pending acks),
//!   unacked = `messages_unacknowledged`, consumers = `consumers`, the
//!   status rules' position = the acknowledgements (`ack`, `deliver_no_ack`,
//!   `get_no_ack`);
//! * `queue_dead_letters_total{reason="dead_letter_queue"}`: what entered
//!   the queue's dead-letter target (its `x-dead-letter-exchange` and
//!   routing key, from its arguments or its policy, resolved through the
//!   exchange's bindings) without a client publishing it — the growth of
//!   the target's enqueue count (`backing_queue_status.next_seq_id`, classic
//!   targets) less that of its publishes.
//!
//! Streams (with `streams_url`, over the stream protocol: `streams.rs`):
//! `queue_messages_published_total` the growth of the last message's
//! offset + 1 (offset-tracking entries between messages count: offsets,
//! not messages); one row per consumer named in `stream_consumers` that
//! stored an offset on the stream: lag = the last message's offset less
//! the stored one, lag seconds = the age of the chunk holding the first
//! offset it has not stored (exact to the chunk's millisecond), consumers =
//! the subscriptions attached to the stream (the stream management
//! plugin's list), the status rules' position = the stored offset.
//!
//! Which agent polls: with `[sources.election]`, the one whose AMQP
//! connection holds the source's exclusive queue (`election.rs`); without,
//! every agent configured with it (`kind.rs` says why).

mod client;
pub mod config;
mod doctor;
pub mod election;
pub mod fetch;
mod kind;
pub mod streams;

pub use config::RabbitSpec;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::client::{Api, ApiError};
use self::fetch::{DeadLetterMemory, FetchError, StreamConns};
use self::streams::StreamError;
use super::poll_loop::{PollStats, Source, SourceError};
use crate::sources::queue::Memory;
use crate::telemetry::snapshot;

pub struct RabbitSource {
    spec: Arc<RabbitSpec>,
    api: Api,
    memory: Memory,
    dead: DeadLetterMemory,
    streams: StreamConns,
}

impl RabbitSource {
    pub fn new(spec: RabbitSpec) -> RabbitSource {
        let api = Api::new(&spec, spec.timeout);
        RabbitSource {
            memory: Memory::new(spec.status_window),
            dead: DeadLetterMemory::default(),
            streams: StreamConns::default(),
            api,
            spec: Arc::new(spec),
        }
    }

    async fn cycle(&mut self) -> Result<PollStats, SourceError> {
        let read = fetch::fetch(&self.api, &self.spec, &mut self.streams)
            .await
            .map_err(source_error)?;
        let now = Instant::now();
        let wall = wall_now();
        let seen = fetch::observe(&read, &self.spec.queues, &mut self.dead, wall);
        let owner = self.spec.owner.clone().unwrap_or_default();
        self.memory.publish(&self.spec.name, &owner, &seen, now);
        Ok(PollStats {
            rows_read: read.vhosts.iter().map(|v| v.rows.len() as u64).sum(),
            notes: read
                .refused
                .iter()
                .map(|v| refused_note(v, &self.spec.username))
                .chain(read.stream_notes.iter().cloned())
                .collect(),
        })
    }
}

/// The agent's clock, in seconds since the epoch.
pub(crate) fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What the card says of a vhost the user may not read.
pub(crate) fn refused_note(vhost: &str, user: &str) -> String {
    format!(
        "vhost \"{vhost}\" is not watched: user \"{user}\" has no permissions there \
         (empty ones suffice: rabbitmqctl set_permissions -p '{vhost}' '{user}' '' '' '')"
    )
}

/// A failed request as the poll loop reports it: the URL asked and why,
/// never the password.
fn source_error(e: FetchError) -> SourceError {
    let e = match e {
        FetchError::Api(e) => e,
        FetchError::Streams(
            StreamError::Connection { at, message } | StreamError::Refused { at, message, .. },
        ) => {
            return SourceError::Connect { dsn: at, message };
        }
    };
    match e {
        ApiError::Unreachable { url, cause } => SourceError::Connect {
            dsn: url,
            message: cause,
        },
        ApiError::Timeout { url, timeout } => SourceError::Connect {
            dsn: url,
            message: format!("no answer within {timeout:?}"),
        },
        ApiError::Unauthorized { url } => SourceError::Connect {
            dsn: url,
            message: "401 Unauthorized: the management API refused the username and password"
                .into(),
        },
        e => SourceError::Query(e.to_string()),
    }
}

impl Source for RabbitSource {
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
        // Down: the series go rather than freeze; the counters' baselines
        // stay for when the broker is back.
        snapshot::clear(&self.spec.name);
    }
}
