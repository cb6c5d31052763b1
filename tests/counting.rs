//! The counting rules of docs/metrics.md that the generated workloads do not reach,
//! one scripted event history each on PostgreSQL, with the expected counters written
//! out from the rules step by step: a re-drive (a dead event put back to pending and
//! completed again, with and without its attempts reset), the baseline (rows that
//! predate the agent), `state_retention` (a late duplicate counted before it runs
//! out, not after), `event_type_limit` (types past the limit folded into `other`)
//! and the quantile gauges (only for types with a measured processing time).

use crate::common;
// One statement on the test's table (`{t}` is its name).
use common::table_sql as sql;

use std::time::Duration;

use common::scenarios::inbox_source_toml;
use common::{Agent, Db, Metrics, READY_TIMEOUT, wait_until};

const SOURCE: &str = "rules";

/// An expected value: (metric, labels besides `source`, value).
type Want<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

/// A named counter of the source (summed over the labels not given), 0 when absent.
fn count(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l = vec![("source", SOURCE)];
    l.extend_from_slice(labels);
    m.sum(name, &l)
}

/// Waits until every `(name, labels, value)` holds on a scrape; panics naming `step`
/// and every difference.
async fn expect(agent: &Agent, step: &str, want: &[Want<'_>]) {
    let res = wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        let bad: Vec<String> = want
            .iter()
            .filter_map(|(name, labels, v)| {
                let got = count(&m, name, labels);
                (got != *v).then(|| format!("{name}{labels:?}: got {got}, want {v}"))
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    })
    .await;
    if let Err(e) = res {
        panic!("after {step}: {e}");
    }
}

/// Checks that `want` holds now and still holds after `wait` and at least five
/// more polls (counted by the agent: a stalled agent would hold anything).
async fn stays(agent: &Agent, step: &str, wait: Duration, want: &[Want<'_>]) {
    expect(agent, step, want).await;
    agent.wait_polls(SOURCE, 5, wait).await;
    expect(agent, &format!("{step}, {wait:?} and 5 polls later"), want).await;
}

const RECEIVED: &str = "inbox_messages_received_total";
const COMPLETED: &str = "inbox_messages_completed_total";
const FAILURES: &str = "inbox_attempt_failures_total";
const ATTEMPTS_N: &str = "inbox_delivery_attempts_count";
const ATTEMPTS_SUM: &str = "inbox_delivery_attempts_sum";
const DELIVERIES: &str = "inbox_deliveries_total";
const DUPLICATES: &str = "inbox_duplicate_deliveries_total";
const SUCCEEDED: &[(&str, &str)] = &[("outcome", "succeeded")];
const DEAD: &[(&str, &str)] = &[("outcome", "dead_lettered")];

/// Guards the re-drive rules: an event dead after 2 attempts (1 failed attempt),
/// put back to pending (2 failed attempts), completed after its 3rd (completions:
/// dead 1, succeeded 1; attempts observed 2 and 3), then re-driven with its attempts
/// reset to 0, failing once more and succeeding on its 2nd attempt of the new run:
/// its failed attempts are counted anew from 0 (3 in all), one more completion, 2
/// attempts observed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_driven_event_counts_again_and_a_reset_counts_its_attempts_anew() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("redrive").await.inbox;
    let agent = Agent::start(&inbox_source_toml(SOURCE, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    let upd = |set: &str| {
        format!("UPDATE {{t}} SET {set}, updated_at = clock_timestamp() WHERE event_id = 'e1'")
    };

    sql(
        &db,
        &t,
        "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                  attempts, deliveries, updated_at) VALUES ('e1', 'order.paid', 'processing', \
                  clock_timestamp(), clock_timestamp(), 1, 1, clock_timestamp())",
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'failed', last_error = 'TimeoutError: upstream'"),
    )
    .await;
    expect(
        &agent,
        "a first failed attempt",
        &[(RECEIVED, &[], 1.0), (FAILURES, &[], 1.0)],
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'processing', attempts = 2, started_at = clock_timestamp()"),
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'dead', finished_at = clock_timestamp()"),
    )
    .await;
    expect(
        &agent,
        "dead after 2 attempts",
        &[
            (COMPLETED, DEAD, 1.0),
            (COMPLETED, SUCCEEDED, 0.0),
            (FAILURES, &[], 1.0),
            (ATTEMPTS_N, &[], 1.0),
            (ATTEMPTS_SUM, &[], 2.0),
        ],
    )
    .await;

    // Re-drive: back to pending, its 2 attempts kept (both failed).
    sql(&db, &t, &upd("status = 'pending', finished_at = NULL")).await;
    expect(
        &agent,
        "the re-drive",
        &[(FAILURES, &[], 2.0), (COMPLETED, DEAD, 1.0)],
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'processing', attempts = 3, started_at = clock_timestamp()"),
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'succeeded', finished_at = clock_timestamp()"),
    )
    .await;
    expect(
        &agent,
        "success on the 3rd attempt",
        &[
            (COMPLETED, DEAD, 1.0),
            (COMPLETED, SUCCEEDED, 1.0),
            (FAILURES, &[], 2.0),
            (ATTEMPTS_N, &[], 2.0),
            (ATTEMPTS_SUM, &[], 5.0),
            (RECEIVED, &[], 1.0),
        ],
    )
    .await;

    // Re-drive with the attempts reset: counted anew from 0.
    sql(
        &db,
        &t,
        &upd("status = 'pending', attempts = 0, finished_at = NULL"),
    )
    .await;
    stays(
        &agent,
        "a reset re-drive",
        Duration::from_secs(1),
        &[(FAILURES, &[], 2.0)],
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'processing', attempts = 1, started_at = clock_timestamp()"),
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'failed', last_error = 'TimeoutError: again'"),
    )
    .await;
    expect(&agent, "a failure after the reset", &[(FAILURES, &[], 3.0)]).await;
    sql(
        &db,
        &t,
        &upd("status = 'processing', attempts = 2, started_at = clock_timestamp()"),
    )
    .await;
    sql(
        &db,
        &t,
        &upd("status = 'succeeded', finished_at = clock_timestamp()"),
    )
    .await;
    stays(
        &agent,
        "success on the 2nd attempt after the reset",
        Duration::from_secs(2),
        &[
            (RECEIVED, &[], 1.0),
            (COMPLETED, DEAD, 1.0),
            (COMPLETED, SUCCEEDED, 2.0),
            (FAILURES, &[], 3.0),
            (ATTEMPTS_N, &[], 3.0),
            (ATTEMPTS_SUM, &[], 7.0),
            (DELIVERIES, &[], 1.0),
            (DUPLICATES, &[], 0.0),
        ],
    )
    .await;
    drop(agent);
    db.cleanup().await;
}

/// Guards the baseline: rows written before the agent starts are not arrivals, and
/// what they showed then is not counted; their later changes are. A pending row that
/// then succeeds on its first attempt (one completion, 1 attempt), and a row that had
/// failed once before the start and succeeds on its 2nd attempt (one completion, 2
/// attempts, no failure counted: it happened before), a row already finished before
/// the start (nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_predate_the_agent_are_a_baseline_whose_changes_count() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("baseline").await.inbox;
    sql(&db, &t, "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                  finished_at, attempts, deliveries, last_error, updated_at) VALUES \
                  ('p1', 'order.paid', 'pending', now() - interval '1 hour', NULL, NULL, 0, 1, NULL, now() - interval '1 hour'), \
                  ('p2', 'order.paid', 'failed', now() - interval '1 hour', now() - interval '59 minutes', NULL, 1, 1, 'TimeoutError: x', now() - interval '59 minutes'), \
                  ('f1', 'order.paid', 'succeeded', now() - interval '1 hour', now() - interval '1 hour', now() - interval '59 minutes', 1, 1, NULL, now() - interval '59 minutes')").await;
    let agent = Agent::start(&inbox_source_toml(SOURCE, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    stays(
        &agent,
        "the start",
        Duration::from_secs(1),
        &[
            (RECEIVED, &[], 0.0),
            (COMPLETED, &[], 0.0),
            (FAILURES, &[], 0.0),
            (DELIVERIES, &[], 0.0),
            ("inbox_backlog_messages", &[], 2.0),
        ],
    )
    .await;
    for (id, attempts) in [("p1", 1), ("p2", 2)] {
        sql(
            &db,
            &t,
            &format!(
                "UPDATE {{t}} SET status = 'processing', attempts = {attempts}, started_at = \
                 clock_timestamp(), updated_at = clock_timestamp() WHERE event_id = '{id}'"
            ),
        )
        .await;
        sql(
            &db,
            &t,
            &format!(
                "UPDATE {{t}} SET status = 'succeeded', finished_at = clock_timestamp(), \
                 updated_at = clock_timestamp() WHERE event_id = '{id}'"
            ),
        )
        .await;
    }
    stays(
        &agent,
        "both baseline rows succeeded",
        Duration::from_secs(2),
        &[
            (RECEIVED, &[], 0.0),
            (COMPLETED, SUCCEEDED, 2.0),
            (COMPLETED, DEAD, 0.0),
            (FAILURES, &[], 0.0),
            (ATTEMPTS_N, &[], 2.0),
            (ATTEMPTS_SUM, &[], 3.0),
            ("inbox_backlog_messages", &[], 0.0),
        ],
    )
    .await;
    drop(agent);
    db.cleanup().await;
}

/// Guards `state_retention`: a duplicate delivery to a finished event is counted
/// while the event is remembered (within `state_retention` of its last change) and
/// not once it is forgotten (unchanged for longer than that plus the 10 s forgetting
/// period); the forgotten event's row, seen again, is not a new arrival or a new
/// completion either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_duplicate_counts_within_state_retention_and_not_after() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("retention").await.inbox;
    let config = inbox_source_toml(SOURCE, &db.dsn, &t).replace(
        "overlap = \"10s\"",
        "overlap = \"1s\"\nstate_retention = \"3s\"",
    );
    assert!(config.contains("state_retention = \"3s\""), "{config}");
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let now = "clock_timestamp()";
    sql(
        &db,
        &t,
        &format!(
            "INSERT INTO {{t}} (event_id, event_type, status, received_at, \
                  started_at, finished_at, attempts, deliveries, updated_at) VALUES ('e2', \
                  'order.paid', 'succeeded', {now}, {now}, {now}, 1, 1, {now})"
        ),
    )
    .await;
    expect(
        &agent,
        "the completion",
        &[(COMPLETED, SUCCEEDED, 1.0), (DUPLICATES, &[], 0.0)],
    )
    .await;
    let duplicate = "UPDATE {t} SET deliveries = deliveries + 1, updated_at = clock_timestamp() \
                     WHERE event_id = 'e2'";
    sql(&db, &t, duplicate).await;
    expect(
        &agent,
        "a duplicate within state_retention",
        &[(DUPLICATES, &[], 1.0), (DELIVERIES, &[], 2.0)],
    )
    .await;
    // Unchanged for longer than state_retention (3 s) plus the forgetting period
    // (every 10 s) and a poll.
    tokio::time::sleep(Duration::from_secs(14)).await;
    // The only row in the table, unchanged since: rows read grow again only once the
    // agent has read the UPDATE below, so the counts after it are checked on a poll
    // that saw the late duplicate, not before.
    let rows_read = |m: &Metrics| count(m, "inboxwatch_rows_read_total", &[]);
    let before = rows_read(&agent.scrape().await);
    sql(&db, &t, duplicate).await;
    wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        (rows_read(&m) > before)
            .then_some(())
            .ok_or_else(|| format!("rows read {} since {before}", rows_read(&m)))
    })
    .await
    .expect("the agent read the late duplicate's UPDATE");
    stays(
        &agent,
        "a duplicate after state_retention",
        Duration::from_secs(3),
        &[
            (RECEIVED, &[], 1.0),
            (COMPLETED, SUCCEEDED, 1.0),
            (DUPLICATES, &[], 1.0),
            (DELIVERIES, &[], 2.0),
        ],
    )
    .await;
    drop(agent);
    db.cleanup().await;
}

/// Guards `event_type_limit`: with a limit of 2, the first two event types seen keep
/// their label and every later one is counted under `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_types_past_the_limit_fold_into_other() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("types").await.inbox;
    let config = inbox_source_toml(SOURCE, &db.dsn, &t)
        .replace("event_type_limit = 50", "event_type_limit = 2");
    assert!(config.contains("event_type_limit = 2\n"), "{config}");
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let mut seen = Vec::new();
    for (i, ty) in ["a.first", "b.second", "c.third", "d.fourth", "a.first"]
        .iter()
        .enumerate()
    {
        sql(
            &db,
            &t,
            &format!(
                "INSERT INTO {{t}} (event_id, event_type, status, received_at, \
                      started_at, finished_at, attempts, deliveries, updated_at) VALUES \
                      ('t{i}', '{ty}', 'succeeded', clock_timestamp(), clock_timestamp(), \
                      clock_timestamp(), 1, 1, clock_timestamp())"
            ),
        )
        .await;
        seen.push(*ty);
        let n = |label: &str| -> f64 {
            seen.iter()
                .filter(|s| match label {
                    "other" => !["a.first", "b.second"].contains(s),
                    l => **s == l,
                })
                .count() as f64
        };
        // One type at a time, so that "the first two seen" is well defined.
        expect(
            &agent,
            &format!("event {i} ({ty})"),
            &[
                (RECEIVED, &[("event_type", "a.first")], n("a.first")),
                (RECEIVED, &[("event_type", "b.second")], n("b.second")),
                (RECEIVED, &[("event_type", "other")], n("other")),
                (RECEIVED, &[], seen.len() as f64),
            ],
        )
        .await;
    }
    let m = agent.scrape().await;
    let labels: std::collections::BTreeSet<String> = m
        .series(RECEIVED, &[("source", SOURCE)])
        .map(|s| s.labels["event_type"].clone())
        .collect();
    assert_eq!(
        labels,
        ["a.first", "b.second", "other"].map(String::from).into(),
        "the event_type labels of {RECEIVED}"
    );
    drop(agent);
    db.cleanup().await;
}

/// Guards the quantile gauges' labels: an event type gets
/// `inbox_processing_duration_quantile_seconds` only once one of its events has a
/// measured processing time (started and finished). One that succeeded after exactly
/// 1.5 s has its three quantiles at 1.5 s (within the sketch's 1 %); a type whose
/// event is still pending, and one dead-lettered without ever starting (no
/// processing time), have no quantile series at all, though both are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantiles_only_for_event_types_with_a_measured_duration() {
    const QUANTILE: &str = "inbox_processing_duration_quantile_seconds";
    let db = Db::postgres().await;
    let t = db.fresh_tables("quantiles").await.inbox;
    let agent = Agent::start(&inbox_source_toml(SOURCE, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    // Received after the agent's start (else they are the baseline, not arrivals).
    tokio::time::sleep(Duration::from_secs(4)).await;
    sql(&db, &t, "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, \
                  finished_at, attempts, deliveries, last_error, updated_at) VALUES \
                  ('q1', 'timed', 'succeeded', now() - interval '3 seconds', now() - interval '2 seconds', now() - interval '0.5 seconds', 1, 1, NULL, clock_timestamp()), \
                  ('q2', 'waiting', 'pending', now(), NULL, NULL, 0, 1, NULL, clock_timestamp()), \
                  ('q3', 'unstarted', 'dead', now() - interval '1 second', NULL, now(), 0, 1, 'ValidationError: x', clock_timestamp())").await;
    let counted: &[Want<'_>] = &[
        (RECEIVED, &[("event_type", "timed")], 1.0),
        (RECEIVED, &[("event_type", "waiting")], 1.0),
        (RECEIVED, &[("event_type", "unstarted")], 1.0),
        (
            COMPLETED,
            &[("event_type", "timed"), ("outcome", "succeeded")],
            1.0,
        ),
        (
            COMPLETED,
            &[("event_type", "unstarted"), ("outcome", "dead_lettered")],
            1.0,
        ),
        ("inbox_backlog_messages", &[("event_type", "waiting")], 1.0),
    ];
    // Checked after the counts and again several polls later: every poll
    // refreshes the gauges, and none may add a series.
    for step in ["the three events are counted", "2 s later"] {
        stays(&agent, step, Duration::from_secs(2), counted).await;
        let m = agent.scrape().await;
        let mut wrong = Vec::new();
        for s in m.series(QUANTILE, &[("source", SOURCE)]) {
            let ty = s.labels.get("event_type").map_or("", String::as_str);
            if ty != "timed" {
                wrong.push(format!(
                    "{:?} = {}: no measured duration",
                    s.labels, s.value
                ));
            }
        }
        for q in ["0.5", "0.95", "0.99"] {
            let got = m.get(
                QUANTILE,
                &[("source", SOURCE), ("event_type", "timed"), ("quantile", q)],
            );
            if !got.is_some_and(|v| (v - 1.5).abs() <= 0.015) {
                wrong.push(format!(
                    "timed, quantile {q}: got {got:?}, want 1.5 within 1 %"
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "after {step}, {QUANTILE}:\n{}",
            wrong.join("\n")
        );
    }
    drop(agent);
    db.cleanup().await;
}
