//! The benchmark table: the DDL `inboxwatch schema` recommends, filled with a
//! generated history, and the SQL a user of prometheus-sql-exporter would write
//! for the same metrics.

use std::process::Command;

use sqlx::AnyConnection;

use crate::{Dialect, exec};

/// Event types of the history and the workload, with their weights (per cent).
pub const EVENT_TYPES: [(&str, u32); 6] = [
    ("orders.created", 40),
    ("payments.captured", 25),
    ("shipments.dispatched", 15),
    ("invoices.issued", 10),
    ("refunds.requested", 6),
    ("customers.updated", 4),
];

/// The watched table's name.
pub const TABLE: &str = "bench_inbox";

/// The same without `updated_at`: the agent then runs with `cursor = "none"`.
pub const COLUMNS_NO_CURSOR: &str = "columns = { event_id = \"event_id\", event_type = \"event_type\", \
     status = \"status\", received_at = \"received_at\", started_at = \"started_at\", \
     finished_at = \"finished_at\", attempts = \"attempts\", deliveries = \"deliveries\", \
     last_error = \"last_error\", traceparent = \"traceparent\" }\n";

/// Every column of the table mapped to its meaning, as one key of a
/// `[[sources]]` block (an optional meaning is used only when written).
pub const COLUMNS: &str = "columns = { event_id = \"event_id\", event_type = \"event_type\", \
     status = \"status\", received_at = \"received_at\", started_at = \"started_at\", \
     finished_at = \"finished_at\", attempts = \"attempts\", deliveries = \"deliveries\", \
     last_error = \"last_error\", traceparent = \"traceparent\", updated_at = \"updated_at\" }\n";

/// `inboxwatch schema` for the dialect, split into the table and its indexes.
fn schema(agent: &str, dialect: Dialect) -> (Vec<String>, Vec<String>) {
    let out = Command::new(agent)
        .args(["schema", "--dialect", dialect.cli(), "--table", TABLE])
        .output()
        .expect("inboxwatch schema runs");
    assert!(out.status.success(), "inboxwatch schema failed");
    let text = String::from_utf8(out.stdout).expect("schema output is UTF-8");
    let statements: Vec<String> = text
        .split(";\n")
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|s| !s.trim().is_empty())
        .collect();
    statements
        .into_iter()
        .partition(|s| !s.trim_start().starts_with("CREATE INDEX"))
}

/// A CASE over `h` (0..99) that picks an event type by weight.
fn event_type_case(h: &str) -> String {
    let mut acc = 0;
    let mut arms = String::new();
    for (name, w) in EVENT_TYPES {
        acc += w;
        arms.push_str(&format!(" WHEN {h} < {acc} THEN '{name}'"));
    }
    format!("CASE{arms} END")
}

/// Creates the table, loads `rows` rows of history, builds the recommended
/// indexes and refreshes the planner's statistics. Returns the unfinished rows.
///
/// The history spans 30 days: `unfinished` of the rows unfinished (pending,
/// processing, failed; spread over the whole span, so the oldest is a month
/// old and some processing rows are stuck), 0.5 % dead-lettered, about 6 %
/// retried once or more, 4 % delivered twice, six event types with skewed
/// weights, error texts on failed and dead rows, and a traceparent on every row.
pub async fn build(
    conn: &mut AnyConnection,
    agent: &str,
    dialect: Dialect,
    rows: u64,
    unfinished: u64,
) -> u64 {
    // Every `every`-th row is unfinished: 30 % of them processing, 20 %
    // failed, 50 % pending.
    let every = (rows / unfinished.max(1)).max(1);
    let (table_ddl, index_ddl) = schema(agent, dialect);
    exec(conn, &format!("DROP TABLE IF EXISTS {TABLE}")).await;
    for s in &table_ddl {
        exec(conn, s).await;
    }
    let span_s = 30 * 86_400;
    let step = span_s as f64 / rows as f64;
    let et = event_type_case("(g * 37 % 100)");
    let status = "CASE WHEN g % EVERY = 0 THEN (CASE (g / EVERY) % 10 WHEN 0 THEN 'processing' WHEN 1 THEN 'processing' \
                  WHEN 2 THEN 'processing' WHEN 3 THEN 'failed' WHEN 4 THEN 'failed' ELSE 'pending' END) \
                  WHEN g % 200 = 1 THEN 'dead' ELSE 'succeeded' END";
    let attempts = "(1 + CASE WHEN g % 17 = 0 THEN 1 ELSE 0 END + CASE WHEN g % 51 = 0 THEN 1 ELSE 0 END \
                    + CASE WHEN g % 200 = 1 THEN 3 ELSE 0 END)";
    let deliveries = "(1 + CASE WHEN g % 25 = 3 THEN 1 ELSE 0 END)";
    let error = "CASE WHEN g % EVERY = 0 AND (g / EVERY) % 10 IN (3, 4) THEN 'TimeoutError: upstream payments-api did not answer within 5s' \
                 WHEN g % 200 = 1 THEN 'ValidationError: order references unknown customer' ELSE NULL END";
    let sql = match dialect {
        Dialect::Postgres => {
            let recv = format!("(now() - ({rows} - g) * interval '{step} seconds')");
            let wait = "((g * 7919 % 400) + 5) * interval '1 millisecond'";
            let dur = "((g * 104729 % 900) + 20 + CASE WHEN g % 53 = 0 THEN (g % 7) * 1000 ELSE 0 END) * interval '1 millisecond'";
            let unfinished = "g % EVERY = 0";
            format!(
                "INSERT INTO {TABLE} (event_id, event_type, status, received_at, started_at, finished_at, attempts, deliveries, last_error, traceparent, updated_at) \
                 SELECT 'hist-' || g, {et}, {status}, {recv}, \
                 CASE WHEN {unfinished} AND (g / EVERY) % 10 >= 5 THEN NULL ELSE {recv} + {wait} END, \
                 CASE WHEN {unfinished} THEN NULL ELSE {recv} + {wait} + {dur} END, \
                 CASE WHEN {unfinished} AND (g / EVERY) % 10 >= 5 THEN 0 ELSE {attempts} END, {deliveries}, {error}, \
                 '00-' || md5(g::text) || '-' || substr(md5('s' || g), 1, 16) || '-01', \
                 CASE WHEN {unfinished} THEN {recv} + {wait} ELSE {recv} + {wait} + {dur} END \
                 FROM generate_series(1::bigint, {rows}) g"
            )
        }
        Dialect::MySql => {
            let recv = format!(
                "TIMESTAMPADD(MICROSECOND, -CAST(({rows} - g) * {step} * 1000000 AS SIGNED), UTC_TIMESTAMP(6))"
            );
            let wait = "((g * 7919 % 400) + 5) * 1000";
            let dur = "((g * 104729 % 900) + 20 + CASE WHEN g % 53 = 0 THEN (g % 7) * 1000 ELSE 0 END) * 1000";
            let unfinished = "g % EVERY = 0";
            format!(
                "INSERT INTO {TABLE} (event_id, event_type, status, received_at, started_at, finished_at, attempts, deliveries, last_error, traceparent, updated_at) \
                 SELECT CONCAT('hist-', g), {et}, {status}, {recv}, \
                 CASE WHEN {unfinished} AND (g DIV EVERY) % 10 >= 5 THEN NULL ELSE TIMESTAMPADD(MICROSECOND, {wait}, {recv}) END, \
                 CASE WHEN {unfinished} THEN NULL ELSE TIMESTAMPADD(MICROSECOND, {wait} + {dur}, {recv}) END, \
                 CASE WHEN {unfinished} AND (g DIV EVERY) % 10 >= 5 THEN 0 ELSE {attempts} END, {deliveries}, {error}, \
                 CONCAT('00-', MD5(g), '-', SUBSTR(MD5(CONCAT('s', g)), 1, 16), '-01'), \
                 CASE WHEN {unfinished} THEN TIMESTAMPADD(MICROSECOND, {wait}, {recv}) ELSE TIMESTAMPADD(MICROSECOND, {wait} + {dur}, {recv}) END \
                 FROM (SELECT seq AS g FROM seq_1_to_{rows}) s"
            )
            .replace("(g / EVERY)", "(g DIV EVERY)")
        }
    };
    exec(conn, &sql.replace("EVERY", &every.to_string())).await;
    for s in &index_ddl {
        exec(conn, s).await;
    }
    match dialect {
        Dialect::Postgres => exec(conn, &format!("VACUUM ANALYZE {TABLE}")).await,
        Dialect::MySql => exec(conn, &format!("ANALYZE TABLE {TABLE}")).await,
    }
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {TABLE} WHERE status IN ('pending', 'processing', 'failed')"
    )))
    .fetch_one(&mut *conn)
    .await
    .expect("count the unfinished rows");
    u64::try_from(n).unwrap_or(0)
}

/// The user-written SQL for prometheus-sql-exporter: (name, labels, value
/// column, query).
pub fn exporter_queries(
    dialect: Dialect,
) -> Vec<(&'static str, Vec<&'static str>, &'static str, String)> {
    let t = TABLE;
    let unfinished = "status IN ('pending', 'processing', 'failed')";
    match dialect {
        Dialect::Postgres => vec![
            (
                "inbox_backlog",
                vec!["event_type", "status"],
                "count",
                format!(
                    "SELECT event_type, status, count(*)::float AS count FROM {t} WHERE {unfinished} GROUP BY event_type, status"
                ),
            ),
            (
                "inbox_oldest_age_seconds",
                vec!["event_type"],
                "age",
                format!(
                    "SELECT event_type, extract(epoch FROM now() - min(received_at))::float AS age FROM {t} WHERE {unfinished} GROUP BY event_type"
                ),
            ),
            (
                "inbox_stuck",
                vec!["event_type"],
                "count",
                format!(
                    "SELECT event_type, count(*)::float AS count FROM {t} WHERE status = 'processing' AND started_at < now() - interval '10 minutes' GROUP BY event_type"
                ),
            ),
            (
                "inbox_completed_5m",
                vec!["event_type", "outcome"],
                "count",
                format!(
                    "SELECT event_type, status AS outcome, count(*)::float AS count FROM {t} WHERE status IN ('succeeded', 'dead') AND finished_at > now() - interval '5 minutes' GROUP BY event_type, status"
                ),
            ),
            (
                "inbox_processing_p95_seconds",
                vec!["event_type"],
                "p95",
                format!(
                    "SELECT event_type, percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))::float AS p95 FROM {t} \
                 WHERE finished_at > now() - interval '5 minutes' AND started_at IS NOT NULL GROUP BY event_type"
                ),
            ),
            (
                "inbox_duplicate_ratio_5m",
                vec!["event_type"],
                "ratio",
                format!(
                    "SELECT event_type, (sum(deliveries - 1)::float / nullif(sum(deliveries), 0))::float AS ratio FROM {t} \
                 WHERE updated_at > now() - interval '5 minutes' GROUP BY event_type"
                ),
            ),
        ],
        Dialect::MySql => vec![
            (
                "inbox_backlog",
                vec!["event_type", "status"],
                "count",
                format!(
                    "SELECT event_type, status, COUNT(*) AS count FROM {t} WHERE {unfinished} GROUP BY event_type, status"
                ),
            ),
            (
                "inbox_oldest_age_seconds",
                vec!["event_type"],
                "age",
                format!(
                    "SELECT event_type, TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) / 1e6 AS age FROM {t} WHERE {unfinished} GROUP BY event_type"
                ),
            ),
            (
                "inbox_stuck",
                vec!["event_type"],
                "count",
                format!(
                    "SELECT event_type, COUNT(*) AS count FROM {t} WHERE status = 'processing' AND started_at < UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE GROUP BY event_type"
                ),
            ),
            (
                "inbox_completed_5m",
                vec!["event_type", "outcome"],
                "count",
                format!(
                    "SELECT event_type, status AS outcome, COUNT(*) AS count FROM {t} WHERE status IN ('succeeded', 'dead') AND finished_at > UTC_TIMESTAMP(6) - INTERVAL 5 MINUTE GROUP BY event_type, status"
                ),
            ),
            (
                "inbox_processing_p95_seconds",
                vec!["event_type"],
                "p95",
                format!(
                    "SELECT DISTINCT event_type, PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY TIMESTAMPDIFF(MICROSECOND, started_at, finished_at) / 1e6) \
                 OVER (PARTITION BY event_type) AS p95 FROM {t} WHERE finished_at > UTC_TIMESTAMP(6) - INTERVAL 5 MINUTE AND started_at IS NOT NULL"
                ),
            ),
            (
                "inbox_duplicate_ratio_5m",
                vec!["event_type"],
                "ratio",
                format!(
                    "SELECT event_type, SUM(deliveries - 1) / NULLIF(SUM(deliveries), 0) AS ratio FROM {t} \
                 WHERE updated_at > UTC_TIMESTAMP(6) - INTERVAL 5 MINUTE GROUP BY event_type"
                ),
            ),
        ],
    }
}

/// The prometheus-sql-exporter configuration (YAML) for the queries above.
pub fn exporter_config(dialect: Dialect, dsn: &str, interval_s: f64) -> String {
    let mut out = format!(
        "jobs:\n- name: \"inbox\"\n  interval: '{}ms'\n  connections:\n  - '{dsn}'\n  queries:\n",
        (interval_s * 1000.0).round() as u64
    );
    for (name, labels, value, query) in exporter_queries(dialect) {
        let labels: Vec<String> = labels.iter().map(|l| format!("\"{l}\"")).collect();
        out.push_str(&format!(
            "  - name: \"{name}\"\n    help: \"{name}\"\n    labels: [{}]\n    values: [\"{value}\"]\n    query: |\n      {query}\n",
            labels.join(", ")
        ));
    }
    out
}
