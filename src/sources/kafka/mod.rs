//! The Kafka source: consumer-group lag in messages and in exact seconds,
//! group status, dead-letter and retry topics — read with the agent's own
//! client, which never joins a watched group or commits an offset.
//!
//! One cycle is a fetch (`fetch.rs`: what the brokers say) and a pure step
//! (`series.rs`: what it means):
//! 1. `Metadata` for every topic (brokers, partition leaders);
//! 2. `ListOffsets` (latest) per leader broker, every watched partition in one
//!    request: the high watermarks;
//! 3. `ListGroups` per broker (the broker that lists a group coordinates it,
//!    so no `FindCoordinator` is sent), then `DescribeGroups` and
//!    `OffsetFetch` per coordinator for all its groups at once;
//! 4. for every partition with lag, the record at the committed offset is
//!    fetched (in batches per leader, at most `read_concurrency` requests in
//!    flight) and its timestamp gives the lag in seconds; the timestamp is
//!    cached per (topic, partition, committed offset);
//! 5. status, dead-letter and retry counters, and one snapshot of series.
//!
//! Which agent reads a cluster is decided apart from the cycle, by a group
//! of the agents' own (`election.rs`, which does send `FindCoordinator`).

pub mod client;
pub mod config;
pub mod dead_letters;
mod doctor;
pub mod election;
pub mod fetch;
mod kind;
pub mod oauth;
pub mod records;
pub mod scram;
pub mod series;
pub mod status;

pub use config::KafkaSpec;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::client::Connector;
use self::fetch::Fetcher;
use self::series::{Memory, Settings};
use super::run::{PollStats, Source, SourceError};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot;

pub struct KafkaSource {
    spec: Arc<KafkaSpec>,
    fetcher: Fetcher,
    settings: Settings,
    memory: Memory,
}

impl KafkaSource {
    pub fn new(spec: KafkaSpec) -> KafkaSource {
        let connector = Connector::new(
            spec.client_id.clone(),
            spec.security.clone(),
            spec.timeout.min(Duration::from_secs(10)),
        );
        let spec = Arc::new(spec);
        KafkaSource {
            fetcher: Fetcher::new(spec.clone(), connector),
            settings: Settings::new(&spec),
            memory: Memory::default(),
            spec,
        }
    }

    async fn cycle(&mut self) -> Result<PollStats, SourceError> {
        let now = Instant::now();
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let said = self.fetcher.fetch().await?;
        let reads = said.record_reads;
        if reads > 0 {
            metrics::counter!(metric::KAFKA_RECORD_READS, "source" => self.spec.name.clone())
                .increment(reads);
        }
        let future = self.memory.new_future_timestamps(&said, wall_ms);
        metrics::counter!(metric::KAFKA_FUTURE_TIMESTAMPS, "source" => self.spec.name.clone())
            .increment(future);
        let mut out = snapshot::Builder::default();
        self.memory
            .samples(&self.settings, &said, now, wall_ms, &mut |s| out.push(s));
        snapshot::publish(&self.spec.name, out);
        Ok(PollStats { rows_read: reads })
    }
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
        self.fetcher.disconnect();
    }
}
