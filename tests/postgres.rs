//! Ground truth on PostgreSQL: the real agent tails a table that a concurrent
//! workload writes, and every exported number is compared with what the workload
//! knows it wrote (`INBOXWATCH_TEST_PG`, default postgres://postgres@127.0.0.1:5432/test).

use crate::common;

use common::Db;
use common::scenarios::{
    dead_without_new_attempt_ground_truth, error_classes_ground_truth, inbox_ground_truth,
    outbox_ground_truth,
};

/// Guards the inbox counting rules on PostgreSQL: every counter per event type is
/// exact (no event missed, none counted twice — including rows from transactions that
/// commit 2 s after newer rows were read, and duplicate deliveries after completion),
/// histogram counts exact and sums within 1e-6, history rows from before the agent's
/// start never counted, quantiles within 1 % of the exact durations, and backlog,
/// oldest age and stuck rows equal to direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_inbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::postgres().await;
    inbox_ground_truth(&db, "pg").await;
}

/// Guards the outbox rules on PostgreSQL: published count and publish-delay histogram
/// count/sum per event type equal the ground truth (late commits included, rows
/// published before the agent started excluded), backlog and oldest unpublished age
/// equal direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_outbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::postgres().await;
    outbox_ground_truth(&db, "pg").await;
}

/// Guards the error classes on PostgreSQL: failed attempts, dead letters and retries
/// on permanent errors by `error_class` (built-in classes, a source's own, `other` and
/// `unknown`) equal the workload's truth exactly; the source's info series carries its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_counters_by_error_class_match_the_workload() {
    let db = Db::postgres().await;
    error_classes_ground_truth(&db, "pgcls").await;
}

/// Guards how the tail reads PostgreSQL times (their binary value):
/// `timestamp without time zone` columns read as UTC (the oldest pending
/// event's age is its minute, from the rows read when there is no change
/// cursor, from the aggregate when there is), and durations are exact to the
/// microsecond at any date — in the year 2900 too, where seconds since 1970
/// as a float (`date_part`) are only good to about 4 µs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_times_read_exactly_and_as_utc() {
    use common::{Agent, READY_TIMEOUT, toml_str, unique_name, wait_until};
    use std::time::Duration;

    let db = Db::postgres().await;
    let table = unique_name("inbox", "tz");
    db.register_table(&table);
    db.exec(
        &format!(
            "CREATE TABLE {table} (event_id TEXT PRIMARY KEY, event_type TEXT, status TEXT NOT NULL, \
             received_at TIMESTAMP(6) NOT NULL, started_at TIMESTAMP(6), finished_at TIMESTAMP(6), \
             updated_at TIMESTAMP(6) NOT NULL)"
        ),
        &[],
    )
    .await;
    // Processing 0.250007 s and 1.000003 s, end to end 0.350009 s and
    // 1.000004 s (the first event's times after the agent's start, which
    // the rows finished before are not counted from); one event pending for
    // a minute.
    let insert = |id: &str, status: &str, received: &str, started: &str, finished: &str| {
        format!(
            "INSERT INTO {table} VALUES ('{id}', 'tz', '{status}', {received}, {started}, {finished}, \
             now() AT TIME ZONE 'UTC')"
        )
    };
    // The same table with its change cursor and without (then the backlog
    // and its age come from the rows read, not from an aggregate). Without a
    // change cursor a row whose received_at is older than the overlap window
    // (the pending one below, a minute old when inserted) is read by the
    // reconcile, every 2 s here (docs/metrics.md, "Without a change cursor").
    let sources = ["tz-pg", "tz-pg-none"];
    let config: String = sources
        .iter()
        .zip(["updated_at = \"updated_at\" ", ""])
        .map(|(name, cursor)| {
            let reconcile = if cursor.is_empty() {
                "reconcile_every = \"2s\"\n"
            } else {
                ""
            };
            format!(
                "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n\
                 {reconcile}columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
                 received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
                 {cursor}}}\n",
                toml_str(name),
                toml_str(&db.dsn),
                toml_str(&table)
            )
        })
        .collect();
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    for sql in [
        insert(
            "e1",
            "succeeded",
            "date_trunc('second', now() AT TIME ZONE 'UTC') + INTERVAL '2.000001 s'",
            "date_trunc('second', now() AT TIME ZONE 'UTC') + INTERVAL '2.100003 s'",
            "date_trunc('second', now() AT TIME ZONE 'UTC') + INTERVAL '2.350010 s'",
        ),
        insert(
            "e2",
            "succeeded",
            "'2900-06-01 00:00:00.000001'",
            "'2900-06-01 00:00:00.000002'",
            "'2900-06-01 00:00:01.000005'",
        ),
        insert(
            "e3",
            "pending",
            "now() AT TIME ZONE 'UTC' - INTERVAL '60 seconds'",
            "NULL",
            "NULL",
        ),
    ] {
        db.exec(&sql, &[]).await;
    }
    for source in sources {
        let labels = [("source", source)];
        let m = wait_until(Duration::from_secs(30), || async {
            let m = agent.try_scrape().await?;
            let done = m.sum("inbox_processing_duration_seconds_count", &labels);
            let pending = m.sum("inbox_backlog_messages", &labels);
            if done == 2.0 && pending == 1.0 {
                Ok(m)
            } else {
                Err(format!("{done} completions and {pending} pending seen"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{source}: the agent did not read the rows: {e}"));
        let processing = m.sum("inbox_processing_duration_seconds_sum", &labels);
        let end_to_end = m.sum("inbox_end_to_end_latency_seconds_sum", &labels);
        assert!(
            (processing - 1.250010).abs() < 1e-9,
            "{source}: processing time sum {processing}, expected 1.250010 s"
        );
        assert!(
            (end_to_end - 1.350013).abs() < 1e-9,
            "{source}: end-to-end latency sum {end_to_end}, expected 1.350013 s"
        );
        let age = m.sum("inbox_oldest_unprocessed_age_seconds", &labels);
        assert!(
            (60.0..90.0).contains(&age),
            "{source}: the pending event's age is {age} s, expected its minute"
        );
    }
    agent.kill();
    db.cleanup().await;
}

/// Guards issue 35's false retries on PostgreSQL: a row going `failed` → `dead` with its
/// attempts unchanged completes the attempt it showed failed — no retry, no
/// failure, no attempt more (`/api/v1/events/{id}` shows exactly `attempts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_move_to_dead_without_a_new_attempt_is_no_retry() {
    let db = Db::postgres().await;
    dead_without_new_attempt_ground_truth(&db, "pgend").await;
}

/// Guards the tails read together on PostgreSQL (`cursor = "none"`): rows
/// that arrived, started and finished between two polls are in each of the
/// three columns' pages, and the poll that finds them reads each once, not
/// once per column. The pages' row places are merged by the TID scan that
/// reads them (a list of places has OR semantics), with no `UNION` of their
/// own. The polls are 5 s apart and the counter is scraped every 100 ms, so
/// the first scrape that shows rows read shows that one poll's, unless the
/// test stalled for a whole poll interval. (A later
/// poll may read them again: while other suites hold transactions open, a
/// row of a transaction the last snapshot could not rule out is re-read
/// within the look-back, once a poll, as a late commit would be.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_rows_that_moved_several_columns_are_read_once() {
    use common::{Agent, Metrics, READY_TIMEOUT, toml_str, wait_until};
    use std::time::Duration;

    const ROWS: f64 = 50.0;
    let db = Db::postgres().await;
    let t = db.fresh_tables("once").await.inbox;
    let config = format!(
        "[[sources]]\nname = \"once\"\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
         poll_interval = \"5s\"\noverlap = \"1s\"\nreconcile_every = \"1h\"\n\
         columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
         received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\" }}\n",
        toml_str(&db.dsn),
        toml_str(&t),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let s = [("source", "once")];
    let read = |m: &Metrics| m.sum("inboxwatch_rows_read_total", &s);
    let done = |m: &Metrics| m.sum("inbox_messages_completed_total", &s);
    // Two polls of the empty table, then the rows, each of its three times
    // set by one statement.
    let before = agent.wait_polls("once", 2, Duration::ZERO).await;
    assert_eq!(read(&before), 0.0, "rows read from an empty table");
    db.exec(
        &format!(
            "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
             finished_at, attempts, deliveries, updated_at) SELECT 'once-' || g, \
             'orders.created', 'succeeded', now(), now(), now(), 1, 1, now() \
             FROM generate_series(1, {ROWS}) AS g"
        ),
        &[],
    )
    .await;
    let first = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        if read(&m) > 0.0 {
            Ok(read(&m))
        } else {
            Err("no rows read".to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the rows were not read: {e}\n{}", agent.stderr()));
    assert_eq!(
        first, ROWS,
        "rows read by the poll that found {ROWS} rows moved in all three columns"
    );
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        (done(&m) == ROWS)
            .then_some(())
            .ok_or_else(|| format!("completed {}", done(&m)))
    })
    .await
    .unwrap_or_else(|e| panic!("the rows were not counted: {e}\n{}", agent.stderr()));
}
