//! A Kafka cluster as a kind of source: its entry, its election (a group of
//! the agents' own on the watched cluster), its `doctor` checks. It keeps no
//! event rows, so `trace` skips it; `dead-letters` reads the latest records
//! of its dead-letter topics.

use tracing::{info, warn};

use super::config::{KafkaSpec, RawKafka, validate};
use super::election::KafkaElection;
use super::{KafkaSource, card, doctor};
use crate::card::{Card, Past};
use crate::checks::Validator;
use crate::sources::kind::{DeadRecords, Finding, Kind, Runtime};
use crate::telemetry::values::Reading;

impl Kind for KafkaSpec {
    const KIND: &'static str = "kafka";
    type Raw = RawKafka;

    fn validate(raw: RawKafka, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        validate(v, key, name, &raw)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn owner(&self) -> &str {
        self.owner.as_deref().unwrap_or_default()
    }

    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        info!(source = %self.name, brokers = ?self.brokers, "Watching Kafka cluster.");
        if let Some(sasl) = &self.security.sasl
            && self.security.tls.is_none()
            && sasl.mechanism.sends_secret_in_clear()
        {
            warn!(
                source = %self.name,
                mechanism = sasl.mechanism.as_str(),
                "SASL without [sources.tls] (SASL_PLAINTEXT): the credentials cross the network readable; use it only on a network you trust."
            );
        }
        let leader = rt.elect(KafkaElection::for_source(&self));
        let name = self.name.clone();
        rt.spawn_loop(&name, move || KafkaSource::new(self.clone()), leader);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("kafka, brokers {}", self.brokers.join(", "))
    }

    async fn doctor(&self) -> Vec<Finding> {
        doctor::check(self).await
    }

    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        card::card(values, past)
    }

    fn reads_dead_letter_topics(&self) -> bool {
        true
    }

    async fn dead_letter_records(
        &self,
        per_partition: usize,
        total: usize,
    ) -> Result<DeadRecords, String> {
        super::dead_letters::dead_letter_records(self, per_partition, total).await
    }
}
