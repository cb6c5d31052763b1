//! `inboxwatch dead-letters replay | ignore`: the audited human actions on
//! dead-lettered events. The command picks the source; its kind, when it
//! offers dead-letter actions (`DeadLetterActions`), does the work over the
//! source's write-capable `[sources.dead_letter_actions]` DSN. The agent
//! (`run`) never comes here.

use std::fmt::Write as _;

use crate::config::Config;
use crate::sources::SourceSpec;
use crate::sources::kind::{ActionError, ActionRequest};
use crate::text::{printable, timestamp};

/// Why the command did nothing at all.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Bad usage: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Nothing could be tried (connecting, the audit table): exit 1.
    #[error("{0}")]
    Failed(String),
}

impl CommandError {
    /// Exit code: 2 for bad usage, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Usage(_) => 2,
            CommandError::Failed(_) => 1,
        }
    }
}

/// Runs one `dead-letters replay` / `ignore`: one line per event, and
/// whether every event was done (or, without `--yes`, would be).
pub async fn run(
    config: &Config,
    source: &str,
    request: &ActionRequest,
) -> Result<(String, bool), CommandError> {
    for (flag, value) in [
        ("--operator", &request.operator),
        ("--reason", &request.reason),
    ] {
        if value.trim().is_empty() {
            return Err(CommandError::Usage(format!(
                "{flag}: must not be empty (it is recorded in the audit table)"
            )));
        }
    }
    if let Some(bad) = request.event_ids.iter().find(|i| i.is_empty()) {
        return Err(CommandError::Usage(format!(
            "event id {bad:?}: must not be empty"
        )));
    }
    let spec = find(config, source)?;
    let outcomes = match spec.dead_letter_actions() {
        Some(actions) => actions.act(request).await,
        None => Err(ActionError::Unsupported(spec.kind())),
    }
    .map_err(|e| match e {
        ActionError::Failed(m) => CommandError::Failed(format!("source \"{source}\": {m}")),
        other => CommandError::Usage(format!("--source: source \"{source}\" {other}")),
    })?;
    let mut out = String::new();
    let mut all = true;
    for o in &outcomes {
        all &= o.done;
        let _ = writeln!(out, "{}", printable(&o.line));
    }
    Ok((out, all))
}

fn find<'a>(config: &'a Config, source: &str) -> Result<&'a SourceSpec, CommandError> {
    config
        .sources
        .iter()
        .find(|s| s.name() == source)
        .ok_or_else(|| {
            CommandError::Usage(format!(
                "--source: no source named \"{source}\" in the config"
            ))
        })
}

/// `dead-letters history`: the audit rows of these events, oldest first,
/// tab-separated under a header.
pub async fn history(
    config: &Config,
    source: &str,
    event_ids: &[String],
) -> Result<String, CommandError> {
    let spec = find(config, source)?;
    let entries = match spec.dead_letter_actions() {
        Some(actions) => actions.history(event_ids).await,
        None => Ok(Vec::new()),
    }
    .map_err(|m| CommandError::Failed(format!("source \"{source}\": {m}")))?;
    let mut out = String::from(
        "event_id\taction\toperator\treason\tat\tprevious_status\tattempts\tlast_error\n",
    );
    let cell = |s: Option<&str>| s.map_or("-".to_string(), printable);
    for e in entries {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            cell(Some(&e.event_id)),
            cell(Some(&e.action)),
            cell(Some(&e.operator)),
            cell(Some(&e.reason)),
            timestamp(e.at),
            cell(e.previous_status.as_deref()),
            e.attempts.map_or("-".to_string(), |a| a.to_string()),
            cell(
                e.last_error
                    .as_deref()
                    .map(|e| config.redact.text(e))
                    .as_deref()
            ),
        );
    }
    Ok(out)
}
