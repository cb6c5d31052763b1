//! `inboxwatch dead-letters replay --topic`: records of a dead-letter topic
//! sent back, as a bulk run is: the records picked once when the run
//! starts, each sent at most once, oldest first per partition, at most
//! `--rate` a second; without `--yes`, the count, the first twenty records
//! and the command that applies it. The kind picks, produces and audits
//! (`TopicReplay`); a run without an audit table is refused before
//! anything is sent.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Duration;

use super::{
    CommandError, SHOWN_IDS, action_error, check_request, command_words, find, new_run_id,
    shell_word,
};
use crate::config::Config;
use crate::sources::kind::{ActionRequest, ReplayRun, TopicSelection};
use crate::text::printable;

/// Records one run sends back at most: a larger incident is worked in
/// narrower ranges (`--partition` with `--from-offset` / `--to-offset`,
/// `--since` / `--until`).
pub const TOPIC_REPLAY_MAX: usize = 10_000;

/// The command that applies this dry run.
fn apply_command(
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    s: &TopicSelection,
    rate: u32,
) -> String {
    let mut words = command_words(config_path, source, request);
    words.extend(["--topic".to_string(), shell_word(&s.topic)]);
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            words.push(name.to_string());
            words.push(shell_word(&v));
        }
    };
    let secs = |d: Duration| format!("{}s", d.as_secs());
    flag("--partition", s.partition.map(|p| p.to_string()));
    flag("--from-offset", s.from_offset.map(|o| o.to_string()));
    flag("--to-offset", s.to_offset.map(|o| o.to_string()));
    for (k, v) in &s.headers {
        flag("--header", Some(format!("{k}={v}")));
    }
    flag("--since", s.since.map(secs));
    flag("--until", s.until.map(secs));
    flag("--to", s.to.clone());
    flag("--rate", Some(format!("{rate}/s")));
    words.push("--yes".to_string());
    words.join(" ")
}

/// `dead-letters replay --topic`: the records `selection` picks, sent back
/// at most `rate` a second, each audited; without `--yes`, what would be.
pub async fn topic_replay(
    config: &Config,
    config_path: &Path,
    source: &str,
    request: &ActionRequest,
    selection: &TopicSelection,
    rate: u32,
) -> Result<(String, bool), CommandError> {
    check_request(request)?;
    let spec = find(config, source)?;
    let Some(replay) = spec.topic_replay() else {
        return Err(CommandError::Usage(format!(
            "--topic: source \"{source}\" is of kind \"{}\", which has no dead-letter topics to \
             send back",
            spec.kind()
        )));
    };
    if replay.audit_table().is_none() {
        return Err(CommandError::Usage(format!(
            "source \"{source}\" has no audit DSN ([sources.dead_letter_actions] audit_dsn): \
             every record sent back is recorded in an audit table, so the replay is refused; \
             nothing was sent"
        )));
    }
    let records = replay
        .select(selection)
        .await
        .map_err(|e| action_error(source, e))?;
    if records.len() > selection.max {
        return Err(CommandError::Usage(format!(
            "more than {} records picked: a run sends at most that many; narrow it with \
             --partition and --from-offset / --to-offset, or --since / --until",
            selection.max
        )));
    }
    let mut out = String::new();
    if !request.apply {
        let _ = writeln!(
            out,
            "{} records of \"{}\" would be sent back",
            records.len(),
            printable(&selection.topic)
        );
        for r in records.iter().take(SHOWN_IDS) {
            let _ = writeln!(
                out,
                "{} -> {}",
                printable(&r.coordinates()),
                printable(&r.destination)
            );
        }
        if records.len() > SHOWN_IDS {
            let _ = writeln!(out, "… and {} more", records.len() - SHOWN_IDS);
        }
        let _ = writeln!(
            out,
            "to apply: {}",
            apply_command(config_path, source, request, selection, rate)
        );
        return Ok((out, true));
    }
    let run = ReplayRun {
        run_id: new_run_id(),
        operator: request.operator.clone(),
        reason: request.reason.clone(),
    };
    let mut sender = replay
        .open(&run)
        .await
        .map_err(|e| action_error(source, e))?;
    let progress = std::io::stderr().is_terminal() && std::io::stdout().is_terminal();
    let step = usize::try_from(rate).unwrap_or(1).max(1);
    let mut sent = 0;
    for chunk in records.chunks(step) {
        let started = tokio::time::Instant::now();
        let outcomes = sender.send(chunk).await.map_err(|e| {
            let e = action_error(source, e);
            let after = format!(
                " (after {sent} of {} records; run id {})",
                records.len(),
                run.run_id
            );
            match e {
                CommandError::Failed(m) => CommandError::Failed(m + &after),
                CommandError::Usage(m) => CommandError::Usage(m + &after),
            }
        })?;
        sent += outcomes.iter().filter(|o| o.done).count();
        for o in outcomes.iter().filter(|o| !o.done) {
            let _ = writeln!(out, "{}", printable(&o.line));
        }
        if progress {
            eprint!("\r{sent}/{} records", records.len());
        }
        // Each chunk of `rate` records takes a whole second, the last one
        // too: the run never goes faster than the cap.
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    }
    if progress {
        eprintln!();
    }
    let _ = writeln!(
        out,
        "replay: {sent} of {} records sent back (run id {})",
        records.len(),
        run.run_id
    );
    Ok((out, sent == records.len()))
}
