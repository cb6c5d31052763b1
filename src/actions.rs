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
use crate::sources::kind::{
    Action, ActionError, ActionRequest, DeadLetterActions, Run, RunCounts, Selection,
};
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

/// A bulk selection as the command's flags (without `--rate`): the words
/// of its command line, and the `selection` column of its run.
fn selection_words(s: &Selection) -> Vec<String> {
    let mut words = Vec::new();
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
    words
}

/// The command line of `request` on `source` up to its selection.
fn command_words(config_path: &Path, source: &str, request: &ActionRequest) -> Vec<String> {
    vec![
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
    ]
}

/// The command that applies this dry run.
fn apply_command(
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    s: &Selection,
) -> String {
    let mut words = command_words(config_path, source, request);
    words.extend(selection_words(s));
    words.extend([
        "--rate".to_string(),
        format!("{}/s", s.rate),
        "--yes".into(),
    ]);
    words.join(" ")
}

/// The command that resumes run `run_id`.
fn resume_command(
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    run_id: &str,
) -> String {
    let mut words = command_words(config_path, source, request);
    words.extend(["--resume".to_string(), shell_word(run_id), "--yes".into()]);
    words.join(" ")
}

/// A new run's id: its start in UTC and six random hex digits, e.g.
/// `20261204T170102Z-9f3a1c`.
fn new_run_id() -> String {
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let compact: String = at.chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("{compact}-{:06x}", fastrand::u32(..) & 0xff_ffff)
}

/// The first twenty ids and how many more, one per line.
fn shown(out: &mut String, ids: &[String]) {
    for id in ids.iter().take(SHOWN_IDS) {
        let _ = writeln!(out, "{}", printable(id));
    }
    if ids.len() > SHOWN_IDS {
        let _ = writeln!(out, "… and {} more", ids.len() - SHOWN_IDS);
    }
}

fn verb(action: Action) -> &'static str {
    match action {
        Action::Replay => "replayed",
        Action::Ignore => "ignored",
    }
}

/// `dead-letters replay | ignore` with a group or a filter: the dead letters
/// picked when the run starts (its snapshot), each at most once, oldest
/// first, at most `rate` a second, recorded as a run (its row, and its id on
/// each audit row). Without `--yes`, the count, the first twenty ids and the
/// command that applies it; nothing is written.
pub async fn bulk(
    config: &Config,
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    selection: &Selection,
) -> Result<(String, bool), CommandError> {
    check_request(request)?;
    let spec = find(config, source)?;
    let actions = offered(spec)?;
    let ids = snapshot(config, spec, selection).await?;
    let mut out = String::new();
    if !request.apply {
        let _ = writeln!(
            out,
            "{} dead letters would be {}",
            ids.len(),
            verb(request.action)
        );
        shown(&mut out, &ids);
        let _ = writeln!(
            out,
            "to apply: {}",
            apply_command(config_path, source, request, selection)
        );
        return Ok((out, true));
    }
    let run = Run {
        id: new_run_id(),
        action: request.action,
        operator: request.operator.clone(),
        reason: request.reason.clone(),
        selection: selection_words(selection).join(" "),
        rate: selection.rate,
        event_ids: ids,
        started_at: 0,
        finished_at: None,
        counts: RunCounts::default(),
    };
    actions
        .begin_run(&run)
        .await
        .map_err(|e| action_error(source, e))?;
    eprintln!(
        "run {}: {} dead letters to be {} at most {}/s; if it is interrupted, resume it with: {}",
        run.id,
        run.event_ids.len(),
        verb(request.action),
        run.rate,
        resume_command(config_path, source, request, &run.id)
    );
    execute(
        actions,
        config_path,
        source,
        request,
        &run.id,
        &run.event_ids,
        RunCounts::default(),
        run.rate,
    )
    .await
}

/// `dead-letters replay | ignore --resume RUN_ID`: the events of an
/// interrupted run's snapshot that no audit row of the run names, in the
/// run's order; `rate`, or else the run's own. Without `--yes`, what would
/// be done.
pub async fn resume(
    config: &Config,
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    run_id: &str,
    rate: Option<u32>,
) -> Result<(String, bool), CommandError> {
    check_request(request)?;
    let spec = find(config, source)?;
    let actions = offered(spec)?;
    let (run, done) = actions
        .load_run(run_id)
        .await
        .map_err(|e| action_error(source, e))?;
    if run.action != request.action {
        return Err(CommandError::Usage(format!(
            "--resume: run \"{run_id}\" is a {} run: resume it with `dead-letters {}`",
            run.action.as_str(),
            run.action.as_str()
        )));
    }
    let c = run.counts;
    if let Some(at) = run.finished_at {
        return Ok((
            format!(
                "run {run_id} finished at {}: nothing to resume ({}: {}, skipped (no longer \
                 dead): {}, failed: {})\n",
                timestamp(at),
                run.action.as_str(),
                c.done,
                c.skipped,
                c.failed
            ),
            true,
        ));
    }
    let done: std::collections::HashSet<String> = done.into_iter().collect();
    let remaining: Vec<String> = run
        .event_ids
        .iter()
        .filter(|id| !done.contains(*id))
        .cloned()
        .collect();
    let already = (run.event_ids.len() - remaining.len()) as u64;
    let rate = rate.unwrap_or(run.rate);
    let mut out = String::new();
    if !request.apply {
        let _ = writeln!(
            out,
            "{} of the {} dead letters of run {run_id} would be {} ({} were already)",
            remaining.len(),
            run.event_ids.len(),
            verb(request.action),
            already
        );
        shown(&mut out, &remaining);
        let _ = writeln!(
            out,
            "to apply: {}",
            resume_command(config_path, source, request, run_id)
        );
        return Ok((out, true));
    }
    eprintln!(
        "run {run_id}: resumed, {} of {} dead letters left, at most {rate}/s",
        remaining.len(),
        run.event_ids.len()
    );
    let counts = RunCounts {
        done: already,
        ..RunCounts::default()
    };
    execute(
        actions,
        config_path,
        source,
        request,
        run_id,
        &remaining,
        counts,
        rate,
    )
    .await
}

/// The source's dead-letter actions, or why it has none.
fn offered(spec: &SourceSpec) -> Result<&dyn DeadLetterActions, CommandError> {
    spec.dead_letter_actions().ok_or_else(|| {
        CommandError::Usage(format!(
            "--source: source \"{}\" {}",
            spec.name(),
            ActionError::Unsupported(spec.kind())
        ))
    })
}

/// An error of the kind as the command says it: a refusal (no such topic,
/// a range outside a partition, …) is bad usage, naming the source.
fn action_error(source: &str, e: ActionError) -> CommandError {
    match e {
        ActionError::Failed(m) => CommandError::Failed(format!("source \"{source}\": {m}")),
        ActionError::Refused(m) => CommandError::Usage(format!("source \"{source}\": {m}")),
        other => CommandError::Usage(format!("--source: source \"{source}\" {other}")),
    }
}

/// Works through `ids` of run `run_id`, `rate` a second, from `counts`: the
/// run's row keeps the counts after each second's events, and its end. An
/// interruption (Ctrl-C, SIGTERM) stops the run once the second's events in
/// hand are done, and says how to resume it.
#[allow(clippy::too_many_arguments)]
async fn execute(
    actions: &dyn DeadLetterActions,
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    run_id: &str,
    ids: &[String],
    mut counts: RunCounts,
    rate: u32,
) -> Result<(String, bool), CommandError> {
    let progress = std::io::stderr().is_terminal() && std::io::stdout().is_terminal();
    let total = counts.done as usize + ids.len();
    let mut out = String::new();
    let step = usize::try_from(rate).unwrap_or(1).max(1);
    let mut stop = std::pin::pin!(interrupted());
    // Polled once, so that the handlers are in place before the first event.
    tokio::select! {
        biased;
        () = &mut stop => return Err(stopped(config_path, source, request, run_id, counts, total)),
        () = std::future::ready(()) => {}
    }
    let mut warned = false;
    for chunk in ids.chunks(step) {
        let started = tokio::time::Instant::now();
        let one = ActionRequest {
            event_ids: chunk.to_vec(),
            run_id: Some(run_id.to_string()),
            ..request.clone()
        };
        // A signal during the second's events stops the run after them:
        // the counts then match the audit rows.
        let outcomes = actions.act(&one).await;
        let outcomes = outcomes.map_err(|e| match e {
            ActionError::Failed(m) => CommandError::Failed(format!(
                "source \"{source}\": {m} (after {} of {} events; resume with: {})",
                counts.done + counts.skipped + counts.failed,
                total,
                resume_command(config_path, source, request, run_id)
            )),
            other => CommandError::Usage(format!("--source: source \"{source}\" {other}")),
        })?;
        for o in &outcomes {
            if o.done {
                counts.done += 1;
            } else if o.line.starts_with("refused") {
                counts.skipped += 1;
            } else {
                counts.failed += 1;
            }
            if !o.done {
                let _ = writeln!(out, "{}", printable(&o.line));
            }
        }
        if let Err(e) = actions.update_run(run_id, counts, false).await
            && !warned
        {
            warned = true;
            eprintln!("warning: the counts of run {run_id} could not be recorded: {e}");
        }
        if progress {
            let seen = counts.done + counts.skipped + counts.failed;
            eprint!("\r{seen}/{total} events");
        }
        // Each chunk of `rate` events takes a whole second, the last one
        // too: the run never goes faster than the cap.
        tokio::select! {
            () = tokio::time::sleep_until(started + Duration::from_secs(1)) => {}
            () = &mut stop => {
                let _ = actions.update_run(run_id, counts, false).await;
                return Err(stopped(config_path, source, request, run_id, counts, total));
            }
        }
    }
    if progress {
        eprintln!();
    }
    if let Err(e) = actions.update_run(run_id, counts, true).await {
        eprintln!("warning: the end of run {run_id} could not be recorded: {e}");
    }
    let _ = writeln!(
        out,
        "run {run_id}: {}: {}, skipped (no longer dead): {}, failed: {}",
        request.action.as_str(),
        counts.done,
        counts.skipped,
        counts.failed
    );
    Ok((out, counts.failed == 0))
}

/// Ctrl-C or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What an interrupted run says: how far it got and how to resume it.
fn stopped(
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    run_id: &str,
    counts: RunCounts,
    total: usize,
) -> CommandError {
    CommandError::Failed(format!(
        "run {run_id} interrupted after {} of {total} events ({}: {}, skipped: {}, failed: {}); \
         resume with: {}",
        counts.done + counts.skipped + counts.failed,
        request.action.as_str(),
        counts.done,
        counts.skipped,
        counts.failed,
        resume_command(config_path, source, request, run_id)
    ))
}
