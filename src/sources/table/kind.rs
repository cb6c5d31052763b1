//! Inbox and outbox tables as kinds of source: how their entries are read
//! (and the presets they take), how they start (a database lock decides the
//! owner; one pool per database is shared by every table on it), what
//! `doctor` checks, and what they offer beyond polling: both the lookups and
//! the indexes of `schema --config`; inboxes also the dead-letter actions.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tracing::info;

use super::config::{
    InboxSpec, OutboxSpec, RawInbox, RawOutbox, RawTable, TableSpec, inbox_spec, outbox_spec,
    table_spec,
};
use super::doctor;
use super::inbox::Inbox;
use super::lock::{LockSessions, SourceLock};
use super::outbox::Outbox;
use super::shape::Shape;
use super::{Pools, TableSource, actions, card, lookup, presets, schema};
use crate::card::{Card, Past};
use crate::coordination::LEASE;
use crate::redact::Redactor;
use crate::sources::common::{Common, RawCommon};
use crate::sources::kind::{
    ActionError, ActionOutcome, ActionRequest, Answer, AuditEntry, DeadLetter, DeadLetterActions,
    Finding, Kind, Lookups, Preset, Run, RunCounts, Runtime, Schema,
};
use crate::telemetry::catalogue as metric;
use crate::telemetry::values::Reading;
use crate::tracing_link::SpanSink;
use crate::validation::Validator;

/// The `Kind` of a table source: `$spec` with its own keys `$raw`, checked by
/// `$validate`, polled as `$poll`, checked by `doctor` as `$shape`; the
/// methods given after them are the kind's own.
macro_rules! table_kind {
    (
        $spec:ty, $kind:literal, $raw:ty, $validate:path, $poll:ident, $shape:path;
        $($own:item)*
    ) => {
        impl Kind for $spec {
            const KIND: &'static str = $kind;
            type Raw = (RawCommon, RawTable, $raw);

            fn validate(
                (common, shared, own): Self::Raw,
                key: &str,
                name: String,
                v: &mut Validator<'_>,
            ) -> Option<Self> {
                let table = table_spec((common, shared), $kind, key, name, v);
                $validate(table, own, key, v)
            }

            fn presets() -> Vec<Box<dyn Preset>> {
                presets::of_kind($kind)
            }

            fn common(&self) -> &Common {
                &self.table.common
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

            fn reads(&self) -> String {
                TableSource::new(self.table.clone(), $poll::new(self.clone())).reads()
            }

            fn lookups(&self) -> Option<&dyn Lookups> {
                Some(self)
            }

            fn schema(&self) -> Option<&dyn Schema> {
                Some(self)
            }

            $($own)*
        }

        impl Schema for $spec {
            fn indexes(&self) -> String {
                let source = TableSource::new(self.table.clone(), $poll::new(self.clone()));
                doctor::indexes(&source, $shape(self))
            }
        }
    };
}

table_kind! {
    InboxSpec, "inbox", RawInbox, inbox_spec, Inbox, Shape::Inbox;
    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        card::inbox(values, past)
    }

    fn dead_letter_actions(&self) -> Option<&dyn DeadLetterActions> {
        Some(self)
    }
}

table_kind! {
    OutboxSpec, "outbox", RawOutbox, outbox_spec, Outbox, Shape::Outbox;
    fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
        card::outbox(values, past)
    }
}

impl Lookups for InboxSpec {
    fn trace_event<'a>(
        &'a self,
        event_id: &'a str,
        redact: &'a Redactor,
    ) -> Answer<'a, Result<Option<String>, String>> {
        Box::pin(lookup::trace_inbox(self, event_id, redact))
    }

    fn dead_letters(
        &self,
        since: Duration,
        limit: usize,
    ) -> Answer<'_, Result<Vec<DeadLetter>, String>> {
        Box::pin(lookup::dead_letters(self, since, limit))
    }

    fn failing(
        &self,
        since: Duration,
        limit: usize,
    ) -> Answer<'_, Result<Vec<DeadLetter>, String>> {
        Box::pin(lookup::failing(self, since, limit))
    }

    fn error_classes(&self) -> Vec<String> {
        self.error_classes
            .all()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }
}

/// An outbox row is published or not: it is never dead-lettered.
impl Lookups for OutboxSpec {
    fn trace_event<'a>(
        &'a self,
        event_id: &'a str,
        redact: &'a Redactor,
    ) -> Answer<'a, Result<Option<String>, String>> {
        Box::pin(lookup::trace_outbox(self, event_id, redact))
    }

    fn dead_letters(
        &self,
        _since: Duration,
        _limit: usize,
    ) -> Answer<'_, Result<Vec<DeadLetter>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn error_classes(&self) -> Vec<String> {
        Vec::new()
    }
}

impl DeadLetterActions for InboxSpec {
    fn audit_ddl(&self) -> Option<String> {
        self.actions
            .as_ref()
            .map(|a| schema::audit_ddl(self.table.dsn.dialect(), &a.audit_table))
    }

    fn act<'a>(
        &'a self,
        request: &'a ActionRequest,
    ) -> Answer<'a, Result<Vec<ActionOutcome>, ActionError>> {
        Box::pin(actions::act(self, request))
    }

    fn history<'a>(
        &'a self,
        event_ids: &'a [String],
    ) -> Answer<'a, Result<Vec<AuditEntry>, String>> {
        Box::pin(actions::audit_history(self, event_ids))
    }

    fn begin_run<'a>(&'a self, run: &'a Run) -> Answer<'a, Result<(), ActionError>> {
        Box::pin(actions::begin_run(self, run))
    }

    fn update_run<'a>(
        &'a self,
        run_id: &'a str,
        counts: RunCounts,
        finished: bool,
    ) -> Answer<'a, Result<(), ActionError>> {
        Box::pin(actions::update_run(self, run_id, counts, finished))
    }

    fn load_run<'a>(
        &'a self,
        run_id: &'a str,
    ) -> Answer<'a, Result<(Run, Vec<String>), ActionError>> {
        Box::pin(actions::load_run(self, run_id))
    }
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
