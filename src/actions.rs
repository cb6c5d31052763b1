//! `inboxwatch dead-letters replay | ignore`: the audited human actions on
//! dead-lettered events. The command picks the source; its kind, when it
//! offers dead-letter actions (`DeadLetterActions`), does the work over the
//! source's write-capable `[sources.dead_letter_actions]` DSN. The agent
//! (`run`) never comes here.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Duration;

use crate::config::Config;
use crate::fingerprint::Key;
use crate::sources::SourceSpec;
use crate::sources::kind::{Action, ActionError, ActionRequest, Selection};
use crate::text::{printable, timestamp};

mod topic_replay;
pub use topic_replay::{TOPIC_REPLAY_MAX, topic_replay};

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
    check_request(request)?;
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

/// Operator and reason present, no empty event id.
fn check_request(request: &ActionRequest) -> Result<(), CommandError> {
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
    Ok(())
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

/// Dead letters a bulk run reads at most (per run): a larger incident is
/// worked in narrower windows (`--since`, `--until`).
pub const BULK_MAX: usize = 100_000;

/// The window of a bulk run without `--since`.
const BULK_SINCE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Ids a dry run of a bulk action shows.
const SHOWN_IDS: usize = 20;

/// A bulk run's snapshot: the ids of the dead letters `selection` picks,
/// read once when the run starts, oldest dead-lettered first (then by id).
async fn snapshot(
    config: &Config,
    spec: &SourceSpec,
    selection: &Selection,
) -> Result<Vec<String>, CommandError> {
    let Some(lookups) = spec.lookups() else {
        return Err(CommandError::Usage(format!(
            "--source: source \"{}\" is of kind \"{}\", which offers no dead-letter actions",
            spec.name(),
            spec.kind()
        )));
    };
    let rows = lookups
        .dead_letters(selection.since.unwrap_or(BULK_SINCE), BULK_MAX + 1)
        .await
        .map_err(|m| CommandError::Failed(format!("source \"{}\": {m}", spec.name())))?;
    if rows.len() > BULK_MAX {
        return Err(CommandError::Usage(format!(
            "more than {BULK_MAX} dead letters in the window: narrow it with --since / --until"
        )));
    }
    let until = selection.until.map(|d| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(now.saturating_sub(d).as_micros()).unwrap_or(i64::MAX)
    });
    let mut picked: Vec<(i64, String)> = rows
        .iter()
        .filter(|r| {
            let key = r.as_letter(&config.redact, spec.name(), spec.owner(), |l| Key::of(&l));
            selection.group.as_ref().is_none_or(|g| *g == key.id())
                && selection
                    .error_class
                    .as_ref()
                    .is_none_or(|c| *c == key.error_class)
                && selection
                    .event_type
                    .as_ref()
                    .is_none_or(|t| *t == key.event_type)
                && until.is_none_or(|u| r.dead_at.is_some_and(|at| at <= u))
        })
        .map(|r| (r.dead_at.unwrap_or_default(), r.event_id.clone()))
        .collect();
    picked.sort();
    picked.dedup_by(|a, b| a.1 == b.1);
    Ok(picked.into_iter().map(|(_, id)| id).collect())
}

/// A word the shell reads back as itself.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that applies this dry run.
fn apply_command(
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    s: &Selection,
) -> String {
    let mut words = vec![
        "inboxwatch".to_string(),
        "dead-letters".to_string(),
        request.action.as_str().to_string(),
        "--config".to_string(),
        shell_word(&config_path.to_string_lossy()),
        "--source".to_string(),
        shell_word(source),
        "--operator".to_string(),
        shell_word(&request.operator),
        "--reason".to_string(),
        shell_word(&request.reason),
    ];
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            words.push(name.to_string());
            words.push(shell_word(&v));
        }
    };
    let secs = |d: Duration| format!("{}s", d.as_secs());
    flag("--group", s.group.clone());
    flag("--error-class", s.error_class.clone());
    flag("--event-type", s.event_type.clone());
    flag("--since", s.since.map(secs));
    flag("--until", s.until.map(secs));
    flag("--rate", Some(format!("{}/s", s.rate)));
    words.push("--yes".to_string());
    words.join(" ")
}

/// What became of a bulk run's events.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    done: usize,
    skipped: usize,
    failed: usize,
}

/// `dead-letters replay | ignore` with a group or a filter: the dead letters
/// picked when the run starts (its snapshot), each at most once, oldest
/// first, at most `rate` a second. Without `--yes`, the count, the first
/// twenty ids and the command that applies it; nothing is written.
pub async fn bulk(
    config: &Config,
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    selection: &Selection,
) -> Result<(String, bool), CommandError> {
    check_request(request)?;
    let spec = find(config, source)?;
    let Some(actions) = spec.dead_letter_actions() else {
        return Err(CommandError::Usage(format!(
            "--source: source \"{source}\" {}",
            ActionError::Unsupported(spec.kind())
        )));
    };
    let ids = snapshot(config, spec, selection).await?;
    let mut out = String::new();
    if !request.apply {
        let _ = writeln!(
            out,
            "{} dead letters would be {}",
            ids.len(),
            match request.action {
                Action::Replay => "replayed",
                Action::Ignore => "ignored",
            }
        );
        for id in ids.iter().take(SHOWN_IDS) {
            let _ = writeln!(out, "{}", printable(id));
        }
        if ids.len() > SHOWN_IDS {
            let _ = writeln!(out, "… and {} more", ids.len() - SHOWN_IDS);
        }
        let _ = writeln!(
            out,
            "to apply: {}",
            apply_command(config_path, source, request, selection)
        );
        return Ok((out, true));
    }
    let progress = std::io::stderr().is_terminal() && std::io::stdout().is_terminal();
    let mut tally = Tally::default();
    let step = usize::try_from(selection.rate).unwrap_or(1).max(1);
    for chunk in ids.chunks(step) {
        let started = tokio::time::Instant::now();
        let one = ActionRequest {
            event_ids: chunk.to_vec(),
            ..request.clone()
        };
        let outcomes = actions.act(&one).await.map_err(|e| match e {
            ActionError::Failed(m) => CommandError::Failed(format!(
                "source \"{source}\": {m} (after {} of {} events)",
                tally.done + tally.skipped + tally.failed,
                ids.len()
            )),
            other => CommandError::Usage(format!("--source: source \"{source}\" {other}")),
        })?;
        for o in &outcomes {
            if o.done {
                tally.done += 1;
            } else if o.line.starts_with("refused") {
                tally.skipped += 1;
            } else {
                tally.failed += 1;
            }
            if !o.done {
                let _ = writeln!(out, "{}", printable(&o.line));
            }
        }
        if progress {
            let seen = tally.done + tally.skipped + tally.failed;
            eprint!("\r{seen}/{} events", ids.len());
        }
        // Each chunk of `rate` events takes a whole second, the last one
        // too: the run never goes faster than the cap.
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    }
    if progress {
        eprintln!();
    }
    let _ = writeln!(
        out,
        "{}: {}, skipped (no longer dead): {}, failed: {}",
        request.action.as_str(),
        tally.done,
        tally.skipped,
        tally.failed
    );
    Ok((out, tally.failed == 0))
}
