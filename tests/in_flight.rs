//! Without a change cursor the rows in flight are looked up by id, since they
//! change where no time column shows it (docs/metrics.md, "Without a change
//! cursor"): those started within `max(overlap, stuck_after)` on every poll,
//! and those started earlier — stuck, or failed and waiting long for a retry —
//! in turn, each about once per `overlap`. Here rows stay in `processing` past
//! that horizon and then fail (a reaper, or the consumer's own timeout) without
//! any time column moving: the failures, their error class and the backlog by
//! status must show within a few rounds, with `reconcile_every` an hour, so no
//! reconcile can be what saw them. Before the stuck rows were taken in turn,
//! nothing but a full reconcile (every tenth one) would ever have seen them.
//!
//! On PostgreSQL and SQLite, with the partial index over the rows in flight
//! that `schema --config` prints, the same rows are read through it instead:
//! the recent ones as one range, the stuck ones in slices of their starts. On
//! MariaDB, with the index on (status, received_at) that `schema` prints, the
//! stuck rows are checked in slices of their arrivals by their ids and
//! statuses in that index alone, and only the changed ones looked up.
//! Then half of the rows go back to pending by hand, which again no time
//! column shows.

use crate::common;

use std::time::Duration;

use common::{Agent, Db, Metrics, READY_TIMEOUT, schema_indexes, toml_str, wait_until};

const SOURCE: &str = "stuck";
/// The rows that get stuck and then fail.
const ROWS: u32 = 40;
/// `overlap` and `stuck_after`: the horizon is the larger, 3 s.
const OVERLAP_S: u64 = 3;
const STUCK_AFTER_S: u64 = 2;

/// The unfinished rows by status as the agent shows them.
fn backlog(m: &Metrics) -> [f64; 3] {
    ["pending", "processing", "failed"].map(|status| {
        m.sum(
            "inbox_backlog_messages",
            &[("source", SOURCE), ("status", status)],
        )
    })
}

/// The `i`-th row's event id as SQL, for an id column of type `id_type`
/// (`None`: the test table's own text column).
fn id_sql(id_type: Option<&str>, i: u32) -> String {
    match id_type {
        Some("uuid") => format!("'00000000-0000-4000-8000-{i:012}'"),
        Some("bigint") => i.to_string(),
        _ => format!("'stuck-{i}'"),
    }
}

/// Creates the partial index over the rows in flight as `schema --config`
/// prints it for `config`.
async fn create_in_flight_index(db: &Db, config: &str) {
    let indexes = schema_indexes(config);
    let index: Vec<&String> = indexes
        .iter()
        .filter(|l| l.contains("_in_flight ON"))
        .collect();
    assert_eq!(
        index.len(),
        1,
        "schema --config prints no index of the rows in flight:\n{}",
        indexes.join("\n")
    );
    db.exec(index[0], &[]).await;
}

/// `id_type`: PostgreSQL only, the event id column made of that type (the
/// look-ups bind the ids cast to it). `index`: on PostgreSQL and SQLite the
/// partial index over the rows in flight is created, on MariaDB the index on
/// (status, received_at) is kept, and the agent must read them through it;
/// without it, it looks them up by id.
async fn stuck_rows_that_fail_are_counted(db: Db, id_type: Option<&str>, index: bool) {
    stuck_rows_change(db, id_type, index, Arrivals::Apart).await;
}

/// How the stuck rows arrive: their `received_at`, which MariaDB's check
/// slices by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrivals {
    /// One statement a row.
    Apart,
    /// One statement for every row: one `received_at`, which one slice
    /// takes whole.
    One,
    /// As `One`, with `batch_size = 10`, so that a slice of their arrivals
    /// holds more rows than a page: on MariaDB the agent must say so and
    /// look the stuck rows up by id in turn instead.
    OneOverAPage,
}

/// As [`stuck_rows_that_fail_are_counted`], the rows arriving as `arrivals`
/// says.
async fn stuck_rows_change(db: Db, id_type: Option<&str>, index: bool, arrivals: Arrivals) {
    let t = db.fresh_tables("stuck").await.inbox;
    if let Some(ty) = id_type {
        db.exec(
            &format!(
                "ALTER TABLE {t} ALTER COLUMN event_id TYPE {ty} \
                 USING CAST(CAST(event_id AS TEXT) AS {ty})"
            ),
            &[],
        )
        .await;
    }
    let config = format!(
        "[[sources]]\nname = \"{SOURCE}\"\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
         poll_interval = \"300ms\"\noverlap = \"{OVERLAP_S}s\"\nstuck_after = \"{STUCK_AFTER_S}s\"\n\
         reconcile_every = \"1h\"\n{}\
         columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
         received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
         attempts = \"attempts\", deliveries = \"deliveries\", last_error = \"last_error\" }}\n",
        toml_str(&db.dsn),
        toml_str(&t),
        if arrivals == Arrivals::OneOverAPage {
            "batch_size = 10\n"
        } else {
            ""
        },
    );
    let mariadb = db.dialect == common::Dialect::Mysql;
    if index && !mariadb {
        create_in_flight_index(&db, &config).await;
    }
    if !index && mariadb {
        // The table's index on (status, received_at), which `schema` prints
        // and which MariaDB checks the stuck rows through, dropped.
        db.exec(&format!("DROP INDEX {t}_unfinished ON {t}"), &[])
            .await;
    }
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let now = db.dialect.clock_sql();
    let ids: Vec<String> = (1..=ROWS).map(|i| id_sql(id_type, i)).collect();
    let ids = format!("({})", ids.join(", "));
    let row = |i: u32| {
        format!(
            "({}, 'orders.created', 'pending', {now}, 0, 1, {now})",
            id_sql(id_type, i)
        )
    };
    let insert = format!(
        "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, deliveries, \
         updated_at) VALUES "
    );
    if arrivals != Arrivals::Apart {
        // One statement: one clock reading for every row.
        let rows: Vec<String> = (1..=ROWS).map(row).collect();
        db.exec(&format!("{insert}{}", rows.join(", ")), &[]).await;
    } else {
        for i in 1..=ROWS {
            db.exec(&format!("{insert}{}", row(i)), &[]).await;
        }
    }
    // One start for every row, as a worker that claims a batch in one
    // statement gives them (PostgreSQL's `clock_timestamp()` would give each
    // its own; `now()` is the transaction's time).
    let claimed = match db.dialect {
        common::Dialect::Postgres => "now()",
        _ => now,
    };
    let n = db
        .exec(
            &format!(
                "UPDATE {t} SET status = 'processing', started_at = {claimed}, attempts = 1 \
                 WHERE event_id IN {ids}"
            ),
            &[],
        )
        .await;
    assert_eq!(n, u64::from(ROWS));
    let s = ("source", SOURCE);
    let rows = f64::from(ROWS);
    let seen = wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let got = (m.sum("inbox_messages_received_total", &[s]), backlog(&m));
        if got == (rows, [0.0, rows, 0.0]) {
            Ok(())
        } else {
            Err(format!(
                "received and backlog {got:?}, want ({rows}, [0, {rows}, 0])"
            ))
        }
    })
    .await;
    if let Err(e) = seen {
        panic!(
            "the rows were not read in processing: {e}\n{}",
            agent.stderr()
        );
    }
    // Past the horizon (3 s) and every read of the overlap window (the tail's
    // 1 s look-back behind a mark at most `overlap` behind the clock, and the
    // late-commit slices up to `overlap` back), then two more polls: from here
    // only a look-up by id can see the rows change.
    let started = db.now_ms().await;
    wait_until(Duration::from_secs(60), || async {
        let waited = db.now_ms().await - started;
        if waited >= 2 * 1000 * i64::try_from(OVERLAP_S).unwrap_or(0) + 2000 {
            Ok(())
        } else {
            Err(format!("{waited} ms since the start"))
        }
    })
    .await
    .expect("the database's clock moves");
    let before = agent.wait_polls(SOURCE, 2, Duration::ZERO).await;
    assert_eq!(
        (
            before.sum("inbox_attempt_failures_total", &[s]),
            before.sum("inbox_stuck_messages", &[s])
        ),
        (0.0, rows),
        "before the failures: none counted, every row stuck"
    );
    // Quiet, every row stuck: each is read once a round of overlap /
    // poll_interval = 10 polls (through the index, or looked up by id in
    // turn), not more often. Rows that share one start (set by one
    // statement, as here) or one arrival (`Arrivals::One`) are still read
    // once a round, not every other poll. A scrape between a poll's
    // duration and its rows (the window's first) can hold one poll's rows
    // more: one round's worth of slack.
    const ROUND: f64 = 10.0;
    let read = |m: &Metrics| m.sum("inboxwatch_rows_read_total", &[s]);
    let quiet = agent.wait_polls(SOURCE, 30, Duration::ZERO).await;
    let polls = Agent::polls(&quiet, SOURCE) - Agent::polls(&before, SOURCE);
    let quiet_read = read(&quiet) - read(&before);
    eprintln!("quiet: {quiet_read} rows read in {polls} polls");
    assert!(
        quiet_read <= rows * ((polls / ROUND).ceil() + 1.0),
        "{quiet_read} rows read in {polls} quiet polls: more than each of the {rows} stuck \
         rows once a round of {ROUND} polls (and a round more)\n{}",
        agent.stderr()
    );
    // Failed where no time column shows it, as a reaper does.
    let n = db
        .exec(
            &format!(
                "UPDATE {t} SET status = 'failed', last_error = 'TimeoutError: worker lost' \
                 WHERE event_id IN {ids}"
            ),
            &[],
        )
        .await;
    assert_eq!(n, u64::from(ROWS));
    // Each stuck row is looked up once in overlap / poll_interval = 10 polls:
    // give it three rounds, counted by the agent's own polls.
    let res = agent
        .wait_for_polls(&[SOURCE], Duration::ZERO, 30, |m| {
            let got = (
                m.sum("inbox_attempt_failures_total", &[s]),
                m.sum(
                    "inbox_attempt_failures_total",
                    &[s, ("error_class", "timeout")],
                ),
                backlog(m),
                m.sum("inbox_stuck_messages", &[s]),
            );
            if got == (rows, rows, [0.0, 0.0, rows], 0.0) {
                Ok(())
            } else {
                Err(format!(
                    "failures, of them timeout, backlog by status, stuck: {got:?}, want \
                     ({rows}, {rows}, [0, 0, {rows}], 0)"
                ))
            }
        })
        .await;
    if let Err(e) = res {
        panic!(
            "the stuck rows' failures were not seen without a reconcile:\n{e}\n{}",
            agent.stderr()
        );
    }
    // Half of them back in pending by hand, again with no time column
    // moving: they leave the rows in flight, which only a read of them shows.
    let half = ROWS / 2;
    let back: Vec<String> = (1..=half).map(|i| id_sql(id_type, i)).collect();
    let n = db
        .exec(
            &format!(
                "UPDATE {t} SET status = 'pending' WHERE event_id IN ({})",
                back.join(", ")
            ),
            &[],
        )
        .await;
    assert_eq!(n, u64::from(half));
    let left = f64::from(ROWS - half);
    let pending = f64::from(half);
    let res = agent
        .wait_for_polls(&[SOURCE], Duration::ZERO, 30, |m| {
            let got = (m.sum("inbox_attempt_failures_total", &[s]), backlog(m));
            if got == (rows, [pending, 0.0, left]) {
                Ok(())
            } else {
                Err(format!(
                    "failures, backlog by status: {got:?}, want ({rows}, [{pending}, 0, {left}])"
                ))
            }
        })
        .await;
    if let Err(e) = res {
        panic!(
            "the stuck rows back in pending were not seen without a reconcile:\n{e}\n{}",
            agent.stderr()
        );
    }
    let log = agent.stderr();
    let line = |text: &str| log.lines().any(|l| l.contains(text));
    let through_index = line("The rows in flight are read through a partial index.")
        || line("The stuck rows in flight are checked through the index on (status, received_at)");
    let by_id = line("The rows in flight are looked up by id");
    assert_eq!(
        (through_index, by_id),
        (index, !index),
        "how the rows in flight were read (through the index, by id), index {index}:\n{log}"
    );
    assert_eq!(
        line("A slice of the stuck rows' arrivals holds more rows in flight than batch_size"),
        arrivals == Arrivals::OneOverAPage,
        "whether a slice overflowed its page, arrivals {arrivals:?}:\n{log}"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_that_fail_are_counted_without_a_reconcile_postgres() {
    stuck_rows_that_fail_are_counted(Db::postgres().await, None, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_read_through_the_partial_index_postgres() {
    stuck_rows_that_fail_are_counted(Db::postgres().await, None, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_read_through_the_partial_index_sqlite() {
    stuck_rows_that_fail_are_counted(Db::sqlite().await, None, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_with_uuid_ids_are_looked_up_postgres() {
    stuck_rows_that_fail_are_counted(Db::postgres().await, Some("uuid"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_with_bigint_ids_are_looked_up_postgres() {
    stuck_rows_that_fail_are_counted(Db::postgres().await, Some("bigint"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_that_fail_are_counted_without_a_reconcile_mariadb() {
    stuck_rows_that_fail_are_counted(Db::mysql().await, None, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_checked_through_the_status_index_mariadb() {
    stuck_rows_that_fail_are_counted(Db::mysql().await, None, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_with_one_arrival_over_a_page_are_looked_up_mariadb() {
    stuck_rows_change(Db::mysql().await, None, true, Arrivals::OneOverAPage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_with_one_arrival_checked_through_the_status_index_mariadb() {
    stuck_rows_change(Db::mysql().await, None, true, Arrivals::One).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_rows_that_fail_are_counted_without_a_reconcile_sqlite() {
    stuck_rows_that_fail_are_counted(Db::sqlite().await, None, false).await;
}
