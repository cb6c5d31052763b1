//! Dead letters as JetStream tells them: a message a consumer gave up on
//! after `max_deliver` attempts, and one its client terminated (`AckTerm`),
//! each announced once by an advisory on
//! `$JS.EVENT.ADVISORY.CONSUMER.{MAX_DELIVERIES,MSG_TERMINATED}.<stream>.<consumer>`.
//! The server keeps no count of them: they are counted while the source
//! listens (two wildcard subscriptions, whatever the number of consumers).
//! Time it did not listen while it owned the source — the connection down,
//! the source reset after a failed poll — is recorded as a counting gap
//! (`inboxwatch_counting_gaps_total{reason="advisories"}`), never silently.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_nats::Client;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::telemetry::catalogue as metric;

/// The `reason` of `inboxwatch_counting_gaps_total` for time the
/// advisories were not listened to.
pub const GAP_REASON: &str = "advisories";

const SUBJECTS: [(&str, &str); 2] = [
    (
        "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>",
        "max_deliveries",
    ),
    ("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", "terminated"),
];

/// Counts per (stream, consumer, reason) since the last [`Listener::take`].
type Counts = Arc<Mutex<BTreeMap<(String, String, &'static str), u64>>>;

/// The stream sequences each consumer gave up on, heard so far.
type GivenUp = Arc<Mutex<BTreeMap<(String, String), BTreeSet<u64>>>>;

/// The two subscriptions and what they counted.
pub struct Listener {
    counts: Counts,
    given_up: GivenUp,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Deserialize)]
struct Advisory {
    stream: String,
    consumer: String,
    #[serde(default)]
    stream_seq: Option<u64>,
}

impl Listener {
    /// Subscribes to both advisories on `client`.
    pub async fn subscribe(client: &Client) -> Result<Listener, String> {
        let counts: Counts = Arc::default();
        let given_up: GivenUp = Arc::default();
        let mut tasks = Vec::new();
        for (subject, reason) in SUBJECTS {
            let mut sub = client
                .subscribe(subject)
                .await
                .map_err(|e| format!("cannot subscribe to {subject}: {e}"))?;
            let counts = counts.clone();
            let given_up = given_up.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    match serde_json::from_slice::<Advisory>(&m.payload) {
                        Ok(a) => {
                            if let Some(seq) = a.stream_seq {
                                given_up
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .entry((a.stream.clone(), a.consumer.clone()))
                                    .or_default()
                                    .insert(seq);
                            }
                            *counts
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .entry((a.stream, a.consumer, reason))
                                .or_default() += 1;
                        }
                        Err(e) => warn!(subject = %m.subject, error = %e, "An advisory that cannot be read."),
                    }
                }
            }));
        }
        // The subscriptions are in place on the server once it answered a
        // round trip after them.
        client
            .flush()
            .await
            .map_err(|e| format!("cannot subscribe to the advisories: {e}"))?;
        Ok(Listener {
            counts,
            given_up,
            tasks,
        })
    }

    /// The sequences `consumer` of `stream` gave up on above `floor` (those
    /// at or below it are forgotten: the ack floor passed them).
    pub fn given_up_above(&self, stream: &str, consumer: &str, floor: u64) -> BTreeSet<u64> {
        let mut all = self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        let key = (stream.to_string(), consumer.to_string());
        let Some(set) = all.get_mut(&key) else {
            return BTreeSet::new();
        };
        *set = set.split_off(&(floor + 1));
        if set.is_empty() {
            all.remove(&key);
            return BTreeSet::new();
        }
        set.clone()
    }

    /// What was counted since the last call.
    pub fn take(&self) -> BTreeMap<(String, String, &'static str), u64> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Records that the advisories of `source` were not listened to from
/// `from` to `to`.
pub fn record_gap(source: &str, from: SystemTime, to: SystemTime) {
    let seconds = to.duration_since(from).unwrap_or_default().as_secs_f64();
    metrics::counter!(metric::COUNTING_GAPS, "source" => source.to_string(), "reason" => GAP_REASON)
        .increment(1);
    metrics::counter!(metric::COUNTING_GAP_SECONDS, "source" => source.to_string())
        .increment(seconds.ceil() as u64);
    warn!(
        source = %source,
        reason = GAP_REASON,
        from = %humantime::format_rfc3339_millis(from),
        to = %humantime::format_rfc3339_millis(to),
        seconds = format_args!("{seconds:.1}"),
        "Dead-letter advisories were not listened to for a while: messages given up on then are not counted."
    );
}

/// The gap series exist at 0 from the start, so that the first gap shows
/// in `increase()`.
pub fn register_gaps(source: &str) {
    metrics::counter!(metric::COUNTING_GAPS, "source" => source.to_string(), "reason" => GAP_REASON)
        .increment(0);
}
