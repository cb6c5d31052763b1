//! Reliability and bad input (SPEC §8) against PostgreSQL: a SELECT-only role, a
//! missing table or column next to a healthy source, bad rows, and the database
//! going away in the middle of a workload.

use crate::common;

use std::time::{Duration, Instant};

use common::checks::{Tol, render_diff};
use common::scenarios::{CONVERGE, POLL, POLL_TIMEOUT, inbox_source_toml, wait_for_expectations};
use common::workload::{Clock, EVENT_TYPES, InboxEvent, InboxWorkload, Status, Target};
use common::{
    Agent, Db, Dialect, Metrics, Proxy, READY_TIMEOUT, V, stays, unique_name, url_hostport,
    url_with_hostport, wait_until,
};

fn up(m: &Metrics, source: &str) -> Option<f64> {
    m.get("inboxwatch_source_up", &[("source", source)])
}

fn target(db: &Db, table: &str) -> Target {
    Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: table.to_string(),
    }
}

async fn table_md5(db: &Db, table: &str) -> String {
    db.query(
        &format!("SELECT md5(string_agg(t::text, ',' ORDER BY event_id)) FROM {table} t"),
        &[],
    )
    .await[0][0]
        .clone()
        .expect("md5 of a non-empty table")
}

const RO_PASSWORD: &str = "ro-Secret-7731";

/// Guards "never writes to a watched database" (§2.3, §8): the agent works with a role
/// that has only CONNECT, USAGE and SELECT — it counts a workload exactly, without a
/// poll error or a "permission denied" — and the table's md5 checksum is identical
/// before and after at least ten of its polls with no other writer. Also guards that
/// the DSN password never appears in the agent's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn select_only_role_counts_workload_and_table_checksum_is_unchanged() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("ro").await;
    let role = unique_name("iw_ro", "r");
    let dsn = db
        .select_only_role(&role, RO_PASSWORD, "", &tables.inbox)
        .await;
    let source = "ro-inbox";
    let agent = Agent::start(&inbox_source_toml(source, &dsn, &tables.inbox));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = InboxWorkload::small(300, 2)
        .run(&target(&db, &tables.inbox), clock)
        .await;
    wait_for_expectations(
        &agent,
        &truth.expectations(source),
        CONVERGE,
        "agent with a SELECT-only role",
    )
    .await;

    let before = table_md5(&db, &tables.inbox).await;
    let polls = |m: &Metrics| {
        m.sum(
            "inboxwatch_poll_duration_seconds_count",
            &[("source", source)],
        )
    };
    let p0 = polls(&agent.scrape().await);
    let agent_ref = &agent;
    if let Err(e) = wait_until(Duration::from_secs(30), || async move {
        let p = polls(&agent_ref.try_scrape().await?);
        if p >= p0 + 10.0 {
            Ok(())
        } else {
            Err(format!(
                "inboxwatch_poll_duration_seconds_count{{source={source:?}}} = {p}, waiting for {}",
                p0 + 10.0
            ))
        }
    })
    .await
    {
        panic!("the agent did not poll ten more times: {e}");
    }
    let m = agent.scrape().await;
    assert_eq!(
        m.sum("inboxwatch_poll_errors_total", &[("source", source)]),
        0.0,
        "poll errors with a SELECT-only role"
    );
    agent.kill();
    let after = table_md5(&db, &tables.inbox).await;
    assert_eq!(
        before, after,
        "the table changed while only the agent was connected"
    );
    let out = format!("{}\n{}", agent.stderr(), agent.stdout());
    assert!(
        !out.to_lowercase().contains("permission denied"),
        "the agent tried something a SELECT-only role may not do"
    );
    assert!(
        !out.contains(RO_PASSWORD),
        "the DSN password appears in the agent's output"
    );
    drop(agent);
    db.cleanup().await;
}

/// Guards "missing table or column: that source is down with an error naming the
/// table and column; other sources keep working" (§8): one source on a table that does
/// not exist, one on a table without `finished_at`, one healthy. The broken ones
/// export `inboxwatch_source_up 0` and are named in stderr; the healthy one exports
/// `up 1` and exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_table_or_column_downs_only_that_source_and_names_it() {
    let db = Db::postgres().await;
    let good = db.fresh_tables("ok").await;
    let nocol = db.fresh_tables("nocol").await;
    db.exec(
        &format!("ALTER TABLE {} DROP COLUMN finished_at", nocol.inbox),
        &[],
    )
    .await;
    let absent = unique_name("inbox", "absent");
    let config = [
        inbox_source_toml("healthy", &db.dsn, &good.inbox),
        inbox_source_toml("no-column", &db.dsn, &nocol.inbox),
        inbox_source_toml("no-table", &db.dsn, &absent),
    ]
    .concat();
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    let agent_ref = &agent;
    let states = || async move {
        let m = agent_ref.try_scrape().await?;
        let s = [
            ("healthy", up(&m, "healthy"), 1.0),
            ("no-column", up(&m, "no-column"), 0.0),
            ("no-table", up(&m, "no-table"), 0.0),
        ];
        if s.iter().all(|(_, have, want)| *have == Some(*want)) {
            Ok(())
        } else {
            Err(format!(
                "inboxwatch_source_up (source, actual, expected): {s:?}"
            ))
        }
    };
    if let Err(e) = wait_until(Duration::from_secs(15), states).await {
        panic!("sources' up states: {e}");
    }

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = InboxWorkload::small(200, 2)
        .run(&target(&db, &good.inbox), clock)
        .await;
    wait_for_expectations(
        &agent,
        &truth.expectations("healthy"),
        CONVERGE,
        "the healthy source next to broken ones",
    )
    .await;
    if let Err(e) = states().await {
        panic!("after the workload: {e}");
    }

    let stderr = agent.stderr();
    assert!(
        stderr.contains(&absent),
        "stderr does not name the missing table {absent:?}"
    );
    assert!(
        stderr.contains(&nocol.inbox) && stderr.contains("finished_at"),
        "stderr does not name the table {:?} and its missing column finished_at",
        nocol.inbox
    );
    assert!(agent.exited().is_none(), "the agent exited");
    drop(agent);
    db.cleanup().await;
}

#[allow(clippy::too_many_arguments)]
async fn insert_raw(
    db: &Db,
    table: &str,
    id: &str,
    event_type: &str,
    status: &str,
    received: Option<i64>,
    started: Option<i64>,
    finished: Option<i64>,
    updated: i64,
) {
    let d = db.dialect;
    let ts = |ms: Option<i64>| V::opt_text(ms.map(|ms| d.ts_text(ms)));
    db.exec(
        &format!(
            "INSERT INTO {table} (event_id, event_type, status, received_at, started_at, finished_at, \
             attempts, deliveries, updated_at) VALUES (?, ?, ?, {{ts}}, {{ts}}, {{ts}}, 1, 1, {{ts}})"
        ),
        &[
            V::text(id),
            V::text(event_type),
            V::text(status),
            ts(received),
            ts(started),
            ts(finished),
            ts(Some(updated)),
        ],
    )
    .await;
}

/// Guards "bad rows are counted in inboxwatch_rows_rejected_total{reason}, never a
/// panic" (§8) and "a rejected row is counted once per (event id, updated_at), not once
/// per re-read": NULL received_at (null_time), an unknown status, finished_at before started_at, and a 1 MB last_error (rejected
/// reason last_error_too_long but still counted), written in the middle of a workload.
/// Each reason's count is exact and stays exact past the overlap window; the agent
/// stays up and still counts the good rows exactly. A terminal row without
/// finished_at is not rejected: it counts one completion, with no duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_bad_rows_are_rejected_once_each_and_good_rows_still_count_exactly() {
    bad_rows_are_rejected_once_each(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_bad_rows_are_rejected_once_each_and_good_rows_still_count_exactly() {
    bad_rows_are_rejected_once_each(Db::mysql().await).await;
}

async fn bad_rows_are_rejected_once_each(db: Db) {
    let tables = db.fresh_tables("bad").await;
    let t = tables.inbox.clone();
    let nullable = match db.dialect {
        Dialect::Mysql => format!("ALTER TABLE {t} MODIFY received_at DATETIME(6) NULL"),
        _ => format!("ALTER TABLE {t} ALTER COLUMN received_at DROP NOT NULL"),
    };
    db.exec(&nullable, &[]).await;
    let source = "bad-rows";
    let agent = Agent::start(&inbox_source_toml(source, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let tgt = target(&db, &t);
    let workload = tokio::spawn(async move { InboxWorkload::small(300, 2).run(&tgt, clock).await });

    // In the middle of the workload: once the agent has read some of it.
    let agent_ref = &agent;
    let mid = wait_until(Duration::from_secs(20), || async move {
        let m = agent_ref.try_scrape().await?;
        let read = m.sum("inboxwatch_rows_read_total", &[("source", source)]);
        if read >= 100.0 {
            Ok(())
        } else {
            Err(format!("inboxwatch_rows_read_total = {read}"))
        }
    })
    .await;
    if let Err(e) = mid {
        panic!("the agent did not start reading the workload: {e}");
    }
    // Every time is >= the generator's base, which is after the agent's start S.
    let (base, now) = (clock.base(), clock.now());
    assert!(
        now - base >= 200,
        "the workload has been running for a while"
    );
    let bad = "bad.rows";
    for i in 0..2 {
        let id = format!("bad-null-received-{i}");
        insert_raw(&db, &t, &id, bad, "pending", None, None, None, now).await;
    }
    let id = "bad-done-no-finish";
    insert_raw(
        &db,
        &t,
        id,
        bad,
        "succeeded",
        Some(base),
        Some(now),
        None,
        now,
    )
    .await;
    for i in 0..4 {
        let id = format!("bad-status-{i}");
        insert_raw(&db, &t, &id, bad, "exploded", Some(base), None, None, now).await;
    }
    for i in 0..2 {
        let id = format!("bad-finish-before-start-{i}");
        let (s, f) = (Some(now), Some((base + now) / 2));
        insert_raw(&db, &t, &id, bad, "succeeded", Some(base), s, f, now).await;
    }
    let huge = "E".repeat(1024 * 1024);
    let long_rows: Vec<InboxEvent> = (0..2)
        .map(|i| InboxEvent {
            id: format!("long-error-{i}"),
            event_type: Some(EVENT_TYPES[0].to_string()),
            status: Status::Failed,
            received_ms: base,
            started_ms: Some(now),
            finished_ms: None,
            attempts: 2,
            deliveries: 1,
            last_error: Some(huge.clone()),
            traceparent: None,
            updated_ms: now,
        })
        .collect();
    for ev in &long_rows {
        let (sql, args) = ev.insert_stmt(db.dialect, &t);
        db.pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("insert a 1 MB last_error: {e}"));
    }

    let mut truth = workload.await.expect("the workload panicked");
    truth.add(long_rows);
    let labels: Vec<String> = truth.by_type().keys().cloned().collect();
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let mut exp = truth.expectations_for(source, Some(&labels));
    for (reason, n) in [
        ("null_time", 2.0),
        ("unknown_status", 4.0),
        ("finish_before_start", 2.0),
        ("last_error_too_long", 2.0),
    ] {
        exp.push(
            "inboxwatch_rows_rejected_total",
            &[("source", source), ("reason", reason)],
            n,
            Tol::Exact,
        );
    }
    exp.close("inboxwatch_rows_rejected_total", &[("source", source)]);
    // The final row without a finished time: received and completed once,
    // its attempts observed, no duration.
    let bad_label = [("source", source), ("event_type", bad)];
    for (name, v) in [
        ("inbox_messages_received_total", 1.0),
        ("inbox_delivery_attempts_count", 1.0),
    ] {
        exp.push(name, &bad_label, v, Tol::Exact);
    }
    exp.push(
        "inbox_messages_completed_total",
        &[
            ("source", source),
            ("event_type", bad),
            ("outcome", "succeeded"),
        ],
        1.0,
        Tol::Exact,
    );
    for name in [
        "inbox_processing_duration_seconds_count",
        "inbox_end_to_end_latency_seconds_count",
    ] {
        exp.push(name, &bad_label, 0.0, Tol::Exact);
    }
    wait_for_expectations(&agent, &exp, CONVERGE, "rejections and good rows").await;

    // Past the overlap window (10 s): every row has been re-read many times.
    let exp_ref = &exp;
    let held = stays(Duration::from_secs(12), || async move {
        let m = agent_ref.try_scrape().await?;
        let d = exp_ref.diff(&m);
        if !d.is_empty() {
            return Err(format!("counts moved on re-read:\n{}", render_diff(&d)));
        }
        match up(&m, source) {
            Some(1.0) => Ok(()),
            v => Err(format!(
                "inboxwatch_source_up = {v:?} with bad rows in the table"
            )),
        }
    })
    .await;
    if let Err(e) = held {
        panic!("{e}");
    }
    assert!(agent.exited().is_none(), "the agent exited");
    drop(agent);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_connection_loss_downs_source_and_recovers_without_loss_or_double_count() {
    connection_loss_downs_source_and_recovers_without_loss_or_double_count(Db::postgres().await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_connection_loss_downs_source_and_recovers_without_loss_or_double_count() {
    connection_loss_downs_source_and_recovers_without_loss_or_double_count(Db::mysql().await).await;
}

/// Guards "a database that goes away: the source reports down within two polls,
/// reconnects with backoff, and counts nothing twice afterwards" (§8). The agent
/// reaches PostgreSQL through a proxy; in the middle of a workload the proxy drops
/// every connection and refuses new ones: `inboxwatch_source_up` must drop to 0 (how
/// soon is printed: two poll intervals plus the poll timeout are promised) and stay 0
/// while cut; after the proxy is
/// restored the source comes back by itself, and after the workload every counter is
/// exactly the ground truth (nothing lost, nothing doubled) and stays so.
async fn connection_loss_downs_source_and_recovers_without_loss_or_double_count(db: Db) {
    let tables = db.fresh_tables("cut").await;
    let proxy = Proxy::start(&url_hostport(&db.dsn)).await;
    let dsn = url_with_hostport(&db.dsn, &format!("127.0.0.1:{}", proxy.port));
    let source = "via-proxy";
    let agent = Agent::start(&inbox_source_toml(source, &dsn, &tables.inbox));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let tgt = target(&db, &tables.inbox);
    let mut w = InboxWorkload::small(1500, 3);
    w.late_batches = 2;
    let workload = tokio::spawn(async move { w.run(&tgt, clock).await });

    let agent_ref = &agent;
    let read_some = wait_until(Duration::from_secs(20), || async move {
        let m = agent_ref.try_scrape().await?;
        let read = m.sum("inboxwatch_rows_read_total", &[("source", source)]);
        if read >= 200.0 && up(&m, source) == Some(1.0) {
            Ok(())
        } else {
            Err(format!("rows read {read}, up {:?}", up(&m, source)))
        }
    })
    .await;
    if let Err(e) = read_some {
        panic!("the agent did not start reading the workload through the proxy: {e}");
    }

    let cut_at = Instant::now();
    proxy.cut();
    let down = wait_until(Duration::from_secs(20), || async move {
        let m = agent_ref.try_scrape().await?;
        match up(&m, source) {
            Some(0.0) => Ok(cut_at.elapsed()),
            v => Err(format!("inboxwatch_source_up = {v:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the source never reported down after the cut: {e}"));
    // The first poll that fails sets it to 0 (src/sources/run.rs); how soon that
    // shows is a measurement, printed against the promise: a loaded machine
    // stretches it without a bug, so only the deadline above fails the test.
    let promise = POLL * 2 + POLL_TIMEOUT;
    eprintln!(
        "MEASURED: source reported down {down:?} after the cut (promised within {promise:?})"
    );
    let still_down = stays(Duration::from_secs(3), || async move {
        match up(&agent_ref.try_scrape().await?, source) {
            Some(0.0) => Ok(()),
            v => Err(format!(
                "inboxwatch_source_up = {v:?} while the database is unreachable"
            )),
        }
    })
    .await;
    if let Err(e) = still_down {
        panic!("{e}");
    }

    let restored_at = Instant::now();
    proxy.restore();
    let back = wait_until(Duration::from_secs(30), || async move {
        match up(&agent_ref.try_scrape().await?, source) {
            Some(1.0) => Ok(restored_at.elapsed()),
            v => Err(format!("inboxwatch_source_up = {v:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the source did not come back after the proxy was restored: {e}"));
    eprintln!(
        "source back up {back:?} after restore; proxy (relayed, refused) = {:?}",
        proxy.stats()
    );

    let truth = workload.await.expect("the workload panicked");
    eprintln!("ground truth: {}", truth.summary());
    let exp = truth.expectations(source);
    let m = wait_for_expectations(&agent, &exp, CONVERGE, "counters after a connection loss").await;
    eprintln!(
        "poll errors: {:?}",
        m.series("inboxwatch_poll_errors_total", &[("source", source)])
            .map(|s| s.series() + " " + &s.value.to_string())
            .collect::<Vec<_>>()
    );
    let exp_ref = &exp;
    let held = stays(Duration::from_secs(12), || async move {
        let d = exp_ref.diff(&agent_ref.try_scrape().await?);
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(e) = held {
        panic!("counters moved after reaching the ground truth: {e}");
    }
    drop(agent);
    drop(proxy);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_login_slower_than_timeout_is_waited_for_and_a_full_server_named() {
    slow_logins_are_waited_for(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_a_login_slower_than_timeout_is_waited_for() {
    slow_logins_are_waited_for(Db::mysql().await).await;
}

/// Each new session through the proxy waits this long before the server sees
/// it: longer than the source's `timeout` ([`SLOW_TIMEOUT`]), within the 3 s the
/// lock's session has.
const SLOW_LOGIN: Duration = Duration::from_millis(1500);
const SLOW_TIMEOUT: Duration = Duration::from_secs(1);

/// Guards logins slower than `timeout`, and the cause of a failed login named.
/// Through a proxy that holds every new connection back [`SLOW_LOGIN`] (a
/// loaded server slow to log in), a source whose `timeout` is shorter comes up
/// and counts a workload exactly: its first poll may take `full_read_timeout`,
/// its login 10 s of it. Before, the pool dropped each login at `timeout`,
/// whatever limit the poll had, and the source never came up ("pool timed out
/// while waiting for an open connection"). On PostgreSQL also a role allowed
/// one session, which the lock's takes: the polls fail naming the role's limit,
/// as the server said it, where the pool retried it until its time-out and said
/// only that.
async fn slow_logins_are_waited_for(db: Db) {
    let tables = db.fresh_tables("slowlogin").await;
    let proxy = Proxy::start(&url_hostport(&db.dsn)).await;
    proxy.slow_connects(SLOW_LOGIN);
    let dsn = url_with_hostport(&db.dsn, &format!("127.0.0.1:{}", proxy.port));
    let slow = "slow-login";
    let timeout = format!("timeout = \"{}ms\"", SLOW_TIMEOUT.as_millis());
    let mut config =
        inbox_source_toml(slow, &dsn, &tables.inbox).replace("timeout = \"2s\"", &timeout);
    assert!(config.contains(&timeout), "{config}");
    let full = "one-session";
    let role = unique_name("iw_one", "r");
    if db.dialect == Dialect::Postgres {
        let one = db
            .select_only_role(&role, RO_PASSWORD, " CONNECTION LIMIT 1", &tables.inbox)
            .await;
        config += &inbox_source_toml(full, &one, &tables.inbox);
    }
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = InboxWorkload::small(300, 2)
        .run(&target(&db, &tables.inbox), clock)
        .await;
    let m = wait_for_expectations(
        &agent,
        &truth.expectations(slow),
        CONVERGE,
        "a source whose logins take longer than its timeout",
    )
    .await;
    // The evidence that this tried what it is about: every session the agent
    // opened through the proxy waited longer than `timeout`, and the source's
    // first poll took as long.
    let (relayed, _) = proxy.stats();
    assert!(
        relayed >= 2,
        "the lock's and a poll's sessions: {relayed} relayed"
    );
    let s = ("source", slow);
    let le = SLOW_TIMEOUT.as_secs_f64().to_string();
    let polls = Agent::polls(&m, slow);
    let within = m.sum("inboxwatch_poll_duration_seconds_bucket", &[s, ("le", &le)]);
    assert!(
        polls - within >= 1.0,
        "no poll of {slow} took longer than its {SLOW_TIMEOUT:?} timeout: {within} of {polls}"
    );
    if db.dialect == Dialect::Postgres {
        let said = format!("too many connections for role \"{role}\"");
        let named = wait_until(Duration::from_secs(60), || async {
            let out = agent.stderr();
            let named = out.lines().any(|l| {
                l.contains(&format!("source={full}"))
                    && l.contains("Poll failed")
                    && l.contains(&said)
            });
            if named { Ok(out) } else { Err(out) }
        })
        .await;
        let out = named.unwrap_or_else(|out| {
            panic!("{full}'s polls did not say the role's limit was reached:\n{out}")
        });
        assert!(!out.contains("pool timed out"), "{out}");
        assert_eq!(up(&agent.scrape().await, full), Some(0.0), "{out}");
    }
    drop(agent);
    db.cleanup().await;
}

/// Guards the gauges kept from the tailed rows instead of an aggregate on every poll
/// (SPEC §7 poll cost) and the reconcile that corrects them:
/// * with `reconcile_every = "1h"`, rows the tail reads (a new pending row) show in
///   backlog, oldest age and stuck rows at once, equal to direct queries, while a
///   change the tail cannot see (a row finished without moving `updated_at`, a row
///   deleted) leaves the backlog as it was for 3 s of polls: no aggregate runs per poll;
/// * with `reconcile_every = "2s"` and a backlog over `max_tracked_events` (gauges from
///   the aggregate), the gauges equal direct queries after an unseen delete, after the
///   backlog shrinks under the cap (the map is re-read), after another unseen change
///   (the reconcile finds the difference and re-reads), and after a tailed insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gauges_follow_the_tail_and_the_reconcile_catches_what_it_cannot_see() {
    use common::scenarios::{inbox_gauge_expectations, wait_for_live};
    let db = Db::postgres().await;
    let tables = db.fresh_tables("rec").await;
    let t = tables.inbox.clone();
    let now = db.now_ms().await;
    let old = now - 60_000;
    let rows: [(&str, &str, &str, Option<i64>); 8] = [
        ("p-0", "orders.created", "pending", None),
        ("p-1", "orders.created", "pending", None),
        ("p-2", "orders.created", "pending", None),
        ("p-3", "payments.captured", "pending", None),
        (
            "r-0",
            "payments.captured",
            "processing",
            Some(now - 3_600_000),
        ),
        ("r-1", "orders.created", "processing", Some(now - 1_000)),
        ("f-0", "orders.created", "failed", Some(now - 5_000)),
        ("s-0", "orders.created", "succeeded", Some(now - 5_000)),
    ];
    for (i, (id, et, status, started)) in rows.iter().enumerate() {
        let received = Some(now - 7_200_000 + i as i64 * 1_000);
        let finished = (*status == "succeeded").then_some(now - 4_000);
        insert_raw(&db, &t, id, et, status, received, *started, finished, old).await;
    }
    // Changes the tail cannot see: `updated_at` stays where it was.
    let unseen = |sql: String| {
        let db = &db;
        async move {
            db.exec(&sql, &[]).await;
        }
    };

    let toml = |extra: &str| format!("{}{extra}", inbox_source_toml("rec", &db.dsn, &t));
    let agent = Agent::start(&toml("reconcile_every = \"1h\"\n"));
    agent.wait_ready(READY_TIMEOUT).await;
    wait_for_live(
        &agent,
        Duration::from_secs(15),
        "gauges after the seed",
        || inbox_gauge_expectations(&db, &t, "rec"),
    )
    .await;
    let tick = db.now_ms().await;
    insert_raw(
        &db,
        &t,
        "p-4",
        "orders.created",
        "pending",
        Some(tick),
        None,
        None,
        tick,
    )
    .await;
    wait_for_live(
        &agent,
        Duration::from_secs(15),
        "gauges after a tailed insert",
        || inbox_gauge_expectations(&db, &t, "rec"),
    )
    .await;
    let pending = [
        ("source", "rec"),
        ("event_type", "orders.created"),
        ("status", "pending"),
    ];
    let failed = [
        ("source", "rec"),
        ("event_type", "orders.created"),
        ("status", "failed"),
    ];
    let before = agent.scrape().await;
    assert_eq!(before.get("inbox_backlog_messages", &pending), Some(4.0));
    assert_eq!(before.get("inbox_backlog_messages", &failed), Some(1.0));
    unseen(format!(
        "UPDATE {t} SET status = 'succeeded', started_at = now(), finished_at = now() WHERE event_id = 'p-0'"
    ))
    .await;
    unseen(format!("DELETE FROM {t} WHERE event_id = 'f-0'")).await;
    let agent_ref = &agent;
    let kept = stays(Duration::from_secs(3), || async move {
        let m = agent_ref.try_scrape().await?;
        let got = (
            m.get("inbox_backlog_messages", &pending),
            m.get("inbox_backlog_messages", &failed),
        );
        if got == (Some(4.0), Some(1.0)) {
            Ok(())
        } else {
            Err(format!(
                "backlog (pending, failed) = {got:?} moved on a change the tail cannot see, \
                 with the reconcile an hour away: an aggregate ran on a poll"
            ))
        }
    })
    .await;
    if let Err(e) = kept {
        panic!("{e}");
    }
    drop(agent);

    // Six unfinished rows, a cap of four: the gauges come from the aggregate.
    let agent = Agent::start(&toml("reconcile_every = \"2s\"\nmax_tracked_events = 4\n"));
    agent.wait_ready(READY_TIMEOUT).await;
    let live = |what: &'static str| {
        let (db, t, agent) = (&db, t.as_str(), &agent);
        async move {
            wait_for_live(agent, Duration::from_secs(15), what, || {
                inbox_gauge_expectations(db, t, "rec")
            })
            .await;
        }
    };
    live("gauges over the cap").await;
    unseen(format!("DELETE FROM {t} WHERE event_id = 'p-1'")).await;
    live("gauges over the cap after an unseen delete").await;
    unseen(format!("DELETE FROM {t} WHERE event_id IN ('p-2', 'p-3')")).await;
    live("gauges after the backlog shrank under the cap").await;
    unseen(format!(
        "UPDATE {t} SET status = 'dead', finished_at = now() WHERE event_id = 'r-1'"
    ))
    .await;
    live("gauges after an unseen change under the cap").await;
    let tick = db.now_ms().await;
    insert_raw(
        &db,
        &t,
        "p-5",
        "payments.captured",
        "failed",
        Some(tick),
        Some(tick),
        None,
        tick,
    )
    .await;
    live("gauges after a tailed insert under the cap").await;
    drop(agent);
    db.cleanup().await;
}
