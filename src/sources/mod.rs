//! Sources poll what the consumers leave behind. Each kind of source is a
//! folder here that owns its settings, its poll, its election, its `doctor`
//! checks and its lookups, behind [`kind::Kind`]; the loop they all run in is
//! [`run`]. This file is the registry: the one list of kinds.
//!
//! Adding a kind: a folder with a type implementing [`kind::Kind`], one line
//! in [`kinds!`] below (docs/architecture.md has the recipe).

pub mod kafka;
pub mod kind;
pub mod run;
pub mod table;

use std::time::Duration;

use toml::Spanned;
use toml::de::DeValue;

use crate::checks::Validator;
use crate::dsn::Dialect;
use crate::redact::Redactor;
use crate::telemetry::catalogue as metric;
use kind::{
    ActionError, ActionOutcome, ActionRequest, AuditEntry, DeadLetter, DeadRecords, Finding, Kind,
    Runtime,
};

/// Declares [`SourceSpec`], one variant per kind, and its methods, each of
/// which hands over to the kind: nothing outside a kind's folder matches on it.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident($spec:ty),)+) => {
        /// One validated source, of whichever kind. A handful per agent, read
        /// once: the size of the largest kind's settings does not matter.
        #[derive(Debug, Clone)]
        #[allow(clippy::large_enum_variant)]
        pub enum SourceSpec {
            $($(#[$doc])* $variant($spec),)+
        }

        impl SourceSpec {
            /// Every `kind = "…"` the file may say, in the registry's order.
            pub const KINDS: &[&str] = &[$(<$spec as Kind>::KIND),+];

            /// Reads and checks one entry of kind `kind`; `None` when no kind
            /// has that name, `Some(None)` when the entry has problems.
            pub fn check(
                kind: &str,
                key: &str,
                name: String,
                entry: Spanned<DeValue<'_>>,
                v: &mut Validator<'_>,
            ) -> Option<Option<SourceSpec>> {
                $(if kind == <$spec as Kind>::KIND {
                    return Some(check::<$spec>(key, name, entry, v).map(SourceSpec::$variant));
                })+
                None
            }

            /// The kinds other than `kind` that take the key at `path`.
            fn owners(kind: &str, path: &[String]) -> Vec<&'static str> {
                let mut out = Vec::new();
                $(if kind != <$spec as Kind>::KIND && <$spec as Kind>::knows(path) {
                    out.push(<$spec as Kind>::KIND);
                })+
                out
            }

            /// The configured name (the `source` label).
            pub fn name(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.name(),)+ }
            }

            /// The team that owns the source, "" when none is configured.
            pub fn owner(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.owner(),)+ }
            }

            /// The kind's name (`inbox`, `outbox`, `kafka`).
            pub fn kind(&self) -> &'static str {
                match self { $(SourceSpec::$variant(_) => <$spec as Kind>::KIND,)+ }
            }

            /// The `service` label of the source's info series.
            pub fn service(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.service(),)+ }
            }

            /// Starts the source's election and poll loop, after exporting
            /// its info series (every agent exports it, leader or not, so
            /// that the rules' `group_left(owner)` joins always find it).
            pub fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
                metrics::gauge!(
                    metric::SOURCE_INFO,
                    "source" => self.name().to_string(),
                    "kind" => self.kind(),
                    "owner" => self.owner().to_string(),
                    "service" => self.service().to_string()
                )
                .set(1.0);
                match self { $(SourceSpec::$variant(s) => s.start(rt),)+ }
            }

            /// What `doctor` prints after the name.
            pub fn describe(&self) -> String {
                match self { $(SourceSpec::$variant(s) => s.describe(),)+ }
            }

            /// `doctor`'s checks of the source.
            pub async fn doctor(&self) -> Vec<Finding> {
                match self { $(SourceSpec::$variant(s) => s.doctor().await,)+ }
            }

            /// What each poll reads, with the mode; `None` without a table.
            pub fn reads(&self) -> Option<String> {
                match self { $(SourceSpec::$variant(s) => s.reads(),)+ }
            }

            /// The indexes the source's queries need, as DDL.
            pub fn indexes(&self) -> Option<String> {
                match self { $(SourceSpec::$variant(s) => s.indexes(),)+ }
            }

            /// Whether the lookups can search the source.
            pub fn keeps_events(&self) -> bool {
                match self { $(SourceSpec::$variant(s) => s.keeps_events(),)+ }
            }

            /// The error classes the source's dead letters can have.
            pub fn error_classes(&self) -> Vec<String> {
                match self { $(SourceSpec::$variant(s) => s.error_classes(),)+ }
            }

            /// What the source knows of one event, its table texts masked by `redact`.
            pub async fn trace_event(
                &self,
                event_id: &str,
                redact: &Redactor,
            ) -> Result<Option<String>, String> {
                match self { $(SourceSpec::$variant(s) => s.trace_event(event_id, redact).await,)+ }
            }

            /// The events dead-lettered lately.
            pub async fn dead_letters(
                &self,
                since: Duration,
                limit: usize,
            ) -> Result<Vec<DeadLetter>, String> {
                match self { $(SourceSpec::$variant(s) => s.dead_letters(since, limit).await,)+ }
            }

            /// The DDL of the source's dead-letter audit table, if it has one.
            pub fn audit_ddl(&self) -> Option<String> {
                match self { $(SourceSpec::$variant(s) => s.audit_ddl(),)+ }
            }

            /// `dead-letters replay` / `ignore` on this source.
            pub async fn dead_letter_action(
                &self,
                request: &ActionRequest,
            ) -> Result<Vec<ActionOutcome>, ActionError> {
                match self { $(SourceSpec::$variant(s) => s.dead_letter_action(request).await,)+ }
            }

            /// The replay / ignore history of these events (for the pages).
            pub async fn dead_letter_history(
                &self,
                event_ids: &[String],
            ) -> Result<Vec<AuditEntry>, String> {
                match self { $(SourceSpec::$variant(s) => s.dead_letter_history(event_ids).await,)+ }
            }

            /// Whether `dead-letters` reads the source's dead-letter topics.
            pub fn reads_dead_letter_topics(&self) -> bool {
                match self { $(SourceSpec::$variant(s) => s.reads_dead_letter_topics(),)+ }
            }

            /// The latest records of the source's dead-letter topics.
            pub async fn dead_letter_records(
                &self,
                per_partition: usize,
                total: usize,
            ) -> Result<DeadRecords, String> {
                match self {
                    $(SourceSpec::$variant(s) => s.dead_letter_records(per_partition, total).await,)+
                }
            }
        }
    };
}

kinds! {
    /// An inbox / processing-record table.
    Inbox(table::InboxSpec),
    /// An outbox table.
    Outbox(table::OutboxSpec),
    /// A Kafka cluster's consumer groups and topics.
    Kafka(kafka::KafkaSpec),
}

/// `inboxwatch schema --dialect`: the recommended tables of the table kinds
/// (an inbox table, an outbox table if named) and, if named, the audit table
/// of the dead-letter actions, after an empty line.
pub fn recommended_schema(
    dialect: Dialect,
    inbox: &str,
    outbox: Option<&str>,
    audit: Option<&str>,
) -> String {
    let mut out = table::schema::ddl(dialect, inbox, outbox);
    if let Some(audit) = audit {
        out.push('\n');
        out.push_str(&table::schema::audit_ddl(dialect, audit));
    }
    out
}

/// Reads and validates one entry as a `K`: every key `K` does not take is
/// reported, with the kinds that do take it, and every setting is checked
/// even then, so that one run names every problem.
fn check<K: Kind>(
    key: &str,
    name: String,
    entry: Spanned<DeValue<'_>>,
    v: &mut Validator<'_>,
) -> Option<K> {
    let before = v.count();
    let (raw, unknown) = K::read(v, key, entry);
    for u in &unknown {
        let owners = SourceSpec::owners(K::KIND, &u.path);
        let owner = (!owners.is_empty()).then(|| format!("{} sources", and_list(&owners)));
        let here = format!("{} sources", K::KIND);
        let mut expected = K::keys_at(u.parent());
        if u.path.len() == 1 {
            expected.splice(0..0, ["name", "kind"]);
            if K::KIND != "kafka" {
                expected.insert(2, "preset");
            }
        }
        v.unknown_key(
            u,
            &expected,
            owner
                .as_deref()
                .map(|o| format!("{o}, not of {here}"))
                .as_deref(),
        );
    }
    let spec = K::validate(raw?, key, name, v);
    if v.count() > before { None } else { spec }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
