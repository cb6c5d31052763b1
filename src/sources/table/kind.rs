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
use super::doctor::{self, Shape};
use super::inbox::Inbox;
use super::lock::{LockSessions, SourceLock};
use super::outbox::Outbox;
use super::{Pools, TableSource, lookup};
use crate::checks::{Validator, knows};
use crate::coordination::LEASE;
use crate::sources::kind::{DeadLetter, Finding, Kind, Read, Runtime};
use crate::telemetry::catalogue as m;
use crate::tracing_link::SpanSink;

impl Kind for InboxSpec {
    const KIND: &'static str = "inbox";
    type Raw = (RawTable, RawInbox);

    fn read(v: &mut Validator<'_>, key: &str, entry: Spanned<DeValue<'_>>) -> Read<Self::Raw> {
        config::read::<RawInbox>(v, key, entry)
    }

    fn knows(path: &[String]) -> bool {
        knows::<RawTable>(path) || knows::<RawInbox>(path)
    }

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        let table = table_spec(raw.0, key, name, v);
        inbox_spec(table, raw.1, key, v)
    }

    fn name(&self) -> &str {
        &self.table.name
    }

    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        let (leader, sink, pool) = prepare(&self.table, rt)?;
        let name = self.table.name.clone();
        let make = move || {
            TableSource::new(
                self.table.clone(),
                Inbox::new(self.clone()).with_spans(sink.clone()),
            )
            .with_pool(pool.clone())
        };
        rt.spawn_loop(&name, make, leader);
        Ok(())
    }

    fn describe(&self) -> String {
        describe(&self.table)
    }

    async fn doctor(&self) -> Vec<Finding> {
        let source = TableSource::new(self.table.clone(), Inbox::new(self.clone()));
        doctor::check(&source, Shape::Inbox(self)).await
    }

    fn keeps_events(&self) -> bool {
        true
    }

    async fn trace_event(&self, event_id: &str) -> Result<Option<String>, String> {
        lookup::trace_inbox(self, event_id).await
    }

    async fn dead_letters(&self, since: Duration, limit: usize) -> Result<Vec<DeadLetter>, String> {
        lookup::dead_letters(self, since, limit).await
    }
}

impl Kind for OutboxSpec {
    const KIND: &'static str = "outbox";
    type Raw = (RawTable, RawOutbox);

    fn read(v: &mut Validator<'_>, key: &str, entry: Spanned<DeValue<'_>>) -> Read<Self::Raw> {
        config::read::<RawOutbox>(v, key, entry)
    }

    fn knows(path: &[String]) -> bool {
        knows::<RawTable>(path) || knows::<RawOutbox>(path)
    }

    fn validate(raw: Self::Raw, key: &str, name: String, v: &mut Validator<'_>) -> Option<Self> {
        let table = table_spec(raw.0, key, name, v);
        outbox_spec(table, raw.1, key, v)
    }

    fn name(&self) -> &str {
        &self.table.name
    }

    fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
        let (leader, sink, pool) = prepare(&self.table, rt)?;
        let name = self.table.name.clone();
        let make = move || {
            TableSource::new(
                self.table.clone(),
                Outbox::new(self.clone()).with_spans(sink.clone()),
            )
            .with_pool(pool.clone())
        };
        rt.spawn_loop(&name, make, leader);
        Ok(())
    }

    fn describe(&self) -> String {
        describe(&self.table)
    }

    async fn doctor(&self) -> Vec<Finding> {
        let source = TableSource::new(self.table.clone(), Outbox::new(self.clone()));
        doctor::check(&source, Shape::Outbox(self)).await
    }

    fn keeps_events(&self) -> bool {
        true
    }

    async fn trace_event(&self, event_id: &str) -> Result<Option<String>, String> {
        lookup::trace_outbox(self, event_id).await
    }
}

fn describe(table: &TableSpec) -> String {
    format!("{}, table {}", table.dsn, table.table)
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
        metrics::gauge!(m::OBJECTIVE_OLDEST_AGE, "source" => name.clone()).set(o.as_secs_f64());
    }
    if let Some(p) = table.objectives.p95 {
        metrics::gauge!(m::OBJECTIVE_P95, "source" => name.clone()).set(p.as_secs_f64());
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
