//! RabbitMQ as a kind of source: its entry, its election (none of its own:
//! see [`RabbitSpec::start`]), what its poll reads, its `doctor` checks and
//! the queue kinds' status card.

use tracing::{info, warn};

use super::config::{RabbitSpec, RawRabbit, validate};
use super::election::RabbitElection;
use super::{RabbitSource, doctor};
use crate::card::{Card, Past};
use crate::sources::common::{Common, RawCommon};
use crate::sources::kind::{Finding, Kind, Runtime};
use crate::sources::queue;
use crate::telemetry::values::Reading;
use crate::validation::Validator;

impl Kind for RabbitSpec {
    const KIND: &'static str = "rabbitmq";
    type Raw = (RawCommon, RawRabbit);

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        validate(v, key, name, raw)
    }

    fn common(&self) -> &Common {
        &self.common
    }

    /// With `[sources.election]`, the owner is the agent whose AMQP
    /// connection holds the source's exclusive queue (`election.rs`).
    /// Without it the source is owned outright: a read-only (`monitoring`)
    /// user may declare no queue, and the management API offers no atomic
    /// create-if-absent to build a lock on; two agents given the same
    /// source then both export it, which the start line warns of.
    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        info!(source = %self.name, url = %self.management_url, "Watching RabbitMQ.");
        queue::export_objectives(&self.common);
        let leader = match &self.election {
            Some(url) => rt.elect(RabbitElection::for_source(&self, url)),
            None => {
                warn!(
                    source = %self.name,
                    "No [sources.election]: every agent configured with this RabbitMQ source polls and exports it; give it to one agent only, or configure the election."
                );
                rt.own_outright(&self.name)
            }
        };
        let name = self.name.clone();
        rt.spawn_loop(&name, move || RabbitSource::new(self.clone()), leader);
        Ok(())
    }

    fn reads(&self) -> String {
        let streams = match &self.streams {
            Some(url) => format!(
                "; over the stream protocol ({url}), each watched stream's last chunk and, per \
                 name in stream_consumers ({}), its stored offset and the chunk after it, and \
                 the subscriptions attached to the streams (/api/stream/consumers)",
                self.stream_consumers.len()
            ),
            None => String::new(),
        };
        format!(
            "each poll reads the management API: the vhosts, then each watched vhost's queues \
             in one request (columns {}), and the type and bindings of each dead-letter \
             exchange its queues name{streams}",
            super::fetch::COLUMNS
        )
    }

    fn describe(&self) -> String {
        format!("rabbitmq, management API {}", self.management_url)
    }

    async fn doctor(&self) -> Vec<Finding> {
        doctor::check(self).await
    }

    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        queue::card(values, past)
    }
}
