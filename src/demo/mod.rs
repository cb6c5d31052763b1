//! `inboxwatch demo`: the embedded default. A simulated consumer writes an
//! inbox table — in a temporary SQLite file, or with `--dsn` in a table of its
//! own on a real PostgreSQL or MariaDB — and the agent watches it and serves
//! `/metrics`: live numbers with one command. `--drill NAME` injects one fault
//! ([`drill`]) to show that it is seen.

pub mod drill;
pub mod simulate;
pub mod sql;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::app::{self, Agent};
use crate::config;
use crate::dsn::{Dialect, Dsn};
use crate::sources::kind::{Action, ActionRequest};
use drill::{Drill, FAULT_START};

/// Table name of the demo inbox in its SQLite file.
const SQLITE_TABLE: &str = "inbox";
/// Table name of the demo inbox on a real database (`--dsn`).
pub const SERVER_TABLE: &str = "inboxwatch_demo_inbox";
/// Its dead-letter audit table there.
pub const SERVER_AUDIT_TABLE: &str = "inboxwatch_demo_inbox_actions";
/// The table comment that marks a table as the demo's own: only such a table is
/// ever dropped.
pub const MARKER: &str = "created by inboxwatch demo; dropped when it exits";
/// The demo's stuck threshold: short, so a stuck row shows within seconds.
const STUCK_AFTER: Duration = Duration::from_secs(10);
/// The source's name (the `source` label).
pub const SOURCE: &str = "demo-inbox";

/// What `inboxwatch demo` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Listen address of the agent.
    pub listen: SocketAddr,
    /// New events per second.
    pub rate: f64,
    /// The fault to inject, if any.
    pub drill: Option<Drill>,
    /// A PostgreSQL or MariaDB to run on instead of a temporary SQLite file.
    pub dsn: Option<String>,
}

impl Options {
    /// The options of `inboxwatch demo`, its `--drill` by name; `Err` names
    /// every drill when there is none of that name.
    pub fn new(
        listen: SocketAddr,
        rate: f64,
        drill: Option<&str>,
        dsn: Option<String>,
    ) -> Result<Options, String> {
        let drill = drill.map(|name| drill::find(name).map(|d| d.drill));
        Ok(Options {
            listen,
            rate,
            drill: drill.transpose()?,
            dsn,
        })
    }
}

/// The config the demo agent runs on, as a user would write it: `dsn` is the
/// database (written into the file as it is), `audit_table` the dead-letter
/// audit table.
pub fn demo_config(dsn: &str, table: &str, audit_table: &str, listen: SocketAddr) -> String {
    let dsn = toml::Value::String(dsn.to_owned()).to_string();
    format!(
        r#"[server]
listen = "{listen}"

[[sources]]
name = "{SOURCE}"
kind = "inbox"
dsn = {dsn}
table = "{table}"
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
ordering_key = "ordering_key"
version = "version"

[sources.statuses]
parked = ["{parked}"]

[sources.objectives]
oldest_age = "30s"
p95 = "1s"

# `inboxwatch dead-letters replay / ignore` (the commands the dead-letter
# page prints) write with this DSN; the agent never opens it.
[sources.dead_letter_actions]
dsn = {dsn}
audit_table = "{audit_table}"
"#,
        stuck = STUCK_AFTER.as_secs(),
        parked = sql::PARKED,
    )
}

/// Runs the simulation and the agent until Ctrl-C or SIGTERM, then removes the
/// database (the SQLite file, or the demo's tables on a real database).
pub async fn run(options: Options) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let dir = std::env::temp_dir().join(format!("inboxwatch-demo-{}", std::process::id()));
    private_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = match options.dsn.clone() {
        None => run_sqlite(&dir, &options).await,
        Some(dsn) => run_server(&dir, &dsn, &options).await,
    };
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        warn!(path = %dir.display(), error = %e, "Could not remove the demo's directory.");
    }
    result
}

/// The directory of the demo's files, readable by its user only (the config
/// holds the `--dsn`).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes `text` to a new file readable and writable by its user only.
fn private_file(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
}

async fn run_sqlite(dir: &Path, options: &Options) -> anyhow::Result<()> {
    let db: PathBuf = dir.join("inbox.db");
    let dsn = format!("sqlite://{}", db.display());
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .connect(&format!("{dsn}?mode=rwc"))
        .await
        .context("opening the demo database")?;
    simulate::create_table(&pool, Dialect::Sqlite, SQLITE_TABLE, MARKER)
        .await
        .context("creating the demo inbox table")?;
    let place = db.display().to_string();
    let target = Target {
        pool: pool.clone(),
        dialect: Dialect::Sqlite,
        dsn,
        table: SQLITE_TABLE,
        audit_table: "inboxwatch_dead_letter_actions",
        place: &place,
    };
    let result = run_on(dir, &target, options).await;
    pool.close().await;
    result
}

async fn run_server(dir: &Path, text: &str, options: &Options) -> anyhow::Result<()> {
    let dsn = Dsn::parse(text).map_err(|e| anyhow::anyhow!("--dsn: {e}"))?;
    let dialect = dsn.dialect();
    if dialect == Dialect::Sqlite {
        anyhow::bail!(
            "--dsn: give a postgres:// or mysql:// URL (without --dsn the demo uses SQLite)"
        );
    }
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(dsn.expose())
        .await
        .map_err(|e| anyhow::anyhow!("connecting to {dsn}: {}", dsn.scrub(&e.to_string())))?;
    for table in [SERVER_TABLE, SERVER_AUDIT_TABLE] {
        claim_table(&pool, dialect, table)
            .await
            .map_err(|e| anyhow::anyhow!("{dsn}: {}", dsn.scrub(&format!("{e:#}"))))?;
    }
    let created = simulate::create_table(&pool, dialect, SERVER_TABLE, MARKER)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{dsn}: creating {SERVER_TABLE}: {}",
                dsn.scrub(&e.to_string())
            )
        });
    let result = match created {
        Ok(()) => {
            let place = format!("table {SERVER_TABLE} on {dsn}");
            let target = Target {
                pool: pool.clone(),
                dialect,
                dsn: dsn.expose().to_owned(),
                table: SERVER_TABLE,
                audit_table: SERVER_AUDIT_TABLE,
                place: &place,
            };
            run_on(dir, &target, options)
                .await
                .map_err(|e| anyhow::anyhow!("{}", dsn.scrub(&format!("{e:#}"))))
        }
        Err(e) => Err(e),
    };
    for table in [SERVER_TABLE, SERVER_AUDIT_TABLE] {
        if let Err(e) = drop_own_table(&pool, dialect, table).await {
            warn!(table, error = %dsn.scrub(&e.to_string()), "Could not drop the demo's table.");
        } else {
            info!(table, "Dropped the demo's table.");
        }
    }
    pool.close().await;
    result
}

/// The comment of `table` in the current schema (database), or `None` if
/// there is no such table.
pub async fn table_comment(
    pool: &AnyPool,
    dialect: Dialect,
    table: &str,
) -> Result<Option<String>, sqlx::Error> {
    let sql = match dialect {
        Dialect::Postgres => {
            "SELECT coalesce(obj_description(c.oid, 'pg_class'), '') FROM pg_class c \
             WHERE c.oid = to_regclass($1)"
        }
        Dialect::MySql => {
            "SELECT CAST(table_comment AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?"
        }
        Dialect::Sqlite => "SELECT '' FROM sqlite_master WHERE type = 'table' AND name = ?1",
    };
    sqlx::query_scalar::<_, String>(sql)
        .bind(table)
        .fetch_optional(pool)
        .await
}

/// Makes sure `table` is free for the demo. A table of that name is refused,
/// untouched: anyone else's, and the demo's own too (another demo may be running
/// on this database now; one that was killed leaves its table behind).
async fn claim_table(pool: &AnyPool, dialect: Dialect, table: &str) -> anyhow::Result<()> {
    match table_comment(pool, dialect, table).await? {
        None => Ok(()),
        Some(c) if c == MARKER => anyhow::bail!(
            "table {table} already exists, created by inboxwatch demo: another demo runs on \
             this database, or one was killed before it could drop it; if none runs, drop it \
             (DROP TABLE {table}) and start again"
        ),
        Some(_) => anyhow::bail!(
            "table {table} already exists and was not created by inboxwatch demo; the demo \
             leaves it alone: use another database, or drop or rename that table"
        ),
    }
}

/// Drops `table` if it carries the demo's marker.
async fn drop_own_table(pool: &AnyPool, dialect: Dialect, table: &str) -> anyhow::Result<()> {
    if table_comment(pool, dialect, table).await?.as_deref() == Some(MARKER) {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Where the demo runs.
struct Target<'a> {
    pool: AnyPool,
    dialect: Dialect,
    /// The DSN for the agent's config (secrets included).
    dsn: String,
    table: &'static str,
    audit_table: &'static str,
    /// Printed: the file, or the table and the redacted DSN.
    place: &'a str,
}

async fn run_on(dir: &Path, target: &Target<'_>, options: &Options) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let (phases, phase_rx) = tokio::sync::mpsc::unbounded_channel();
    let sim = simulate::Simulation {
        table: target.table.to_string(),
        dialect: target.dialect,
        rate_per_sec: options.rate,
        stuck_after: STUCK_AFTER,
        // A drill shows its own fault alone.
        plant_stuck_row: options.drill.is_none(),
        drill: options.drill,
        phases: Some(phases),
        ..simulate::Simulation::default()
    };
    // The config is a file beside the database, so that the replay and
    // ignore commands the pages print can be run as they are.
    // It holds the DSN: readable by its user only, as the directory.
    let path = dir.join("inboxwatch.toml");
    private_file(
        &path,
        &demo_config(
            &target.dsn,
            target.table,
            target.audit_table,
            options.listen,
        ),
    )
    .with_context(|| format!("writing {}", path.display()))?;
    let cfg = config::load(&path)
        .map_err(|e| anyhow::anyhow!("the demo's own config is invalid: {e}"))?;
    for ddl in cfg
        .sources
        .iter()
        .filter_map(|s| s.dead_letter_actions()?.audit_ddl())
    {
        for statement in ddl.split(';').filter(|s| !s.trim().is_empty()) {
            sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
                .execute(&target.pool)
                .await
                .context("creating the demo's dead-letter audit table")?;
        }
    }
    mark_table(&target.pool, target.dialect, target.audit_table).await?;
    let consumer = tokio::spawn(simulate::run(target.pool.clone(), sim, cancel.clone()));
    let started = async { Agent::start(cfg.clone(), app::install_recorder()?).await }.await;
    let agent = match started {
        Ok(agent) => agent,
        Err(e) => {
            // Its port taken, say: the consumer stops and gives back the pool's
            // connections, so the demo exits at once and cleans up (it held
            // them, and the pool's close waited for ever).
            cancel.cancel();
            consumer.abort();
            let _ = consumer.await;
            return Err(e);
        }
    };
    println!(
        "inboxwatch demo: the status page is http://{addr}/\n\
         \n\
         A simulated consumer writes to {place} and the agent watches it.\n\
         \n\
         \x20 dead letters: http://{addr}/dead-letters\n\
         \x20 metrics:      http://{addr}/metrics\n\
         \x20 readiness:    http://{addr}/readyz\n\
         \n\
         Look for inbox_oldest_unprocessed_age_seconds (the oldest unprocessed message),\n\
         inbox_processing_duration_quantile_seconds{{quantile=\"0.95\"}} (P95),\n\
         inbox_duplicate_deliveries_total / inbox_deliveries_total (idempotency hit rate),\n\
         inbox_messages_completed_total{{outcome=\"dead_lettered\"}} (dead letters) and\n\
         inbox_stuck_messages{stuck}. Ctrl-C stops.",
        place = target.place,
        addr = agent.addr,
        stuck = if options.drill.is_none() {
            format!(
                " (one row is stuck on purpose until the consumer's {} s lease reclaims it)",
                sql::LEASE.as_secs()
            )
        } else {
            String::new()
        },
    );
    let announcer = options.drill.map(|d| {
        tokio::spawn(announce(
            d,
            phase_rx,
            cfg,
            target.pool.clone(),
            target.table,
        ))
    });
    tokio::select! {
        _ = app::shutdown_signal() => {}
        r = consumer => match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "The simulated consumer stopped."),
            Err(e) => warn!(error = %e, "The simulated consumer failed."),
        },
    }
    if let Some(a) = announcer {
        a.abort();
    }
    cancel.cancel();
    agent.shutdown().await;
    Ok(())
}

/// Marks the audit table as the demo's own (PostgreSQL and MariaDB).
async fn mark_table(pool: &AnyPool, dialect: Dialect, table: &str) -> anyhow::Result<()> {
    let sql = match dialect {
        Dialect::Postgres => format!("COMMENT ON TABLE {table} IS '{MARKER}'"),
        Dialect::MySql => format!("ALTER TABLE {table} COMMENT = '{MARKER}'"),
        Dialect::Sqlite => return Ok(()),
    };
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(pool)
        .await
        .with_context(|| format!("marking {table} as the demo's"))?;
    Ok(())
}

/// Prints what a drill does and what to watch, and when its fault starts and
/// ends (as the consumer tells it); `dead-letter-replay` replays the batch once
/// the consumer has the fix.
async fn announce(
    drill: Drill,
    mut phases: tokio::sync::mpsc::UnboundedReceiver<simulate::Phase>,
    cfg: config::Config,
    pool: AnyPool,
    table: &str,
) {
    let d = drill.info();
    let at = |t: Duration| format!("+{} s", t.as_secs());
    let end = FAULT_START + d.length;
    println!(
        "\nDrill {name}: the fault starts at {start} and ends at {end}.\n\
         \x20 what:   {what}\n\
         \x20 signal: {signal}\n\
         \x20 alert:  {alert} (pending within {within} s of the fault's start; \
         runbook: docs/runbooks.md#{runbook})",
        name = d.name,
        start = at(FAULT_START),
        end = at(end),
        what = d.consumer,
        signal = d.signal,
        alert = d.alert,
        within = d.pending_within.as_secs(),
        runbook = d.runbook,
    );
    while let Some(phase) = phases.recv().await {
        match phase {
            simulate::Phase::FaultStarts => {
                println!(
                    "Drill {}: the fault starts now ({}).",
                    d.name,
                    at(FAULT_START)
                );
            }
            simulate::Phase::FaultEnds => {
                println!("Drill {}: the fault ends now ({}).", d.name, at(end));
                if drill == Drill::DeadLetterReplay {
                    match replay_batch(&cfg, &pool, table).await {
                        Ok(text) => println!(
                            "Drill {}: the cause is fixed; replayed the batch's dead letters:\n{text}",
                            d.name
                        ),
                        Err(e) => warn!(error = %e, "Drill: the replay failed."),
                    }
                }
            }
        }
    }
}

/// `inboxwatch dead-letters replay --yes` on the batch's dead letters.
async fn replay_batch(cfg: &config::Config, pool: &AnyPool, table: &str) -> anyhow::Result<String> {
    let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT event_id FROM {table} WHERE status = 'dead' AND event_id LIKE '{}%' \
         ORDER BY event_id",
        simulate::BATCH_PREFIX
    )))
    .fetch_all(pool)
    .await?;
    let request = ActionRequest {
        action: Action::Replay,
        operator: "inboxwatch demo".to_owned(),
        reason: "drill dead-letter-replay: the bad deploy is rolled back".to_owned(),
        event_ids: ids,
        apply: true,
        run_id: None,
    };
    let (text, _) = crate::actions::run(cfg, SOURCE, &request).await?;
    Ok(text)
}
