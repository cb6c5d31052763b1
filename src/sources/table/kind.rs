//! Inbox and outbox tables as kinds of source: how their entries are read,
//! how they start (a database lock decides the owner; one pool per database
//! is shared by every table on it), what `doctor` checks and what the
//! lookups find.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use toml::Spanned;
use toml::de::DeValue;
use tracing::info;

use super::config::{
    self, InboxSpec, OutboxSpec, RawInbox, RawOutbox, RawTable, TableSpec, inbox_spec, outbox_spec,
    table_spec,
};
use super::doctor;
use super::inbox::Inbox;
use super::lock::{LockSessions, SourceLock};
use super::outbox::Outbox;
use super::shape::Shape;
use super::{Pools, TableSource, actions, lookup, schema};
use crate::checks::{Validator, keys_at, knows};
use crate::coordination::LEASE;
use crate::redact::Redactor;
use crate::sources::kind::{
    ActionError, ActionOutcome, ActionRequest, AuditEntry, DeadLetter, Finding, Kind, Read, Runtime,
};
use crate::telemetry::catalogue as metric;
use crate::tracing_link::SpanSink;

/// The `Kind` of a table source: `$spec` with its own keys `$raw`, checked by
/// `$validate`, polled as `$poll`, checked by `doctor` as `$shape`, looked up
/// by `$trace`; the methods given after them are the kind's own.
macro_rules! table_kind {
    (
        $spec:ty, $kind:literal, $raw:ty, $validate:path, $poll:ident, $shape:path, $trace:path;
        $($own:item)*
    ) => {
        impl Kind for $spec {
            const KIND: &'static str = $kind;
            type Raw = (RawTable, $raw);

            fn read(
                v: &mut Validator<'_>,
                key: &str,
                entry: Spanned<DeValue<'_>>,
            ) -> Read<Self::Raw> {
                config::read::<$raw>(v, key, entry)
            }

            fn knows(path: &[String]) -> bool {
                knows::<RawTable>(path) || knows::<$raw>(path)
            }

            fn keys_at(path: &[String]) -> Vec<&'static str> {
                let mut keys = keys_at::<RawTable>(path);
                keys.extend(keys_at::<$raw>(path));
                keys
            }

            fn validate(
                raw: Self::Raw,
                key: &str,
                name: String,
                v: &mut Validator<'_>,
            ) -> Option<Self> {
                let table = table_spec(raw.0, key, name, v);
                $validate(table, raw.1, key, v)
            }

            fn name(&self) -> &str {
                &self.table.name
            }

            fn owner(&self) -> &str {
                self.table.owner.as_deref().unwrap_or_default()
            }

            fn service(&self) -> &str {
                self.table.service_name.as_deref().unwrap_or(&self.table.name)
            }

            fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
                let (leader, sink, pool) = prepare(&self.table, rt)?;
                let name = self.table.name.clone();
                let journal = rt.journal.clone();
                let make = move || {
                    let poll = $poll::new(self.clone())
                        .with_spans(sink.clone())
                        .with_journal(journal.clone());
                    TableSource::new(self.table.clone(), poll).with_pool(pool.clone())
                };
                rt.spawn_loop(&name, make, leader);
                Ok(())
            }

            fn describe(&self) -> String {
                format!("{}, table {}", self.table.dsn, self.table.table)
            }

            async fn doctor(&self) -> Vec<Finding> {
                let mut source = TableSource::new(self.table.clone(), $poll::new(self.clone()));
                doctor::check(&mut source, $shape(self)).await
            }

            fn keeps_events(&self) -> bool {
                true
            }

            fn reads(&self) -> Option<String> {
                let source = TableSource::new(self.table.clone(), $poll::new(self.clone()));
                Some(source.reads())
            }

            fn indexes(&self) -> Option<String> {
                let source = TableSource::new(self.table.clone(), $poll::new(self.clone()));
                Some(doctor::indexes(&source, $shape(self)))
            }

            async fn trace_event(
                &self,
                event_id: &str,
                redact: &Redactor,
            ) -> Result<Option<String>, String> {
                $trace(self, event_id, redact).await
            }

            $($own)*
        }
    };
}

table_kind! {
    InboxSpec, "inbox", RawInbox, inbox_spec, Inbox, Shape::Inbox, lookup::trace_inbox;
    async fn dead_letters(&self, since: Duration, limit: usize) -> Result<Vec<DeadLetter>, String> {
        lookup::dead_letters(self, since, limit).await
    }

    fn error_classes(&self) -> Vec<String> {
        self.error_classes.all().iter().map(|c| c.name.clone()).collect()
    }

    fn audit_ddl(&self) -> Option<String> {
        self.actions
            .as_ref()
            .map(|a| schema::audit_ddl(self.table.dsn.dialect(), &a.audit_table))
    }

    async fn dead_letter_action(
        &self,
        request: &ActionRequest,
    ) -> Result<Vec<ActionOutcome>, ActionError> {
        actions::act(self, request).await
    }

    async fn dead_letter_history(&self, event_ids: &[String]) -> Result<Vec<AuditEntry>, String> {
        actions::audit_history(self, event_ids).await
    }
}

table_kind! {
    OutboxSpec, "outbox", RawOutbox, outbox_spec, Outbox, Shape::Outbox, lookup::trace_outbox;
}

/// What every table source needs before its loop starts: the objective
/// gauges, its election (or outright ownership of a local file), its span
/// sink and its database's shared pool.
fn prepare(
    table: &TableSpec,
    rt: &mut Runtime,
) -> anyhow::Result<(
    tokio::sync::watch::Receiver<Option<bool>>,
    Option<SpanSink>,
    sqlx::AnyPool,
)> {
    let name = &table.name;
    if let Some(o) = table.objectives.oldest_age {
        metrics::gauge!(metric::OBJECTIVE_OLDEST_AGE, "source" => name.clone())
            .set(o.as_secs_f64());
    }
    if let Some(p) = table.objectives.p95 {
        metrics::gauge!(metric::OBJECTIVE_P95, "source" => name.clone()).set(p.as_secs_f64());
    }
    info!(source = %name, dsn = %table.dsn, table = %table.table, "Watching source.");
    // One lock session and one small poll pool per database, whatever the
    // number of sources on it.
    let sessions = rt.shared(|_| Arc::new(LockSessions::new(LEASE)));
    let leader = match SourceLock::for_source(table, &sessions) {
        Some(lock) => rt.elect(lock),
        None => rt.own_outright(name),
    };
    let sink = match rt.linker.as_mut() {
        Some(l) => Some(l.sink(
            name,
            table.service_name.as_deref(),
            &table.trace,
            table.objectives.p95,
        )?),
        None => None,
    };
    let pools = rt.shared(|rt| Arc::new(Pools::new(rt.max_connections_per_database)));
    let pool = pools
        .get(table)
        .with_context(|| format!("source \"{name}\""))?;
    Ok((leader, sink, pool))
}
