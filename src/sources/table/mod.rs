//! Inbox and outbox tables on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Each poll is one read-only transaction that tails the change cursor
//! (`updated_at`) from the last high-water mark minus the overlap window, so a
//! transaction that commits late is still seen. What a row changed since it
//! was last seen is worked out against a bounded map of recently seen events,
//! so re-reading the overlap never counts twice. The gauges come from a map of
//! the unfinished rows kept from the same rows ([`backlog`]), checked against
//! an aggregate over the unfinished rows every `reconcile_every`; it runs on
//! every poll only while the backlog is too large to keep.

pub mod backlog;
pub mod config;
pub mod dialect;
mod doctor;
pub mod inbox;
mod kind;
pub mod lock;
mod lookup;
pub mod outbox;
pub mod schema;
mod state;

pub use config::{InboxSpec, OutboxSpec, Status, StatusMap, TableSpec};

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use sqlx::any::AnyPoolOptions;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Connection, Row};
use tracing::debug;

use crate::dsn::Dialect;
use crate::sources::run::{PollStats, Source, SourceError};
use crate::telemetry::catalogue as metric;
use backlog::{Backlog, GaugeMap, Unfinished};
use dialect::{Param, Sql};

/// How far behind the change cursor every poll looks, for transactions that
/// commit shortly after setting `updated_at`; older stragglers (up to the
/// source's `overlap`) are caught by the periodic sweep.
pub const COMMIT_LAG: Duration = Duration::from_secs(2);

/// Text of `last_error` longer than this (in characters) is rejected as a label
/// source and counted under `last_error_too_long`.
pub const MAX_ERROR_LEN: i64 = 64 * 1024;

/// A row's change cursor when the column is NULL.
pub(crate) const NO_CURSOR: i64 = i64::MIN;

/// Why a row was rejected (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    NullTime,
    UnknownStatus,
    FinishBeforeStart,
    LastErrorTooLong,
    /// A `traceparent` that is not a W3C trace context: its span has no link.
    BadTraceparent,
    /// A time with no value in range (`infinity`, a year past 294,000, a
    /// text that is not a time).
    TimeOutOfRange,
    /// `attempts` or `deliveries` negative, or grown by more than
    /// `max_count_jump` in one change.
    ImplausibleCount,
    /// A NULL change cursor: the tail cannot see the row change.
    NullCursor,
}

impl Reject {
    /// Every reason, for creating the series at 0.
    pub const ALL: [Reject; 8] = [
        Reject::NullTime,
        Reject::UnknownStatus,
        Reject::FinishBeforeStart,
        Reject::LastErrorTooLong,
        Reject::BadTraceparent,
        Reject::TimeOutOfRange,
        Reject::ImplausibleCount,
        Reject::NullCursor,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::NullTime => "null_time",
            Reject::UnknownStatus => "unknown_status",
            Reject::FinishBeforeStart => "finish_before_start",
            Reject::LastErrorTooLong => "last_error_too_long",
            Reject::BadTraceparent => "bad_traceparent",
            Reject::TimeOutOfRange => "time_out_of_range",
            Reject::ImplausibleCount => "implausible_count",
            Reject::NullCursor => "null_cursor",
        }
    }
}

/// The part of a table source that differs between inbox and outbox tables.
pub trait TableKind: Send + 'static {
    /// Every mapped column as (meaning, column), for the schema check.
    fn columns(&self) -> Vec<(&'static str, String)>;
    /// The select list of the tail and seed queries, as (meaning, expression).
    fn select_list(&self, sql: &Sql) -> Vec<(&'static str, String)>;
    /// The change-cursor column.
    fn updated_at(&self) -> &str;
    /// The event id column: the keyset of the scan for NULL change cursors.
    /// The select list has it first, as text.
    fn event_id(&self) -> &str;
    /// A query over the unfinished rows whose result seeds the state map at
    /// start, so their later changes count exactly (`None`: nothing to seed).
    fn seed_filter(&self, sql: &Sql) -> Option<String>;
    /// Counts a rejected row the kind did not read itself.
    fn reject(&mut self, reason: Reject);
    /// Sets the agent's start on the database clock.
    fn start(&mut self, db_now: i64);
    /// Takes one row of the tail (or seed) into account. `baseline`: the row
    /// predates the agent and only sets the state it is compared with later.
    fn observe(&mut self, row: &AnyRow, baseline: bool) -> Result<(), String>;
    /// A tail or seed row's event key and, if the row is unfinished, what the
    /// gauges need of it.
    fn unfinished(&mut self, row: &AnyRow) -> Result<(u64, Option<Unfinished>), String>;
    /// The aggregate over unfinished rows that gives the gauges.
    fn gauge_query(&self, sql: &Sql, db_now: i64) -> String;
    /// The gauges in the gauge query's rows.
    fn gauges(&mut self, rows: &[AnyRow]) -> Result<GaugeMap, String>;
    /// Rows whose `stuck_from` lies before this are stuck (microseconds).
    fn stuck_before(&self, db_now: i64) -> i64;
    /// Records what the poll accumulated and the gauges, once, and forgets
    /// old state.
    fn flush(&mut self, gauges: &GaugeMap, db_now: i64, now: Instant);
}

/// A table source: connection, cursor and the poll transaction.
pub struct TableSource<K: TableKind> {
    spec: TableSpec,
    sql: Sql,
    kind: K,
    conn: Option<AnyConnection>,
    /// The database's shared pool, when the agent gives one (`run`); without
    /// one (`doctor`, `trace`) the source keeps a connection of its own.
    pool: Option<AnyPool>,
    /// Whether the table and columns were checked on the pool's connections.
    schema_checked: bool,
    /// Highest change cursor read so far (microseconds), capped at the database's now.
    high: Option<i64>,
    /// When the whole overlap window was last re-read.
    last_sweep: Option<Instant>,
    /// PostgreSQL: the snapshot xmin of the last poll and of the last sweep
    /// (see [`Sql::unseen`]).
    poll_xmin: Option<i64>,
    sweep_xmin: Option<i64>,
    /// The unfinished rows, for the gauges.
    backlog: Backlog,
    /// When the backlog was last checked against the gauge query.
    last_reconcile: Option<Instant>,
    /// Rows whose change cursor is NULL, which the tail cannot see.
    nulls: NullScan,
}

/// The scan for rows with a NULL change cursor, a page per sweep: each such
/// row is counted once as rejected (`null_cursor`) while it stays NULL.
#[derive(Debug, Default)]
struct NullScan {
    /// The last event id of the previous page; empty: from the start.
    after: String,
    /// Keys counted, and the keys seen in the current pass over the table:
    /// a key not seen again in a whole pass has left (got a cursor, deleted).
    counted: HashSet<u64>,
    pass: HashSet<u64>,
}

impl<K: TableKind> TableSource<K> {
    /// A source that connects on its first poll.
    pub fn new(spec: TableSpec, kind: K) -> Self {
        let sql = Sql {
            dialect: spec.dsn.dialect(),
        };
        TableSource {
            backlog: Backlog::new(spec.max_tracked_events),
            spec,
            sql,
            kind,
            conn: None,
            pool: None,
            schema_checked: false,
            high: None,
            last_sweep: None,
            poll_xmin: None,
            sweep_xmin: None,
            last_reconcile: None,
            nulls: NullScan::default(),
        }
    }

    /// Polls on connections of `pool` (one pool per database, shared by its
    /// sources) instead of a connection of its own.
    pub fn with_pool(mut self, pool: AnyPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// What connecting needs, detached from the source so that no borrow of
    /// it (and of its connection) is held across the connect.
    /// The SQL dialect of the source's database.
    pub fn sql(&self) -> Sql {
        self.sql
    }

    pub fn opener(&self) -> Opener {
        Opener {
            spec: self.spec.clone(),
            sql: self.sql,
            columns: self.kind.columns(),
        }
    }

    /// The select list of the tail, seed and NULL-cursor queries.
    fn select_list(&self) -> String {
        let list: Vec<String> = self
            .kind
            .select_list(&self.sql)
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        list.join(", ")
    }

    /// The tail: rows changed after a cursor, in the change cursor's index
    /// order (no sort), a page of `batch_size` rows.
    fn tail_query(&self) -> String {
        let updated = self.sql.ident(self.kind.updated_at());
        let unseen = self
            .sql
            .unseen(&updated, 2, 3)
            .map_or(String::new(), |u| format!(" AND {u}"));
        format!(
            "SELECT {} FROM {} WHERE {}{unseen} ORDER BY {updated} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.after(&updated, 1),
            self.sql.limit(self.spec.batch_size),
        )
    }

    /// Every row whose change cursor lies in (`$1`, `$2`]: one cursor value,
    /// the rows of which a full page may have cut (a bulk transaction writes
    /// any number of rows with one `updated_at`: PostgreSQL's `now()` is one
    /// value per transaction). Read whole, streamed, in no order.
    fn ties_query(&self) -> String {
        let updated = self.sql.ident(self.kind.updated_at());
        format!(
            "SELECT {} FROM {} WHERE {} AND NOT {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.after(&updated, 1),
            self.sql.after(&updated, 2),
        )
    }

    /// A page of rows whose change cursor is NULL, after an event id.
    fn null_query(&self) -> String {
        let id = self.sql.id_key(&self.sql.ident(self.kind.event_id()));
        format!(
            "SELECT {} FROM {} WHERE {} IS NULL AND {id} > {} ORDER BY {id} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.ident(self.kind.updated_at()),
            self.sql.id_param(1),
            self.sql.limit(self.spec.batch_size),
        )
    }

    fn seed_query(&self) -> Option<String> {
        let filter = self.kind.seed_filter(&self.sql)?;
        Some(format!(
            "SELECT {} FROM {} WHERE {filter} {}",
            self.select_list(),
            self.sql.table(&self.spec.table),
            self.sql.limit(self.spec.max_tracked_events),
        ))
    }

    /// The queries one poll runs, for `doctor`'s EXPLAIN: (what, SQL, whether
    /// it binds the cursor as its first parameter).
    pub fn queries(&self) -> Vec<(&'static str, String, bool)> {
        let mut out = vec![("tail", self.tail_query(), true)];
        out.push(("gauges", self.kind.gauge_query(&self.sql, 0), false));
        if let Some(seed) = self.seed_query() {
            out.push(("seed", seed, false));
        }
        out
    }

    async fn poll_once(&mut self) -> Result<PollStats, SourceError> {
        if let Some(pool) = self.pool.clone() {
            let mut conn = pool.acquire().await.map_err(|e| SourceError::Connect {
                dsn: self.spec.dsn.to_string(),
                message: self.spec.dsn.scrub(&e.to_string()),
            })?;
            let result = async {
                if !self.schema_checked {
                    self.opener().check_schema(&mut conn).await?;
                    self.schema_checked = true;
                }
                self.poll_on(&mut conn).await
            }
            .await;
            if result.is_err() {
                // The connection may be broken or mid-transaction: the pool
                // opens a new one rather than handing this one out again.
                conn.close_on_drop();
                self.schema_checked = false;
            }
            return result;
        }
        // The connection is taken for the poll and put back only when it
        // succeeds: a failed poll leaves none, so the next one reconnects.
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.opener().open().await?,
        };
        let stats = self.poll_on(&mut conn).await?;
        self.conn = Some(conn);
        Ok(stats)
    }

    async fn poll_on(&mut self, conn: &mut AnyConnection) -> Result<PollStats, SourceError> {
        let q = |e: sqlx::Error| SourceError::Query(e.to_string());
        let tail = self.tail_query();
        let ties = self.ties_query();
        let seed = self.seed_query();
        let updated_col = self.kind.select_list(&self.sql).len() - 1;
        let mut tx = conn.begin().await.map_err(q)?;
        let now_row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {}, {}",
            self.sql.now_micros(),
            self.sql.snapshot_xmin().unwrap_or("0")
        )))
        .fetch_one(&mut *tx)
        .await
        .map_err(q)?;
        let db_now: i64 = now_row.try_get(0).map_err(q)?;
        let snapshot_xmin: i64 = now_row.try_get(1).map_err(q)?;
        // Most polls look back only COMMIT_LAG, which catches ordinary commit
        // latency at once; every third of the overlap window a sweep re-reads
        // the whole window for the rare transaction that commits later still.
        // Reads stay proportional to the change rate, not to overlap / interval.
        let sweep_every = (self.spec.overlap / 3).max(self.spec.poll_interval);
        let sweep = self.last_sweep.is_none_or(|t| t.elapsed() >= sweep_every);
        let lookback = if sweep {
            self.last_sweep = Some(Instant::now());
            self.spec.overlap
        } else {
            self.spec.overlap.min(COMMIT_LAG)
        };
        let overlap = i64::try_from(lookback.as_micros()).unwrap_or(i64::MAX);
        let mut rows_read = 0u64;
        let baseline = self.high.is_none();
        if baseline {
            self.kind.start(db_now);
            if let Some(seed) = &seed {
                // Streamed: the backlog can be large, and memory stays bounded
                // by the maps, not by the result set.
                let mut rows = sqlx::query(sqlx::AssertSqlSafe(seed.clone())).fetch(&mut *tx);
                let mut n = 0usize;
                self.backlog.clear();
                while let Some(row) = rows.try_next().await.map_err(q)? {
                    n += 1;
                    self.take(&row, true)?;
                }
                rows_read += n as u64;
                self.backlog.filled(n < self.spec.max_tracked_events);
                self.last_reconcile = Some(Instant::now());
            }
        }
        let high = self.high.unwrap_or(db_now);
        // Rows up to `high` in the range re-read were read by the last poll
        // (the last sweep, for a sweep) unless written by a transaction still
        // running then; 0 (unknown) re-reads them all.
        let seen_before = if sweep {
            self.sweep_xmin
        } else {
            self.poll_xmin
        };
        let seen_before = if baseline {
            0
        } else {
            seen_before.unwrap_or(0)
        };
        let mut low = high.saturating_sub(overlap);
        let mut max_seen = high;
        loop {
            let mut query = bind(
                sqlx::query(sqlx::AssertSqlSafe(tail.clone())),
                self.sql.cursor(low),
            );
            if self.sql.snapshot_xmin().is_some() {
                query = bind(query, self.sql.cursor(high)).bind(seen_before);
            }
            let rows = query.fetch_all(&mut *tx).await.map_err(q)?;
            rows_read += rows.len() as u64;
            for row in &rows {
                self.take(row, baseline)?;
                let updated: Option<i64> =
                    get(row, updated_col, "updated_at").map_err(SourceError::Schema)?;
                if let Some(u) = updated.filter(|u| *u != dialect::OUT_OF_RANGE) {
                    max_seen = max_seen.max(u);
                }
            }
            if rows.len() < self.spec.batch_size {
                break;
            }
            let last = rows.last().expect("a full page has a last row");
            let cursor: Option<i64> =
                get(last, updated_col, "updated_at").map_err(SourceError::Schema)?;
            // Rows whose cursor has no value (`infinity`) sort last: the page
            // holds only such rows from here on, each rejected.
            let Some(last) = cursor.filter(|c| *c != dialect::OUT_OF_RANGE) else {
                break;
            };
            // The page may end inside a run of rows sharing its last cursor
            // value: read all of that value (those already read are
            // recognised), then go on strictly after it. One unit below, as
            // the cursor is rounded to a microsecond (SQLite: a millisecond).
            let mut ties = bind(
                bind(
                    sqlx::query(sqlx::AssertSqlSafe(ties.clone())),
                    self.sql.cursor(last.saturating_sub(self.sql.cursor_unit())),
                ),
                self.sql.cursor(last),
            )
            .fetch(&mut *tx);
            while let Some(row) = ties.try_next().await.map_err(q)? {
                rows_read += 1;
                self.take(&row, baseline)?;
            }
            drop(ties);
            low = last;
        }
        // A clock ahead of the database must not push the cursor into the future.
        self.high = Some(max_seen.min(db_now));
        self.poll_xmin = Some(snapshot_xmin);
        if sweep {
            self.sweep_xmin = Some(snapshot_xmin);
            let rows = sqlx::query(sqlx::AssertSqlSafe(self.null_query()))
                .bind(self.nulls.after.clone())
                .fetch_all(&mut *tx)
                .await
                .map_err(q)?;
            rows_read += rows.len() as u64;
            for row in &rows {
                let id: Option<String> = get(row, 0, "event_id").map_err(SourceError::Schema)?;
                let key = key_of(id.as_deref().unwrap_or_default());
                self.nulls.pass.insert(key);
                if self.nulls.counted.insert(key) {
                    self.kind.reject(Reject::NullCursor);
                }
                self.see(row)?;
            }
            match rows.last() {
                Some(last) if rows.len() == self.spec.batch_size => {
                    let id: Option<String> =
                        get(last, 0, "event_id").map_err(SourceError::Schema)?;
                    self.nulls.after = id.unwrap_or_default();
                }
                _ => {
                    // A whole pass: forget the rows that were not seen in it.
                    self.nulls.after.clear();
                    let pass = std::mem::take(&mut self.nulls.pass);
                    self.nulls.counted.retain(|k| pass.contains(k));
                }
            }
        }
        let stuck_before = self.kind.stuck_before(db_now);
        let due = self
            .last_reconcile
            .is_none_or(|t| t.elapsed() >= self.spec.reconcile_every);
        let gauges = if self.backlog.is_complete() && !due {
            self.backlog.gauges(stuck_before)
        } else {
            let rows = sqlx::query(sqlx::AssertSqlSafe(
                self.kind.gauge_query(&self.sql, db_now),
            ))
            .fetch_all(&mut *tx)
            .await
            .map_err(q)?;
            let truth = self.kind.gauges(&rows).map_err(SourceError::Schema)?;
            if due {
                self.last_reconcile = Some(Instant::now());
                let kept = self.backlog.is_complete();
                let total: u64 = truth.values().flat_map(|g| g.counts).sum();
                let fits = usize::try_from(total).is_ok_and(|n| n < self.backlog.cap());
                if let Some(seed) = seed.filter(|_| fits)
                    && !(kept && self.backlog.gauges(stuck_before) == truth)
                {
                    // Rows changed where the tail cannot see them (deleted, or
                    // changed without moving the cursor), or the backlog fits
                    // again after being too large: read it afresh.
                    debug!(source = %self.spec.name, kept, "Re-reading the unfinished rows for the gauges.");
                    let mut rows = sqlx::query(sqlx::AssertSqlSafe(seed)).fetch(&mut *tx);
                    let mut n = 0usize;
                    self.backlog.clear();
                    while let Some(row) = rows.try_next().await.map_err(q)? {
                        n += 1;
                        self.see(&row)?;
                    }
                    rows_read += n as u64;
                    self.backlog.filled(n < self.spec.max_tracked_events);
                }
            }
            truth
        };
        tx.commit().await.map_err(q)?;
        self.kind.flush(&gauges, db_now, Instant::now());
        Ok(PollStats { rows_read })
    }

    /// Takes a tailed row into the counts and the backlog.
    fn take(&mut self, row: &AnyRow, baseline: bool) -> Result<(), SourceError> {
        self.kind
            .observe(row, baseline)
            .map_err(SourceError::Schema)?;
        self.see(row)
    }

    /// Takes a row's current version into the backlog.
    fn see(&mut self, row: &AnyRow) -> Result<(), SourceError> {
        let (key, unfinished) = self.kind.unfinished(row).map_err(SourceError::Schema)?;
        self.backlog.update(key, unfinished);
        Ok(())
    }
}

/// Sets a new session up: UTC, read-only transactions, the statement timeout.
async fn setup_session(
    conn: &mut AnyConnection,
    sql: Sql,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    for stmt in sql.session_setup(timeout) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut *conn)
            .await?;
    }
    let variants = sql.statement_timeout_variants(timeout);
    if !variants.is_empty() {
        let mut ok = false;
        for stmt in variants {
            if sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
                .execute(&mut *conn)
                .await
                .is_ok()
            {
                ok = true;
                break;
            }
        }
        if !ok {
            debug!("No statement timeout variable on this server.");
        }
    }
    Ok(())
}

/// The poll connections of an agent: one small pool per database (and
/// statement timeout), shared by every source on it, so that the sessions an
/// agent opens do not grow with the number of sources.
pub struct Pools {
    max_connections: u32,
    by_database: std::sync::Mutex<HashMap<(String, Duration), AnyPool>>,
}

impl Pools {
    /// Pools of at most `max_connections` sessions each.
    pub fn new(max_connections: u32) -> Self {
        Pools {
            max_connections,
            by_database: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The pool of `spec`'s database; connects lazily.
    pub fn get(&self, spec: &TableSpec) -> Result<AnyPool, SourceError> {
        let mut pools = self.by_database.lock().unwrap_or_else(|e| e.into_inner());
        let key = (spec.dsn.expose().to_string(), spec.timeout);
        if let Some(pool) = pools.get(&key) {
            return Ok(pool.clone());
        }
        let sql = Sql {
            dialect: spec.dsn.dialect(),
        };
        let timeout = spec.timeout;
        let pool = AnyPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout(Duration::from_secs(60))
            // A broken connection fails its poll and is closed then; a test
            // query before every poll would cost a round trip each.
            .test_before_acquire(false)
            .after_connect(move |conn, _meta| {
                Box::pin(async move { setup_session(conn, sql, timeout).await })
            })
            .connect_lazy(&connect_url(spec))
            .map_err(|e| SourceError::Connect {
                dsn: spec.dsn.to_string(),
                message: spec.dsn.scrub(&e.to_string()),
            })?;
        pools.insert(key, pool.clone());
        Ok(pool)
    }
}

/// Opens a checked, read-only connection for a table source.
pub struct Opener {
    spec: TableSpec,
    sql: Sql,
    columns: Vec<(&'static str, String)>,
}

impl Opener {
    /// Connects, sets the session up (UTC, read-only, statement timeout) and
    /// checks the table and its mapped columns.
    pub async fn open(self) -> Result<AnyConnection, SourceError> {
        let url = connect_url(&self.spec);
        let connect_err = |e: sqlx::Error| SourceError::Connect {
            dsn: self.spec.dsn.to_string(),
            message: self.spec.dsn.scrub(&e.to_string()),
        };
        let mut conn = AnyConnection::connect(&url).await.map_err(connect_err)?;
        setup_session(&mut conn, self.sql, self.spec.timeout)
            .await
            .map_err(connect_err)?;
        self.check_schema(&mut conn).await?;
        Ok(conn)
    }

    /// Names the missing table or columns before the first query fails on them.
    async fn check_schema(&self, conn: &mut AnyConnection) -> Result<(), SourceError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(
            self.sql.columns_query(&self.spec.table),
        ))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| SourceError::Query(e.to_string()))?;
        let mut present = HashMap::new();
        for row in &rows {
            let name: String = row
                .try_get(0)
                .map_err(|e| SourceError::Query(e.to_string()))?;
            let ty: String = row.try_get(1).unwrap_or_default();
            present.insert(name, ty);
        }
        if present.is_empty() {
            return Err(SourceError::Schema(format!(
                "table \"{}\" does not exist or is not readable ({}.table)",
                self.spec.table, self.spec.key
            )));
        }
        let missing: Vec<String> = self
            .columns
            .iter()
            .filter(|(_, col)| !present.contains_key(col.as_str()))
            .map(|(meaning, col)| {
                format!(
                    "table \"{}\" has no column \"{col}\" ({}.columns.{meaning})",
                    self.spec.table, self.spec.key
                )
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(SourceError::Schema(missing.join("; ")))
        }
    }
}

impl<K: TableKind> Source for TableSource<K> {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn poll_interval(&self) -> Duration {
        self.spec.poll_interval
    }

    fn timeout(&self) -> Duration {
        self.spec.timeout
    }

    async fn poll(&mut self) -> Result<PollStats, SourceError> {
        self.poll_once().await
    }

    fn reset(&mut self) {
        self.conn = None;
    }
}

fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    param: Param,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    match param {
        Param::Int(v) => query.bind(v),
        Param::Text(v) => query.bind(v),
    }
}

/// The URL the agent connects with: SQLite files are opened read-only.
pub fn connect_url(spec: &TableSpec) -> String {
    let url = spec.dsn.expose();
    if spec.dsn.dialect() == Dialect::Sqlite && !url.contains("mode=") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}mode=ro")
    } else {
        url.to_string()
    }
}

/// Per-label-id sums of a poll, recorded once at its end.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    counts: HashMap<Reject, u64>,
    created: bool,
}

impl Rejections {
    pub(crate) fn add(&mut self, reason: Reject) {
        *self.counts.entry(reason).or_default() += 1;
    }

    /// Records the poll's rejections; every reason's series exists from the
    /// first poll on, at 0, so that the first rejection shows in `rate()`.
    pub(crate) fn flush(&mut self, source: &str) {
        if !self.created {
            self.created = true;
            for reason in Reject::ALL {
                metrics::counter!(metric::ROWS_REJECTED, "source" => source.to_string(), "reason" => reason.as_str())
                    .increment(0);
            }
        }
        for (reason, n) in self.counts.drain() {
            metrics::counter!(metric::ROWS_REJECTED, "source" => source.to_string(), "reason" => reason.as_str())
                .increment(n);
        }
    }
}

/// Reads column `i` of a row, naming the meaning in the error.
pub(crate) fn get<'r, T>(row: &'r AnyRow, i: usize, meaning: &str) -> Result<T, String>
where
    T: sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
{
    row.try_get(i)
        .map_err(|e| format!("column for {meaning} has an unusable type: {e}"))
}

/// A stable 64-bit key of an event id (SipHash with fixed keys).
pub(crate) fn key_of(event_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6368_6576_656e_7473);
    event_id.hash(&mut h);
    h.finish()
}
