//! RabbitMQ as a kind of source: its entry, its election (none of its own:
//! see [`RabbitSpec::start`]), what its poll reads, its `doctor` checks and
//! the queue kinds' status card.

use tracing::{info, warn};

use super::config::{RabbitSpec, RawRabbit, validate};
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

    /// The source is owned outright: a read-only (`monitoring`) user can
    /// take no lock on the broker — the one atomic lock RabbitMQ has, an
    /// exclusive queue held on an AMQP connection, needs a user that may
    /// declare queues — and the management API offers no atomic
    /// create-if-absent. Two agents given the same source both export it
    /// (the same gauges twice, each with its own counter baselines), which
    /// the start line says.
    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        info!(source = %self.name, url = %self.management_url, "Watching RabbitMQ.");
        warn!(
            source = %self.name,
            "A RabbitMQ source has no election: every agent configured with it polls and exports it; give it to one agent only."
        );
        queue::export_objectives(&self.common);
        let leader = rt.own_outright(&self.name);
        let name = self.name.clone();
        rt.spawn_loop(&name, move || RabbitSource::new(self.clone()), leader);
        Ok(())
    }

    fn reads(&self) -> String {
        format!(
            "each poll reads the management API: the vhosts, then each watched vhost's queues \
             ({} a page, columns {}), and the type and bindings of each dead-letter exchange \
             its queues name",
            super::fetch::PAGE_SIZE,
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
