//! An inbox or an outbox source's settings, for the code that reads either
//! and differs between them: `doctor`'s checks, what each metric will be
//! (`capabilities`), and the optional meanings both `doctor` and `run` look
//! for among a table's columns.

use super::config::{InboxSpec, OutboxSpec, TableSpec};

/// An inbox or an outbox source, for the checks that differ.
#[derive(Clone, Copy)]
pub(crate) enum Shape<'a> {
    Inbox(&'a InboxSpec),
    Outbox(&'a OutboxSpec),
}

impl Shape<'_> {
    /// The settings every table source has.
    pub(crate) fn table(&self) -> &TableSpec {
        match self {
            Shape::Inbox(s) => &s.table,
            Shape::Outbox(s) => &s.table,
        }
    }

    /// The meanings a table of this shape may map beyond those it needs:
    /// what `doctor` looks for among the table's columns and what `run`
    /// notes when a column of that very name is left unmapped.
    pub(crate) fn optional_meanings(&self) -> &'static [&'static str] {
        match self {
            Shape::Inbox(_) => &[
                "event_type",
                "started_at",
                "finished_at",
                "attempts",
                "deliveries",
                "last_error",
                "traceparent",
                "business_key",
                "summary",
                "updated_at",
                "ordering_key",
                "version",
            ],
            Shape::Outbox(_) => &["event_type", "traceparent", "updated_at"],
        }
    }

    /// The optional meanings left unmapped that `run` notes when the table
    /// has a column of that very name: all but `updated_at`, which serves as
    /// a change cursor only if the consumer sets it on every change (`doctor`
    /// says when a column looks like one, with that caveat).
    pub(crate) fn unmapped_meanings(&self) -> Vec<&'static str> {
        let mapped = self.mapped();
        self.optional_meanings()
            .iter()
            .copied()
            .filter(|m| *m != "updated_at" && !mapped.iter().any(|(k, _)| k == m))
            .collect()
    }

    /// Each mapped meaning and its column.
    pub(crate) fn mapped(&self) -> Vec<(&'static str, &str)> {
        match self {
            Shape::Inbox(s) => s.columns.mapped(),
            Shape::Outbox(s) => s.columns.mapped(),
        }
    }
}
