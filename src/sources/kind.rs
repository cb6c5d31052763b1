//! What a source kind is to the rest of the agent: how its `[[sources]]`
//! entry is read and checked, how it starts (its election and its poll
//! loop), what `doctor` checks of it, and whether the on-call lookups can
//! search it. `app`, `doctor`, `lookup` and the configuration reach a kind
//! only through [`Kind`], by way of the registry in `sources/mod.rs`.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toml::Spanned;
use toml::de::DeValue;

use crate::checks::{Unknown, Validator, keys_at, knows};
use crate::coordination::{Leadership, Lock, elect};
use crate::health::Health;
use crate::sources::run::{Source, run_loop};
use crate::tracing_link::Linker;

/// A kind of source: one folder under `src/sources/`, one variant of the
/// registry's `SourceSpec`. The value is the validated settings of one source.
pub trait Kind: Sized + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The `kind = "…"` that names it in the file.
    const KIND: &'static str;
    /// The entry as written (without `name` and `kind`).
    type Raw: DeserializeOwned;

    /// Reads the entry; keys it does not take are returned, not reported.
    fn read(v: &mut Validator<'_>, key: &str, entry: Spanned<DeValue<'_>>) -> Read<Self::Raw> {
        v.read::<Self::Raw>(key, entry)
    }

    /// Whether the kind takes the key at `path` (to say whose key a
    /// misplaced one is).
    fn knows(path: &[String]) -> bool {
        knows::<Self::Raw>(path)
    }

    /// The keys the kind takes in the table at `path` of its entry (besides
    /// `name` and `kind` at the top).
    fn keys_at(path: &[String]) -> Vec<&'static str> {
        keys_at::<Self::Raw>(path)
    }

    /// Checks every setting, reporting each problem with its key
    /// (`key` is the entry's, e.g. `sources[2]`). `None` when any is wrong.
    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self>;

    /// The configured name: the `source` label.
    fn name(&self) -> &str;

    /// The team that owns the source (`owner`), "" when none is configured.
    fn owner(&self) -> &str;

    /// The `service` label of `inboxwatch_source_info`: the consumer's
    /// `service_name` (the `service.name` of its spans), else the source name.
    fn service(&self) -> &str {
        self.name()
    }

    /// Starts watching: the election that decides whether this agent polls
    /// the source, and the poll loop.
    fn start(self, rt: &mut Runtime) -> anyhow::Result<()>;

    /// What `doctor` prints after the name, e.g. `kafka, brokers a:9092`.
    fn describe(&self) -> String;

    /// `doctor`'s checks of this source (run on the command's own runtime:
    /// the future need not be `Send`).
    fn doctor(&self) -> impl Future<Output = Vec<Finding>>;

    /// Whether `trace` and `dead-letters` can search this source: it keeps
    /// one row per event.
    fn keeps_events(&self) -> bool {
        false
    }

    /// What the source knows of one event, as `trace` prints it; `None`
    /// when it has no row of that event.
    fn trace_event(
        &self,
        _event_id: &str,
    ) -> impl Future<Output = Result<Option<String>, String>> + Send {
        async { Ok(None) }
    }

    /// The indexes the source's queries need, as DDL in its dialect
    /// (`schema --config`); `None` for sources that read no table.
    fn indexes(&self) -> Option<String> {
        None
    }

    /// The events dead-lettered within `since`, newest first, at most `limit`.
    fn dead_letters(
        &self,
        _since: Duration,
        _limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, String>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// A read entry and the keys it had that the kind does not take.
pub type Read<T> = (Option<T>, Vec<Unknown>);

/// One finding of `doctor`.
#[derive(Debug)]
pub enum Finding {
    Ok(String),
    Warn(String),
    Error(String),
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
}

/// What a starting source gets from the agent: where to spawn its tasks,
/// the agent's ownership and health records, span export, and values the
/// sources of one kind share (a pool per database, say).
pub struct Runtime {
    pub leadership: Arc<Leadership>,
    pub health: Arc<Health>,
    pub cancel: CancellationToken,
    /// Span export, when `[tracing]` is configured.
    pub linker: Option<Linker>,
    /// `[server] max_connections_per_database`.
    pub max_connections_per_database: u32,
    tasks: JoinSet<()>,
    /// Senders of sources no election decides: kept so that ownership never ends.
    owned_outright: Vec<watch::Sender<Option<bool>>>,
    shared: Vec<Box<dyn Any + Send>>,
}

impl Runtime {
    pub fn new(
        health: Arc<Health>,
        leadership: Arc<Leadership>,
        cancel: CancellationToken,
        linker: Option<Linker>,
        max_connections_per_database: u32,
    ) -> Runtime {
        Runtime {
            leadership,
            health,
            cancel,
            linker,
            max_connections_per_database,
            tasks: JoinSet::new(),
            owned_outright: Vec::new(),
            shared: Vec::new(),
        }
    }

    /// The agent's one value of type `T`, made by `make` when first asked for.
    pub fn shared<T: Any + Send + Clone>(&mut self, make: impl FnOnce(&Runtime) -> T) -> T {
        if let Some(found) = self.shared.iter().find_map(|b| b.downcast_ref::<T>()) {
            return found.clone();
        }
        let made = make(self);
        self.shared.push(Box::new(made.clone()));
        made
    }

    /// Spawns the election of a source; the receiver says whether this agent owns it.
    pub fn elect<L: Lock>(&mut self, lock: L) -> watch::Receiver<Option<bool>> {
        let (tx, rx) = watch::channel(None);
        self.tasks.spawn(elect(
            lock,
            self.leadership.clone(),
            self.health.clone(),
            tx,
            self.cancel.clone(),
        ));
        rx
    }

    /// A source no other agent can watch (a local file): this agent owns it.
    pub fn own_outright(&mut self, name: &str) -> watch::Receiver<Option<bool>> {
        self.leadership.set(name, true);
        let (tx, rx) = watch::channel(Some(true));
        self.owned_outright.push(tx);
        rx
    }

    /// Spawns the poll loop of a source, polling while `leader` says this agent owns it.
    pub fn spawn_loop<S, F>(&mut self, name: &str, make: F, leader: watch::Receiver<Option<bool>>)
    where
        S: Source,
        F: Fn() -> S + Send + 'static,
    {
        self.tasks.spawn(run_loop(
            name.to_string(),
            make,
            self.health.clone(),
            leader,
            self.cancel.clone(),
        ));
    }

    /// The spawned tasks, the span linker and what keeps outright ownership,
    /// once every source has started.
    pub fn finish(
        self,
    ) -> (
        JoinSet<()>,
        Option<Linker>,
        Vec<watch::Sender<Option<bool>>>,
    ) {
        (self.tasks, self.linker, self.owned_outright)
    }
}

/// Characters of `last_error` the lookups show.
pub const ERROR_SHOWN: usize = 200;

/// What a kind gives for a time that has no microsecond value that fits in
/// 64 bits (PostgreSQL's `infinity`, a year past 294,000) or that cannot be
/// read as a time: a row holding one is rejected as `time_out_of_range`,
/// and the lookups show it as such.
pub const OUT_OF_RANGE: i64 = i64::MIN + 1;

/// RFC 3339 UTC with milliseconds, from microseconds since the epoch; a time
/// RFC 3339 cannot show (before 1970 for the formatter, after 9999, or out of
/// range in the database) is shown as what it is.
pub fn timestamp(micros: i64) -> String {
    /// 10000-01-01T00:00:00Z.
    const YEAR_10000: i64 = 253_402_300_800_000_000;
    if micros == OUT_OF_RANGE {
        "(out of range)".to_string()
    } else if !(0..YEAR_10000).contains(&micros) {
        format!("({micros} µs from 1970-01-01T00:00:00Z)")
    } else {
        humantime::format_rfc3339_millis(crate::tracing_link::at(micros)).to_string()
    }
}

/// A duration in milliseconds, as `1.234s` or `56ms`.
pub fn ms(micros: i64) -> String {
    let ms = micros.div_euclid(1000);
    if ms.abs() >= 1000 {
        format!("{:.3}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `trace` and `dead-letters` on rows with times out of range
    /// (`infinity`, before 1970, after 9999): shown as such, never a panic.
    #[test]
    fn timestamps_rfc3339_cannot_show_are_shown_as_they_are() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:00.001Z");
        assert_eq!(timestamp(OUT_OF_RANGE), "(out of range)");
        assert_eq!(
            timestamp(-1_000_000),
            "(-1000000 µs from 1970-01-01T00:00:00Z)"
        );
        assert_eq!(
            timestamp(253_402_300_800_000_000),
            "(253402300800000000 µs from 1970-01-01T00:00:00Z)"
        );
    }
}
