//! The tables consumers already have (issue 12), on PostgreSQL, MariaDB and SQLite:
//! no change cursor (`cursor = "none"`), their own column names and status words, no
//! `deliveries` or `traceparent`, rows deleted on success, optional columns left out.
//! The real agent watches a table that four concurrent writers fill, and every exported
//! number is compared with the ground truth of `common::shapes` (or, for the gauges,
//! a direct query on the table at the end).

use crate::common;

use std::time::Duration;

use common::checks::{Expectations, render_diff};
use common::scenarios::{
    CONVERGE, inbox_gauge_expectations, inbox_table_diff, wait_for_expectations, wait_for_live,
};
use common::shapes::{
    Layout, Record, ShapeTruth, ShapeWorkload, gauge_expectations, seed_history, table_diff,
};
use common::workload::{Clock, InboxTruth, InboxWorkload, Status, Target, seed_inbox_history};
use common::{Agent, Db, Metrics, READY_TIMEOUT, stays, toml_str};

/// Series a table without a `deliveries` column must not have at all (not even 0).
const DELIVERY_SERIES: [&str; 2] = ["inbox_deliveries_total", "inbox_duplicate_deliveries_total"];

/// One line per series of `names` that `source` exports.
fn present(m: &Metrics, source: &str, names: &[&str]) -> Vec<String> {
    let scope = [("source", source)];
    let mut out = Vec::new();
    for name in names {
        for s in m.series(name, &scope) {
            out.push(format!(
                "{}: exported ({}), but the source maps no deliveries column",
                s.series(),
                s.value
            ));
        }
    }
    out
}

fn target(db: &Db, table: &str) -> Target {
    Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: table.to_string(),
    }
}

/// Harness self-check: the table holds what the generator believes it wrote, and the
/// timing rules the expectations rely on held.
async fn check_harness(db: &Db, table: &str, truth: &ShapeTruth, history: &[Record]) {
    let all: Vec<&Record> = truth.records.iter().chain(history).collect();
    let mut d = table_diff(db, table, &truth.layout, &all).await;
    d.extend(truth.timing_violations());
    assert!(
        d.is_empty(),
        "HARNESS BUG: the table or the timing differs from the generator's model:\n{}",
        render_diff(&d)
    );
}

/// Creates the table, seeds history, starts the agent (waiting for `/readyz` before
/// the first write), runs the standard workload, and checks every counter, histogram
/// `_count`/`_sum`, the absence of the delivery series, `source_up`, the gauges
/// against a direct query, and that nothing moves for longer than the overlap window.
async fn watched_table_matches_ground_truth(db: &Db, layout: Layout, short: &str, extra: &str) {
    let table = layout.create_table(db, short).await;
    watched_matches_ground_truth(db, layout, table, short, extra).await;
}

/// [`watched_table_matches_ground_truth`] on a table already made.
async fn watched_matches_ground_truth(
    db: &Db,
    layout: Layout,
    table: String,
    short: &str,
    extra: &str,
) {
    let target = target(db, &table);
    let history = seed_history(&target, &layout, db.now_ms().await).await;
    let source = format!("{short}-{}", layout.prefix);
    let agent = Agent::start(&layout.source_toml(&source, &db.dsn, &table, extra));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = ShapeWorkload::standard(layout.clone())
        .run(&target, clock)
        .await;
    eprintln!("ground truth: {}", truth.summary());
    check_harness(db, &table, &truth, &history).await;

    let exp = truth.expectations(&source, db.dialect);
    let m = wait_for_expectations(&agent, &exp, CONVERGE, "counters and histograms").await;
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", &source)]),
        Some(1.0),
        "inboxwatch_source_up of a healthy source"
    );
    let p = present(&m, &source, &DELIVERY_SERIES);
    assert!(p.is_empty(), "{}", render_diff(&p));

    let (tb, src, ly) = (table.as_str(), source.as_str(), &layout);
    wait_for_live(
        &agent,
        Duration::from_secs(15),
        "gauges (direct query vs /metrics)",
        || gauge_expectations(db, tb, ly, src),
    )
    .await;

    // Without a cursor every poll re-reads the overlap window and every unfinished
    // row: nothing may count twice. Watch for longer than the overlap.
    let stable = stays(Duration::from_secs(12), || async {
        let m = agent.try_scrape().await?;
        let mut d = exp.diff(&m);
        d.extend(present(&m, src, &DELIVERY_SERIES));
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(d) = stable {
        panic!("counters moved after reaching the ground truth (counted twice?):\n{d}");
    }

    drop(agent);
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------
// The generator itself (no agent)
// ---------------------------------------------------------------------------------

async fn generator_run(db: &Db, layout: Layout, short: &str) {
    let table = layout.create_table(db, short).await;
    let target = target(db, &table);
    let history = seed_history(&target, &layout, db.now_ms().await).await;
    let truth = ShapeWorkload::small(layout.clone(), 300)
        .run(&target, Clock::new(db.now_ms().await + 5))
        .await;
    eprintln!(
        "{:?} on {:?}: {}",
        layout.shape,
        db.dialect,
        truth.summary()
    );
    check_harness(db, &table, &truth, &history).await;
    let rs = &truth.records;
    let has = |what: &str, f: &dyn Fn(&Record) -> bool| {
        assert!(
            rs.iter().any(f),
            "{:?}: the workload wrote no row that {what}",
            layout.shape
        );
    };
    has("succeeded first time", &|r| {
        r.status == Status::Succeeded && r.attempts == 1
    });
    has("succeeded after retries", &|r| {
        r.status == Status::Succeeded && r.attempts > 1
    });
    has("is dead", &|r| r.status == Status::Dead);
    has("is left pending", &|r| r.status == Status::Pending);
    has("is left processing", &|r| r.status == Status::Processing);
    has("is left failed", &|r| r.status == Status::Failed);
    if layout.deletes_succeeded() {
        has("was deleted", &|r| r.deleted_ms.is_some());
        assert!(truth.ghosts > 0, "no ghost rows");
    } else {
        has("became final in a late write", &|r| {
            r.is_terminal() && r.states.last().is_some_and(|w| w.late)
        });
        has("was received in a late write", &|r| r.states[0].late);
    }
}

async fn generator_matches_table(db: Db, short: &str) {
    // One after the other: each takes 4 of the pool's 10 connections for its writers,
    // and a writer waiting for a connection would miss its turn to hold a late
    // transaction.
    for layout in [
        Layout::shape_a(),
        Layout::shape_b(),
        Layout::deleted_on_success(),
    ] {
        generator_run(&db, layout, short).await;
    }
    db.cleanup().await;
}

/// Guards the generator on PostgreSQL: after a run of every layout, each table holds
/// exactly the rows the model holds (deleted and never-visible rows gone), the timing
/// rules hold, and every kind of life, late write included, occurred.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generator_model_equals_table_contents_postgres() {
    generator_matches_table(Db::postgres().await, "gpg").await;
}

/// Guards the generator on MariaDB (late transactions held open 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generator_model_equals_table_contents_mariadb() {
    generator_matches_table(Db::mysql().await, "gmy").await;
}

/// Guards the generator on SQLite (late rows stamped 3 s in the past).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generator_model_equals_table_contents_sqlite() {
    generator_matches_table(Db::sqlite().await, "glite").await;
}

// ---------------------------------------------------------------------------------
// Shape A and shape B on each database
// ---------------------------------------------------------------------------------

/// Guards shape A (`message_key`, `business_type`, `first_arrival`, `processing_start`,
/// `processing_end`, `status` in its own words, `failure_reason`, `retry_count` as
/// attempts; no `updated_at`, `deliveries` or `traceparent`) on PostgreSQL with
/// `cursor = "none"`: received, completed by outcome, attempt failures, attempts
/// histogram, processing and end-to-end histograms exact (late commits 3 s late
/// included), gauges equal to a direct query, no rejected rows, no delivery series.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_a_without_cursor_matches_ground_truth_postgres() {
    let db = Db::postgres().await;
    watched_table_matches_ground_truth(&db, Layout::shape_a(), "pg", "").await;
}

/// Guards shape A on PostgreSQL in a table partitioned by a hash of the id
/// (two partitions), as in a plain table. Its tails are merged by the rows
/// themselves, not by each row version's place (`ctid`), which each
/// partition numbers on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_a_without_cursor_partitioned_matches_ground_truth_postgres() {
    let db = Db::postgres().await;
    let layout = Layout::shape_a();
    let table = layout.create_partitioned_table(&db, "pgpart").await;
    watched_matches_ground_truth(&db, layout, table, "pgpart", "").await;
}

/// Guards shape A on MariaDB (DATETIME(6) times), as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_a_without_cursor_matches_ground_truth_mariadb() {
    let db = Db::mysql().await;
    watched_table_matches_ground_truth(&db, Layout::shape_a(), "my", "").await;
}

/// Guards shape A on SQLite (text times in milliseconds), as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_a_without_cursor_matches_ground_truth_sqlite() {
    let db = Db::sqlite().await;
    watched_table_matches_ground_truth(&db, Layout::shape_a(), "lite", "").await;
}

/// Guards shape B (`event_id`, `event_type`, `status` in its own words,
/// `first_received`, `completion_time`, `error_summary`: no start time, no attempts)
/// on PostgreSQL with `cursor = "none"`: attempt failures are the moves into failed
/// (each lasting 1 s, so all seen), every attempts observation is 1, no processing
/// observations and no stuck rows; the rest as for shape A.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_b_without_cursor_matches_ground_truth_postgres() {
    let db = Db::postgres().await;
    watched_table_matches_ground_truth(&db, Layout::shape_b(), "pg", "").await;
}

/// Guards shape B on MariaDB, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_b_without_cursor_matches_ground_truth_mariadb() {
    let db = Db::mysql().await;
    watched_table_matches_ground_truth(&db, Layout::shape_b(), "my", "").await;
}

/// Guards shape B on SQLite, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shape_b_without_cursor_matches_ground_truth_sqlite() {
    let db = Db::sqlite().await;
    watched_table_matches_ground_truth(&db, Layout::shape_b(), "lite", "").await;
}

// ---------------------------------------------------------------------------------
// Deleted on success
// ---------------------------------------------------------------------------------

const DELETED: &str = "finished_rows = \"deleted\"\ndeleted_durations = true\n";

/// Guards `finished_rows = "deleted"` on PostgreSQL: the consumer DELETEs a row when
/// it succeeds (after at least 1 s unfinished) and keeps dead ones. Completions by
/// outcome, attempt failures and the attempts histogram exact; rows inserted and
/// deleted inside one transaction never counted; processing and end-to-end `_count`
/// exact, `_sum` between the true sum and the true sum + (poll interval + 1 s) per
/// deleted row (`deleted_durations = true`: noticed at the next poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_on_success_counts_every_row_seen_postgres() {
    let db = Db::postgres().await;
    watched_table_matches_ground_truth(&db, Layout::deleted_on_success(), "pg", DELETED).await;
}

/// Guards `finished_rows = "deleted"` on MariaDB, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_on_success_counts_every_row_seen_mariadb() {
    let db = Db::mysql().await;
    watched_table_matches_ground_truth(&db, Layout::deleted_on_success(), "my", DELETED).await;
}

/// Guards `finished_rows = "deleted"` on SQLite, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_on_success_counts_every_row_seen_sqlite() {
    let db = Db::sqlite().await;
    watched_table_matches_ground_truth(&db, Layout::deleted_on_success(), "lite", DELETED).await;
}

// ---------------------------------------------------------------------------------
// Optional columns left out
// ---------------------------------------------------------------------------------

/// Every meaning of the contract table `inboxwatch schema` creates, under its own name.
const CONTRACT: [&str; 11] = [
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
];

/// What a source that leaves `column` out of `[sources.columns]` must export.
fn expected_without(truth: &InboxTruth, source: &str, column: &str) -> Expectations {
    let mut x = truth.expectations(source);
    match column {
        "deliveries" => {
            x.items
                .retain(|e| !DELIVERY_SERIES.contains(&e.name.as_str()));
            x.closed
                .retain(|(n, _)| !DELIVERY_SERIES.contains(&n.as_str()));
        }
        "started_at" => {
            for e in &mut x.items {
                if e.name.starts_with("inbox_processing_duration_seconds_") {
                    e.value = 0.0;
                }
            }
        }
        _ => {}
    }
    x
}

/// Guards "an omitted optional column is not used" on PostgreSQL: one contract-shaped
/// table (it has every column) watched by four sources, each leaving one of
/// `traceparent`, `deliveries`, `last_error`, `started_at` out of `[sources.columns]`
/// (with `updated_at` mapped, so the cursor defaults to `updated_at`). Every source is
/// up and counts exactly; without `deliveries` the delivery and duplicate series are
/// absent; without `started_at` there is no processing observation and no stuck row,
/// though the table's `started_at` is filled (and 4 rows are stuck by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_columns_left_out_in_turn_are_not_used_postgres() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("opt").await;
    let target = target(&db, &tables.inbox);
    let history = seed_inbox_history(&target, db.now_ms().await).await;
    let left_out = ["traceparent", "deliveries", "last_error", "started_at"];
    let source = |col: &str| format!("pg-no-{}", col.replace('_', "-"));
    let mut toml = String::new();
    for col in left_out {
        // The keys of `scenarios::inbox_source_toml`, with a column map of our own.
        toml.push_str(&format!(
            "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
             poll_interval = \"300ms\"\noverlap = \"10s\"\nstuck_after = \"10m\"\n\
             event_type_limit = 50\ntimeout = \"2s\"\nquantile_window = \"5m\"\n\n\
             [sources.columns]\n",
            toml_str(&source(col)),
            toml_str(&db.dsn),
            toml_str(&tables.inbox)
        ));
        for meaning in CONTRACT.iter().filter(|m| **m != col) {
            toml.push_str(&format!("{meaning} = {}\n", toml_str(meaning)));
        }
        toml.push('\n');
    }
    let agent = Agent::start(&toml);
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = InboxWorkload::standard().run(&target, clock).await;
    eprintln!(
        "ground truth: {}; {} history rows",
        truth.summary(),
        history.len()
    );
    let d = inbox_table_diff(&db, &tables.inbox, &truth).await;
    assert!(
        d.is_empty(),
        "HARNESS BUG: the table differs from the generator's model:\n{}",
        render_diff(&d)
    );

    let mut exp = Expectations::default();
    for col in left_out {
        exp.extend(expected_without(&truth, &source(col), col));
    }
    let m = wait_for_expectations(&agent, &exp, CONVERGE, "counters of the four sources").await;
    for col in left_out {
        assert_eq!(
            m.get("inboxwatch_source_up", &[("source", &source(col))]),
            Some(1.0),
            "inboxwatch_source_up of the source without {col}"
        );
    }
    let no_deliveries = source("deliveries");
    let p = present(&m, &no_deliveries, &DELIVERY_SERIES);
    assert!(p.is_empty(), "{}", render_diff(&p));

    let (inbox, srcs) = (tables.inbox.as_str(), &left_out);
    wait_for_live(&agent, Duration::from_secs(15), "gauges", || async {
        let mut x = Expectations::default();
        for col in srcs.iter() {
            let mut g = inbox_gauge_expectations(&db, inbox, &source(col)).await;
            if *col == "started_at" {
                // No start time: nothing is stuck (the scope stays closed: all 0).
                g.items.retain(|e| e.name != "inbox_stuck_messages");
            }
            x.extend(g);
        }
        x
    })
    .await;

    let stable = stays(Duration::from_secs(12), || async {
        let m = agent.try_scrape().await?;
        let mut d = exp.diff(&m);
        d.extend(present(&m, &no_deliveries, &DELIVERY_SERIES));
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(d) = stable {
        panic!("counters moved after reaching the ground truth:\n{d}");
    }

    drop(agent);
    db.cleanup().await;
}
