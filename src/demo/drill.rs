//! The fault drills of `inboxwatch demo --drill NAME`: one fault injected into
//! the simulated consumer from [`FAULT_START`] after the start for a fixed
//! period, so that a team sees, before going live, that each failure mode
//! moves a metric and an alert (docs/drills.md).

use std::time::Duration;

/// When every drill's fault starts, after the simulation's start: long enough
/// for a baseline in Prometheus, short enough for a test.
pub const FAULT_START: Duration = Duration::from_secs(30);

/// One failure mode the simulated consumer can be put through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drill {
    /// The consumer is killed right after the database commit of an attempt.
    KillAfterCommit,
    /// Acknowledgements time out: completed events are delivered again.
    AckTimeout,
    /// The same message is delivered to two consumers at once.
    ConcurrentDelivery,
    /// The downstream slows down and answers 429.
    DownstreamThrottling,
    /// A batch of dead letters, fixed and replayed as `dead-letters replay` does.
    DeadLetterReplay,
    /// A partition rebalance: the workers pause, then resume.
    Rebalance,
    /// One ordering key's events fail until the key is parked.
    PoisonKey,
}

/// What a drill does and what to watch, as printed and documented.
#[derive(Debug, Clone, Copy)]
pub struct DrillInfo {
    pub drill: Drill,
    /// The name on the command line.
    pub name: &'static str,
    /// What the consumer does during the fault.
    pub consumer: &'static str,
    /// The metric (signal) that moves.
    pub signal: &'static str,
    /// The alert of alerts/inboxwatch.rules.yml that goes pending.
    pub alert: &'static str,
    /// Its section of docs/runbooks.md (the anchor).
    pub runbook: &'static str,
    /// How long the fault lasts.
    pub length: Duration,
    /// Within how long of the fault's start the alert goes pending, at most
    /// (with Prometheus scraping and evaluating every second or two).
    pub pending_within: Duration,
}

/// Every drill, in the order `--drill list` prints them.
pub const DRILLS: &[DrillInfo] = &[
    DrillInfo {
        drill: Drill::KillAfterCommit,
        name: "kill-after-commit",
        consumer: "the consumer is killed every 10 s right after committing an attempt: the attempts in flight \
                   stay in processing until the restarted consumer's 25 s lease reclaims them, \
                   and the broker redelivers what was committed but not acknowledged",
        signal: "inbox_stuck_messages",
        alert: "InboxStuckMessages",
        runbook: "inboxstuckmessages",
        length: Duration::from_secs(40),
        pending_within: Duration::from_secs(45),
    },
    DrillInfo {
        drill: Drill::AckTimeout,
        name: "ack-timeout",
        consumer: "acknowledgements time out: 40 % of the completed events are delivered \
                   again 1-5 s after they succeeded",
        signal: "inbox_duplicate_deliveries_total{phase=\"after_completion\"}",
        alert: "InboxAckFailures",
        runbook: "inboxackfailures",
        length: Duration::from_secs(60),
        pending_within: Duration::from_secs(45),
    },
    DrillInfo {
        drill: Drill::ConcurrentDelivery,
        name: "concurrent-delivery",
        consumer: "35 % of the new events are delivered a second time within 150 ms, while the \
                   first delivery is still pending or processing; the idempotency guard rejects \
                   the second",
        signal: "inbox_duplicate_deliveries_total{phase=\"in_flight\"}",
        alert: "InboxDuplicateRatioHigh",
        runbook: "inboxduplicateratiohigh",
        length: Duration::from_secs(60),
        pending_within: Duration::from_secs(45),
    },
    DrillInfo {
        drill: Drill::DownstreamThrottling,
        name: "downstream-throttling",
        consumer: "the downstream answers 85 % of the calls with 429 Too Many Requests and the \
                   rest 4x slower; throttled attempts are retried with backoff, never \
                   dead-lettered",
        signal: "inbox_attempt_failures_total{error_class=\"throttled\"}",
        alert: "InboxRetryStorm",
        runbook: "inboxretrystorm",
        length: Duration::from_secs(45),
        pending_within: Duration::from_secs(50),
    },
    DrillInfo {
        drill: Drill::DeadLetterReplay,
        name: "dead-letter-replay",
        consumer: "a bad deploy dead-letters a batch of 60 events; 20 s later the cause is fixed \
                   and the batch is replayed (dead letters back to pending, with an audit row \
                   each, as `inboxwatch dead-letters replay` does) and completes",
        signal: "inbox_messages_completed_total{outcome=\"dead_lettered\"}",
        alert: "InboxDeadLetterSpike",
        runbook: "inboxdeadletterspike",
        length: Duration::from_secs(20),
        pending_within: Duration::from_secs(40),
    },
    DrillInfo {
        drill: Drill::Rebalance,
        name: "rebalance",
        consumer: "partitions are revoked: the workers pause (deliveries go on) for the \
                   fault's length, then resume and drain the backlog",
        signal: "source:inbox_time_to_drain_seconds:rate5m (backlog / (completions - arrivals)), \
                 inbox_oldest_unprocessed_age_seconds",
        alert: "InboxBacklogNotDraining",
        runbook: "inboxbacklognotdraining",
        length: Duration::from_secs(45),
        pending_within: Duration::from_secs(50),
    },
    DrillInfo {
        drill: Drill::PoisonKey,
        name: "poison-key",
        consumer: "one ordering key gets an event every 2 s whose first version fails every \
                   attempt; after 4 attempts the key is parked (its later versions moved aside \
                   behind it) and at the fault's end it is fixed and replayed in version order",
        signal: "inbox_parked_keys, inbox_parked_messages",
        alert: "InboxParkedKeys",
        runbook: "inboxparkedkeys",
        length: Duration::from_secs(60),
        pending_within: Duration::from_secs(30),
    },
];

impl Drill {
    /// Its description.
    pub fn info(self) -> &'static DrillInfo {
        DRILLS
            .iter()
            .find(|d| d.drill == self)
            .expect("every drill is in DRILLS")
    }
}

/// The drill named `name`, or the error that lists the drills.
pub fn find(name: &str) -> Result<&'static DrillInfo, String> {
    DRILLS.iter().find(|d| d.name == name).ok_or_else(|| {
        format!(
            "--drill: unknown drill \"{name}\" (expected one of {}, or list)",
            names().join(", ")
        )
    })
}

/// The drills' names.
pub fn names() -> Vec<&'static str> {
    DRILLS.iter().map(|d| d.name).collect()
}

/// `inboxwatch demo --drill list`: one paragraph per drill.
pub fn listing() -> String {
    let mut out = format!(
        "Each drill injects one fault into the demo's consumer {} s after the start; \
         see docs/drills.md.\n\n",
        FAULT_START.as_secs()
    );
    for d in DRILLS {
        out.push_str(&format!(
            "{}\n  fault:  {} s from +{} s\n  what:   {}\n  signal: {}\n  alert:  {} \
             (pending within {} s of the fault's start; runbook: docs/runbooks.md#{})\n\n",
            d.name,
            d.length.as_secs(),
            FAULT_START.as_secs(),
            d.consumer,
            d.signal,
            d.alert,
            d.pending_within.as_secs(),
            d.runbook
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drill_is_listed_once_with_its_alert() {
        let text = listing();
        for d in DRILLS {
            assert_eq!(
                text.matches(&format!("\n{}\n", d.name)).count(),
                1,
                "{}",
                d.name
            );
            assert!(
                text.contains(&format!("alert:  {} ", d.alert)),
                "{}",
                d.name
            );
            assert_eq!(find(d.name).expect("found").drill, d.drill);
            assert_eq!(d.drill.info().name, d.name);
            assert_eq!(d.runbook, d.alert.to_lowercase());
        }
        assert_eq!(DRILLS.len(), 7);
    }

    #[test]
    fn an_unknown_drill_names_every_drill() {
        let e = find("kill").expect_err("unknown");
        assert!(e.starts_with("--drill: unknown drill \"kill\""), "{e}");
        for name in names() {
            assert!(e.contains(name), "{e} lacks {name}");
        }
    }
}
