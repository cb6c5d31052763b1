//! The SQL that differs between PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Every timestamp leaves the database as microseconds since the Unix epoch
//! (UTC), computed by the database itself, so that the agent never parses a
//! driver-specific time type and ages are on the database's clock.

use std::time::Duration;

use crate::dsn::Dialect;

/// What [`Sql::micros`] gives for a time that has no microsecond value that
/// fits in 64 bits (PostgreSQL's `infinity`, a year past 294,000) or that the
/// database cannot read as a time (SQLite text): the row is rejected as
/// `time_out_of_range`, the source stays up.
pub use crate::text::OUT_OF_RANGE;

/// Microseconds from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A value bound as the tail cursor.
#[derive(Debug, Clone)]
pub enum Param {
    Int(i64),
    Text(String),
}

/// How a look-up by event id names the ids ([`Sql::id_bind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdBind {
    /// As bound text parameters, each cast to this type where one is given.
    Params(Option<&'static str>),
    /// As literals in the statement, which the database converts to the
    /// column's type itself.
    Literals,
}

/// SQL fragments for one dialect.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    pub dialect: Dialect,
}

impl Sql {
    /// Quotes an identifier (names are checked to be plain identifiers by the config).
    pub fn ident(&self, name: &str) -> String {
        match self.dialect {
            Dialect::MySql => format!("`{name}`"),
            Dialect::Postgres | Dialect::Sqlite => format!("\"{name}\""),
        }
    }

    /// Quotes `table` or `schema.table`.
    pub fn table(&self, name: &str) -> String {
        name.split('.')
            .map(|p| self.ident(p))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// A string literal.
    pub fn literal(&self, value: &str) -> String {
        let escaped = value.replace('\'', "''");
        match self.dialect {
            // MySQL also treats backslash as an escape inside literals.
            Dialect::MySql => format!("'{}'", escaped.replace('\\', "\\\\")),
            Dialect::Postgres | Dialect::Sqlite => format!("'{escaped}'"),
        }
    }

    /// `IN (…)` list of string literals.
    pub fn in_list(&self, words: &[&str]) -> String {
        let items: Vec<String> = words.iter().map(|w| self.literal(w)).collect();
        format!("({})", items.join(", "))
    }

    /// `expr IN (…)`: whether `expr` is one of `words` (string literals).
    pub fn is_in(&self, expr: &str, words: &[&str]) -> String {
        format!("{expr} IN {}", self.in_list(words))
    }

    /// How the event ids of a look-up are compared with an id column of
    /// type `data_type` (as `information_schema.columns` or SQLite's
    /// `pragma_table_info` names it): bound as text parameters, which
    /// MariaDB and SQLite convert to the column's type as they do a
    /// literal; on PostgreSQL each is cast to the column's type, known for
    /// the usual id types. Another PostgreSQL type (an enum, a domain, a
    /// `character(n)` a cast would pad) keeps literals in the statement.
    pub fn id_bind(&self, data_type: &str) -> IdBind {
        match self.dialect {
            Dialect::MySql | Dialect::Sqlite => IdBind::Params(None),
            Dialect::Postgres => match data_type {
                "bigint" => IdBind::Params(Some("BIGINT")),
                "integer" => IdBind::Params(Some("INTEGER")),
                "smallint" => IdBind::Params(Some("SMALLINT")),
                "numeric" => IdBind::Params(Some("NUMERIC")),
                "uuid" => IdBind::Params(Some("UUID")),
                "text" => IdBind::Params(Some("TEXT")),
                "character varying" => IdBind::Params(Some("VARCHAR")),
                _ => IdBind::Literals,
            },
        }
    }

    /// `column IN (…)` of `n` event ids as [`Sql::id_bind`] says, from
    /// parameter 1: one statement per `n`, prepared once.
    pub fn id_params(&self, column: &str, n: usize, bind: IdBind) -> String {
        let items: Vec<String> = (1..=n)
            .map(|i| match bind {
                IdBind::Params(Some(ty)) => format!("CAST({} AS {ty})", self.placeholder(i)),
                _ => self.placeholder(i),
            })
            .collect();
        format!("{column} IN ({})", items.join(", "))
    }

    /// A column (or expression) as text, whatever its type (uuid, enum, varchar).
    pub fn text(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("CAST({expr} AS TEXT)"),
            Dialect::MySql => format!("CAST({expr} AS CHAR)"),
            Dialect::Sqlite => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// An integer column as a 64-bit integer.
    pub fn int(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("CAST({expr} AS BIGINT)"),
            Dialect::MySql => format!("CAST({expr} AS SIGNED)"),
            Dialect::Sqlite => format!("CAST({expr} AS INTEGER)"),
        }
    }

    /// The first `n` characters of a text expression. On PostgreSQL the
    /// expression is cast to text first, so that a `json` / `jsonb` column
    /// (pg-boss keeps its errors in one) reads as its text; MariaDB and
    /// SQLite take JSON as text already.
    pub fn prefix(&self, expr: &str, n: usize) -> String {
        match self.dialect {
            Dialect::Postgres => format!("LEFT(CAST({expr} AS TEXT), {n})"),
            Dialect::MySql => format!("LEFT({expr}, {n})"),
            Dialect::Sqlite => format!("SUBSTR({expr}, 1, {n})"),
        }
    }

    /// Length in characters of a text expression (of its text on
    /// PostgreSQL, as [`Sql::prefix`]).
    pub fn char_length(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("CHAR_LENGTH(CAST({expr} AS TEXT))"),
            Dialect::MySql => format!("CHAR_LENGTH({expr})"),
            Dialect::Sqlite => format!("LENGTH({expr})"),
        }
    }

    /// A timestamp expression as microseconds since the epoch (NULL stays NULL).
    /// A time that has no such value — PostgreSQL's `infinity` and
    /// `-infinity`, a year past 294,000, a text SQLite cannot read as a time —
    /// comes out as [`OUT_OF_RANGE`] instead of failing the whole query, so
    /// that one bad row is rejected rather than taking the source down.
    pub fn micros(&self, expr: &str) -> String {
        match self.dialect {
            // date_part is float8 arithmetic, EXTRACT numeric: about half the
            // cost per value, and exact to the microsecond for dates within a
            // century of 1970 (the float's error stays under 0.25 µs).
            // ±9.2e12 s is the range whose microseconds fit a BIGINT.
            Dialect::Postgres => format!(
                "CASE WHEN {expr} IS NULL THEN NULL \
                 WHEN date_part('epoch', {expr}) BETWEEN -9.2e12 AND 9.2e12 \
                 THEN CAST(date_part('epoch', {expr}) * 1000000 AS BIGINT) \
                 ELSE {OUT_OF_RANGE} END"
            ),
            // DATETIME and TIMESTAMP span years 1000 (0 on MariaDB) to 9999,
            // within range; a zero or invalid date has no difference (NULL).
            // The difference is taken once, from a typed literal: a `CASE`
            // that tested it and took it again, from a string MariaDB parsed
            // anew for every row, cost a tail of 500 rows 1.29 ms where this
            // costs 1.06 ms, and the pairs of 500 rows 0.32 ms against 0.26.
            Dialect::MySql => format!(
                "IFNULL(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {expr}), \
                 IF({expr} IS NULL, NULL, {OUT_OF_RANGE}))"
            ),
            // SQLite keeps times as text; julianday() parses the ISO-8601 forms
            // and gives NULL for anything else. The text is parsed once: a
            // `CASE` that parsed it to test it and again for the value took
            // 0.75 µs for a row's three times where this takes 0.63 µs
            // (300,000 rows read through Python's sqlite3).
            Dialect::Sqlite => format!(
                "IFNULL(CAST(ROUND((julianday({expr}) - 2440587.5) * 86400000.0) AS INTEGER) * 1000, \
                 CASE WHEN {expr} IS NULL THEN NULL ELSE {OUT_OF_RANGE} END)"
            ),
        }
    }

    /// A time in the select list of the rows a poll reads, read back with
    /// [`Sql::read_time`]. On PostgreSQL the value's own eight bytes
    /// (`timestamptz_send`: microseconds since 2000-01-01), which costs the
    /// server nothing per row where [`Sql::micros`]'s float arithmetic was
    /// about a third of the tail's time, and is exact at any date. The
    /// agent's sessions are in UTC ([`Sql::session_setup`]), so a `timestamp
    /// without time zone` reads as UTC, as `date_part` read it. Elsewhere
    /// [`Sql::micros`].
    pub fn row_time(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("timestamptz_send(CAST({expr} AS TIMESTAMPTZ))"),
            Dialect::MySql | Dialect::Sqlite => self.micros(expr),
        }
    }

    /// A non-NULL time of a [`Sql::row_time`] column on PostgreSQL:
    /// microseconds since the epoch, [`OUT_OF_RANGE`] for `infinity`,
    /// `-infinity` and times whose microseconds since 1970 do not fit 64 bits.
    pub fn read_time(bytes: &[u8]) -> Result<i64, String> {
        let raw = <[u8; 8]>::try_from(bytes)
            .map(i64::from_be_bytes)
            .map_err(|_| format!("{} bytes where a timestamp has 8", bytes.len()))?;
        Ok(match raw {
            i64::MAX | i64::MIN => OUT_OF_RANGE,
            r => r.checked_add(PG_EPOCH_MICROS).unwrap_or(OUT_OF_RANGE),
        })
    }

    /// The earliest time of a column in an aggregate, as microseconds;
    /// PostgreSQL's `-infinity` is left out (it has no age).
    pub fn min_micros(&self, column: &str) -> String {
        match self.dialect {
            Dialect::Postgres => self.micros(&format!(
                "MIN(CASE WHEN isfinite({column}) THEN {column} END)"
            )),
            Dialect::MySql | Dialect::Sqlite => self.micros(&format!("MIN({column})")),
        }
    }

    /// A time in microseconds read from a row, `None` where the database
    /// gave NULL or [`OUT_OF_RANGE`].
    pub fn in_range(micros: Option<i64>) -> Option<i64> {
        micros.filter(|m| *m != OUT_OF_RANGE)
    }

    /// A text expression that orders and compares byte by byte, whatever the
    /// column's collation: the keyset of the scan for NULL change cursors,
    /// which must be total (a case-insensitive collation would make two event
    /// ids equal).
    pub fn id_key(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("{} COLLATE \"C\"", self.text(expr)),
            Dialect::MySql => format!("CAST({expr} AS BINARY)"),
            Dialect::Sqlite => format!("{} COLLATE BINARY", self.text(expr)),
        }
    }

    /// A bound text parameter compared with [`Sql::id_key`].
    pub fn id_param(&self, n: usize) -> String {
        let p = self.placeholder(n);
        match self.dialect {
            Dialect::Postgres => format!("CAST({p} AS TEXT) COLLATE \"C\""),
            Dialect::MySql => format!("CAST({p} AS BINARY)"),
            Dialect::Sqlite => format!("{p} COLLATE BINARY"),
        }
    }

    /// The database's current time as microseconds since the epoch.
    pub fn now_micros(&self) -> String {
        match self.dialect {
            Dialect::Postgres => self.micros("now()"),
            Dialect::MySql => self.micros("UTC_TIMESTAMP(6)"),
            Dialect::Sqlite => self.micros("strftime('%Y-%m-%d %H:%M:%f', 'now')"),
        }
    }

    /// The placeholder of the `n`-th (1-based) bound parameter.
    pub fn placeholder(&self, n: usize) -> String {
        match self.dialect {
            Dialect::Postgres => format!("${n}"),
            Dialect::MySql | Dialect::Sqlite => "?".to_string(),
        }
    }

    /// `column > cursor`, written so that an index on the column is used: the
    /// cursor is converted to the column's type, never the column to a number.
    pub fn after(&self, column: &str, n: usize) -> String {
        self.compare(column, ">", n)
    }

    /// `column <= cursor`, as [`Sql::after`] writes it: an upper bound of the
    /// same index range (SQLite does not turn `NOT column > ?` into one).
    pub fn at_most(&self, column: &str, n: usize) -> String {
        self.compare(column, "<=", n)
    }

    fn compare(&self, column: &str, op: &str, n: usize) -> String {
        let p = self.placeholder(n);
        match self.dialect {
            Dialect::Postgres => format!(
                "{column} {op} (TIMESTAMPTZ 'epoch' + CAST({p} AS BIGINT) * INTERVAL '1 microsecond')"
            ),
            Dialect::MySql => {
                format!("{column} {op} TIMESTAMPADD(MICROSECOND, {p}, '1970-01-01 00:00:00')")
            }
            Dialect::Sqlite => format!("{column} {op} {p}"),
        }
    }

    /// PostgreSQL: the oldest transaction still running when the poll's
    /// snapshot was taken, as a 64-bit transaction id.
    pub fn snapshot_xmin(&self) -> Option<&'static str> {
        match self.dialect {
            Dialect::Postgres => {
                Some("CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS TEXT) AS BIGINT)")
            }
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// PostgreSQL: the tail's condition for rows that were already read: a
    /// row version at or before the high-water mark (parameter `high`) is
    /// returned only if it was written by a transaction that had not ended
    /// when an earlier poll, which read its range, took its snapshot (its
    /// `xmin` at or after that snapshot's xmin, parameter `xmin`; 0 returns
    /// every row). Such a version is a late commit; every other one was read.
    pub fn unseen(&self, column: &str, high: usize, xmin: usize) -> Option<String> {
        Some(format!(
            "({} OR {})",
            self.after(column, high),
            self.written_since(xmin)?
        ))
    }

    /// PostgreSQL: a row version written by a transaction not older than the
    /// snapshot xmin bound as parameter `xmin` (0: every row).
    pub fn written_since(&self, xmin: usize) -> Option<String> {
        match self.dialect {
            Dialect::Postgres => Some(format!(
                "age(xmin) <= age(CAST(CAST(CAST({} AS TEXT) AS xid8) AS xid))",
                self.placeholder(xmin)
            )),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// The parameter [`Sql::after`] compares with, for a cursor in microseconds.
    pub fn cursor(&self, micros: i64) -> Param {
        match self.dialect {
            Dialect::Postgres | Dialect::MySql => Param::Int(micros),
            Dialect::Sqlite => Param::Text(sqlite_time(micros)),
        }
    }

    /// [`Sql::cursor`] written out as a literal, for a statement sent as
    /// text (an `EXPLAIN` of what the agent binds).
    pub fn cursor_literal(&self, micros: i64) -> String {
        match self.cursor(micros) {
            Param::Int(v) => v.to_string(),
            Param::Text(t) => self.literal(&t),
        }
    }

    /// The resolution of a cursor in microseconds: SQLite's times are read to
    /// the millisecond.
    pub fn cursor_unit(&self) -> i64 {
        match self.dialect {
            Dialect::Postgres | Dialect::MySql => 1,
            Dialect::Sqlite => 1000,
        }
    }

    /// Statements run once on every new connection: UTC and read-only
    /// transactions (the statement timeout: [`Sql::statement_timeout`]).
    pub fn session_setup(&self) -> Vec<String> {
        match self.dialect {
            Dialect::Postgres => vec![
                "SET TIME ZONE 'UTC'".into(),
                "SET application_name = 'inboxwatch'".into(),
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                    .into(),
            ],
            Dialect::MySql => vec![
                "SET time_zone = '+00:00'".into(),
                "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY".into(),
            ],
            Dialect::Sqlite => vec![],
        }
    }

    /// Settings a server may not have, each tried once and skipped when it
    /// is refused. PostgreSQL 12 and later: every prepared statement of the
    /// session planned once (a generic plan). A poll runs the same dozen
    /// statements with new bounds each time, and re-planning them cost as
    /// much database time as running them (docs/performance.md); their
    /// generic plans are the index range scans the bounds ask for.
    pub fn optional_setup(&self) -> Vec<String> {
        match self.dialect {
            Dialect::Postgres => vec!["SET plan_cache_mode = force_generic_plan".into()],
            Dialect::MySql | Dialect::Sqlite => vec![],
        }
    }

    /// The statement timeout: MariaDB and MySQL name it differently.
    pub fn statement_timeout_variants(&self, timeout: Duration) -> Vec<String> {
        match self.dialect {
            Dialect::MySql => vec![
                format!(
                    "SET SESSION max_statement_time = {:.3}",
                    timeout.as_secs_f64()
                ),
                format!(
                    "SET SESSION max_execution_time = {}",
                    timeout.as_millis().max(1)
                ),
            ],
            _ => vec![],
        }
    }

    /// The statement timeout of a PostgreSQL session (elsewhere: see
    /// [`Sql::statement_timeout_variants`]).
    pub fn statement_timeout(&self, timeout: Duration) -> Vec<String> {
        match self.dialect {
            Dialect::Postgres => vec![format!(
                "SET statement_timeout = {}",
                timeout.as_millis().max(1)
            )],
            _ => vec![],
        }
    }

    /// `LIMIT n`.
    pub fn limit(&self, n: usize) -> String {
        format!("LIMIT {n}")
    }

    /// Columns of `table`: rows of (name, type).
    pub fn columns_query(&self, table: &str) -> String {
        let (schema, name) = split_table(table);
        match self.dialect {
            Dialect::Postgres => format!(
                "SELECT CAST(column_name AS TEXT), CAST(data_type AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = {} AND table_name = {}",
                schema.map_or("current_schema()".to_string(), |s| self.literal(s)),
                self.literal(name)
            ),
            Dialect::MySql => format!(
                "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns \
                 WHERE table_schema = {} AND table_name = {}",
                schema.map_or("DATABASE()".to_string(), |s| self.literal(s)),
                self.literal(name)
            ),
            Dialect::Sqlite => format!(
                "SELECT name, type FROM pragma_table_info({}{})",
                self.literal(name),
                schema.map_or(String::new(), |s| format!(", {}", self.literal(s)))
            ),
        }
    }
}

/// Splits `schema.table`.
pub fn split_table(table: &str) -> (Option<&str>, &str) {
    match table.split_once('.') {
        Some((s, t)) => (Some(s), t),
        None => (None, table),
    }
}

/// This machine's clock in microseconds since the epoch (0 before it),
/// for the bounds of a plan's `EXPLAIN`.
pub fn wall_clock_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// SQLite's canonical text time, `YYYY-MM-DD HH:MM:SS.SSS` (UTC), of a time in
/// microseconds since the epoch (rounded down to the millisecond).
pub fn sqlite_time(micros: i64) -> String {
    let millis = micros.div_euclid(1000);
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{ms:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn look_ups_bind_ids_cast_to_the_column_type_or_fall_back_to_literals() {
        let pg = Sql {
            dialect: Dialect::Postgres,
        };
        assert_eq!(
            pg.id_params("\"id\"", 2, pg.id_bind("uuid")),
            "\"id\" IN (CAST($1 AS UUID), CAST($2 AS UUID))"
        );
        assert_eq!(pg.id_bind("bigint"), IdBind::Params(Some("BIGINT")));
        assert_eq!(
            pg.id_bind("character varying"),
            IdBind::Params(Some("VARCHAR"))
        );
        // A cast to `character` would be `character(1)`; an enum or a domain
        // has a name of its own: literals, as before.
        for other in ["character", "USER-DEFINED", "ARRAY", ""] {
            assert_eq!(pg.id_bind(other), IdBind::Literals, "{other}");
        }
        let my = Sql {
            dialect: Dialect::MySql,
        };
        assert_eq!(my.id_bind("bigint"), IdBind::Params(None));
        assert_eq!(
            my.id_params("`id`", 3, IdBind::Params(None)),
            "`id` IN (?, ?, ?)"
        );
        let lite = Sql {
            dialect: Dialect::Sqlite,
        };
        assert_eq!(lite.id_bind("INTEGER"), IdBind::Params(None));
    }

    #[test]
    fn sqlite_time_matches_strftime_format() {
        assert_eq!(sqlite_time(0), "1970-01-01 00:00:00.000");
        // 2026-11-29 18:24:02.123456 UTC
        assert_eq!(
            sqlite_time(1_795_976_642_123_456),
            "2026-11-29 18:24:02.123"
        );
        assert_eq!(sqlite_time(951_782_400_000_000), "2000-02-29 00:00:00.000");
        assert_eq!(sqlite_time(-1_000), "1969-12-31 23:59:59.999");
    }

    #[test]
    fn literals_escape_quotes() {
        let pg = Sql {
            dialect: Dialect::Postgres,
        };
        assert_eq!(pg.literal("it's"), "'it''s'");
        let my = Sql {
            dialect: Dialect::MySql,
        };
        assert_eq!(my.literal("a\\'b"), "'a\\\\''b'");
        assert_eq!(my.table("s.t"), "`s`.`t`");
        assert_eq!(
            my.is_in("`status`", &["new", "it's"]),
            "`status` IN ('new', 'it''s')"
        );
        assert_eq!(pg.is_in("s", &["a\\b"]), "s IN ('a\\b')");
    }

    /// A PostgreSQL `json` / `jsonb` error column is read as its text.
    #[test]
    fn postgres_reads_error_text_of_any_column_type() {
        let pg = Sql {
            dialect: Dialect::Postgres,
        };
        assert_eq!(
            pg.prefix("\"output\"", 9),
            "LEFT(CAST(\"output\" AS TEXT), 9)"
        );
        assert_eq!(
            pg.char_length("\"output\""),
            "CHAR_LENGTH(CAST(\"output\" AS TEXT))"
        );
    }

    /// PostgreSQL's binary timestamps: microseconds since 2000-01-01, the
    /// infinities and what does not fit 64 bits since 1970 out of range.
    #[test]
    fn postgres_binary_times_read_as_microseconds_since_1970() {
        let at = |micros_since_2000: i64| Sql::read_time(&micros_since_2000.to_be_bytes());
        assert_eq!(at(0), Ok(946_684_800_000_000));
        // 2026-12-01 12:00:00.123457 UTC, 1969-12-31 23:59:59.999999 UTC.
        assert_eq!(at(849_441_600_123_457), Ok(1_796_126_400_123_457));
        assert_eq!(at(-946_684_800_000_001), Ok(-1));
        assert_eq!(at(i64::MAX), Ok(OUT_OF_RANGE));
        assert_eq!(at(i64::MIN), Ok(OUT_OF_RANGE));
        // 294276-12-31 23:59:59 UTC, PostgreSQL's last second.
        assert_eq!(at(9_223_371_331_199_000_000), Ok(OUT_OF_RANGE));
        assert_eq!(
            Sql::read_time(&[0; 4]),
            Err("4 bytes where a timestamp has 8".to_string())
        );
    }
}
