//! Who owns which source. When several agents watch the same source (a
//! DaemonSet), exactly one polls and exports it; the others stand by with
//! `inboxwatch_source_leader{source} 0` and take over when the owner goes.
//!
//! What decides is a [`Lock`] each kind provides (a lock of the watched
//! database for tables, `sources/table/lock.rs`; membership of a group of
//! the agents' own for Kafka, `sources/kafka/election.rs`); [`elect`] runs
//! any of them the same way.
//!
//! An owner whose polls cannot reach the source gives it up
//! ([`crate::health::Health::request_yield`]), so that an agent that can
//! poll it takes over.
//!
//! The owner renews every [`HEARTBEAT`]; a renewal that fails stops the export
//! at once, well before the lock's lease ([`LEASE`] for the database locks)
//! lets another agent in, so rates are never doubled.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::health::Health;
use crate::telemetry::catalogue as metric;

/// How often the owner renews its lock and a standby agent tries to take it.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a database keeps the lock of an owner that stopped answering.
pub const LEASE: Duration = Duration::from_secs(20);
/// Heartbeats an agent waits before it contests a source it gave up.
const YIELD_PAUSE: u32 = 3;
/// Head start an agent gives the others per source it already owns.
const SPREAD: Duration = Duration::from_secs(1);
/// Longest wait for one lock statement.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(3);

/// The sources this agent exports; read by `/metrics` to hide the others.
#[derive(Debug, Default)]
pub struct Leadership {
    led: Mutex<HashSet<String>>,
    contending: Mutex<HashSet<String>>,
    all: Mutex<HashSet<String>>,
}

impl Leadership {
    /// Registers a source as standing by.
    pub fn register(&self, source: &str) {
        lock(&self.all).insert(source.to_string());
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(0.0);
    }

    /// Records whether this agent owns `source` (`false`: another agent does).
    pub fn set(&self, source: &str, leader: bool) {
        if leader {
            lock(&self.led).insert(source.to_string());
            lock(&self.contending).remove(source);
        } else {
            lock(&self.led).remove(source);
            lock(&self.contending).remove(source);
        }
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(if leader {
            1.0
        } else {
            0.0
        });
    }

    /// Records that nobody can be seen to own `source`: its database cannot be
    /// reached. Its `inboxwatch_source_up 0` stays visible.
    pub fn set_contending(&self, source: &str) {
        lock(&self.led).remove(source);
        lock(&self.contending).insert(source.to_string());
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(0.0);
    }

    /// How many sources this agent owns.
    pub fn led_count(&self) -> usize {
        lock(&self.led).len()
    }

    /// The sources nobody can be seen to own from here (their database does not
    /// answer this agent): reported down, their other series stale.
    pub fn contending(&self) -> Vec<String> {
        lock(&self.contending).iter().cloned().collect()
    }

    /// The registered sources another agent owns (or may own: not yet contested).
    pub fn standing_by(&self) -> Vec<String> {
        let led = lock(&self.led).clone();
        let contending = lock(&self.contending).clone();
        lock(&self.all)
            .iter()
            .filter(|s| !led.contains(*s) && !contending.contains(*s))
            .cloned()
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the set itself stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes from a Prometheus text rendering every sample of the sources this
/// agent stands by for, except `inboxwatch_source_leader`, the counting-gap
/// counters (this agent's own record of its takeovers, born at 0 before the
/// first one so that `increase()` sees it) and `inboxwatch_source_info` (the
/// configuration it runs, which the alert rules join `owner` from). The
/// sources it cannot reach to contend for (`contending`) are hidden the same
/// way but keep `inboxwatch_source_up` (0: it says they are down from here):
/// what this agent counted while it owned one is stale once it lost the lock,
/// and another agent may count it now.
pub fn hide_standby(rendered: String, standing_by: &[String], contending: &[String]) -> String {
    if standing_by.is_empty() && contending.is_empty() {
        return rendered;
    }
    let needles = |sources: &[String]| -> Vec<(String, String)> {
        sources
            .iter()
            .map(|s| {
                let v = s
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                (format!("{{source=\"{v}\""), format!(",source=\"{v}\""))
            })
            .collect()
    };
    let (standing_by, contending) = (needles(standing_by), needles(contending));
    let of = |line: &str, needles: &[(String, String)]| {
        needles
            .iter()
            .any(|(a, b)| line.contains(a.as_str()) || line.contains(b.as_str()))
    };
    let mut out = String::with_capacity(rendered.len());
    for line in rendered.lines() {
        let kept_anyway = line.starts_with('#')
            || line.starts_with(metric::SOURCE_LEADER)
            || line.starts_with(metric::SOURCE_INFO)
            || line.starts_with(metric::COUNTING_GAPS)
            || line.starts_with(metric::COUNTING_GAP_SECONDS);
        let is_up = line
            .strip_prefix(metric::SOURCE_UP)
            .is_some_and(|rest| rest.starts_with([' ', '{']));
        let hidden = !kept_anyway && (of(line, &standing_by) || (!is_up && of(line, &contending)));
        if !hidden {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// What decides who owns a source: a lock that can be tried, renewed and
/// given up. Errors are messages fit for logs (no secrets).
pub trait Lock: Send + 'static {
    /// The source it decides.
    fn source(&self) -> &str;
    /// Longest wait for one operation before it counts as failed.
    fn patience(&self) -> Duration {
        STATEMENT_TIMEOUT
    }
    /// How often the owner renews and a standby tries.
    fn heartbeat(&self) -> Duration {
        HEARTBEAT
    }
    /// Tries once to take the lock; true when this agent now owns the source.
    fn try_acquire(&mut self) -> impl Future<Output = Result<bool, String>> + Send;
    /// Renews a held lock: `Ok(false)` when another agent now owns the
    /// source, an error when this one cannot tell (it must stop exporting).
    fn renew(&mut self) -> impl Future<Output = Result<bool, String>> + Send;
    /// Gives the lock up.
    fn release(&mut self) -> impl Future<Output = ()> + Send;
    /// Drops what a failed operation left behind, before trying again.
    fn abandon(&mut self) -> impl Future<Output = ()> + Send {
        self.release()
    }
}

/// Keeps `lock` for `source`: takes it when free, renews it while held, and
/// reports ownership on `leader` until `cancel`, then releases it.
pub async fn elect<L: Lock>(
    mut lock: L,
    leadership: std::sync::Arc<Leadership>,
    health: std::sync::Arc<Health>,
    leader: watch::Sender<Option<bool>>,
    cancel: CancellationToken,
) {
    let source = lock.source().to_string();
    let patience = lock.patience();
    let heartbeat = lock.heartbeat();
    // A database this agent cannot reach is reported down here: nobody may
    // own the source then, and someone has to say so.
    let unreachable = |error: String| {
        leadership.set_contending(&source);
        metrics::gauge!(metric::SOURCE_UP, "source" => source.clone()).set(0.0);
        health.set_down(&source, error);
    };
    let mut held = false;
    // A random start spreads the first attempts.
    let mut delay = heartbeat.mul_f64(fastrand::f64() * 0.2);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        if held && health.take_yield(&source) {
            // The source cannot be polled from here (its polls cannot connect
            // or time out): holding it would keep an agent that can from
            // taking over. It is tried again after the others had a chance.
            held = false;
            let _ = leader.send(None);
            leadership.set_contending(&source);
            warn!(source = %source, "Cannot poll the source from here; gave its lock up so that another agent can take it.");
            lock.release().await;
            delay = heartbeat * YIELD_PAUSE;
            continue;
        }
        if held {
            match tokio::time::timeout(patience, lock.renew()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    held = false;
                    health.saw_other_owner(&source);
                    leadership.set(&source, false);
                    let _ = leader.send(Some(false));
                    info!(source = %source, "Another agent owns the source now; standing by.");
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(e)) => e,
                        _ => format!("no answer within {patience:?}"),
                    };
                    held = false;
                    let _ = leader.send(None);
                    warn!(source = %source, error = %error, "Lost the source's lock; exporting stopped.");
                    unreachable(format!("lost the source's lock: {error}"));
                    lock.abandon().await;
                }
            }
            delay = heartbeat;
        } else {
            // An agent that already owns sources gives the others a head start,
            // so that sources spread over the agents from the first round on.
            let owned = leadership.led_count() as u32;
            if owned > 0 {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(SPREAD * owned) => {}
                }
            }
            match tokio::time::timeout(patience, lock.try_acquire()).await {
                Ok(Ok(true)) => {
                    held = true;
                    // A request to give the source up made before this term is stale.
                    health.take_yield(&source);
                    leadership.set(&source, true);
                    let _ = leader.send(Some(true));
                    info!(source = %source, "Took the source's lock; exporting it.");
                }
                Ok(Ok(false)) => {
                    health.saw_other_owner(&source);
                    leadership.set(&source, false);
                    leader.send_if_modified(|v| v.replace(false) != Some(false));
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(e)) => e,
                        _ => format!("no answer within {patience:?}"),
                    };
                    warn!(source = %source, error = %error, "Could not contest the source's lock.");
                    leader.send_if_modified(|v| v.take().is_some());
                    unreachable(format!(
                        "cannot reach the database to contest the source's lock: {error}"
                    ));
                    lock.abandon().await;
                }
            }
            delay = heartbeat.mul_f64(1.0 + 0.2 * fastrand::f64());
        }
    }
    if held {
        let _ = leader.send(Some(false));
        leadership.set(&source, false);
        info!(source = %source, "Released the source's lock.");
    }
    lock.release().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_sources_are_hidden_except_their_leader_gauge_gap_counters_and_info() {
        let text = "# HELP a x\n\
                    inbox_backlog_messages{source=\"a\",event_type=\"t\",status=\"pending\"} 1\n\
                    inbox_backlog_messages{source=\"ab\",event_type=\"t\",status=\"pending\"} 2\n\
                    inboxwatch_source_info{kind=\"inbox\",owner=\"team-a\",service=\"a\",source=\"a\"} 1\n\
                    inboxwatch_source_leader{source=\"a\"} 0\n\
                    inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 0\n\
                    inboxwatch_poll_errors_total{kind=\"query\",source=\"a\"} 3\n\
                    inboxwatch_build_info{version=\"1\"} 1\n";
        let out = hide_standby(text.to_string(), &["a".to_string()], &[]);
        assert_eq!(
            out,
            "# HELP a x\n\
             inbox_backlog_messages{source=\"ab\",event_type=\"t\",status=\"pending\"} 2\n\
             inboxwatch_source_info{kind=\"inbox\",owner=\"team-a\",service=\"a\",source=\"a\"} 1\n\
             inboxwatch_source_leader{source=\"a\"} 0\n\
             inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 0\n\
             inboxwatch_build_info{version=\"1\"} 1\n"
        );
    }

    #[test]
    fn sources_out_of_reach_keep_only_up_leader_gap_counters_and_info() {
        let text = "inbox_messages_received_total{event_type=\"t\",source=\"a\"} 7\n\
                    inboxwatch_source_up{source=\"a\"} 0\n\
                    inboxwatch_source_up{source=\"b\"} 1\n\
                    inboxwatch_source_leader{source=\"a\"} 0\n\
                    inboxwatch_source_info{kind=\"inbox\",owner=\"\",service=\"a\",source=\"a\"} 1\n\
                    inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 1\n\
                    inboxwatch_poll_errors_total{kind=\"timeout\",source=\"a\"} 3\n";
        let out = hide_standby(text.to_string(), &[], &["a".to_string()]);
        assert_eq!(
            out,
            "inboxwatch_source_up{source=\"a\"} 0\n\
             inboxwatch_source_up{source=\"b\"} 1\n\
             inboxwatch_source_leader{source=\"a\"} 0\n\
             inboxwatch_source_info{kind=\"inbox\",owner=\"\",service=\"a\",source=\"a\"} 1\n\
             inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 1\n"
        );
    }
}
