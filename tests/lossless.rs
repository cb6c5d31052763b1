//! Nothing lost silently (SPEC §8): transactions of any size, rows with
//! values out of range, outages of any length. Each test writes what it knows
//! and compares the agent's counters with it exactly.

mod common;

use std::time::Duration;

use common::scenarios::{CONVERGE, wait_for_expectations};
use common::{Agent, Db, Dialect, Metrics, READY_TIMEOUT, V, toml_str};

use common::checks::{Expectations, Tol};

/// One inbox source with a small page, so that bulk transactions span pages.
fn paged_source(name: &str, dsn: &str, table: &str, batch_size: usize) -> String {
    format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n\
         overlap = \"10s\"\ntimeout = \"5s\"\nbatch_size = {batch_size}\n\n",
        toml_str(name),
        toml_str(dsn),
        toml_str(table)
    )
}

/// A timestamp parameter of this dialect.
fn ts(d: Dialect, ms: i64) -> V {
    V::text(d.ts_text(ms))
}

/// Inserts `n` pending events in one transaction, every row with the same
/// `received_at` and `updated_at` (what `now()` gives a whole transaction).
async fn insert_bulk(db: &Db, table: &str, prefix: &str, n: usize, at_ms: i64) {
    let sql = db.sql(&format!(
        "INSERT INTO {table} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
         VALUES (?, 'bulk', 'pending', {{ts}}, 0, 1, {{ts}})"
    ));
    let mut conn = db.pool.acquire().await;
    conn.raw("BEGIN").await.expect("BEGIN");
    for i in 0..n {
        conn.execute(
            &sql,
            &[
                V::text(format!("{prefix}-{i:05}")),
                ts(db.dialect, at_ms),
                ts(db.dialect, at_ms),
            ],
        )
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    conn.raw("COMMIT").await.expect("COMMIT");
}

/// Completes every event of `prefix` in one UPDATE: one shared `updated_at`.
async fn complete_bulk(db: &Db, table: &str, prefix: &str, started_ms: i64, at_ms: i64) -> u64 {
    db.exec(
        &format!(
            "UPDATE {table} SET status = 'succeeded', attempts = 1, started_at = {{ts}}, \
             finished_at = {{ts}}, updated_at = {{ts}} WHERE event_id LIKE ?"
        ),
        &[
            ts(db.dialect, started_ms),
            ts(db.dialect, at_ms),
            ts(db.dialect, at_ms),
            V::text(format!("{prefix}-%")),
        ],
    )
    .await
}

/// Guards defect "rows that share one `updated_at` beyond `batch_size` are
/// lost": with `batch_size = 100`, transactions of 100, 250 and 1,000 rows
/// sharing one cursor value (inserted together, then completed by one UPDATE)
/// are all counted, each row once: received, completed and the processing
/// histogram exact, the backlog back to zero.
async fn bulk_transactions_are_counted_whole(db: Db, short: &str) {
    let tables = db.fresh_tables(short).await;
    let source = format!("bulk-{short}");
    let mut agent = Agent::start(&paged_source(&source, &db.dsn, &tables.inbox, 100));
    agent.wait_ready(READY_TIMEOUT).await;

    let mut total = 0usize;
    for (round, n) in [100usize, 250, 1000].into_iter().enumerate() {
        let prefix = format!("b{round}");
        let at = db.now_ms().await + 5;
        insert_bulk(&db, &tables.inbox, &prefix, n, at).await;
        total += n;
        let mut exp = Expectations::default();
        let l = [("source", source.as_str()), ("event_type", "bulk")];
        exp.push(
            "inbox_messages_received_total",
            &l,
            total as f64,
            Tol::Exact,
        );
        exp.push(
            "inbox_backlog_messages",
            &[
                ("source", source.as_str()),
                ("event_type", "bulk"),
                ("status", "pending"),
            ],
            n as f64,
            Tol::Exact,
        );
        wait_for_expectations(
            &agent,
            &exp,
            CONVERGE,
            &format!("{n} rows inserted in one transaction"),
        )
        .await;

        let done = db.now_ms().await + 5;
        let updated = complete_bulk(&db, &tables.inbox, &prefix, done - 3, done).await;
        assert_eq!(updated, n as u64, "rows completed by the bulk UPDATE");
        let mut exp = Expectations::default();
        exp.push(
            "inbox_messages_completed_total",
            &[
                ("source", source.as_str()),
                ("event_type", "bulk"),
                ("outcome", "succeeded"),
            ],
            total as f64,
            Tol::Exact,
        );
        exp.push(
            "inbox_processing_duration_seconds_count",
            &l,
            total as f64,
            Tol::Exact,
        );
        exp.push(
            "inbox_messages_received_total",
            &l,
            total as f64,
            Tol::Exact,
        );
        exp.push(
            "inbox_backlog_messages",
            &[
                ("source", source.as_str()),
                ("event_type", "bulk"),
                ("status", "pending"),
            ],
            0.0,
            Tol::Exact,
        );
        wait_for_expectations(
            &agent,
            &exp,
            CONVERGE,
            &format!("{n} rows completed by one UPDATE"),
        )
        .await;
    }
    // Nothing is counted twice on the re-reads of the overlap window.
    let m = settle(&agent, Duration::from_secs(4)).await;
    assert_eq!(
        m.sum(
            "inbox_messages_completed_total",
            &[("source", source.as_str())]
        ),
        total as f64,
        "completions after the overlap was re-read"
    );
    assert_eq!(
        m.sum(
            "inboxwatch_rows_rejected_total",
            &[("source", source.as_str())]
        ),
        0.0,
        "rows rejected"
    );
    agent.kill();
    db.cleanup().await;
}

/// Scrapes again after `d`, for checks that nothing moves any more.
async fn settle(agent: &Agent, d: Duration) -> Metrics {
    tokio::time::sleep(d).await;
    agent.scrape().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_bulk_transactions_sharing_one_cursor_value_are_counted_whole() {
    bulk_transactions_are_counted_whole(Db::postgres().await, "bkpg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_bulk_transactions_sharing_one_cursor_value_are_counted_whole() {
    bulk_transactions_are_counted_whole(Db::mysql().await, "bkmy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_bulk_transactions_sharing_one_cursor_value_are_counted_whole() {
    bulk_transactions_are_counted_whole(Db::sqlite().await, "bklt").await;
}

/// Inserts one row from SQL literals (`NULL` or a quoted value each).
async fn insert_literal(db: &Db, table: &str, cols: &[(&str, String)]) {
    let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
    let values: Vec<&str> = cols.iter().map(|(_, v)| v.as_str()).collect();
    db.exec(
        &format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            names.join(", "),
            values.join(", ")
        ),
        &[],
    )
    .await;
}

fn quoted(s: &str) -> String {
    format!("'{s}'")
}

/// Guards defect "one row with `received_at = 'infinity'` takes the source
/// down" and the sanity rules beside it: times out of range (PostgreSQL's
/// `infinity` / `-infinity` / year 294276, MariaDB's zero date, text SQLite
/// cannot read), negative counts, a `deliveries` jump past `max_count_jump`
/// and a NULL change cursor are each one rejected row with its reason, counted
/// once however often the row is re-read; the source stays up with no poll
/// error, and the good rows around them count exactly (the jump is not added
/// to the duplicates; the next real duplicate is).
async fn bad_values_are_row_problems_not_source_problems(
    db: Db,
    short: &str,
    bad_times: &[&str],
    bad_cursor: Option<&str>,
) {
    let tables = db.fresh_tables(short).await;
    let t = &tables.inbox;
    let nullable = match db.dialect {
        Dialect::Postgres => format!("ALTER TABLE {t} ALTER COLUMN updated_at DROP NOT NULL"),
        Dialect::Mysql => format!("ALTER TABLE {t} MODIFY updated_at DATETIME(6) NULL"),
        // SQLite cannot drop NOT NULL in place: make the table again.
        Dialect::Sqlite => format!(
            "CREATE TABLE {t}_n AS SELECT * FROM {t} WHERE 0; DROP TABLE {t}; ALTER TABLE {t}_n RENAME TO {t}"
        ),
    };
    db.pool
        .raw(&nullable)
        .await
        .expect("make updated_at nullable");
    let source = format!("bad-{short}");
    let mut agent = Agent::start(&paged_source(&source, &db.dsn, t, 100));
    agent.wait_ready(READY_TIMEOUT).await;
    let now = || async { quoted(&db.dialect.ts_text(db.now_ms().await + 5)) };

    let row = |id: &str, status: &str, received: String, updated: String| {
        vec![
            ("event_id", quoted(id)),
            ("event_type", quoted("t")),
            ("status", quoted(status)),
            ("received_at", received),
            ("attempts", "0".to_string()),
            ("deliveries", "1".to_string()),
            ("updated_at", updated),
        ]
    };
    // Good rows, and one of every kind of bad value.
    for i in 0..5 {
        insert_literal(
            &db,
            t,
            &row(&format!("ok-{i}"), "pending", now().await, now().await),
        )
        .await;
    }
    for (i, bad) in bad_times.iter().enumerate() {
        insert_literal(
            &db,
            t,
            &row(
                &format!("bad-received-{i}"),
                "pending",
                bad.to_string(),
                now().await,
            ),
        )
        .await;
    }
    if let Some(cursor) = bad_cursor {
        insert_literal(
            &db,
            t,
            &row("bad-cursor", "pending", now().await, cursor.to_string()),
        )
        .await;
    }
    let bad_rows = bad_times.len() + usize::from(bad_cursor.is_some());
    let mut negative = row("negative", "pending", now().await, now().await);
    negative[5].1 = "-1".to_string();
    insert_literal(&db, t, &negative).await;
    insert_literal(
        &db,
        t,
        &row("null-cursor", "pending", now().await, "NULL".to_string()),
    )
    .await;
    insert_literal(&db, t, &row("jump", "pending", now().await, now().await)).await;
    insert_literal(
        &db,
        t,
        &row("late-finish", "pending", now().await, now().await),
    )
    .await;

    let s = source.as_str();
    let mut exp = Expectations::default();
    let rejected = |reason: &'static str| [("source", s), ("reason", reason)];
    exp.push(
        "inbox_messages_received_total",
        &[("source", s)],
        7.0,
        Tol::Exact,
    );
    exp.push("inboxwatch_source_up", &[("source", s)], 1.0, Tol::Exact);
    exp.push(
        "inboxwatch_rows_rejected_total",
        &rejected("time_out_of_range"),
        bad_rows as f64,
        Tol::Exact,
    );
    exp.push(
        "inboxwatch_rows_rejected_total",
        &rejected("implausible_count"),
        1.0,
        Tol::Exact,
    );
    exp.push(
        "inboxwatch_rows_rejected_total",
        &rejected("null_cursor"),
        1.0,
        Tol::Exact,
    );
    wait_for_expectations(&agent, &exp, CONVERGE, "bad rows beside good ones").await;

    // Later changes: a deliveries jump past max_count_jump (not added), then one
    // real duplicate (added); a completion whose finish is out of range; the
    // good rows complete.
    let set = |id: &str, assignments: String| {
        format!("UPDATE {t} SET {assignments} WHERE event_id = '{id}'")
    };
    let n = now().await;
    db.exec(
        &set("jump", format!("deliveries = 5000, updated_at = {n}")),
        &[],
    )
    .await;
    let mut seen = Expectations::default();
    seen.push(
        "inboxwatch_rows_rejected_total",
        &rejected("implausible_count"),
        2.0,
        Tol::Exact,
    );
    wait_for_expectations(&agent, &seen, CONVERGE, "the deliveries jump").await;
    let n = now().await;
    db.exec(
        &set("jump", format!("deliveries = 5001, updated_at = {n}")),
        &[],
    )
    .await;
    let n = now().await;
    db.exec(
        &set(
            "late-finish",
            format!(
                "status = 'succeeded', started_at = {n}, finished_at = {}, updated_at = {n}",
                bad_times[0]
            ),
        ),
        &[],
    )
    .await;
    for i in 0..5 {
        let n = now().await;
        db.exec(
            &set(
                &format!("ok-{i}"),
                format!(
                    "status = 'succeeded', started_at = {n}, finished_at = {n}, updated_at = {n}"
                ),
            ),
            &[],
        )
        .await;
    }
    let mut exp2 = exp.clone();
    exp2.items
        .retain(|e| e.name != "inboxwatch_rows_rejected_total");
    exp2.push(
        "inboxwatch_rows_rejected_total",
        &rejected("time_out_of_range"),
        (bad_rows + 1) as f64,
        Tol::Exact,
    );
    exp2.push(
        "inboxwatch_rows_rejected_total",
        &rejected("implausible_count"),
        2.0,
        Tol::Exact,
    );
    exp2.push(
        "inboxwatch_rows_rejected_total",
        &rejected("null_cursor"),
        1.0,
        Tol::Exact,
    );
    exp2.push(
        "inbox_duplicate_deliveries_total",
        &[("source", s)],
        1.0,
        Tol::Exact,
    );
    exp2.push("inbox_deliveries_total", &[("source", s)], 8.0, Tol::Exact);
    exp2.push(
        "inbox_messages_completed_total",
        &[("source", s), ("outcome", "succeeded")],
        5.0,
        Tol::Exact,
    );
    wait_for_expectations(&agent, &exp2, CONVERGE, "later changes").await;
    // Re-reads of the overlap window (the bad-cursor row comes back on every
    // poll), sweeps for NULL cursors and the state's tidying (every 10 s)
    // count nothing again.
    let m = settle(&agent, Duration::from_secs(11)).await;
    let diff = exp2.diff(&m);
    assert!(diff.is_empty(), "after 11 s more: {diff:?}");
    assert_eq!(
        m.sum("inboxwatch_poll_errors_total", &[("source", s)]),
        0.0,
        "poll errors"
    );
    agent.kill();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_out_of_range_times_and_implausible_counts_are_rejected_rows() {
    bad_values_are_row_problems_not_source_problems(
        Db::postgres().await,
        "oorpg",
        &["'infinity'", "'-infinity'", "'294276-12-31 23:59:59+00'"],
        Some("'infinity'"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_out_of_range_times_and_implausible_counts_are_rejected_rows() {
    bad_values_are_row_problems_not_source_problems(
        Db::mysql().await,
        "oormy",
        &["'0000-00-00 00:00:00'"],
        // A zero date sorts before every cursor: the tail never sees it.
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_out_of_range_times_and_implausible_counts_are_rejected_rows() {
    bad_values_are_row_problems_not_source_problems(
        Db::sqlite().await,
        "oorlt",
        &["'infinity'", "'not a time'"],
        Some("'infinity'"),
    )
    .await;
}
