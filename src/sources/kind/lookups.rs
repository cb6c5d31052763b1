//! The on-call lookups a kind may offer: what it knows of one event
//! (`trace`, `/events/{id}`) and the events it dead-lettered lately
//! (`dead-letters`, `/dead-letters`), read over the agent's own read-only
//! connection. A kind offers them when it keeps one row per event.

use std::time::Duration;

use super::Answer;
use crate::fingerprint::Letter;
use crate::redact::Redactor;
use crate::text::ERROR_SHOWN;

/// The lookups of a source that keeps one row per event.
pub trait Lookups: Sync {
    /// What the source knows of one event, as `trace` prints it, the
    /// table's texts masked by `redact`; `None` when it has no row of that
    /// event.
    fn trace_event<'a>(
        &'a self,
        event_id: &'a str,
        redact: &'a Redactor,
    ) -> Answer<'a, Result<Option<String>, String>>;

    /// The events dead-lettered within `since`, newest first, at most
    /// `limit` (none for a source whose rows are never dead-lettered).
    fn dead_letters(
        &self,
        since: Duration,
        limit: usize,
    ) -> Answer<'_, Result<Vec<DeadLetter>, String>>;

    /// The events failing now (in a failed status, waiting for their next
    /// attempt) whose last failure lies within `since`, the latest first,
    /// at most `limit`, as dead letters are listed (`dead_at`: the last
    /// failure). None for a kind without such a status.
    fn failing(
        &self,
        _since: Duration,
        _limit: usize,
    ) -> Answer<'_, Result<Vec<DeadLetter>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The error classes the source's dead letters can have (`error_class`).
    fn error_classes(&self) -> Vec<String>;
}

/// One dead-lettered event, as `dead-letters` lists it.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub event_id: String,
    pub event_type: Option<String>,
    /// Microseconds since the epoch.
    pub received: Option<i64>,
    /// Microseconds since the epoch.
    pub dead_at: Option<i64>,
    pub attempts: Option<i64>,
    pub last_error: Option<String>,
    /// The optional `business_key` column (an order id, say): shown, never a label.
    pub business_key: Option<String>,
    /// The optional `summary` column (a body digest, say): shown, never a label.
    pub summary: Option<String>,
    /// The class of `last_error` (`[[sources.error_classes]]`).
    pub error_class: Option<String>,
}

impl DeadLetter {
    /// This dead letter of source `source` (owned by `owner`) as failure
    /// grouping sees it, its error text masked by `redact` and cut as the
    /// pages and commands show it, given to `f`.
    pub fn as_letter<R>(
        &self,
        redact: &Redactor,
        source: &str,
        owner: &str,
        f: impl FnOnce(Letter<'_>) -> R,
    ) -> R {
        let error = self
            .last_error
            .as_deref()
            .map(|e| redact.prefix(e, ERROR_SHOWN));
        f(Letter {
            source,
            owner,
            event_type: self.event_type.as_deref(),
            error_class: self.error_class.as_deref(),
            error: error.as_deref(),
            at: self.dead_at,
            event_id: &self.event_id,
        })
    }
}
