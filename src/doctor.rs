//! `inboxwatch doctor`: connects to every source and runs its kind's checks
//! (for tables: the table, column types and indexes, and an EXPLAIN of the
//! queries the agent runs, warning — with the index to create — where one
//! would scan the whole table; for Kafka: API versions and one cycle).

use crate::config::Config;
use crate::sources::kind::Finding;
use crate::text::terminal_text;

/// Runs every check; `Ok(true)` when nothing needs attention.
pub async fn run(config: &Config) -> anyhow::Result<bool> {
    sqlx::any::install_default_drivers();
    let mut healthy = true;
    for spec in &config.sources {
        println!("source \"{}\" ({}):", spec.name(), spec.describe());
        if let Some(used) = config.presets.iter().find(|u| u.source == spec.name()) {
            println!("  {}; effective settings:", used.headline());
            for line in used.effective.lines() {
                println!("    {line}");
            }
        }
        let findings = spec.doctor().await;
        healthy &= findings.iter().all(|f| matches!(f, Finding::Ok(_)));
        print_findings(findings);
    }
    Ok(healthy)
}

fn print_findings(findings: Vec<Finding>) {
    for f in &findings {
        println!("{}", finding_line(f));
    }
}

/// One finding as printed. Its text may hold what a database or a broker
/// named (a table, a queue, a stream, an error it sent): control characters
/// are escaped for the terminal.
fn finding_line(f: &Finding) -> String {
    let (tag, m) = match f {
        Finding::Ok(m) => ("ok:     ", m),
        Finding::Warn(m) => ("warning:", m),
        Finding::Error(m) => ("error:  ", m),
    };
    format!("  {tag} {}", terminal_text(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_is_printed_with_control_characters_escaped() {
        let f = Finding::Warn("queue \"a\u{1b}[2Jb\" (stream): no offset".into());
        assert_eq!(
            finding_line(&f),
            "  warning: queue \"a\\x1b[2Jb\" (stream): no offset"
        );
        assert_eq!(finding_line(&Finding::Ok("fine".into())), "  ok:      fine");
        assert_eq!(
            finding_line(&Finding::Error("bad".into())),
            "  error:   bad"
        );
    }
}
