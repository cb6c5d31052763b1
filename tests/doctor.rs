//! `inboxwatch doctor --config FILE` through the binary, against the real
//! databases: PostgreSQL (`INBOXWATCH_TEST_PG`), MariaDB (`INBOXWATCH_TEST_MYSQL`)
//! and a temporary SQLite file.
//!
//! Each test builds its own tables (unique names, dropped by [`Db`]'s `Drop` even
//! when an assertion fails), writes a config, runs the doctor and checks its
//! findings line by line and its exit code: 0 when nothing needs attention, 1
//! when there is a warning or an error, 2 for a config it cannot use.

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::{AnyConnection, Connection, Row};
use tempfile::{NamedTempFile, TempDir};

use common::agent::schema_ddl;
use common::{Cmd, Dialect, mysql_url, pg_url, unique_name, url_with_hostport, url_with_user};

/// How long one doctor run may take before the test fails.
const DOCTOR_TIMEOUT: Duration = Duration::from_secs(60);

/// The three queries of one poll that the doctor EXPLAINs, in its order.
const QUERIES: [&str; 3] = ["tail on updated_at", "gauges", "seed"];

/// A password no output may ever contain.
const SECRET: &str = "Zq7doctorSecretPw";

/// `inbox_doc_{short}_{pid}_{random}`: unique across parallel test processes and
/// short enough for `_unfinished` index names within PostgreSQL's 63 characters.
fn unique_table(short: &str) -> String {
    unique_name("inbox_doc", short)
}

/// The same URL with `user:password@`, keeping the user (default `root`).
fn with_password(url: &str, password: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let user = match authority.rsplit_once('@') {
        Some((userinfo, _)) => userinfo.split(':').next().unwrap_or("root"),
        None => "root",
    };
    url_with_user(url, user, password)
}

/// The same URL pointing at `127.0.0.1:1`, where nothing listens.
fn unreachable(url: &str) -> String {
    url_with_hostport(url, "127.0.0.1:1")
}

/// The SQL the doctor tests write, per dialect.
trait DoctorSql: Copy {
    fn quote(self, ident: &str) -> String;
    fn rows(self) -> u32;
    fn time(self, seconds: &str) -> String;
    fn concat(self, prefix: &str, expr: &str) -> String;
    fn tail_index(self, table: &str) -> String;
    fn unfinished_index(self, table: &str) -> String;
}

impl DoctorSql for Dialect {
    fn quote(self, ident: &str) -> String {
        match self {
            Dialect::Mysql => format!("`{ident}`"),
            Dialect::Postgres | Dialect::Sqlite => format!("\"{ident}\""),
        }
    }

    /// Rows enough that the planner prefers the indexes over a scan.
    fn rows(self) -> u32 {
        match self {
            Dialect::Postgres => 50_000,
            Dialect::Mysql => 5_000,
            Dialect::Sqlite => 500,
        }
    }

    /// A time `seconds` after one day ago, in the dialect's stored form (UTC).
    fn time(self, seconds: &str) -> String {
        match self {
            Dialect::Postgres => {
                format!("now() - INTERVAL '1 day' + ({seconds}) * INTERVAL '1 second'")
            }
            Dialect::Mysql => {
                format!("UTC_TIMESTAMP(6) - INTERVAL 1 DAY + INTERVAL ({seconds}) SECOND")
            }
            Dialect::Sqlite => format!(
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 day', '+' || ({seconds}) || ' seconds')"
            ),
        }
    }

    fn concat(self, prefix: &str, expr: &str) -> String {
        match self {
            Dialect::Mysql => format!("CONCAT('{prefix}', {expr})"),
            Dialect::Postgres | Dialect::Sqlite => format!("'{prefix}' || ({expr})"),
        }
    }

    /// The `CREATE INDEX` the doctor advises for the tail query.
    fn tail_index(self, table: &str) -> String {
        format!(
            "CREATE INDEX IF NOT EXISTS {table}_updated_at ON {} ({});",
            self.quote(table),
            self.quote("updated_at")
        )
    }

    /// The `CREATE INDEX` the doctor advises for the gauges and seed queries.
    fn unfinished_index(self, table: &str) -> String {
        match self {
            Dialect::Mysql => format!(
                "CREATE INDEX IF NOT EXISTS {table}_unfinished ON `{table}` (`status`, `received_at`);"
            ),
            Dialect::Postgres | Dialect::Sqlite => format!(
                "CREATE INDEX IF NOT EXISTS {table}_unfinished ON \"{table}\" (\"received_at\") \
                 WHERE \"status\" IN ('pending', 'processing', 'failed');"
            ),
        }
    }
}

/// The test's own connection to one database, and the guard of the tables it
/// made: dropping it drops them, also when the test panicked.
struct Db {
    dialect: Dialect,
    /// What the doctor's config gets.
    dsn: String,
    rt: tokio::runtime::Runtime,
    conn: Option<AnyConnection>,
    url: String,
    tables: Vec<String>,
    /// Holds the SQLite file; declared last so it outlives the connection.
    dir: Option<TempDir>,
}

impl Db {
    fn new(dialect: Dialect) -> Db {
        sqlx::any::install_default_drivers();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread tokio runtime builds");
        let (url, dsn, dir) = match dialect {
            Dialect::Postgres => (pg_url(), pg_url(), None),
            Dialect::Mysql => (mysql_url(), mysql_url(), None),
            Dialect::Sqlite => {
                let dir = tempfile::tempdir().expect("create a temp dir for the SQLite file");
                let path = dir.path().join("inbox.db");
                let path = path.to_str().expect("temp paths are UTF-8");
                (
                    format!("sqlite://{path}?mode=rwc"),
                    format!("sqlite://{path}"),
                    Some(dir),
                )
            }
        };
        let conn = rt
            .block_on(AnyConnection::connect(&url))
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        Db {
            dialect,
            dsn,
            rt,
            conn: Some(conn),
            url,
            tables: Vec::new(),
            dir,
        }
    }

    /// A fresh table name, dropped when `self` is.
    fn table(&mut self, short: &str) -> String {
        let name = unique_table(short);
        self.tables.push(name.clone());
        name
    }

    fn sqlite_file(&self) -> PathBuf {
        self.dir
            .as_ref()
            .expect("only SQLite databases have a file")
            .path()
            .join("inbox.db")
    }

    fn exec(&mut self, sql: &str) {
        let conn = self
            .conn
            .as_mut()
            .expect("the connection is open until drop");
        self.rt
            .block_on(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(conn))
            .unwrap_or_else(|e| panic!("{sql}\nfailed: {e}"));
    }

    fn strings(&mut self, sql: &str) -> Vec<String> {
        let conn = self
            .conn
            .as_mut()
            .expect("the connection is open until drop");
        let rows = self
            .rt
            .block_on(sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).fetch_all(conn))
            .unwrap_or_else(|e| panic!("{sql}\nfailed: {e}"));
        rows.iter()
            .map(|r| {
                r.try_get::<Option<String>, _>(0)
                    .unwrap_or_else(|e| panic!("{sql}\ndecoding column 0: {e}"))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The table `inboxwatch schema` recommends, with or without its indexes.
    fn create_inbox(&mut self, table: &str, with_indexes: bool) {
        let ddl = schema_ddl(self.dialect.cli_name(), table, None);
        let ddl = if with_indexes {
            ddl
        } else {
            let kept: Vec<&str> = ddl
                .split(";\n")
                .filter(|stmt| {
                    let code = stmt
                        .lines()
                        .filter(|l| !l.trim_start().starts_with("--"))
                        .collect::<Vec<_>>()
                        .join("\n");
                    !code.trim_start().starts_with("CREATE INDEX")
                })
                .collect();
            kept.join(";\n")
        };
        assert!(
            ddl.contains("CREATE TABLE"),
            "schema printed no table:\n{ddl}"
        );
        self.exec(&ddl);
    }

    /// Fills `table` with `rows` events over the last day, 1 % of them unfinished
    /// (pending, processing, failed in turn), and refreshes the planner statistics.
    fn fill(&mut self, table: &str, rows: u32) {
        let d = self.dialect;
        let digits = rows.saturating_sub(1).max(1).ilog10() + 1;
        let from: Vec<String> = (0..digits).map(|k| format!("d d{k}")).collect();
        let index: Vec<String> = (0..digits)
            .map(|k| format!("{} * d{k}.n", 10u32.pow(k)))
            .collect();
        let status = "CASE WHEN i % 300 = 0 THEN 'pending' WHEN i % 300 = 100 THEN 'processing' \
                      WHEN i % 300 = 200 THEN 'failed' ELSE 'succeeded' END";
        let sql = format!(
            "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, finished_at, \
             attempts, deliveries, last_error, traceparent, updated_at) \
             WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 9) \
             SELECT {id}, {et}, {status}, {received}, \
             CASE WHEN i % 300 = 0 THEN NULL ELSE {started} END, \
             CASE WHEN i % 100 = 0 THEN NULL ELSE {finished} END, \
             1 + i % 3, 1 + i % 2, NULL, NULL, {updated} \
             FROM (SELECT {index} AS i FROM {from}) s WHERE i < {rows}",
            t = d.quote(table),
            id = d.concat("e", "i"),
            et = d.concat("type", "i % 5"),
            received = d.time("i"),
            started = d.time("i + 1"),
            finished = d.time("i + 2"),
            updated = d.time("i + 2"),
            index = index.join(" + "),
            from = from.join(", "),
        );
        self.exec(&sql);
        let analyze = match d {
            Dialect::Postgres => format!("ANALYZE {}", d.quote(table)),
            Dialect::Mysql => format!("ANALYZE TABLE {}", d.quote(table)),
            Dialect::Sqlite => "ANALYZE".to_string(),
        };
        self.exec(&analyze);
        let count = self.strings(&format!(
            "SELECT CAST(COUNT(*) AS {}) FROM {}",
            if d == Dialect::Mysql { "CHAR" } else { "TEXT" },
            d.quote(table)
        ));
        assert_eq!(count, [rows.to_string()], "rows in {table}");
    }

    /// A checksum of every row of `table`, in event id order.
    fn checksum(&mut self, table: &str) -> String {
        let t = self.dialect.quote(table);
        match self.dialect {
            Dialect::Postgres => self.strings(&format!(
                "SELECT md5(string_agg(CAST(x AS text), E'\\n' ORDER BY event_id)) FROM {t} x"
            ))[0]
                .clone(),
            Dialect::Mysql => {
                self.exec("SET SESSION group_concat_max_len = 1073741824");
                let cols = [
                    "event_id",
                    "event_type",
                    "status",
                    "received_at",
                    "started_at",
                    "finished_at",
                    "attempts",
                    "deliveries",
                    "last_error",
                    "traceparent",
                    "updated_at",
                ]
                .map(|c| format!("IFNULL(CAST({c} AS CHAR), '<null>')"))
                .join(", ");
                self.strings(&format!(
                    "SELECT CAST(MD5(GROUP_CONCAT(CONCAT_WS('|', {cols}) ORDER BY event_id \
                     SEPARATOR '\\n')) AS CHAR) FROM {t}"
                ))[0]
                    .clone()
            }
            // The doctor opens SQLite read-only; the file's bytes must not change at all.
            Dialect::Sqlite => {
                let bytes = std::fs::read(self.sqlite_file()).expect("read the SQLite file");
                format!("{} bytes, fnv1a {:016x}", bytes.len(), fnv1a(&bytes))
            }
        }
    }

    /// The names of the indexes on `table`.
    fn indexes(&mut self, table: &str) -> BTreeSet<String> {
        let sql = match self.dialect {
            Dialect::Postgres => format!(
                "SELECT CAST(indexname AS text) FROM pg_indexes \
                 WHERE schemaname = current_schema() AND tablename = '{table}'"
            ),
            Dialect::Mysql => format!(
                "SELECT DISTINCT CAST(index_name AS CHAR) FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
            Dialect::Sqlite => format!(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}'"
            ),
        };
        self.strings(&sql).into_iter().collect()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let tables = std::mem::take(&mut self.tables);
        let (dialect, url) = (self.dialect, self.url.clone());
        let conn = self.conn.take();
        self.rt.block_on(async move {
            // A connection left mid-statement by a panic may be unusable: use a fresh one.
            drop(conn);
            let Ok(mut conn) = AnyConnection::connect(&url).await else {
                eprintln!("cleanup: cannot connect to {url}; tables left: {tables:?}");
                return;
            };
            for t in &tables {
                let sql = format!("DROP TABLE IF EXISTS {}", dialect.quote(t));
                if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                {
                    eprintln!("cleanup: dropping {t} failed: {e}");
                }
            }
            let _ = conn.close().await;
        });
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One `[[sources]]` entry mapping every column of the contract's table;
/// `extra` is appended verbatim (e.g. a `[sources.columns]` table, which then
/// replaces that mapping).
fn source(name: &str, dsn: &str, table: &str, extra: &str) -> String {
    let columns = if extra.contains("[sources.columns]") {
        ""
    } else {
        common::scenarios::INBOX_COLUMNS
    };
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"inbox\"\ndsn = \"{dsn}\"\ntable = \"{table}\"\n{columns}{extra}\n"
    )
}

/// What one doctor run printed and how it exited.
struct Doctor {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Doctor {
    fn run(config: &str, env: &[(&str, &str)]) -> Doctor {
        let file = NamedTempFile::new().expect("create a temp config file");
        std::fs::write(file.path(), config).expect("write the config");
        let out = Cmd::new(["doctor", "--config"])
            .arg(file.path())
            .envs(env.iter().copied())
            .timeout(DOCTOR_TIMEOUT)
            .output();
        Doctor {
            code: out.code,
            stdout: out.stdout,
            stderr: out.stderr,
        }
    }

    fn dump(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// The header and the finding lines of source `name`.
    fn section(&self, name: &str) -> (&str, Vec<&str>) {
        let head = format!("source \"{name}\" (");
        let mut lines = self.stdout.lines();
        let header = lines
            .find(|l| l.starts_with(&head))
            .unwrap_or_else(|| panic!("no section for source {name:?}:\n{}", self.dump()));
        let findings = lines.take_while(|l| l.starts_with("  ")).collect();
        (header, findings)
    }

    /// The warning and error lines of source `name`.
    fn problems(&self, name: &str) -> Vec<&str> {
        let (_, findings) = self.section(name);
        findings
            .into_iter()
            .filter(|l| l.starts_with("  warning: ") || l.starts_with("  error:   "))
            .collect()
    }

    fn assert_healthy(&self, name: &str, table: &str) {
        let (header, findings) = self.section(name);
        assert!(
            header.ends_with(&format!(", table {table}):")),
            "header of {name}: {header}\n{}",
            self.dump()
        );
        assert!(
            self.problems(name).is_empty(),
            "expected no warning or error:\n{}",
            self.dump()
        );
        for q in QUERIES {
            let line = format!("  ok:      the {q} query uses an index");
            assert!(
                findings.contains(&line.as_str()),
                "missing {line:?}:\n{}",
                self.dump()
            );
        }
        assert_eq!(self.code, Some(0), "{}", self.dump());
    }
}

// ---------------------------------------------------------------------------------
// (1) The recommended schema with enough rows: every query uses an index.
// ---------------------------------------------------------------------------------

fn recommended_schema_is_healthy(dialect: Dialect) {
    let mut db = Db::new(dialect);
    let t = db.table("ok");
    db.create_inbox(&t, true);
    db.fill(&t, dialect.rows());
    let out = Doctor::run(&source("orders", &db.dsn, &t, ""), &[]);
    out.assert_healthy("orders", &t);
}

#[test]
fn postgres_recommended_schema_is_healthy() {
    recommended_schema_is_healthy(Dialect::Postgres);
}

#[test]
fn mysql_recommended_schema_is_healthy() {
    recommended_schema_is_healthy(Dialect::Mysql);
}

#[test]
fn sqlite_recommended_schema_is_healthy() {
    recommended_schema_is_healthy(Dialect::Sqlite);
}

// ---------------------------------------------------------------------------------
// (2) No index: three warnings with the exact DDL, and running that DDL cures them.
// ---------------------------------------------------------------------------------

fn missing_indexes_are_advised_and_the_advice_works(dialect: Dialect) {
    let mut db = Db::new(dialect);
    let t = db.table("noidx");
    db.create_inbox(&t, false);
    db.fill(&t, dialect.rows());
    let indexes_before = db.indexes(&t);

    let config = source("orders", &db.dsn, &t, "");
    let out = Doctor::run(&config, &[]);
    let advice = |q: &str, ddl: String| {
        format!("  warning: the {q} query would scan the whole table; create: {ddl}")
    };
    let expected = vec![
        advice("tail on updated_at", dialect.tail_index(&t)),
        advice("gauges", dialect.unfinished_index(&t)),
        advice("seed", dialect.unfinished_index(&t)),
    ];
    assert_eq!(out.problems("orders"), expected, "{}", out.dump());
    assert_eq!(out.code, Some(1), "{}", out.dump());
    assert_eq!(
        db.indexes(&t),
        indexes_before,
        "the doctor advises indexes but must not create them"
    );

    // Run exactly what was printed, each distinct statement once.
    let printed: BTreeSet<&str> = out
        .problems("orders")
        .into_iter()
        .filter_map(|l| l.split_once("; create: ").map(|(_, ddl)| ddl))
        .collect();
    assert_eq!(printed.len(), 2, "{}", out.dump());
    for ddl in printed {
        db.exec(ddl);
    }
    let again = Doctor::run(&config, &[]);
    again.assert_healthy("orders", &t);
}

#[test]
fn postgres_missing_indexes_are_advised_and_the_advice_works() {
    missing_indexes_are_advised_and_the_advice_works(Dialect::Postgres);
}

#[test]
fn mysql_missing_indexes_are_advised_and_the_advice_works() {
    missing_indexes_are_advised_and_the_advice_works(Dialect::Mysql);
}

#[test]
fn sqlite_missing_indexes_are_advised_and_the_advice_works() {
    missing_indexes_are_advised_and_the_advice_works(Dialect::Sqlite);
}

// ---------------------------------------------------------------------------------
// (3) A missing table or column: an error naming the table, the column and the key.
// ---------------------------------------------------------------------------------

fn missing_table_and_columns_name_their_keys(dialect: Dialect) {
    let mut db = Db::new(dialect);
    let absent = db.table("absent");
    let dropped = db.table("nofin");
    db.create_inbox(&dropped, true);
    db.exec(&format!(
        "ALTER TABLE {} DROP COLUMN finished_at",
        dialect.quote(&dropped)
    ));
    let renamed = db.table("rename");
    db.create_inbox(&renamed, true);

    let config = [
        source("absent", &db.dsn, &absent, ""),
        source("no_finished", &db.dsn, &dropped, ""),
        source(
            "renamed",
            &db.dsn,
            &renamed,
            "[sources.columns]\nupdated_at = \"updated_at\"\nfinished_at = \"done_at\"",
        ),
    ]
    .concat();
    let out = Doctor::run(&config, &[]);
    let cases = [
        (
            "absent",
            format!(
                "  error:   table \"{absent}\" does not exist or is not readable (sources[0].table)"
            ),
        ),
        (
            "no_finished",
            format!(
                "  error:   table \"{dropped}\" has no column \"finished_at\" \
                 (sources[1].columns.finished_at)"
            ),
        ),
        (
            "renamed",
            format!(
                "  error:   table \"{renamed}\" has no column \"done_at\" \
                 (sources[2].columns.finished_at)"
            ),
        ),
    ];
    for (name, line) in &cases {
        let (_, findings) = out.section(name);
        assert!(
            findings.contains(&line.as_str()),
            "missing {line:?}:\n{}",
            out.dump()
        );
        assert!(
            !findings.iter().any(|l| l.starts_with("  ok:")),
            "source {name} is unusable, yet something is ok:\n{}",
            out.dump()
        );
    }
    assert_eq!(out.code, Some(1), "{}", out.dump());
}

#[test]
fn postgres_missing_table_and_columns_name_their_keys() {
    missing_table_and_columns_name_their_keys(Dialect::Postgres);
}

#[test]
fn mysql_missing_table_and_columns_name_their_keys() {
    missing_table_and_columns_name_their_keys(Dialect::Mysql);
}

#[test]
fn sqlite_missing_table_and_columns_name_their_keys() {
    missing_table_and_columns_name_their_keys(Dialect::Sqlite);
}

// ---------------------------------------------------------------------------------
// (4) The doctor only reads: rows and indexes are the same afterwards.
// ---------------------------------------------------------------------------------

/// Guards that the doctor, even while advising indexes on a table that lacks them,
/// changes neither the rows nor the indexes (nor, for SQLite, a byte of the file).
fn doctor_never_writes(dialect: Dialect) {
    let mut db = Db::new(dialect);
    let bare = db.table("ro");
    db.create_inbox(&bare, false);
    db.fill(&bare, dialect.rows() / 10);
    let indexed = db.table("roidx");
    db.create_inbox(&indexed, true);
    db.fill(&indexed, dialect.rows() / 10);
    let before = [
        (db.checksum(&bare), db.indexes(&bare)),
        (db.checksum(&indexed), db.indexes(&indexed)),
    ];

    let config = [
        source("bare", &db.dsn, &bare, ""),
        source("indexed", &db.dsn, &indexed, ""),
    ]
    .concat();
    let out = Doctor::run(&config, &[]);
    assert!(
        !out.problems("bare").is_empty(),
        "an unindexed table gets advice:\n{}",
        out.dump()
    );

    let after = [
        (db.checksum(&bare), db.indexes(&bare)),
        (db.checksum(&indexed), db.indexes(&indexed)),
    ];
    assert_eq!(
        after,
        before,
        "the doctor changed the database:\n{}",
        out.dump()
    );
}

#[test]
fn postgres_doctor_never_writes() {
    doctor_never_writes(Dialect::Postgres);
}

#[test]
fn mysql_doctor_never_writes() {
    doctor_never_writes(Dialect::Mysql);
}

#[test]
fn sqlite_doctor_never_writes() {
    doctor_never_writes(Dialect::Sqlite);
}

// ---------------------------------------------------------------------------------
// (5) Secrets: a DSN's password is never printed, whatever fails.
// ---------------------------------------------------------------------------------

/// Guards that neither the header nor a driver error echoes the password, in the
/// URL's userinfo (plain, percent-encoded, from `${ENV}`), in its query string, on
/// an unreachable port and against a real server that rejects or ignores it.
#[test]
fn doctor_never_prints_the_password() {
    let pg_down = unreachable(&with_password(&pg_url(), SECRET));
    let mysql_down = unreachable(&with_password(&mysql_url(), SECRET));
    let encoded = unreachable(&with_password(&pg_url(), &format!("a%40{SECRET}")));
    let from_env = unreachable(&with_password(&pg_url(), "${IW_DOCTOR_TEST_PW}"));
    let in_query = format!(
        "{}{}password={SECRET}",
        unreachable(&pg_url()),
        if pg_url().contains('?') { '&' } else { '?' }
    );
    // MariaDB refuses the wrong password; PostgreSQL under `trust` ignores it and
    // then finds no table — either way there is an error and no secret.
    let mysql_refused = with_password(&mysql_url(), SECRET);
    let pg_accepted = with_password(&pg_url(), SECRET);
    let table = unique_table("secret");

    let sources = [
        ("pg_down", pg_down.as_str(), true),
        ("mysql_down", mysql_down.as_str(), true),
        ("pg_encoded", encoded.as_str(), true),
        ("pg_env", from_env.as_str(), true),
        ("pg_query", in_query.as_str(), false),
        ("mysql_refused", mysql_refused.as_str(), true),
        ("pg_accepted", pg_accepted.as_str(), true),
    ];
    let config: String = sources
        .iter()
        .map(|(name, dsn, _)| source(name, dsn, &table, ""))
        .collect();
    let out = Doctor::run(&config, &[("IW_DOCTOR_TEST_PW", SECRET)]);

    for (name, _, userinfo) in &sources {
        let (header, findings) = out.section(name);
        if *userinfo {
            assert!(header.contains(":***@"), "header not redacted: {header}");
        }
        assert!(
            findings.iter().any(|l| l.starts_with("  error:   ")),
            "source {name} cannot work, yet no error:\n{}",
            out.dump()
        );
    }
    for text in [&out.stdout, &out.stderr] {
        assert!(
            !text.contains(SECRET),
            "the password was printed:\n{}",
            out.dump()
        );
    }
    assert_eq!(out.code, Some(1), "{}", out.dump());
}

// ---------------------------------------------------------------------------------
// Config errors: exit 2 before connecting anywhere.
// ---------------------------------------------------------------------------------

#[test]
fn doctor_rejects_a_bad_config_with_exit_2() {
    let config = source(
        "orders",
        "postgres://postgres@127.0.0.1:1/test",
        "inbox_x",
        "poll_interval = \"5 parsecs\"",
    );
    let out = Doctor::run(&config, &[]);
    assert_eq!(out.code, Some(2), "{}", out.dump());
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("sources[0].poll_interval: ")),
        "the error names the key:\n{}",
        out.dump()
    );
    assert!(
        !out.stdout.contains("source \"orders\""),
        "a bad config is not checked source by source:\n{}",
        out.dump()
    );
}
