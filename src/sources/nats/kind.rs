//! A NATS JetStream server as a kind of source: its entry, its election (a
//! lease in a KV bucket of the agents' own), what its poll reads, its
//! `doctor` checks, and the queue kinds' status card. It keeps no event
//! rows, so it offers no lookups.

use std::sync::Arc;

use tracing::{info, warn};

use super::clock::ServerClock;
use super::config::{NatsSpec, RawNats, validate};
use super::election::NatsElection;
use super::{NatsSource, doctor};
use crate::card::{Card, Past};
use crate::sources::common::{Common, RawCommon};
use crate::sources::kind::{Finding, Kind, Runtime};
use crate::sources::queue;
use crate::telemetry::values::Reading;
use crate::validation::Validator;

impl Kind for NatsSpec {
    const KIND: &'static str = "nats";
    type Raw = (RawCommon, RawNats);

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        validate(v, key, name, raw)
    }

    fn common(&self) -> &Common {
        &self.common
    }

    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        info!(source = %self.name, servers = %self.servers.join(","), "Watching NATS JetStream.");
        if self.tls.is_none()
            && matches!(
                self.auth,
                super::config::Auth::Password { .. } | super::config::Auth::Token(_)
            )
            && self.servers.iter().any(|s| s.starts_with("nats://"))
        {
            warn!(
                source = %self.name,
                "Credentials without [sources.tls]: they cross the network readable; use it only on a network you trust."
            );
        }
        queue::export_objectives(&self.common);
        let spec = Arc::new(self);
        let clock = ServerClock::default();
        let leader = rt.elect(NatsElection::for_source(spec.clone(), clock.clone()));
        let name = spec.name.clone();
        rt.spawn_loop(
            &name,
            move || NatsSource::new(spec.clone(), clock.clone()),
            leader,
        );
        Ok(())
    }

    fn reads(&self) -> String {
        "each poll reads the list of streams (256 to a request), the consumers of each watched \
         stream, and for each consumer whose position moved the stored time of the next message \
         it was not delivered and of the first above its ack floor (one message read each)"
            .into()
    }

    fn describe(&self) -> String {
        format!("nats, servers {}", self.servers.join(", "))
    }

    async fn doctor(&self) -> Vec<Finding> {
        doctor::check(self).await
    }

    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        queue::card(values, past)
    }
}
