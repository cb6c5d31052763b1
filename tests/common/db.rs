//! The databases of the tests: where they are (`INBOXWATCH_TEST_PG`,
//! `INBOXWATCH_TEST_MYSQL`, a temporary SQLite file), DSN surgery, timestamps in
//! each dialect's text, statement templates with bound parameters, and [`Db`]: a
//! pool plus the tables and roles one test created, dropped at its end.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{MySql, Postgres, Row, Sqlite};

use super::agent::schema_ddl;
use super::unique_name;

/// PostgreSQL URL for tests (`INBOXWATCH_TEST_PG`).
pub fn pg_url() -> String {
    std::env::var("INBOXWATCH_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// MariaDB/MySQL URL for tests (`INBOXWATCH_TEST_MYSQL`).
pub fn mysql_url() -> String {
    std::env::var("INBOXWATCH_TEST_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// `host:port` of a `scheme://[user[:pw]@]host:port/db[?..]` URL.
pub fn url_hostport(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

/// The same URL with another `host:port`.
pub fn url_with_hostport(url: &str, hostport: &str) -> String {
    let old = url_hostport(url);
    let (scheme, rest) = url.split_once("://").expect("a database URL has a scheme");
    let (userinfo, after) = match rest.rsplit_once('@') {
        Some((u, a)) => (format!("{u}@"), a),
        None => (String::new(), rest),
    };
    let tail = after.strip_prefix(old.as_str()).unwrap_or(after);
    format!("{scheme}://{userinfo}{hostport}{tail}")
}

/// The same URL with another database (its path; a query string is kept).
pub fn url_with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a database URL has a scheme");
    let (authority, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    format!("{scheme}://{authority}/{database}{query}")
}

/// The same URL with other credentials.
pub fn url_with_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a database URL has a scheme");
    let after = rest.rsplit_once('@').map(|(_, a)| a).unwrap_or(rest);
    format!("{scheme}://{user}:{password}@{after}")
}

// ---------------------------------------------------------------------------------
// Timestamps: UTC milliseconds since the epoch <-> canonical text
// ---------------------------------------------------------------------------------

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC), the canonical SQLite text format.
pub fn fmt_ts(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Parses `YYYY-MM-DD[ T]HH:MM:SS[.fraction][Z|+00|+00:00]` (UTC) to milliseconds,
/// truncating sub-millisecond digits.
pub fn parse_ts(s: &str) -> Option<i64> {
    let s = s.trim();
    let s = s
        .strip_suffix("+00:00")
        .or_else(|| s.strip_suffix("+00"))
        .or_else(|| s.strip_suffix('Z'))
        .unwrap_or(s);
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut dp = date.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut tp = hms.split(':');
    let h: i64 = tp.next()?.parse().ok()?;
    let mi: i64 = tp.next()?.parse().ok()?;
    let se: i64 = tp.next()?.parse().ok()?;
    let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
    let milli: i64 = frac3.parse().ok()?;
    Some(((days_from_civil(y, mo, d) * 86_400) + h * 3600 + mi * 60 + se) * 1000 + milli)
}

// ---------------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------------

/// The three SQL dialects the agent supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Mysql,
    Sqlite,
}

impl Dialect {
    /// The database's clock as SQL, as a writer stamps a time column with it.
    pub fn clock_sql(self) -> &'static str {
        match self {
            Dialect::Postgres => "clock_timestamp()",
            Dialect::Mysql => "UTC_TIMESTAMP(6)",
            Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now')",
        }
    }

    /// The value of `inboxwatch schema --dialect`.
    pub fn cli_name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The type to CAST to for text results.
    pub fn text_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "text",
            Dialect::Mysql => "CHAR",
            Dialect::Sqlite => "TEXT",
        }
    }

    /// The timestamp text this dialect's column accepts, for `ms`.
    pub fn ts_text(self, ms: i64) -> String {
        match self {
            Dialect::Postgres => format!("{}+00", fmt_ts(ms)),
            Dialect::Mysql | Dialect::Sqlite => fmt_ts(ms),
        }
    }

    /// Renders a statement template: `{ts}` is a timestamp parameter (bound as text by
    /// [`Dialect::ts_text`]), `?` any other parameter, `{text}` the text cast type.
    pub fn render(self, template: &str) -> String {
        let ts = match self {
            Dialect::Postgres => "CAST(? AS timestamptz)",
            Dialect::Mysql => "CAST(? AS DATETIME(6))",
            Dialect::Sqlite => "?",
        };
        let sql = template
            .replace("{ts}", ts)
            .replace("{text}", self.text_type());
        if self != Dialect::Postgres {
            return sql;
        }
        let mut out = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&format!("${n}"));
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A bound parameter.
#[derive(Clone, Debug)]
pub enum V {
    Text(String),
    Int(i32),
    /// NULL, typed as text.
    Null,
}

impl V {
    pub fn text(s: impl Into<String>) -> V {
        V::Text(s.into())
    }
    pub fn opt_text(s: Option<impl Into<String>>) -> V {
        s.map_or(V::Null, |s| V::Text(s.into()))
    }
}

macro_rules! bind_all {
    ($db:ty, $sql:expr, $args:expr) => {{
        let mut q = sqlx::query::<$db>(sqlx::AssertSqlSafe($sql.to_string()));
        for a in $args.iter() {
            q = match a {
                V::Text(s) => q.bind(s.clone()),
                V::Int(i) => q.bind(*i),
                V::Null => q.bind(None::<String>),
            };
        }
        q
    }};
}

fn rows_to_text<R: Row>(rows: Vec<R>) -> Result<Vec<Vec<Option<String>>>, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.try_get::<Option<String>, _>(i))
                .collect()
        })
        .collect()
}

/// A connection pool of one of the three dialects.
#[derive(Clone, Debug)]
pub enum Pool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Pool {
    /// Runs one statement (an already rendered one).
    pub async fn execute(&self, sql: &str, args: &[V]) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Pool::Pg(p) => bind_all!(Postgres, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
            Pool::My(p) => bind_all!(MySql, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
            Pool::Lite(p) => bind_all!(Sqlite, sql, args)
                .execute(p)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a query whose every column is text (CAST it) or NULL.
    pub async fn fetch_text(
        &self,
        sql: &str,
        args: &[V],
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error> {
        match self {
            Pool::Pg(p) => rows_to_text(bind_all!(Postgres, sql, args).fetch_all(p).await?),
            Pool::My(p) => rows_to_text(bind_all!(MySql, sql, args).fetch_all(p).await?),
            Pool::Lite(p) => rows_to_text(bind_all!(Sqlite, sql, args).fetch_all(p).await?),
        }
    }

    /// Runs a script (several `;`-separated statements) unprepared.
    pub async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match self {
            Pool::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Pool::My(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Pool::Lite(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        }
    }

    /// A dedicated connection (for a writer that holds a transaction open).
    pub async fn acquire(&self) -> Conn {
        match self {
            Pool::Pg(p) => Conn::Pg(p.acquire().await.expect("acquire a PostgreSQL connection")),
            Pool::My(p) => Conn::My(p.acquire().await.expect("acquire a MariaDB connection")),
            Pool::Lite(p) => Conn::Lite(p.acquire().await.expect("acquire an SQLite connection")),
        }
    }
}

/// One dedicated connection.
pub enum Conn {
    Pg(PoolConnection<Postgres>),
    My(PoolConnection<MySql>),
    Lite(PoolConnection<Sqlite>),
}

impl Conn {
    /// Runs one statement (an already rendered one).
    pub async fn execute(&mut self, sql: &str, args: &[V]) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Conn::Pg(c) => bind_all!(Postgres, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
            Conn::My(c) => bind_all!(MySql, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
            Conn::Lite(c) => bind_all!(Sqlite, sql, args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
        })
    }

    /// Runs an unprepared statement such as BEGIN or COMMIT.
    pub async fn raw(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        match self {
            Conn::Pg(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            Conn::My(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            Conn::Lite(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
        }
    }
}

/// The inbox and outbox table names of one test.
#[derive(Clone, Debug)]
pub struct Tables {
    pub inbox: String,
    pub outbox: String,
}

/// A database for one test: a pool, the DSN the agent should use, and everything the
/// test created there (dropped by [`Db::cleanup`], or on drop as a fallback).
pub struct Db {
    pub dialect: Dialect,
    pub pool: Pool,
    /// The DSN for the agent's config.
    pub dsn: String,
    tables: Mutex<Vec<String>>,
    roles: Mutex<Vec<String>>,
    dir: Option<tempfile::TempDir>,
}

impl Db {
    pub async fn postgres() -> Db {
        Self::postgres_at(pg_url()).await
    }

    /// A pool on another PostgreSQL database than `INBOXWATCH_TEST_PG`'s.
    pub async fn postgres_at(dsn: String) -> Db {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&dsn)
            .await
            .unwrap_or_else(|e| panic!("connect to PostgreSQL at {dsn} (INBOXWATCH_TEST_PG): {e}"));
        Self::new(Dialect::Postgres, Pool::Pg(pool), dsn, None)
    }

    pub async fn mysql() -> Db {
        Self::mysql_at(mysql_url()).await
    }

    /// A pool on another MariaDB database than `INBOXWATCH_TEST_MYSQL`'s.
    pub async fn mysql_at(dsn: String) -> Db {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&dsn)
            .await
            .unwrap_or_else(|e| panic!("connect to MariaDB at {dsn} (INBOXWATCH_TEST_MYSQL): {e}"));
        Self::new(Dialect::Mysql, Pool::My(pool), dsn, None)
    }

    /// A fresh SQLite file in a temp dir, in WAL mode so that the agent's reads and
    /// the workload's writes do not block each other.
    pub async fn sqlite() -> Db {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let dir = tempfile::tempdir().expect("temp dir for the SQLite database");
        let path = dir.path().join("inbox.db");
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await
            .unwrap_or_else(|e| panic!("open SQLite at {}: {e}", path.display()));
        let dsn = format!("sqlite://{}", path.display());
        Self::new(Dialect::Sqlite, Pool::Lite(pool), dsn, Some(dir))
    }

    fn new(dialect: Dialect, pool: Pool, dsn: String, dir: Option<tempfile::TempDir>) -> Db {
        Db {
            dialect,
            pool,
            dsn,
            tables: Mutex::new(Vec::new()),
            roles: Mutex::new(Vec::new()),
            dir,
        }
    }

    /// Renders a template for this dialect (see [`Dialect::render`]).
    pub fn sql(&self, template: &str) -> String {
        self.dialect.render(template)
    }

    /// Renders and runs one statement; panics with the SQL on error.
    pub async fn exec(&self, template: &str, args: &[V]) -> u64 {
        let sql = self.sql(template);
        self.pool
            .execute(&sql, args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Renders and runs a query whose columns are all text; panics with the SQL on error.
    pub async fn query(&self, template: &str, args: &[V]) -> Vec<Vec<Option<String>>> {
        let sql = self.sql(template);
        self.pool
            .fetch_text(&sql, args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The database clock, UTC, in milliseconds (truncated).
    pub async fn now_ms(&self) -> i64 {
        let q = match self.dialect {
            Dialect::Postgres => {
                "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
            }
            Dialect::Mysql => "SELECT CAST(UTC_TIMESTAMP(6) AS CHAR)",
            Dialect::Sqlite => "SELECT strftime('%Y-%m-%d %H:%M:%f','now')",
        };
        let rows = self.query(q, &[]).await;
        let txt = rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .expect("the clock query returns one value");
        parse_ts(&txt).unwrap_or_else(|| panic!("cannot parse the database clock {txt:?}"))
    }

    /// Remembers a table to drop at cleanup.
    pub fn register_table(&self, name: &str) {
        self.tables
            .lock()
            .expect("tables lock")
            .push(name.to_string());
    }

    /// Remembers a PostgreSQL role (or a MariaDB user, at `%`, `localhost` and
    /// `127.0.0.1`) to drop at cleanup.
    pub fn register_role(&self, name: &str) {
        self.roles
            .lock()
            .expect("roles lock")
            .push(name.to_string());
    }

    /// Creates PostgreSQL role `role`, logging in with `password` (and `options`
    /// after it, e.g. ` CONNECTION LIMIT 1`), that may only connect and read
    /// `table`; dropped at cleanup. Returns the DSN that logs in as it.
    pub async fn select_only_role(
        &self,
        role: &str,
        password: &str,
        options: &str,
        table: &str,
    ) -> String {
        self.register_role(role);
        let dbname = self.query("SELECT current_database()::text", &[]).await[0][0]
            .clone()
            .expect("current_database()");
        for stmt in [
            format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'{options}"),
            format!("GRANT CONNECT ON DATABASE \"{dbname}\" TO {role}"),
            format!("GRANT USAGE ON SCHEMA public TO {role}"),
            format!("GRANT SELECT ON {table} TO {role}"),
        ] {
            self.exec(&stmt, &[]).await;
        }
        url_with_user(&self.dsn, role, password)
    }

    /// Creates fresh, uniquely named inbox and outbox tables from the binary's
    /// `schema` output (the test fails if it does not run or its DDL does not execute).
    pub async fn fresh_tables(&self, short: &str) -> Tables {
        let tables = Tables {
            inbox: unique_name("inbox", short),
            outbox: unique_name("outbox", short),
        };
        self.register_table(&tables.inbox);
        self.register_table(&tables.outbox);
        let ddl = schema_ddl(self.dialect.cli_name(), &tables.inbox, Some(&tables.outbox));
        if let Err(e) = self.pool.raw(&ddl).await {
            // MariaDB may refuse multi-statement text; then one statement at a time.
            if self.dialect != Dialect::Mysql {
                panic!("the DDL of `inboxwatch schema` does not execute: {e}\n{ddl}");
            }
            for stmt in split_statements(&ddl) {
                if let Err(e) = self.pool.raw(&stmt).await {
                    panic!("the DDL of `inboxwatch schema` does not execute: {e}\n{stmt}");
                }
            }
        }
        tables
    }

    /// Drops every table and role this test registered.
    pub async fn cleanup(&self) {
        let tables = std::mem::take(&mut *self.tables.lock().expect("tables lock"));
        let roles = std::mem::take(&mut *self.roles.lock().expect("roles lock"));
        for stmt in cleanup_statements(self.dialect, &tables, &roles) {
            if let Err(e) = self.pool.raw(&stmt).await {
                eprintln!("cleanup: {stmt}: {e}");
            }
        }
    }
}

fn cleanup_statements(dialect: Dialect, tables: &[String], roles: &[String]) -> Vec<String> {
    let mut out: Vec<String> = tables
        .iter()
        .map(|t| format!("DROP TABLE IF EXISTS {t}"))
        .collect();
    for r in roles {
        match dialect {
            Dialect::Postgres => {
                out.push(format!("DROP OWNED BY {r}"));
                out.push(format!("DROP ROLE IF EXISTS {r}"));
            }
            Dialect::Mysql => out.extend(
                ["%", "localhost", "127.0.0.1"]
                    .map(|host| format!("DROP USER IF EXISTS '{r}'@'{host}'")),
            ),
            Dialect::Sqlite => {}
        }
    }
    out
}

impl Drop for Db {
    /// Best effort when a test panicked before its explicit cleanup: a fresh
    /// connection on a separate thread (the test's runtime may be unwinding).
    fn drop(&mut self) {
        let tables = std::mem::take(&mut *self.tables.lock().unwrap_or_else(|e| e.into_inner()));
        let roles = std::mem::take(&mut *self.roles.lock().unwrap_or_else(|e| e.into_inner()));
        if self.dialect == Dialect::Sqlite || (tables.is_empty() && roles.is_empty()) {
            return;
        }
        let stmts = cleanup_statements(self.dialect, &tables, &roles);
        let dialect = self.dialect;
        let dsn = self.dsn.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let pool = match dialect {
                    Dialect::Postgres => sqlx::PgPool::connect(&dsn).await.map(Pool::Pg),
                    _ => sqlx::MySqlPool::connect(&dsn).await.map(Pool::My),
                };
                if let Ok(pool) = pool {
                    for s in stmts {
                        let _ = pool.raw(&s).await;
                    }
                }
            });
        })
        .join();
        drop(self.dir.take());
    }
}

/// Splits a DDL script on `;` at line ends, dropping comment-only pieces.
pub fn split_statements(ddl: &str) -> Vec<String> {
    ddl.split(';')
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_string()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// One statement on a test's table, `{t}` standing for `table`'s name; panics with
/// the statement on failure.
pub async fn table_sql(db: &Db, table: &str, stmt: &str) {
    let stmt = stmt.replace("{t}", table);
    db.pool
        .raw(&stmt)
        .await
        .unwrap_or_else(|e| panic!("{stmt}: {e}"));
}
