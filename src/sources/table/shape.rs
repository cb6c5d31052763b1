//! An inbox or an outbox source's settings, for the code that reads either
//! and differs between them: `doctor`'s checks and what each metric will be
//! (`capabilities`).

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

    /// Each mapped meaning and its column.
    pub(crate) fn mapped(&self) -> Vec<(&'static str, &str)> {
        match self {
            Shape::Inbox(s) => s.columns.mapped(),
            Shape::Outbox(s) => s.columns.mapped(),
        }
    }
}
