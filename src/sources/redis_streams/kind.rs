//! Redis Streams consumer groups as a kind of source: its entry, its
//! election (a key with an expiry on the watched server), what its poll
//! reads, its `doctor` checks and its card (the queue family's). It keeps
//! no event rows and offers nothing beyond polling.

use tracing::info;

use super::config::{RawRedisStreams, RedisStreamsSpec, Streams, validate};
use super::election::RedisElection;
use super::{RedisStreamsSource, doctor};
use crate::card::{Card, Past};
use crate::sources::common::{Common, RawCommon};
use crate::sources::kind::{Finding, Kind, Runtime};
use crate::sources::queue;
use crate::telemetry::values::Reading;
use crate::validation::Validator;

impl Kind for RedisStreamsSpec {
    const KIND: &'static str = "redis_streams";
    type Raw = (RawCommon, RawRedisStreams);

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        validate(v, key, name, raw)
    }

    fn common(&self) -> &Common {
        &self.common
    }

    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        queue::export_objectives(&self.common);
        info!(source = %self.name, server = %self.server.shown(), "Watching Redis streams.");
        let leader = rt.elect(RedisElection::for_source(&self));
        let name = self.name.clone();
        rt.spawn_loop(&name, move || RedisStreamsSource::new(self.clone()), leader);
        Ok(())
    }

    fn reads(&self) -> String {
        let which = match &self.streams {
            Streams::Named(names) => format!("of {} named streams", names.len()),
            Streams::Pattern(p) => format!("of the streams SCAN finds for \"{p}\""),
        };
        format!(
            "each poll reads TIME, XINFO STREAM and XINFO GROUPS {which} (pipelined), then per \
             group the XPENDING summary, the first entry after its last-delivered id, and at \
             most {} pending entries for their delivery counts",
            self.redelivery_scan_limit
        )
    }

    fn describe(&self) -> String {
        format!("redis_streams, {}", self.server.shown())
    }

    async fn doctor(&self) -> Vec<Finding> {
        doctor::check(self).await
    }

    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        queue::card(values, past)
    }
}
