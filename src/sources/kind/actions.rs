//! The audited human actions a kind may offer on its dead letters:
//! `dead-letters replay` / `ignore` (the only writes, over a write-capable
//! connection of their own; the agent's poll never makes them) and the
//! history of those actions that the pages show.

use std::time::Duration;

use super::Answer;

/// `dead-letters replay` / `ignore` on a source's dead letters, and their
/// audit.
pub trait DeadLetterActions: Sync {
    /// The DDL of the table the actions are recorded in (`schema --config`);
    /// `None` when the source's actions are not configured.
    fn audit_ddl(&self) -> Option<String>;

    /// One `dead-letters replay` / `ignore`: one transaction per event over
    /// the source's write-capable action DSN. Only the command line calls
    /// this.
    fn act<'a>(
        &'a self,
        request: &'a ActionRequest,
    ) -> Answer<'a, Result<Vec<ActionOutcome>, ActionError>>;

    /// The replay / ignore history of these events, oldest first, read over
    /// the agent's own read-only connection; empty when the actions are not
    /// configured or their audit table does not exist.
    fn history<'a>(
        &'a self,
        event_ids: &'a [String],
    ) -> Answer<'a, Result<Vec<AuditEntry>, String>>;

    /// Records a bulk run before its first event: its row in the runs
    /// table, with its snapshot. `Err` (nothing written) when the runs table
    /// or the audit table's `run_id` column is missing.
    fn begin_run<'a>(&'a self, run: &'a Run) -> Answer<'a, Result<(), ActionError>>;

    /// A bulk run's counts so far, and whether it has finished.
    fn update_run<'a>(
        &'a self,
        run_id: &'a str,
        counts: RunCounts,
        finished: bool,
    ) -> Answer<'a, Result<(), ActionError>>;

    /// A bulk run as recorded, and the events its audit rows say it has
    /// already done, for `--resume`.
    fn load_run<'a>(
        &'a self,
        run_id: &'a str,
    ) -> Answer<'a, Result<(Run, Vec<String>), ActionError>>;
}

/// One bulk `dead-letters replay` / `ignore` run: a row of the runs table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub id: String,
    pub action: Action,
    pub operator: String,
    pub reason: String,
    /// The group or filter, as the command's flags.
    pub selection: String,
    /// Events per second, at most.
    pub rate: u32,
    /// The snapshot: the events to act on, in the run's order.
    pub event_ids: Vec<String>,
    /// When it began, microseconds since the epoch (database clock).
    pub started_at: i64,
    /// When it finished; `None` while it runs or after an interruption.
    pub finished_at: Option<i64>,
    pub counts: RunCounts,
}

/// What became of a bulk run's events so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunCounts {
    /// Replayed or ignored.
    pub done: u64,
    /// No longer dead when their turn came.
    pub skipped: u64,
    /// A database error: nothing changed.
    pub failed: u64,
}

/// The default `audit_table` of `[sources.dead_letter_actions]`, of every
/// kind (one audit table may hold the actions of several sources).
pub const DEFAULT_AUDIT_TABLE: &str = "inboxwatch_dead_letter_actions";

/// What `dead-letters replay` / `ignore` do to a dead-lettered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back to the replay status, for the consumer to process again.
    Replay,
    /// Recorded as deliberately not processed (and, if configured, given
    /// the ignored status).
    Ignore,
}

impl Action {
    /// The `action` column of the audit table.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Ignore => "ignore",
        }
    }

    /// The action an `action` column names.
    pub fn parse(word: &str) -> Option<Action> {
        match word {
            "replay" => Some(Action::Replay),
            "ignore" => Some(Action::Ignore),
            _ => None,
        }
    }
}

/// One `dead-letters replay` / `ignore` command.
#[derive(Debug, Clone)]
pub struct ActionRequest {
    pub action: Action,
    pub operator: String,
    pub reason: String,
    pub event_ids: Vec<String>,
    /// `--yes`: write; without it, only say what would be done.
    pub apply: bool,
    /// The bulk run these events belong to: their audit rows name it.
    pub run_id: Option<String>,
}

/// A bulk `dead-letters replay` / `ignore`: which dead letters, and how fast.
#[derive(Debug, Clone)]
pub struct Selection {
    /// `--group`: a failure group's id (`crate::fingerprint::Key::id`).
    pub group: Option<String>,
    pub error_class: Option<String>,
    pub event_type: Option<String>,
    /// Dead-lettered within this long (default 7 days).
    pub since: Option<Duration>,
    /// Dead-lettered at least this long ago.
    pub until: Option<Duration>,
    /// Events per second, at most.
    pub rate: u32,
}

/// `--rate`: `N/s` or `N`, N from 1 to 10000 events per second.
pub fn parse_rate(text: &str) -> Result<u32, String> {
    let n = text.strip_suffix("/s").unwrap_or(text);
    match n.trim().parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text:?}: expected events per second from 1 to 10000, e.g. `100/s`"
        )),
    }
}

/// What became of one event of an [`ActionRequest`].
#[derive(Debug, Clone)]
pub struct ActionOutcome {
    pub event_id: String,
    /// Done (or, without `--yes`, would be done).
    pub done: bool,
    /// One line saying what was done or why not.
    pub line: String,
}

/// Why a `dead-letters replay` / `ignore` command did nothing at all.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The source's kind keeps no dead-lettered rows.
    #[error("is of kind \"{0}\", which offers no dead-letter actions (replay / ignore)")]
    Unsupported(&'static str),
    /// The inbox has no `[sources.dead_letter_actions]`.
    #[error(
        "has no [sources.dead_letter_actions]: replay and ignore need its write-capable dsn \
         (docs/configuration.md, \"Dead-letter actions\")"
    )]
    NotConfigured,
    /// Connecting, or the audit table, failed: nothing was written.
    #[error("{0}")]
    Failed(String),
    /// The request cannot be done as asked (no such topic, an offset range
    /// outside the partition, …): nothing was written.
    #[error("{0}")]
    Refused(String),
}

/// One row of the audit table: a replay or an ignore of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub event_id: String,
    /// `replay` or `ignore`.
    pub action: String,
    pub operator: String,
    pub reason: String,
    /// When, on the database's clock: microseconds since the epoch.
    pub at: i64,
    /// The row's status word before the action.
    pub previous_status: Option<String>,
    /// The row's attempts before the action.
    pub attempts: Option<i64>,
    /// The row's last error before the action.
    pub last_error: Option<String>,
}
