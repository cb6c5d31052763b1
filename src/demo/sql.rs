//! The SQL of the consumer simulation, per dialect: the demo's inbox table
//! and the statements of its consumer (SQLite, PostgreSQL, MariaDB).

use std::sync::Arc;
use std::time::Duration;

use crate::dsn::Dialect;

/// A retry waits 2^n × the retry base at most, n up to this.
pub const MAX_BACKOFF_DOUBLINGS: u32 = 4;
/// A row in processing whose attempt started longer ago than this is
/// reclaimed: its worker died (the planted stuck row, `kill-after-commit`).
/// Under the demo's 30 s age objective, over its 10 s stuck_after.
pub const LEASE: Duration = Duration::from_secs(25);
/// Status word of a parked row (`poison-key`).
pub const PARKED: &str = "parked";

/// The statements of one run, built once for its table and dialect. Every
/// parameter is used once and in order (MariaDB's `?` are positional).
pub struct Statements {
    pub dialect: Dialect,
    pub table: String,
    pub plant_stuck: Arc<str>,
    pub deliver: Arc<str>,
    pub claimable: Arc<str>,
    pub claim: Arc<str>,
    pub succeed: Arc<str>,
    pub fail: Arc<str>,
    pub dead: Arc<str>,
    pub park: Arc<str>,
    pub unpark: Arc<str>,
}

impl Statements {
    pub fn new(dialect: Dialect, t: &str) -> Self {
        let p = |n: usize| match dialect {
            Dialect::Postgres => format!("${n}"),
            Dialect::MySql => "?".to_owned(),
            Dialect::Sqlite => format!("?{n}"),
        };
        let now = now_sql(dialect);
        // A row's new timestamp never goes below its updated_at, so the row's times
        // stay ordered even if the wall clock steps back.
        let now_ge = match dialect {
            Dialect::Sqlite => format!("max({now}, updated_at)"),
            _ => format!("GREATEST({now}, updated_at)"),
        };
        let ago = |secs: f64| match dialect {
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f','now','-{secs:.3} seconds')"),
            Dialect::Postgres => format!("(clock_timestamp() - interval '{secs:.3} seconds')"),
            Dialect::MySql => format!(
                "(UTC_TIMESTAMP(6) - INTERVAL {} MICROSECOND)",
                (secs * 1e6).round() as i64
            ),
        };
        let backoff_over = match dialect {
            Dialect::Sqlite => format!(
                "julianday(c.updated_at) + ({} * (1 << min(max(c.attempts - 1, 0), \
                 {MAX_BACKOFF_DOUBLINGS}))) / 86400.0 <= julianday('now')",
                p(1)
            ),
            Dialect::Postgres => format!(
                "c.updated_at + make_interval(secs => {} * power(2, least(greatest(c.attempts - 1, \
                 0), {MAX_BACKOFF_DOUBLINGS}))) <= clock_timestamp()",
                p(1)
            ),
            Dialect::MySql => format!(
                "c.updated_at + INTERVAL ROUND({} * POW(2, LEAST(GREATEST(c.attempts - 1, 0), \
                 {MAX_BACKOFF_DOUBLINGS})) * 1000000) MICROSECOND <= UTC_TIMESTAMP(6)",
                p(1)
            ),
        };
        let lease_over = format!("c.started_at < {}", ago(LEASE.as_secs_f64()));
        let bigint = |e: &str| match dialect {
            Dialect::Postgres => format!("CAST({e} AS BIGINT)"),
            Dialect::MySql => format!("CAST({e} AS SIGNED)"),
            Dialect::Sqlite => e.to_owned(),
        };
        let upsert = match dialect {
            Dialect::MySql => format!(
                "ON DUPLICATE KEY UPDATE deliveries = deliveries + 1, updated_at = {now_ge}"
            ),
            Dialect::Postgres => format!(
                "ON CONFLICT (event_id) DO UPDATE SET deliveries = {t}.deliveries + 1, \
                 updated_at = GREATEST({now}, {t}.updated_at)"
            ),
            Dialect::Sqlite => format!(
                "ON CONFLICT (event_id) DO UPDATE SET deliveries = deliveries + 1, \
                 updated_at = {now_ge}"
            ),
        };
        let sql = |s: String| Arc::<str>::from(s);
        Self {
            dialect,
            table: t.to_owned(),
            plant_stuck: sql(format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                 finished_at, attempts, deliveries, last_error, traceparent, updated_at) \
                 VALUES ({}, {}, 'processing', {{received}}, {{started}}, NULL, 1, 1, NULL, {}, {now})",
                p(1),
                p(2),
                p(3)
            )),
            // The inbox write of a real consumer: the first delivery inserts, a
            // redelivery hits the primary key and only counts itself.
            deliver: sql(format!(
                "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, \
                 deliveries, traceparent, updated_at, business_key, summary, ordering_key, version) \
                 VALUES ({}, {}, 'pending', {now}, 0, 1, {}, {now}, {}, {}, {}, {}) {upsert}",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                p(6),
                p(7)
            )),
            // Oldest first among pending rows, failed rows whose backoff is over and
            // rows whose worker died, each the lowest unfinished version of its key;
            // the status IN (...) term lets SQLite walk the partial index.
            claimable: sql(format!(
                "SELECT c.event_id, c.event_type, {attempts} AS attempts, c.ordering_key, \
                 {version} AS version, c.traceparent FROM {t} c \
                 WHERE c.status IN ('pending','processing','failed') \
                 AND (c.status = 'pending' OR (c.status = 'failed' AND {backoff_over}) \
                 OR (c.status = 'processing' AND {lease_over})) \
                 AND NOT EXISTS (SELECT 1 FROM {t} e WHERE e.ordering_key = c.ordering_key \
                 AND e.version < c.version AND e.status IN ('pending','processing','failed')) \
                 ORDER BY c.received_at LIMIT {}",
                p(2),
                attempts = bigint("c.attempts"),
                version = bigint("c.version"),
            )),
            claim: sql(format!(
                "UPDATE {t} SET status = 'processing', attempts = attempts + 1, \
                 started_at = {now_ge}, updated_at = {now_ge} WHERE event_id = {}",
                p(1)
            )),
            succeed: sql(format!(
                "UPDATE {t} SET status = 'succeeded', finished_at = {now_ge}, last_error = NULL, \
                 updated_at = {now_ge} WHERE event_id = {} AND status = 'processing'",
                p(1)
            )),
            fail: sql(format!(
                "UPDATE {t} SET status = 'failed', last_error = {}, updated_at = {now_ge} \
                 WHERE event_id = {} AND status = 'processing'",
                p(1),
                p(2)
            )),
            dead: sql(format!(
                "UPDATE {t} SET status = 'dead', finished_at = {now_ge}, last_error = {}, \
                 updated_at = {now_ge} WHERE event_id = {} AND status = 'processing'",
                p(1),
                p(2)
            )),
            park: sql(format!(
                "UPDATE {t} SET status = '{PARKED}', last_error = {}, updated_at = {now_ge} \
                 WHERE event_id = {}",
                p(1),
                p(2)
            )),
            unpark: sql(format!(
                "UPDATE {t} SET status = 'pending', updated_at = {now_ge} \
                 WHERE ordering_key = {} AND status = '{PARKED}'",
                p(1)
            )),
        }
    }

    /// The planted stuck row's insert: received `started_ago` + 0.25 s ago.
    pub fn plant_stuck_at(&self, started_ago: f64) -> String {
        let ago = |secs: f64| match self.dialect {
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f','now','-{secs:.3} seconds')"),
            Dialect::Postgres => format!("(clock_timestamp() - interval '{secs:.3} seconds')"),
            Dialect::MySql => format!(
                "(UTC_TIMESTAMP(6) - INTERVAL {} MICROSECOND)",
                (secs * 1e6).round() as i64
            ),
        };
        self.plant_stuck
            .replace("{received}", &ago(started_ago + 0.25))
            .replace("{started}", &ago(started_ago))
    }

    /// The table and its indexes; on PostgreSQL and MariaDB with `comment`.
    pub fn ddl(&self, comment: &str) -> Vec<String> {
        let t = &self.table;
        let comment = comment.replace('\'', "''");
        let unfinished = "status IN ('pending','processing','failed')";
        let columns =
            |id: &str, word: &str, status: &str, time: &str, text: &str, int: &str, big: &str| {
                format!(
                    "(event_id {id} PRIMARY KEY, event_type {word}, status {status} NOT NULL, \
                 received_at {time} NOT NULL, started_at {time}, finished_at {time}, \
                 attempts {int} NOT NULL DEFAULT 0, deliveries {int} NOT NULL DEFAULT 1, \
                 last_error {text}, traceparent {word}, updated_at {time} NOT NULL, \
                 business_key {word}, summary {text}, ordering_key {word}, version {big})"
                )
            };
        match self.dialect {
            Dialect::Sqlite => vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} {}",
                    columns("TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "INTEGER", "INTEGER")
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_updated_at ON {t} (updated_at)"),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_unfinished ON {t} (received_at) WHERE {unfinished}"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_ordering ON {t} (ordering_key, version)"),
            ],
            Dialect::Postgres => vec![
                format!(
                    "CREATE TABLE {t} {}",
                    columns(
                        "text",
                        "text",
                        "text",
                        "timestamptz",
                        "text",
                        "integer",
                        "bigint"
                    )
                ),
                format!("COMMENT ON TABLE {t} IS '{comment}'"),
                format!("CREATE INDEX {t}_updated_at ON {t} (updated_at)"),
                format!("CREATE INDEX {t}_unfinished ON {t} (received_at) WHERE {unfinished}"),
                format!("CREATE INDEX {t}_ordering ON {t} (ordering_key, version)"),
            ],
            Dialect::MySql => vec![
                format!(
                    "CREATE TABLE {t} {} COMMENT='{comment}'",
                    columns(
                        "VARCHAR(191)",
                        "VARCHAR(191)",
                        "VARCHAR(32)",
                        "DATETIME(6)",
                        "MEDIUMTEXT",
                        "INT",
                        "BIGINT"
                    )
                ),
                format!("CREATE INDEX {t}_updated_at ON {t} (updated_at)"),
                format!("CREATE INDEX {t}_unfinished ON {t} (status, received_at)"),
                format!("CREATE INDEX {t}_ordering ON {t} (ordering_key, version)"),
            ],
        }
    }
}

/// The database's current time, in the column's type.
pub fn now_sql(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now')",
        Dialect::Postgres => "clock_timestamp()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
    }
}
