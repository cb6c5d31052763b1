//! A Kafka cluster as a kind of source: its entry, its election (a group of
//! the agents' own on the watched cluster), what its poll reads, its
//! `doctor` checks. It keeps no event rows, so it offers no lookups (`trace`
//! skips it); it offers its dead-letter topics, whose latest records
//! `dead-letters` and the dead-letter page list, and sends them back
//! (`dead-letters replay --topic`).

use tracing::{info, warn};

use super::config::{KafkaSpec, RawKafka, validate};
use super::election::KafkaElection;
use super::shards::Assignment;
use super::{KafkaSource, card, doctor};
use crate::card::{Card, Past};
use crate::dsn::Dialect;
use crate::sources::common::{Common, RawCommon};
use crate::sources::kind::{
    ActionError, Answer, DeadLetterTopics, DeadRecords, Finding, Kind, ReplayRecord, ReplayRun,
    ReplaySender, Runtime, TopicReplay, TopicSelection,
};
use crate::telemetry::values::Reading;
use crate::validation::Validator;

impl Kind for KafkaSpec {
    const KIND: &'static str = "kafka";
    type Raw = (RawCommon, RawKafka);

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        validate(v, key, name, raw)
    }

    fn common(&self) -> &Common {
        &self.common
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
        let election = KafkaElection::for_source(&self);
        // A split source reads its shards when each ownership term starts:
        // they change only through a rebalance, which ends the term.
        let slot = self.shards.is_split().then(|| election.slot());
        let leader = rt.elect(election);
        let name = self.name.clone();
        rt.spawn_loop(
            &name,
            move || {
                let share = slot.as_ref().map(|s| {
                    s.get().unwrap_or(Assignment {
                        mine: Vec::new(),
                        of: 1,
                    })
                });
                KafkaSource::new(self.clone(), share)
            },
            leader,
        );
        Ok(())
    }

    fn reads(&self) -> String {
        format!(
            "each poll reads the metadata and end offsets of the watched topics, the committed \
             offsets of the watched consumer groups, and the record at each lagging committed \
             offset for its timestamp (once per offset){}",
            if self.per_topic {
                ", summed per topic"
            } else {
                ""
            }
        )
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

    fn dead_letter_topics(&self) -> Option<&dyn DeadLetterTopics> {
        Some(self)
    }

    fn topic_replay(&self) -> Option<&dyn TopicReplay> {
        Some(self)
    }
}

impl TopicReplay for KafkaSpec {
    fn audit_table(&self) -> Option<(Dialect, &str)> {
        let actions = self.actions.as_deref()?;
        Some((actions.audit_dialect()?, actions.audit_table.as_str()))
    }

    fn select<'a>(
        &'a self,
        selection: &'a TopicSelection,
    ) -> Answer<'a, Result<Vec<ReplayRecord>, ActionError>> {
        Box::pin(super::replay::select(self, selection))
    }

    fn open<'a>(
        &'a self,
        run: &'a ReplayRun,
    ) -> Answer<'a, Result<Box<dyn ReplaySender + 'a>, ActionError>> {
        Box::pin(async move {
            let sender = super::replay::open(self, run).await?;
            Ok(Box::new(sender) as Box<dyn ReplaySender + 'a>)
        })
    }
}

impl DeadLetterTopics for KafkaSpec {
    fn dead_letter_records(
        &self,
        per_partition: usize,
        total: usize,
    ) -> Answer<'_, Result<DeadRecords, String>> {
        Box::pin(super::dead_letters::dead_letter_records(
            self,
            per_partition,
            total,
        ))
    }
}
