//! `inboxwatch doctor`: connects to every source and runs its kind's checks
//! (for tables: the table, column types and indexes, and an EXPLAIN of the
//! queries the agent runs, warning — with the index to create — where one
//! would scan the whole table; for Kafka: API versions and one cycle).

use crate::config::Config;
use crate::sources::kind::Finding;

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
    for f in findings {
        match f {
            Finding::Ok(m) => println!("  ok:      {m}"),
            Finding::Warn(m) => println!("  warning: {m}"),
            Finding::Error(m) => println!("  error:   {m}"),
        }
    }
}
