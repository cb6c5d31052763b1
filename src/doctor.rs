//! `inboxwatch doctor`: connects to every source, checks its table, column
//! types and indexes, and EXPLAINs the queries the agent runs, warning — with
//! the index to create — where one would scan the whole table.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use crate::config::{Config, Dialect, SourceSpec, Status};
use crate::schema::create_index;
use crate::sources::table::TableSource;
use crate::sources::table::dialect::{Param, Sql};
use crate::sources::table::inbox::Inbox;
use crate::sources::table::outbox::Outbox;

/// One finding of the doctor.
#[derive(Debug)]
enum Finding {
    Ok(String),
    Warn(String),
    Error(String),
}

/// Runs every check; `Ok(true)` when nothing needs attention.
pub async fn run(config: &Config) -> anyhow::Result<bool> {
    sqlx::any::install_default_drivers();
    let mut healthy = true;
    for spec in &config.sources {
        if let SourceSpec::Kafka(k) = spec {
            println!(
                "source \"{}\" (kafka, brokers {}):",
                k.name,
                k.brokers.join(", ")
            );
            let found = check_kafka(k).await;
            healthy &= found.iter().all(|f| matches!(f, Finding::Ok(_)));
            print_findings(found);
            continue;
        }
        let table = spec.table().expect("a table source");
        println!(
            "source \"{}\" ({}, table {}):",
            table.name, table.dsn, table.table
        );
        let findings = match spec {
            SourceSpec::Inbox(s) => {
                let source = TableSource::new(s.table.clone(), Inbox::new(s.clone()));
                check(&source, spec).await
            }
            SourceSpec::Outbox(s) => {
                let source = TableSource::new(s.table.clone(), Outbox::new(s.clone()));
                check(&source, spec).await
            }
            SourceSpec::Kafka(_) => unreachable!("handled above"),
        };
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

/// The negotiated API versions of the first reachable broker, then one full
/// cycle of the Kafka source, as the agent would run it.
async fn check_kafka(spec: &crate::sources::kafka::config::KafkaSpec) -> Vec<Finding> {
    use crate::sources::Source as _;
    use kafka_protocol::messages::{
        DescribeGroupsRequest, FetchRequest, ListGroupsRequest, ListOffsetsRequest,
        MetadataRequest, OffsetFetchRequest,
    };
    let mut out = Vec::new();
    let connector = crate::sources::kafka::client::Connector::new(
        spec.client_id.clone(),
        spec.security.clone(),
        spec.timeout,
    );
    let c = match connector.connect_any(&spec.brokers).await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    let v = |r: Result<i16, crate::sources::kafka::client::KafkaError>| {
        r.map(|v| format!("v{v}"))
            .unwrap_or_else(|_| "unsupported".into())
    };
    out.push(Finding::Ok(format!(
        "{}: Metadata {}, ListOffsets {}, ListGroups {}, DescribeGroups {}, OffsetFetch {}, Fetch {}",
        c.addr(),
        v(c.version::<MetadataRequest>()),
        v(c.version::<ListOffsetsRequest>()),
        v(c.version::<ListGroupsRequest>()),
        v(c.version::<DescribeGroupsRequest>()),
        v(c.version::<OffsetFetchRequest>()),
        v(c.version::<FetchRequest>()),
    )));
    if c.version::<OffsetFetchRequest>().is_ok_and(|v| v < 8) {
        out.push(Finding::Warn(
            "OffsetFetch below v8: one request per group each cycle instead of one per 100 groups"
                .into(),
        ));
    }
    let mut source = crate::sources::kafka::KafkaSource::new(spec.clone());
    let started = std::time::Instant::now();
    out.push(
        match tokio::time::timeout(spec.timeout, source.poll()).await {
            Ok(Ok(stats)) => {
                let series = crate::telemetry::snapshot::count(&spec.name).unwrap_or(0);
                Finding::Ok(format!(
                    "one cycle in {:.0} ms: {series} series, {} records read for lag seconds",
                    started.elapsed().as_secs_f64() * 1000.0,
                    stats.rows_read
                ))
            }
            Ok(Err(e)) => Finding::Error(e.to_string()),
            Err(_) => Finding::Error(format!(
                "one cycle did not finish within {:?}",
                spec.timeout
            )),
        },
    );
    out
}

async fn check<K: crate::sources::table::TableKind>(
    source: &TableSource<K>,
    spec: &SourceSpec,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut conn = match source.opener().open().await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    out.push(Finding::Ok(
        "connected; table and every mapped column present".into(),
    ));
    let table = spec.table().expect("a table source");
    let sql = Sql {
        dialect: table.dsn.dialect(),
    };
    out.extend(check_types(&mut conn, &sql, spec).await);
    for (what, query, binds_cursor) in source.queries() {
        let query = if binds_cursor {
            inline(&sql, &query)
        } else {
            query
        };
        match scans(&mut conn, &sql, &query, &table.table).await {
            Ok(false) => out.push(Finding::Ok(format!("the {what} query uses an index"))),
            Ok(true) => out.push(Finding::Warn(format!(
                "the {what} query would scan the whole table; create: {}",
                index_for(what, spec, &sql).trim_end()
            ))),
            Err(e) => out.push(Finding::Error(format!(
                "EXPLAIN of the {what} query failed: {e}"
            ))),
        }
    }
    out
}

/// Replaces the cursor placeholder with a literal, so EXPLAIN sees a realistic value.
fn inline(sql: &Sql, query: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let literal = match sql.cursor(now - 30_000_000) {
        Param::Int(v) => v.to_string(),
        Param::Text(t) => sql.literal(&t),
    };
    // PostgreSQL's tail also binds the high-water mark ($2) and a snapshot
    // xmin ($3, 0: every row).
    let query = query.replacen(&sql.placeholder(1), &literal, 1);
    if sql.dialect == crate::config::Dialect::Postgres {
        query.replacen("$2", &literal, 1).replacen("$3", "0", 1)
    } else {
        query
    }
}

/// Whether the plan of `query` reads every row of `table`.
async fn scans(
    conn: &mut AnyConnection,
    sql: &Sql,
    query: &str,
    table: &str,
) -> Result<bool, sqlx::Error> {
    let (_, bare) = crate::sources::table::dialect::split_table(table);
    match sql.dialect {
        Dialect::Postgres => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows.iter().any(|r| {
                let line: String = r.try_get(0).unwrap_or_default();
                line.contains(&format!("Seq Scan on {bare}"))
                    || line.contains(&format!("Seq Scan on \"{bare}\""))
            }))
        }
        Dialect::MySql => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            // ALL reads the table, index the whole index: both grow with the table.
            Ok(rows
                .iter()
                .any(|r| matches!(column_text(r, "type").as_deref(), Some("ALL" | "index"))))
        }
        Dialect::Sqlite => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {query}")))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows.iter().any(|r| {
                let detail: String = r.try_get(3).unwrap_or_default();
                detail.starts_with(&format!("SCAN {bare}")) && !detail.contains("USING")
            }))
        }
    }
}

fn column_text(row: &AnyRow, name: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(name).ok().flatten()
}

/// The index that serves one of the agent's queries.
fn index_for(what: &str, spec: &SourceSpec, sql: &Sql) -> String {
    let table = spec.table().expect("a table source");
    let t = sql.table(&table.table);
    let base = table.table.replace('.', "_");
    match (what, spec) {
        ("tail", SourceSpec::Inbox(s)) => create_index(
            sql.dialect,
            &format!("{base}_updated_at"),
            &t,
            &sql.ident(&s.columns.updated_at),
            None,
        ),
        ("tail", SourceSpec::Outbox(s)) => create_index(
            sql.dialect,
            &format!("{base}_updated_at"),
            &t,
            &sql.ident(&s.columns.updated_at),
            None,
        ),
        (_, SourceSpec::Inbox(s)) => {
            let status = sql.ident(&s.columns.status);
            let received = sql.ident(&s.columns.received_at);
            if sql.dialect == Dialect::MySql {
                create_index(
                    sql.dialect,
                    &format!("{base}_unfinished"),
                    &t,
                    &format!("{status}, {received}"),
                    None,
                )
            } else {
                let words = s.statuses.unfinished_words();
                let filter = format!("{status} IN {}", sql.in_list(&words));
                create_index(
                    sql.dialect,
                    &format!("{base}_unfinished"),
                    &t,
                    &received,
                    Some(&filter),
                )
            }
        }
        (_, SourceSpec::Outbox(s)) => {
            let published = sql.ident(&s.columns.published_at);
            let created = sql.ident(&s.columns.created_at);
            if sql.dialect == Dialect::MySql {
                create_index(
                    sql.dialect,
                    &format!("{base}_unpublished"),
                    &t,
                    &format!("{published}, {created}"),
                    None,
                )
            } else {
                create_index(
                    sql.dialect,
                    &format!("{base}_unpublished"),
                    &t,
                    &created,
                    Some(&format!("{published} IS NULL")),
                )
            }
        }
        (_, SourceSpec::Kafka(_)) => String::new(),
    }
}

/// Warns about column types the agent reads in a way the user may not expect.
async fn check_types(conn: &mut AnyConnection, sql: &Sql, spec: &SourceSpec) -> Vec<Finding> {
    let mut out = Vec::new();
    let table = spec.table().expect("a table source");
    let rows = match sqlx::query(sqlx::AssertSqlSafe(sql.columns_query(&table.table)))
        .fetch_all(&mut *conn)
        .await
    {
        Ok(r) => r,
        Err(e) => return vec![Finding::Error(format!("reading the columns failed: {e}"))],
    };
    let types: std::collections::HashMap<String, String> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.try_get::<String, _>(0).ok()?,
                r.try_get::<String, _>(1).ok()?.to_lowercase(),
            ))
        })
        .collect();
    let times: Vec<(&str, String)> = match spec {
        SourceSpec::Inbox(s) => {
            let c = &s.columns;
            [
                ("received_at", Some(&c.received_at)),
                ("started_at", c.started_at.as_ref()),
                ("finished_at", c.finished_at.as_ref()),
                ("updated_at", Some(&c.updated_at)),
            ]
            .into_iter()
            .filter_map(|(m, c)| c.map(|c| (m, c.clone())))
            .collect()
        }
        SourceSpec::Outbox(s) => {
            let c = &s.columns;
            vec![
                ("created_at", c.created_at.clone()),
                ("published_at", c.published_at.clone()),
                ("updated_at", c.updated_at.clone()),
            ]
        }
        SourceSpec::Kafka(_) => Vec::new(),
    };
    for (meaning, col) in times {
        let ty = types.get(&col).cloned().unwrap_or_default();
        let fine = match sql.dialect {
            Dialect::Postgres => ty.starts_with("timestamp"),
            Dialect::MySql => ty == "datetime" || ty == "timestamp",
            Dialect::Sqlite => {
                ty.is_empty() || ty == "text" || ty == "datetime" || ty == "timestamp"
            }
        };
        if !fine {
            out.push(Finding::Warn(format!(
                "column \"{col}\" ({meaning}) has type {ty}; the agent reads it as a timestamp"
            )));
        } else if sql.dialect == Dialect::Postgres && ty == "timestamp without time zone" {
            out.push(Finding::Ok(format!(
                "column \"{col}\" ({meaning}) is timestamp without time zone: its values are read as UTC"
            )));
        }
    }
    if let SourceSpec::Inbox(s) = spec {
        let words: Vec<&str> = Status::ALL
            .iter()
            .flat_map(|st| s.statuses.words_for(*st))
            .collect();
        out.push(Finding::Ok(format!(
            "status words mapped: {}",
            words.join(", ")
        )));
    }
    out
}
