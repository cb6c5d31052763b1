//! `inboxwatch demo`: the embedded default. An SQLite inbox in a temporary
//! file, fed by a simulated consumer, watched by the agent, served on
//! `/metrics` — live numbers with one command and no services.

pub mod simulate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::app::{self, Agent};
use crate::config;

/// Table name of the demo inbox.
const TABLE: &str = "inbox";
/// The demo's stuck threshold: short, so a stuck row shows within seconds.
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// The config the demo agent runs on, as a user would write it.
pub fn demo_config(db: &std::path::Path, listen: SocketAddr) -> String {
    format!(
        r#"[server]
listen = "{listen}"

[[sources]]
name = "demo-inbox"
kind = "inbox"
dsn = "sqlite://{db}"
table = "{TABLE}"
poll_interval = "1s"
overlap = "5s"
stuck_after = "{stuck}s"
quantile_window = "5m"
service_name = "demo-consumer"
owner = "team-orders"

[sources.columns]
event_id = "event_id"
event_type = "event_type"
status = "status"
received_at = "received_at"
started_at = "started_at"
finished_at = "finished_at"
attempts = "attempts"
deliveries = "deliveries"
last_error = "last_error"
traceparent = "traceparent"
updated_at = "updated_at"
business_key = "business_key"
summary = "summary"

[sources.objectives]
oldest_age = "30s"
p95 = "1s"

# `inboxwatch dead-letters replay / ignore` (the commands the dead-letter
# page prints) write with this DSN; the agent never opens it.
[sources.dead_letter_actions]
dsn = "sqlite://{db}"
"#,
        db = db.display(),
        stuck = STUCK_AFTER.as_secs(),
    )
}

/// Runs the simulation and the agent until Ctrl-C or SIGTERM, then removes the database.
pub async fn run(listen: SocketAddr, rate: f64) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let dir = std::env::temp_dir().join(format!("inboxwatch-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let db: PathBuf = dir.join("inbox.db");
    let result = run_in(&db, listen, rate).await;
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        warn!(path = %dir.display(), error = %e, "Could not remove the demo database.");
    }
    result
}

async fn run_in(db: &std::path::Path, listen: SocketAddr, rate: f64) -> anyhow::Result<()> {
    let options = SqliteConnectOptions::new()
        .filename(db)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .context("opening the demo database")?;
    simulate::create_table(&pool, TABLE)
        .await
        .context("creating the demo inbox table")?;
    let cancel = CancellationToken::new();
    let sim = simulate::Simulation {
        table: TABLE.to_string(),
        rate_per_sec: rate,
        stuck_after: STUCK_AFTER,
        ..simulate::Simulation::default()
    };
    let consumer = tokio::spawn(simulate::run(pool.clone(), sim, cancel.clone()));

    // The config is a file beside the database, so that the replay and
    // ignore commands the pages print can be run as they are.
    let path = db.with_file_name("inboxwatch.toml");
    std::fs::write(&path, demo_config(db, listen))
        .with_context(|| format!("writing {}", path.display()))?;
    let cfg = config::load(&path)
        .map_err(|e| anyhow::anyhow!("the demo's own config is invalid: {e}"))?;
    for ddl in cfg.sources.iter().filter_map(|s| s.audit_ddl()) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
            .execute(&pool)
            .await
            .context("creating the demo's dead-letter audit table")?;
    }
    let handle = app::install_recorder()?;
    let agent = Agent::start(cfg, handle).await?;
    println!(
        "inboxwatch demo: the status page is http://{addr}/\n\
         \n\
         A simulated consumer writes to {db} and the agent watches it.\n\
         \n\
         \x20 dead letters: http://{addr}/dead-letters\n\
         \x20 metrics:      http://{addr}/metrics\n\
         \x20 readiness:    http://{addr}/readyz\n\
         \n\
         Look for inbox_oldest_unprocessed_age_seconds (the oldest unprocessed message),\n\
         inbox_processing_duration_quantile_seconds{{quantile=\"0.95\"}} (P95),\n\
         inbox_duplicate_deliveries_total / inbox_deliveries_total (idempotency hit rate),\n\
         inbox_messages_completed_total{{outcome=\"dead_lettered\"}} (dead letters) and\n\
         inbox_stuck_messages (one row is stuck on purpose). Ctrl-C stops.",
        db = db.display(),
        addr = agent.addr,
    );
    tokio::select! {
        _ = app::shutdown_signal() => {}
        r = consumer => match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "The simulated consumer stopped."),
            Err(e) => warn!(error = %e, "The simulated consumer failed."),
        },
    }
    cancel.cancel();
    agent.shutdown().await;
    pool.close().await;
    Ok(())
}
