//! The poll loop every kind of source runs in. A source owns connecting and
//! one poll; the loop here owns cadence, timeouts, `inboxwatch_source_up`,
//! backoff, handovers and cancellation, for every kind alike.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::health::{Health, SourceHealth};
use crate::telemetry::catalogue as metric;

/// Polls in a row that cannot connect (or time out) before the owner gives
/// the source up for another agent.
const YIELD_AFTER: u32 = 3;

/// What one successful poll did.
#[derive(Debug, Default, Clone)]
pub struct PollStats {
    /// Rows read from the source.
    pub rows_read: u64,
    /// What the operator should know of the source's setup (a column the
    /// table has and the configuration does not map), shown on its card.
    pub notes: Vec<String>,
}

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The database could not be reached or refused the session.
    #[error("failed to connect to {dsn}: {message}")]
    Connect { dsn: String, message: String },
    /// The watched table or one of its mapped columns is missing or unusable.
    #[error("{0}")]
    Schema(String),
    /// A query failed.
    #[error("query failed: {0}")]
    Query(String),
    /// The poll did not finish within the source's timeout.
    #[error("poll did not finish within {0:?}")]
    Timeout(Duration),
}

impl SourceError {
    /// The `kind` label of `inboxwatch_poll_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceError::Connect { .. } => "connect",
            SourceError::Schema(_) => "schema",
            SourceError::Query(_) => "query",
            SourceError::Timeout(_) => "timeout",
        }
    }
}

/// A watched system. Implementations keep their connection between polls and
/// drop it in [`Source::reset`].
pub trait Source: Send + 'static {
    /// The configured name; becomes the `source` label.
    fn name(&self) -> &str;
    /// How often to poll.
    fn poll_interval(&self) -> Duration;
    /// How long one poll may take.
    fn timeout(&self) -> Duration;
    /// One poll. No retries inside: the loop owns cadence and backoff.
    fn poll(&mut self) -> impl Future<Output = Result<PollStats, SourceError>> + Send;
    /// Forgets the connection after a failure, so the next poll reconnects.
    fn reset(&mut self);
}

/// Delay before the next try after `failures` failed polls in a row:
/// exponential from the poll interval, capped, with ±20 % jitter.
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    let cap = interval.max(Duration::from_secs(30));
    let exp = interval.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let base = exp.min(cap);
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// Polls the source while this agent owns it (`leader` is `Some(true)`;
/// `Some(false)`: another agent owns it; `None`: not known, e.g. the database
/// cannot be reached), until `cancel` fires.
///
/// When ownership comes back after an outage of any length, the source keeps
/// its state and resumes from its own cursor — the rows are still in the
/// table — unless another agent was seen to own it meanwhile: then what this
/// agent knew is stale (the other one counted), and the source is built
/// afresh by `make` with a new baseline. The time between the other owner's
/// last sighting and the new baseline may have gone uncounted: that is
/// recorded as a counting gap (metrics and a WARN line), never silently.
pub async fn run_loop<S, F>(
    name: String,
    make: F,
    health: Arc<Health>,
    mut leader: watch::Receiver<Option<bool>>,
    cancel: CancellationToken,
) where
    S: Source,
    F: Fn() -> S + Send + 'static,
{
    let mut kept: Option<S> = None;
    // The gap series exist at 0 from the start and stay visible while another
    // agent owns the source, so that the first gap (counted at a takeover)
    // shows in `increase()` — a series born at 1 would not.
    metrics::counter!(metric::COUNTING_GAPS, "source" => name.clone(), "reason" => "handover")
        .increment(0);
    metrics::counter!(metric::COUNTING_GAP_SECONDS, "source" => name.clone()).increment(0);
    loop {
        loop {
            match *leader.borrow_and_update() {
                Some(true) => break,
                // Another agent owns it: ready, standing by, and whatever this
                // agent knew of the source is stale from now on.
                Some(false) => {
                    kept = None;
                    health.set_standby(&name);
                }
                None => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = leader.changed() => if changed.is_err() { return },
            }
        }
        let source = match kept.take() {
            Some(source) => source,
            None => {
                if let Some(seen) = health.take_other_owner(&name) {
                    record_gap(&name, "handover", seen, SystemTime::now());
                }
                health.set(&name, SourceHealth::default());
                make()
            }
        };
        match poll_while_leading(source, &health, &mut leader, &cancel).await {
            Some(source) => kept = Some(source),
            None => return,
        }
    }
}

/// Gives the pages malloc holds free back to the system, at most once a
/// second whatever the number of sources: after a poll its rows are freed,
/// but the long-lived allocations made since (the maps' growth, the journal)
/// sit above them, so the heap cannot shrink from its top and the freed
/// pages stayed resident: at the cap of remembered events about 4 MB of the
/// agent's RSS was free heap (docs/performance.md, "Memory at the cap: the
/// remembered events in 16 bytes and the freed pages given back").
fn give_back_freed_memory() {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
        return;
    }
    *last = Some(Instant::now());
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of malloc's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Records a period from `from` to `to` in which counts of `source` may have
/// been lost.
fn record_gap(source: &str, reason: &'static str, from: SystemTime, to: SystemTime) {
    let seconds = to.duration_since(from).unwrap_or_default().as_secs_f64();
    metrics::counter!(metric::COUNTING_GAPS, "source" => source.to_string(), "reason" => reason)
        .increment(1);
    // Whole seconds, rounded up: a counter takes integers.
    metrics::counter!(metric::COUNTING_GAP_SECONDS, "source" => source.to_string())
        .increment(seconds.ceil() as u64);
    warn!(
        source = %source,
        reason,
        from = %humantime::format_rfc3339_millis(from),
        to = %humantime::format_rfc3339_millis(to),
        seconds = format_args!("{seconds:.1}"),
        "Counts were not kept for a while: another agent owned the source until about `from`, this one counts from `to`."
    );
}

/// The poll loop of one ownership term. Returns the source when ownership
/// was lost, `None` when cancelled.
async fn poll_while_leading<S: Source>(
    mut source: S,
    health: &Health,
    leader: &mut watch::Receiver<Option<bool>>,
    cancel: &CancellationToken,
) -> Option<S> {
    let name = source.name().to_string();
    let interval = source.poll_interval();
    let up = metrics::gauge!(metric::SOURCE_UP, "source" => name.clone());
    let duration = metrics::histogram!(metric::POLL_DURATION, "source" => name.clone());
    let rows = metrics::counter!(metric::ROWS_READ, "source" => name.clone());
    // Every error kind's series exists at 0, so that the first error shows in `rate()`.
    for kind in ["connect", "schema", "query", "timeout"] {
        metrics::counter!(metric::POLL_ERRORS, "source" => name.clone(), "kind" => kind)
            .increment(0);
    }
    let mut failures: u32 = 0;
    let mut unreachable_polls: u32 = 0;
    let mut last_error: Option<String> = None;
    let mut was_up: Option<bool> = None;
    loop {
        if *leader.borrow() != Some(true) {
            source.reset();
            return Some(source);
        }
        let started = Instant::now();
        // One span per poll: exported with `[tracing] agent_spans`.
        let span = tracing::info_span!(
            "poll",
            source = %name,
            rows_read = tracing::field::Empty,
            error = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        // Taken before the poll: a source may give its next poll another limit.
        let limit = source.timeout();
        let result = tokio::select! {
            _ = cancel.cancelled() => return None,
            r = tracing::Instrument::instrument(
                tokio::time::timeout(limit, source.poll()),
                span.clone(),
            ) => {
                r.unwrap_or(Err(SourceError::Timeout(limit)))
            }
        };
        match &result {
            Ok(stats) => {
                span.record("rows_read", stats.rows_read);
            }
            Err(e) => {
                span.record("error", e.to_string());
                span.record("otel.status_code", "ERROR");
            }
        }
        drop(span);
        duration.record(started.elapsed().as_secs_f64());
        give_back_freed_memory();
        // Ownership lost while the poll ran (a failed renewal already
        // reported the source down): what it read is not to be reported.
        if *leader.borrow() != Some(true) {
            source.reset();
            return Some(source);
        }
        let delay = match result {
            Ok(stats) => {
                up.set(1.0);
                unreachable_polls = 0;
                rows.increment(stats.rows_read);
                if was_up != Some(true) {
                    info!(source = %name, "Source is up.");
                }
                was_up = Some(true);
                failures = 0;
                last_error = None;
                health.set(
                    &name,
                    SourceHealth {
                        polled: true,
                        up: true,
                        notes: stats.notes,
                        ..SourceHealth::default()
                    },
                );
                interval.saturating_sub(started.elapsed())
            }
            Err(e) => {
                up.set(0.0);
                // An owner that cannot reach the database gives the source up
                // after a few tries, so that an agent that can takes over.
                if matches!(e, SourceError::Connect { .. } | SourceError::Timeout(_)) {
                    unreachable_polls += 1;
                    if unreachable_polls == YIELD_AFTER {
                        health.request_yield(&name);
                    }
                } else {
                    unreachable_polls = 0;
                }
                metrics::counter!(metric::POLL_ERRORS, "source" => name.clone(), "kind" => e.kind())
                    .increment(1);
                let message = e.to_string();
                if was_up != Some(false) || last_error.as_deref() != Some(message.as_str()) {
                    warn!(source = %name, error = %message, "Poll failed; retrying with backoff.");
                }
                was_up = Some(false);
                failures = failures.saturating_add(1);
                source.reset();
                health.set(
                    &name,
                    SourceHealth {
                        polled: true,
                        up: false,
                        error: Some(message.clone()),
                        ..SourceHealth::default()
                    },
                );
                last_error = Some(message);
                backoff(interval, failures)
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
            changed = leader.changed() => if changed.is_err() { return None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over many draws (one draw could land anywhere in a wide range): every delay
    /// within ±20 % of the expected base, and the jitter really spread over that
    /// range (the smallest and largest draws near its ends, the mean near the base).
    #[test]
    fn backoff_grows_from_the_interval_and_stays_capped() {
        const DRAWS: usize = 2_000;
        let short = Duration::from_secs(1);
        let long = Duration::from_secs(60);
        // (interval, failures, base): doubling from the interval, capped at
        // max(interval, 30 s).
        for (interval, failures, base) in [
            (short, 1, 1.0),
            (short, 2, 2.0),
            (short, 3, 4.0),
            (short, 5, 16.0),
            (short, 6, 30.0),
            (short, 10, 30.0),
            (short, 40, 30.0),
            (long, 1, 60.0),
            (long, 5, 60.0),
        ] {
            let draws: Vec<f64> = (0..DRAWS)
                .map(|_| backoff(interval, failures).as_secs_f64())
                .collect();
            let what = format!("interval {interval:?}, failures {failures}");
            let (lo, hi) = (0.8 * base, 1.2 * base);
            for d in &draws {
                assert!((lo..=hi).contains(d), "{what}: {d} s outside [{lo}, {hi}]");
            }
            let min = draws.iter().copied().fold(f64::INFINITY, f64::min);
            let max = draws.iter().copied().fold(0.0, f64::max);
            let mean = draws.iter().sum::<f64>() / DRAWS as f64;
            assert!(
                min < 0.82 * base,
                "{what}: no draw near the low end ({min} s)"
            );
            assert!(
                max > 1.18 * base,
                "{what}: no draw near the high end ({max} s)"
            );
            assert!(
                (mean - base).abs() < 0.02 * base,
                "{what}: mean {mean} s, base {base} s"
            );
        }
    }
}
