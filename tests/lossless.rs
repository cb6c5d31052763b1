//! Nothing lost silently (SPEC §8): transactions of any size, rows with
//! values out of range, outages of any length. Each test writes what it knows
//! and compares the agent's counters with it exactly.

use crate::common;

use std::time::Duration;

use common::scenarios::{CONVERGE, wait_for_expectations};
use common::{Agent, Db, Dialect, Metrics, READY_TIMEOUT, V, toml_str, wait_until};

use common::checks::{Expectations, Tol};

/// One inbox source with a small page, so that bulk transactions span pages.
fn paged_source(name: &str, dsn: &str, table: &str, batch_size: usize) -> String {
    format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n\
         overlap = \"10s\"\ntimeout = \"5s\"\nbatch_size = {batch_size}\n{}\n",
        toml_str(name),
        toml_str(dsn),
        toml_str(table),
        common::scenarios::INBOX_COLUMNS
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
    let agent = Agent::start(&paged_source(&source, &db.dsn, &tables.inbox, 100));
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
    let m = settle(&agent, &source, Duration::from_secs(4)).await;
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

/// Scrapes again after `d` and at least three more polls of `source`, for checks
/// that nothing moves any more.
async fn settle(agent: &Agent, source: &str, d: Duration) -> Metrics {
    agent.wait_polls(source, 3, d).await
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
    let agent = Agent::start(&paged_source(&source, &db.dsn, t, 100));
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
    let m = settle(&agent, s, Duration::from_secs(11)).await;
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

fn metric(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.sum(name, labels)
}

/// Sets `deliveries = deliveries + 1` (a duplicate delivery) on one event.
async fn redeliver(db: &Db, table: &str, id: &str) {
    let at = db.now_ms().await + 5;
    db.exec(
        &format!(
            "UPDATE {table} SET deliveries = deliveries + 1, updated_at = {{ts}} WHERE event_id = ?"
        ),
        &[ts(db.dialect, at), V::text(id)],
    )
    .await;
}

/// Completes one event (succeeded, one attempt).
async fn complete(db: &Db, table: &str, id: &str) {
    let at = db.now_ms().await + 5;
    db.exec(
        &format!(
            "UPDATE {table} SET status = 'succeeded', attempts = 1, started_at = {{ts}}, \
             finished_at = {{ts}}, updated_at = {{ts}} WHERE event_id = ?"
        ),
        &[
            ts(db.dialect, at - 2),
            ts(db.dialect, at),
            ts(db.dialect, at),
            V::text(id),
        ],
    )
    .await;
}

/// Guards defect "an outage longer than the lock lease silently drops what
/// happened during it, even with one agent": the database is cut off for
/// 25 s (longer than the 20 s lease, so the lock is lost) while 23 events
/// complete and 4 get duplicate deliveries; after the cut the agent takes the
/// source back (nobody else owned it) and resumes from its own cursor: every
/// completion and duplicate is counted, and so are duplicates of events
/// finished before the outage (their state was kept). No gap is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_outage_longer_than_the_lease_is_resumed_from_the_agents_own_cursor() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("outage").await;
    let t = &tables.inbox;
    let proxy = common::Proxy::start(&common::url_hostport(&db.dsn)).await;
    let dsn = common::url_with_hostport(&db.dsn, &format!("127.0.0.1:{}", proxy.port));
    let source = "outage";
    let agent = Agent::start(&paged_source(source, &dsn, t, 100));
    agent.wait_ready(READY_TIMEOUT).await;

    let at = db.now_ms().await + 5;
    insert_bulk(&db, t, "o", 40, at).await;
    for i in 0..5 {
        complete(&db, t, &format!("o-{i:05}")).await;
    }
    let l = [("source", source)];
    let mut exp = Expectations::default();
    exp.push("inbox_messages_received_total", &l, 40.0, Tol::Exact);
    exp.push("inbox_messages_completed_total", &l, 5.0, Tol::Exact);
    exp.push("inboxwatch_source_up", &l, 1.0, Tol::Exact);
    wait_for_expectations(&agent, &exp, CONVERGE, "before the outage").await;

    proxy.cut();
    let agent_ref = &agent;
    wait_until(Duration::from_secs(20), || async move {
        let m = agent_ref.try_scrape().await?;
        match m.get("inboxwatch_source_up", &[("source", source)]) {
            Some(0.0) => Ok(()),
            v => Err(format!("inboxwatch_source_up = {v:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the source never went down during the cut: {e}"));
    for i in 5..28 {
        complete(&db, t, &format!("o-{i:05}")).await;
    }
    for i in 30..34 {
        redeliver(&db, t, &format!("o-{i:05}")).await;
    }
    tokio::time::sleep(Duration::from_secs(25)).await;
    let lost = agent.stderr();
    assert!(
        lost.contains("Lost the source's lock") || lost.contains("gave its lock up"),
        "the cut should have cost the agent its lock (the test is about outages longer than the lease)"
    );
    proxy.restore();
    // Duplicates of events finished before the outage.
    redeliver(&db, t, "o-00000").await;
    redeliver(&db, t, "o-00001").await;

    let mut exp = Expectations::default();
    exp.push("inbox_messages_received_total", &l, 40.0, Tol::Exact);
    exp.push("inbox_messages_completed_total", &l, 28.0, Tol::Exact);
    exp.push("inbox_duplicate_deliveries_total", &l, 6.0, Tol::Exact);
    exp.push("inboxwatch_counting_gaps_total", &l, 0.0, Tol::Exact);
    exp.push("inboxwatch_source_up", &l, 1.0, Tol::Exact);
    exp.push(
        "inbox_backlog_messages",
        &[("source", source), ("status", "pending")],
        12.0,
        Tol::Exact,
    );
    wait_for_expectations(&agent, &exp, CONVERGE, "after a 25 s outage").await;
    agent.kill();
    db.cleanup().await;
}

/// Guards "when another agent did own it, make the gap visible": agent B
/// stands by while A owns the source; A is killed; B takes over from scratch
/// (it cannot know A's cursor) and says so: one
/// `inboxwatch_counting_gaps_total{reason="handover"}`, the gap's seconds
/// (from B's last sighting of A's lock to B's own start, a lower bound) no
/// longer than the handover itself, and a WARN line naming both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_takeover_from_another_agent_is_reported_as_a_counting_gap() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("gap").await;
    let source = "gap";
    let config = paged_source(source, &db.dsn, &tables.inbox, 100);
    let a = Agent::start(&config);
    a.wait_ready(READY_TIMEOUT).await;
    let l = [("source", source)];
    let leader = |m: &Metrics| m.get("inboxwatch_source_leader", &l);
    let a_ref = &a;
    wait_until(Duration::from_secs(30), || async move {
        match leader(&a_ref.try_scrape().await?) {
            Some(1.0) => Ok(()),
            v => Err(format!("A's inboxwatch_source_leader = {v:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the first agent never owned the source: {e}"));
    let b = Agent::start(&config);
    b.wait_ready(READY_TIMEOUT).await;
    let b_ref = &b;
    // B has seen A's lock at least once (it is standing by).
    wait_until(Duration::from_secs(30), || async move {
        let (_, body) = b_ref.get("/readyz").await?;
        if body.contains("standby") {
            Ok(())
        } else {
            Err(format!("B's /readyz: {body}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the second agent never stood by: {e}"));
    let m = b.scrape().await;
    // The series exists at 0 before the first gap, so that `increase()` (and
    // the InboxwatchCountingGap alert) sees the first one.
    assert_eq!(
        m.get(
            "inboxwatch_counting_gaps_total",
            &[("source", source), ("reason", "handover")]
        ),
        Some(0.0),
        "B's gap counter while standing by"
    );

    let killed = std::time::Instant::now();
    a.kill();
    let handover = wait_until(Duration::from_secs(40), || async move {
        let m = b_ref.try_scrape().await?;
        match (leader(&m), m.get("inboxwatch_source_up", &l)) {
            (Some(1.0), Some(1.0)) => Ok(killed.elapsed()),
            v => Err(format!("B's (leader, up) = {v:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("B never took over: {e}"));
    let m = b.scrape().await;
    assert_eq!(
        metric(
            &m,
            "inboxwatch_counting_gaps_total",
            &[("source", source), ("reason", "handover")]
        ),
        1.0,
        "gaps reported by the agent that took over"
    );
    let seconds = metric(&m, "inboxwatch_counting_gap_seconds_total", &l);
    // From B's last sighting of the lock (at most one heartbeat, 5 s + 20 %
    // jitter, before the kill) to B's start; whole seconds rounded up.
    let bound = (handover.as_secs_f64() + 6.0).ceil() + 1.0;
    eprintln!("handover took {handover:?}; gap reported: {seconds} s (bound {bound})");
    assert!(
        (1.0..=bound).contains(&seconds),
        "gap seconds {seconds} outside 1..={bound} (handover {handover:?})"
    );
    let log = b.stderr();
    assert!(
        log.contains("WARN") && log.contains("Counts were not kept"),
        "no WARN line about the gap in B's log:\n{log}"
    );
    b.kill();
    db.cleanup().await;
}

/// A PostgreSQL role limited to `limit` sessions, with read access to `table`;
/// returns its DSN.
async fn limited_role(db: &Db, table: &str, limit: u32) -> String {
    let role = common::unique_name("iw_lim", "r");
    db.select_only_role(&role, "lim", &format!(" CONNECTION LIMIT {limit}"), table)
        .await
}

/// Sessions a role has open.
async fn sessions_of(db: &Db, dsn: &str) -> i64 {
    let role = dsn
        .split("://")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .expect("a user in the DSN");
    db.query(
        &format!("SELECT CAST(count(*) AS text) FROM pg_stat_activity WHERE usename = '{role}'"),
        &[],
    )
    .await[0][0]
        .clone()
        .and_then(|n| n.parse().ok())
        .expect("a session count")
}

/// Guards defect "each source holds two database sessions, never shared": 50
/// sources on one database, under a role capped at 10 sessions, are all up
/// and count the same 30 events exactly; the agent holds one lock session
/// plus at most `max_connections_per_database` (4) poll sessions there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_fifty_sources_share_one_lock_session_and_a_small_pool() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("budget").await;
    let dsn = limited_role(&db, &tables.inbox, 10).await;
    let mut config = String::new();
    for i in 0..50 {
        config.push_str(&paged_source(&format!("s{i:02}"), &dsn, &tables.inbox, 100));
    }
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let at = db.now_ms().await + 5;
    insert_bulk(&db, &tables.inbox, "c", 30, at).await;
    let mut exp = Expectations::default();
    for i in 0..50 {
        let name = format!("s{i:02}");
        let l = [("source", name.as_str())];
        exp.push("inboxwatch_source_up", &l, 1.0, Tol::Exact);
        exp.push("inboxwatch_source_leader", &l, 1.0, Tol::Exact);
        exp.push("inbox_messages_received_total", &l, 30.0, Tol::Exact);
    }
    wait_for_expectations(&agent, &exp, CONVERGE, "50 sources under a 10-session role").await;
    let sessions = sessions_of(&db, &dsn).await;
    eprintln!("sessions of the agent's role: {sessions}");
    assert!(
        (2..=5).contains(&sessions),
        "the agent holds {sessions} sessions; expected one lock session and at most 4 poll sessions"
    );
    let m = agent.scrape().await;
    assert_eq!(
        m.sum("inboxwatch_poll_errors_total", &[]),
        0.0,
        "poll errors"
    );
    agent.kill();
    db.cleanup().await;
}

/// Guards "release the lock of a source that cannot poll, so another agent
/// can take it": agent A takes the source's lock but cannot open a poll
/// session (its role's session limit is used up by others); it gives the lock
/// up, and agent B, which can poll, takes the source over and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_owner_that_cannot_poll_gives_the_source_up() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("yield").await;
    let dsn_a = limited_role(&db, &tables.inbox, 2).await;
    // One session of A's role held by somebody else: A's lock session is the
    // second and last it may open.
    let hog = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .connect(&dsn_a)
        .await
        .expect("a session of the limited role");
    let source = "yield";
    let a = Agent::start(&paged_source(source, &dsn_a, &tables.inbox, 100));
    let l = [("source", source)];
    let a_ref = &a;
    wait_until(Duration::from_secs(30), || async move {
        let log = a_ref.stderr();
        if log.contains("gave its lock up") {
            Ok(())
        } else {
            Err(format!("A's log so far:\n{log}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("A never gave up a source it cannot poll: {e}"));
    let b = Agent::start(&paged_source(source, &db.dsn, &tables.inbox, 100));
    b.wait_ready(READY_TIMEOUT).await;
    let at = db.now_ms().await + 5;
    insert_bulk(&db, &tables.inbox, "y", 12, at).await;
    let mut exp = Expectations::default();
    exp.push("inboxwatch_source_leader", &l, 1.0, Tol::Exact);
    exp.push("inbox_messages_received_total", &l, 12.0, Tol::Exact);
    wait_for_expectations(&b, &exp, CONVERGE, "B after A gave the source up").await;
    let m = a.scrape().await;
    assert_eq!(
        m.get("inboxwatch_source_leader", &l),
        Some(0.0),
        "A still claims the source"
    );
    drop(hog);
    a.kill();
    b.kill();
    db.cleanup().await;
}
