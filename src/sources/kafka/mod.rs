//! The Kafka source: consumer-group lag in messages and in exact seconds,
//! group status, dead-letter and retry topics — read with the agent's own
//! client, which never joins a watched group or commits an offset.
//!
//! One cycle is a fetch (`fetch.rs`: what the brokers say) and a pure step
//! (`series.rs`: what it means):
//! 1. `Metadata` for every topic (brokers, partition leaders);
//! 2. `ListOffsets` (latest) per leader broker, every watched partition in one
//!    request: the high watermarks;
//! 3. `ListGroups` per broker (v5: with each group's type), `FindCoordinator`
//!    for groups whose coordinator is not known yet, then per coordinator
//!    `DescribeGroups` (classic groups) or `ConsumerGroupDescribe` (KIP-848
//!    consumer groups) and `OffsetFetch` for up to 100 groups at once;
//! 4. for every partition with lag, the record at the committed offset is
//!    fetched (in batches per leader, at most `read_concurrency` requests in
//!    flight) and its timestamp gives the lag in seconds; the timestamp is
//!    cached per (topic, partition, committed offset);
//! 5. status, dead-letter and retry counters, and one snapshot of series.
//!
//! A leader or coordinator that moved is asked again within the cycle; a
//! broker that is gone makes its partitions unavailable and its groups
//! unreadable for the cycle while the rest completes (`fetch.rs`).
//!
//! Which agent reads a cluster is decided apart from the cycle, by a group
//! of the agents' own (`election.rs`, which does send `FindCoordinator`).

mod audit;
mod card;
pub mod client;
pub mod config;
pub mod dead_letters;
mod doctor;
pub mod election;
pub mod fetch;
mod kind;
pub mod oauth;
pub mod records;
pub mod replay;
pub mod scram;
pub mod series;
pub mod shards;

pub use config::KafkaSpec;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::client::Connector;
use self::fetch::{Fetcher, Protocol, Retry};
use self::series::{Memory, Settings};
use self::shards::Assignment;
use super::poll_loop::{PollStats, Source, SourceError};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot::{self, Sample};
use tracing::info;

pub struct KafkaSource {
    spec: Arc<KafkaSpec>,
    fetcher: Fetcher,
    settings: Settings,
    memory: Memory,
    /// The last cycle's groups: protocol, members and group epoch (for
    /// `doctor`).
    groups: BTreeMap<String, (Protocol, Option<usize>, Option<i32>)>,
    /// The shards this agent exports this term (`None`: not split, all).
    share: Option<Assignment>,
}

impl KafkaSource {
    /// A source that reads the groups of `share` (`None`: every group).
    pub fn new(spec: KafkaSpec, share: Option<Assignment>) -> KafkaSource {
        // A broker that does not answer a new connection costs at most a
        // quarter of the cycle, so the rest of the cycle still completes.
        let connector = Connector::new(
            spec.client_id.clone(),
            spec.security.clone(),
            spec.timeout.min(Duration::from_secs(10)),
        )
        .with_connect_timeout((spec.timeout / 4).min(Duration::from_secs(5)));
        let spec = Arc::new(spec);
        let mut settings = Settings::new(&spec);
        settings.topic_series = share.as_ref().is_none_or(Assignment::owns_topics);
        if let Some(share) = &share {
            info!(source = %spec.name, shards = %share.describe(), topic_series = settings.topic_series, "Exporting this agent's shards of the consumer groups.");
        }
        KafkaSource {
            fetcher: Fetcher::new(spec.clone(), connector, share.clone()),
            settings,
            memory: Memory::default(),
            groups: BTreeMap::new(),
            share,
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
        // A record written while the cycle ran may be stamped after `wall_ms`
        // without any clock skew: only a timestamp later than the end of the
        // fetch is in the future.
        let fetched_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let future = self.memory.new_future_timestamps(&said, fetched_ms);
        metrics::counter!(metric::KAFKA_FUTURE_TIMESTAMPS, "source" => self.spec.name.clone())
            .increment(future);
        // Every reason's series exists from the first cycle (at 0), so that the
        // first retry shows in `rate()`.
        for why in Retry::ALL {
            metrics::counter!(metric::KAFKA_CYCLE_RETRIES, "source" => self.spec.name.clone(), "reason" => why.as_str())
                .increment(said.retries.of(why));
        }
        self.groups = said
            .groups
            .iter()
            .map(|(name, g)| (name.clone(), (g.protocol, g.members, g.epoch)))
            .collect();
        let mut out = snapshot::Builder::default();
        let mut groups = card::Groups::default();
        self.memory.samples(
            &self.settings,
            &said,
            now,
            wall_ms,
            &mut |name, labels, value| {
                groups.add_labels(name, labels, value);
                out.push_labels(name, labels, value);
            },
        );
        let mut notes = Vec::new();
        if let Some(share) = &self.share {
            out.push(Sample {
                name: metric::KAFKA_SHARDS,
                labels: vec![("source", self.spec.name.clone())],
                value: share.mine.len() as f64,
            });
            notes.push(format!(
                "split into shards by consumer group: this agent exports {} ({} groups){}",
                share.describe(),
                self.groups.len(),
                if self.settings.topic_series {
                    ", and the topic series"
                } else {
                    "; the topic series are shard 0's"
                }
            ));
        }
        out.keep(groups);
        snapshot::publish(&self.spec.name, out);
        Ok(PollStats {
            rows_read: reads,
            notes,
        })
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
