//! Optional columns are used only when mapped (issue 35): a table made by
//! `inboxwatch schema`'s own DDL and watched with no `[sources.columns]` has its
//! event types, trace links and deliveries left out. `run` says so at start, and the
//! status card and `/api/v1/status` name each such column with the line that maps
//! it; with the columns mapped, nothing is said.

use crate::common;

use std::time::Duration;

use common::agent::schema_ddl;
use common::scenarios::{CONVERGE, INBOX_COLUMNS};
use common::{Agent, Db, READY_TIMEOUT, toml_str, unique_name, wait_until};

/// The optional meanings of docs/configuration.md whose own-named column the
/// schema's inbox table has (`updated_at` aside: mapping it changes the cursor).
const OPTIONAL: [&str; 7] = [
    "event_type",
    "started_at",
    "finished_at",
    "attempts",
    "deliveries",
    "last_error",
    "traceparent",
];

fn note(meaning: &str) -> String {
    format!(
        "The table has a column \"{meaning}\" that is not mapped, so {meaning} is not used; \
         to use it, add under [sources.columns]: {meaning} = \"{meaning}\""
    )
}

/// The notes `/api/v1/status` gives `source`, once the source has polled.
async fn notes(agent: &Agent, source: &str) -> Vec<String> {
    let res = wait_until(CONVERGE, || async {
        let s = agent.api_source(source).await?;
        if s["state"] != "up" {
            return Err(format!("not up yet: {s}"));
        }
        Ok(s["notes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    })
    .await;
    res.unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()))
}

async fn unmapped_columns_of_the_schema_are_named(db: &Db, short: &str) {
    let table = unique_name("inbox_cols", short);
    db.register_table(&table);
    let ddl = schema_ddl(db.dialect.cli_name(), &table, None);
    for meaning in OPTIONAL {
        assert!(
            ddl.contains(&format!("\n    {meaning} ")),
            "no {meaning} in\n{ddl}"
        );
    }
    db.pool
        .raw(&ddl)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{ddl}"));
    let source = format!("{short}-cols");
    let head = format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n",
        toml_str(&source),
        toml_str(&db.dsn),
        toml_str(&table)
    );

    // No [sources.columns]: every optional column of the schema is named.
    let agent = Agent::start(&head);
    agent.wait_ready(READY_TIMEOUT).await;
    let want: Vec<String> = OPTIONAL.iter().map(|m| note(m)).collect();
    assert_eq!(notes(&agent, &source).await, want);
    let log = agent.stderr();
    for line in &want {
        assert_eq!(log.matches(&format!("{line}.")).count(), 1, "{line}\n{log}");
    }
    let (_, page) = agent.get("/").await.expect("the status page");
    for line in &want {
        let shown = format!("<p data-field=\"note\">{}</p>", line.replace('"', "&quot;"));
        assert!(page.contains(&shown), "{shown}\n{page}");
    }
    agent.terminate(Duration::from_secs(10));

    // Mapped: nothing said.
    let agent = Agent::start(&format!("{head}{INBOX_COLUMNS}"));
    agent.wait_ready(READY_TIMEOUT).await;
    assert_eq!(notes(&agent, &source).await, Vec::<String>::new());
    let log = agent.stderr();
    assert!(!log.contains("that is not mapped"), "{log}");
}

/// Guards the silent loss of optional columns on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unmapped_columns_of_the_schema_are_named() {
    let db = Db::postgres().await;
    unmapped_columns_of_the_schema_are_named(&db, "pgcols").await;
}

/// The same on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_unmapped_columns_of_the_schema_are_named() {
    let db = Db::sqlite().await;
    unmapped_columns_of_the_schema_are_named(&db, "litecols").await;
}
