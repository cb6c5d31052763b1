//! The audit rows of `dead-letters replay --topic`: one per record sent
//! back, in the table the table kind's actions write (`inboxwatch schema
//! --config` prints its DDL), over `[sources.dead_letter_actions]
//! audit_dsn`. A record's `event_id` is `topic/partition/offset` of the
//! dead-letter record; `previous_status` and `attempts` are NULL (a record
//! has neither); `last_error` is the exception message its headers carry.

use sqlx::{AnyConnection, Connection};

use super::config::{KafkaActions, KafkaSpec};
use crate::dsn::{Dialect, Dsn};
use crate::sources::kind::{ActionError, ReplayRecord, ReplayRun};

/// The audit database of one run.
pub struct Audit {
    conn: AnyConnection,
    dialect: Dialect,
    table: String,
}

/// `name` quoted as an identifier of `dialect` (names are plain
/// identifiers: the configuration checks them).
fn ident(dialect: Dialect, name: &str) -> String {
    match dialect {
        Dialect::MySql => format!("`{name}`"),
        Dialect::Postgres | Dialect::Sqlite => format!("\"{name}\""),
    }
}

/// `table` or `schema.table`, quoted.
fn table_name(dialect: Dialect, table: &str) -> String {
    table
        .split('.')
        .map(|p| ident(dialect, p))
        .collect::<Vec<_>>()
        .join(".")
}

/// The database's now, as a value of the dialect's time columns (as the
/// table kind writes it).
fn now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "now()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }
}

/// The audit table's columns, in the order the insert binds them (`at`
/// is the database's now).
const COLUMNS: [&str; 9] = [
    "source",
    "event_id",
    "action",
    "operator",
    "reason",
    "previous_status",
    "attempts",
    "last_error",
    "at",
];

impl Audit {
    /// Connects to the audit DSN and checks that the audit table is there
    /// with its columns: refused otherwise, before anything is sent.
    pub async fn open(spec: &KafkaSpec, actions: &KafkaActions) -> Result<Audit, ActionError> {
        let Some(dsn) = &actions.audit_dsn else {
            return Err(ActionError::Refused(format!(
                "{}.audit_dsn is not set: every record sent back is recorded in an audit table, \
                 so the replay is refused; nothing was sent",
                actions.key
            )));
        };
        let dialect = dsn.dialect();
        let mut conn = connect(dsn, &actions.key).await?;
        let probe = format!(
            "SELECT {} FROM {} WHERE 1 = 0",
            COLUMNS.map(|c| ident(dialect, c)).join(", "),
            table_name(dialect, &actions.audit_table)
        );
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(probe))
            .fetch_all(&mut conn)
            .await
        {
            let _ = conn.close().await;
            return Err(ActionError::Refused(format!(
                "audit table \"{}\" cannot be read with {}.audit_dsn ({}): create it with the \
                 DDL `inboxwatch schema --config FILE` prints for source \"{}\"; nothing was sent",
                actions.audit_table,
                actions.key,
                dsn.scrub(&e.to_string()),
                spec.common.name
            )));
        }
        Ok(Audit {
            conn,
            dialect,
            table: actions.audit_table.clone(),
        })
    }

    /// The audit table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The audit row of `record`, sent back by `run`.
    pub async fn record(
        &mut self,
        spec: &KafkaSpec,
        run: &ReplayRun,
        record: &ReplayRecord,
    ) -> Result<(), String> {
        let d = self.dialect;
        let placeholders: Vec<String> = (1..COLUMNS.len())
            .map(|n| match d {
                Dialect::Postgres => format!("${n}"),
                Dialect::MySql | Dialect::Sqlite => "?".to_string(),
            })
            .chain([now(d).to_string()])
            .collect();
        let insert = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            table_name(d, &self.table),
            COLUMNS.map(|c| ident(d, c)).join(", "),
            placeholders.join(", ")
        );
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(spec.common.name.clone())
            .bind(record.coordinates())
            .bind("replay")
            .bind(run.operator.clone())
            .bind(run.reason.clone())
            .bind(None::<String>)
            .bind(None::<i64>)
            .bind(record.exception_message.clone())
            .execute(&mut self.conn)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// Opens the audit DSN (UTC, so that `now()` is stored as the table kind
/// stores it).
async fn connect(dsn: &Dsn, key: &str) -> Result<AnyConnection, ActionError> {
    let failed = |e: sqlx::Error| {
        ActionError::Failed(format!(
            "{key}.audit_dsn: cannot connect to {dsn}: {}",
            dsn.scrub(&e.to_string())
        ))
    };
    let mut conn = AnyConnection::connect(dsn.expose()).await.map_err(failed)?;
    let setup = match dsn.dialect() {
        Dialect::Postgres => Some("SET TIME ZONE 'UTC'"),
        Dialect::MySql => Some("SET time_zone = '+00:00'"),
        Dialect::Sqlite => None,
    };
    if let Some(stmt) = setup {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut conn)
            .await
            .map_err(failed)?;
    }
    Ok(conn)
}
