//! What a source kind is to the rest of the agent. [`Kind`] holds what every
//! kind has: how its `[[sources]]` entry is read and checked (and the presets
//! it offers), its name and owner, how it starts (its election and its poll
//! loop), what each poll reads, and what `doctor` checks of it. What a kind
//! can do beyond polling is a capability it may offer, a small trait of its
//! own, each with the plain data it answers in, in a file beside this one:
//! [`Lookups`] (`trace` and the dead-letter rows), [`DeadLetterActions`]
//! (`dead-letters replay` / `ignore` and their audit), [`DeadLetterTopics`]
//! (the records of dead-letter topics), [`TopicReplay`] (sending them
//! back); and, here, [`Schema`] (the indexes
//! its queries need). `app`, `doctor`, `lookup`, `actions`, the
//! pages and the configuration reach a kind only through these traits, by
//! way of the registry in `sources/mod.rs`.

mod actions;
mod lookups;
mod replay;
mod topics;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::card::{Card, Past};
use crate::coordination::{Leadership, Lock, elect};
use crate::health::Health;
use crate::journal::Journal;
use crate::sources::common::Common;
use crate::sources::poll_loop::{Source, run_loop};
use crate::telemetry::values::Reading;
use crate::tracing_link::Linker;
use crate::validation::{Parts, Unknown, Validator};

pub use actions::{
    Action, ActionError, ActionOutcome, ActionRequest, AuditEntry, DEFAULT_AUDIT_TABLE,
    DeadLetterActions, Run, RunCounts, Selection, parse_rate,
};
pub use lookups::{DeadLetter, Lookups};
pub use replay::{ReplayRecord, ReplayRun, ReplaySender, TopicReplay, TopicSelection};
pub use topics::{DeadLetterTopics, DeadPartitionProblem, DeadRecord, DeadRecords, VALUE_PREFIX};

/// A kind of source: one folder under `src/sources/`, one variant of the
/// registry's `SourceSpec`. The value is the validated settings of one source.
pub trait Kind: Sized + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The `kind = "…"` that names it in the file.
    const KIND: &'static str;
    /// The entry as written (without `name` and `kind`), in parts read from
    /// the one table: [`crate::sources::common::RawCommon`], the settings
    /// every source has, first, then the kind's own.
    type Raw: Parts;

    /// Reads the entry; keys it does not take are returned, not reported.
    fn read(v: &mut Validator<'_>, key: &str, entry: Spanned<DeValue<'_>>) -> Read<Self::Raw> {
        Self::Raw::read(v, key, entry)
    }

    /// Whether the kind takes the key at `path` (to say whose key a
    /// misplaced one is).
    fn knows(path: &[String]) -> bool {
        Self::Raw::knows(path)
    }

    /// The keys the kind takes in the table at `path` of its entry (besides
    /// `name` and `kind` at the top).
    fn keys_at(path: &[String]) -> Vec<&'static str> {
        Self::Raw::keys_at(path)
    }

    /// Checks every setting, reporting each problem with its key
    /// (`key` is the entry's, e.g. `sources[2]`). `None` when any is wrong.
    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self>;

    /// The presets an entry of this kind may name (`preset = "NAME"`): the
    /// settings of real libraries' sources. A kind without any does not take
    /// the `preset` key.
    fn presets() -> Vec<Box<dyn Preset>> {
        Vec::new()
    }

    /// The configured name: the `source` label.
    fn name(&self) -> &str {
        &self.common().name
    }

    /// The settings every source has, as `sources::common::check` made them.
    fn common(&self) -> &Common;

    /// The team that owns the source (`owner`), "" when none is configured.
    fn owner(&self) -> &str {
        self.common().owner.as_deref().unwrap_or_default()
    }

    /// The `service` label of `inboxwatch_source_info`: the consumer's
    /// `service_name` (the `service.name` of its spans), else the source name.
    fn service(&self) -> &str {
        self.common().service()
    }

    /// Starts watching: the election that decides whether this agent polls
    /// the source, and the poll loop.
    fn start(self, rt: &mut Runtime) -> anyhow::Result<()>;

    /// What each poll reads, in words (for a table with its mode:
    /// `cursor = "none": …`), for `run`'s start line, `doctor`, the status
    /// card and API.
    fn reads(&self) -> String;

    /// What `doctor` prints after the name, e.g. `kafka, brokers a:9092`.
    fn describe(&self) -> String;

    /// `doctor`'s checks of this source (run on the command's own runtime:
    /// the future need not be `Send`).
    fn doctor(&self) -> impl Future<Output = Vec<Finding>>;

    /// The source's status card (the status page, `/api/v1/status`), from
    /// what it recorded (`values`: nothing when another agent exports it)
    /// and its history (`past`).
    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card;

    /// `trace` and `dead-letters` can search the source: it keeps one row
    /// per event.
    fn lookups(&self) -> Option<&dyn Lookups> {
        None
    }

    /// `dead-letters replay` / `ignore` can act on the source's dead letters.
    fn dead_letter_actions(&self) -> Option<&dyn DeadLetterActions> {
        None
    }

    /// `dead-letters` lists the latest records of the source's dead-letter
    /// topics (the records themselves, not rows of a table).
    fn dead_letter_topics(&self) -> Option<&dyn DeadLetterTopics> {
        None
    }

    /// `dead-letters replay --topic` sends records of the source's
    /// dead-letter topics back.
    fn topic_replay(&self) -> Option<&dyn TopicReplay> {
        None
    }

    /// `schema --config` prints the indexes the source's queries need.
    fn schema(&self) -> Option<&dyn Schema> {
        None
    }
}

/// What a capability's lookup answers with: a boxed future, so that a
/// capability is a trait object a kind can hand out (`Send`: the pages run
/// it in a request).
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source that reads tables of the operator's database.
pub trait Schema: Sync {
    /// The indexes the source's queries need, as DDL in its dialect.
    fn indexes(&self) -> String;
}

/// A preset of a kind: the settings of a real library's source, which an
/// entry that says `preset = "NAME"` gets for every key it does not write
/// itself (the configuration merges them before the entry is read).
pub trait Preset {
    /// The name an entry gives it.
    fn name(&self) -> &'static str;
    /// The library and the exact versions it was proven against
    /// (`pg-boss 10.4.2`).
    fn library(&self) -> String;
    /// How it was proven: `library-tested` or `schema-tested`.
    fn proof(&self) -> &'static str;
    /// What it watches, in one line.
    fn summary(&self) -> &str;
    /// The keys it gives an entry (their spans in the preset's own text).
    fn entry(&self) -> DeTable<'static>;
    /// What `inboxwatch presets NAME` prints: what it measures, what it
    /// cannot, its settings.
    fn detail(&self) -> String;
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
    /// Where sources note the attempts of failed events (`/events/{id}`).
    pub journal: Journal,
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
            journal: Journal::default(),
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
