//! Test bodies shared by the per-dialect test files, plus config builders and the
//! comparisons of gauges and quantiles against direct queries and the ground truth.

use std::time::Duration;

use super::checks::{Expectations, Tol, exact_quantile, render_diff};
use super::workload::{
    Clock, InboxTruth, InboxWorkload, OutboxWorkload, Target, seed_inbox_history,
    seed_outbox_history,
};
use super::{Agent, Db, Dialect, Metrics, READY_TIMEOUT, stays, toml_str, wait_until};

/// Poll interval used by every correctness test.
pub const POLL: Duration = Duration::from_millis(300);
/// Per-poll timeout set in every test config.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the exported counters may take to reach the ground truth.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// Every column of the contract's inbox table mapped to its meaning, as one
/// key of a `[[sources]]` block: an optional meaning is used only when written.
pub const INBOX_COLUMNS: &str = "columns = { event_id = \"event_id\", event_type = \"event_type\", \
     status = \"status\", received_at = \"received_at\", started_at = \"started_at\", \
     finished_at = \"finished_at\", attempts = \"attempts\", deliveries = \"deliveries\", \
     last_error = \"last_error\", traceparent = \"traceparent\", updated_at = \"updated_at\" }\n";

/// Every column of the contract's outbox table, as [`INBOX_COLUMNS`].
pub const OUTBOX_COLUMNS: &str = "columns = { event_id = \"event_id\", event_type = \"event_type\", \
     created_at = \"created_at\", published_at = \"published_at\", traceparent = \"traceparent\", \
     updated_at = \"updated_at\" }\n";

/// One `[[sources]]` block for an inbox table, as every correctness test configures it.
pub fn inbox_source_toml(name: &str, dsn: &str, table: &str) -> String {
    format!(
        "[[sources]]\nname = {}\nkind = \"inbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n\
         overlap = \"10s\"\nstuck_after = \"10m\"\nevent_type_limit = 50\ntimeout = \"2s\"\nquantile_window = \"5m\"\n{INBOX_COLUMNS}\n",
        toml_str(name),
        toml_str(dsn),
        toml_str(table)
    )
}

/// One `[[sources]]` block for an outbox table.
pub fn outbox_source_toml(name: &str, dsn: &str, table: &str) -> String {
    format!(
        "[[sources]]\nname = {}\nkind = \"outbox\"\ndsn = {}\ntable = {}\npoll_interval = \"300ms\"\n\
         overlap = \"10s\"\nevent_type_limit = 50\ntimeout = \"2s\"\n{OUTBOX_COLUMNS}\n",
        toml_str(name),
        toml_str(dsn),
        toml_str(table)
    )
}

/// Waits until the scrape matches `exp`; panics with the diff otherwise.
pub async fn wait_for_expectations(
    agent: &Agent,
    exp: &Expectations,
    timeout: Duration,
    what: &str,
) -> Metrics {
    let res = wait_until(timeout, || async move {
        let m = agent.try_scrape().await?;
        let d = exp.diff(&m);
        if d.is_empty() {
            Ok(m)
        } else {
            Err(format!(
                "{} mismatches (expected vs actual):\n{}",
                d.len(),
                render_diff(&d)
            ))
        }
    })
    .await;
    match res {
        Ok(m) => m,
        Err(e) => panic!("{what}: /metrics did not match the ground truth: {e}"),
    }
}

/// Like [`wait_for_expectations`], but the expectations are recomputed on every
/// attempt (they come from direct queries whose ages move with the clock).
pub async fn wait_for_live<F, Fut>(
    agent: &Agent,
    timeout: Duration,
    what: &str,
    mut make: F,
) -> Metrics
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Expectations>,
{
    let res = wait_until(timeout, || {
        let exp = make();
        async move {
            let m = agent.try_scrape().await?;
            let exp = exp.await;
            let d = exp.diff(&m);
            if d.is_empty() {
                Ok(m)
            } else {
                Err(format!(
                    "{} mismatches (direct query vs /metrics):\n{}",
                    d.len(),
                    render_diff(&d)
                ))
            }
        }
    })
    .await;
    match res {
        Ok(m) => m,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn unfinished_in() -> &'static str {
    "('pending','processing','failed')"
}

fn num(v: &Option<String>) -> f64 {
    v.as_deref()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("expected a number from the database, got {v:?}"))
}

fn txt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

/// Inbox gauges straight from the table: backlog by status, oldest unfinished age
/// (±2 s) and stuck rows (`stuck_after = 10m`), per event type; other series of those
/// gauges for `source` must be absent or 0.
pub async fn inbox_gauge_expectations(db: &Db, table: &str, source: &str) -> Expectations {
    let mut x = Expectations::default();
    let unf = unfinished_in();
    let rows = db
        .query(
            &format!(
                "SELECT CAST(COALESCE(event_type, 'unknown') AS {{text}}), CAST(status AS {{text}}), \
                 CAST(COUNT(*) AS {{text}}) FROM {table} WHERE status IN {unf} \
                 GROUP BY COALESCE(event_type, 'unknown'), status"
            ),
            &[],
        )
        .await;
    for r in &rows {
        x.push(
            "inbox_backlog_messages",
            &[
                ("source", source),
                ("event_type", txt(&r[0])),
                ("status", txt(&r[1])),
            ],
            num(&r[2]),
            Tol::Exact,
        );
    }
    let age = match db.dialect {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM (now() - MIN(received_at))) AS text)",
        Dialect::Mysql => {
            "CAST(TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) / 1000000 AS CHAR)"
        }
        Dialect::Sqlite => {
            "CAST((julianday('now') - julianday(MIN(received_at))) * 86400.0 AS TEXT)"
        }
    };
    let rows = db
        .query(
            &format!(
                "SELECT CAST(COALESCE(event_type, 'unknown') AS {{text}}), {age} FROM {table} \
                 WHERE status IN {unf} GROUP BY COALESCE(event_type, 'unknown')"
            ),
            &[],
        )
        .await;
    for r in &rows {
        x.push(
            "inbox_oldest_unprocessed_age_seconds",
            &[("source", source), ("event_type", txt(&r[0]))],
            num(&r[1]),
            Tol::Abs(2.0),
        );
    }
    let stuck_cond = match db.dialect {
        Dialect::Postgres => "started_at < now() - interval '10 minutes'",
        Dialect::Mysql => "started_at < UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE",
        Dialect::Sqlite => "started_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-10 minutes')",
    };
    let rows = db
        .query(
            &format!(
                "SELECT CAST(COALESCE(event_type, 'unknown') AS {{text}}), CAST(COUNT(*) AS {{text}}) \
                 FROM {table} WHERE status = 'processing' AND {stuck_cond} \
                 GROUP BY COALESCE(event_type, 'unknown')"
            ),
            &[],
        )
        .await;
    for r in &rows {
        x.push(
            "inbox_stuck_messages",
            &[("source", source), ("event_type", txt(&r[0]))],
            num(&r[1]),
            Tol::Exact,
        );
    }
    for name in [
        "inbox_backlog_messages",
        "inbox_oldest_unprocessed_age_seconds",
        "inbox_stuck_messages",
    ] {
        x.close(name, &[("source", source)]);
    }
    x
}

/// Outbox gauges straight from the table: unpublished rows and the oldest
/// unpublished age (±2 s), per event type.
pub async fn outbox_gauge_expectations(db: &Db, table: &str, source: &str) -> Expectations {
    let mut x = Expectations::default();
    let age = match db.dialect {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM (now() - MIN(created_at))) AS text)",
        Dialect::Mysql => {
            "CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1000000 AS CHAR)"
        }
        Dialect::Sqlite => {
            "CAST((julianday('now') - julianday(MIN(created_at))) * 86400.0 AS TEXT)"
        }
    };
    let rows = db
        .query(
            &format!(
                "SELECT CAST(COALESCE(event_type, 'unknown') AS {{text}}), CAST(COUNT(*) AS {{text}}), {age} \
                 FROM {table} WHERE published_at IS NULL GROUP BY COALESCE(event_type, 'unknown')"
            ),
            &[],
        )
        .await;
    for r in &rows {
        let l = [("source", source), ("event_type", txt(&r[0]))];
        x.push("outbox_backlog_messages", &l, num(&r[1]), Tol::Exact);
        x.push(
            "outbox_oldest_unpublished_age_seconds",
            &l,
            num(&r[2]),
            Tol::Abs(2.0),
        );
    }
    x.close("outbox_backlog_messages", &[("source", source)]);
    x.close(
        "outbox_oldest_unpublished_age_seconds",
        &[("source", source)],
    );
    x
}

/// P50/P95/P99 gauges vs sorted[floor(q*(n-1))] of the exact durations, within 1 %.
/// Per event type when the gauge carries `event_type`, else over all events.
pub fn quantile_diff(m: &Metrics, truth: &InboxTruth, source: &str) -> Vec<String> {
    const NAME: &str = "inbox_processing_duration_quantile_seconds";
    let scope = [("source", source)];
    let series: Vec<_> = m.series(NAME, &scope).collect();
    if series.is_empty() {
        return vec![format!("no {NAME} series for source {source:?}")];
    }
    let per_type = series.iter().any(|s| s.labels.contains_key("event_type"));
    let labels: Vec<Option<String>> = if per_type {
        truth.by_type().keys().cloned().map(Some).collect()
    } else {
        vec![None]
    };
    let mut out = Vec::new();
    // Every exported series is of an event type the truth has, at a quantile checked below.
    for s in &series {
        let known_type = s
            .labels
            .get("event_type")
            .is_none_or(|t| labels.iter().flatten().any(|l| l == t));
        let known_q = s
            .labels
            .get("quantile")
            .is_some_and(|q| ["0.5", "0.95", "0.99"].contains(&q.as_str()));
        if !known_type || !known_q {
            out.push(format!(
                "{NAME}{:?}: not a series of the ground truth",
                s.labels
            ));
        }
    }
    for label in labels {
        let sorted = truth.processing_durations(label.as_deref());
        if sorted.is_empty() {
            // Nothing measured: no quantile may be exported for it.
            let mut l: Vec<(&str, &str)> = vec![("source", source)];
            if let Some(t) = label.as_deref() {
                l.push(("event_type", t));
            }
            for s in m.series(NAME, &l) {
                out.push(format!(
                    "{NAME}{:?} = {}: exported for {:?}, which has no measured duration",
                    s.labels,
                    s.value,
                    label.as_deref().unwrap_or("(all)")
                ));
            }
            continue;
        }
        for q in [0.5, 0.95, 0.99] {
            let idx = (q * (sorted.len() - 1) as f64).floor() as usize;
            let want = exact_quantile(&sorted, q);
            let q_txt = q.to_string();
            let mut l: Vec<(&str, &str)> = vec![("source", source), ("quantile", q_txt.as_str())];
            if let Some(t) = label.as_deref() {
                l.push(("event_type", t));
            }
            let got = m.get(NAME, &l);
            let ok = got.is_some_and(|g| (g - want).abs() <= 0.01 * want + 1e-9);
            if !ok {
                out.push(format!(
                    "{NAME}{{event_type={:?},quantile=\"{q}\"}}: expected {want} (sorted[{idx}] of n={}; neighbours {:?} / {:?}) within 1%, got {:?}",
                    label.as_deref().unwrap_or("(all)"),
                    sorted.len(),
                    idx.checked_sub(1).map(|i| sorted[i]),
                    sorted.get(idx + 1),
                    got
                ));
            }
        }
    }
    out
}

/// The inbox ground-truth test body for one dialect: history rows, the agent on a
/// fresh table, the standard workload, then every counter, histogram count and sum,
/// quantile and gauge compared with the truth or a direct query.
pub async fn inbox_ground_truth(db: &Db, short: &str) {
    let tables = db.fresh_tables(short).await;
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: tables.inbox.clone(),
    };
    let history = seed_inbox_history(&target, db.now_ms().await).await;
    let source = format!("{short}-inbox");
    let agent = Agent::start(&inbox_source_toml(&source, &db.dsn, &tables.inbox));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = InboxWorkload::standard().run(&target, clock).await;
    eprintln!("ground truth: {}", truth.summary());
    eprintln!(
        "history rows (never counted, in the gauges): {}",
        history.len()
    );
    let d = inbox_table_diff(db, &tables.inbox, &truth).await;
    assert!(
        d.is_empty(),
        "HARNESS BUG: the table differs from the generator's model:\n{}",
        render_diff(&d)
    );

    let exp = truth.expectations(&source);
    let m = wait_for_expectations(&agent, &exp, CONVERGE, "inbox counters and histograms").await;
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", &source)]),
        Some(1.0),
        "inboxwatch_source_up for a healthy source"
    );

    let q = wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        let d = quantile_diff(&m, &truth, &source);
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(e) = q {
        panic!("processing-duration quantiles do not match the exact durations: {e}");
    }

    let (inbox, src) = (tables.inbox.as_str(), source.as_str());
    wait_for_live(&agent, Duration::from_secs(15), "inbox gauges", || {
        inbox_gauge_expectations(db, inbox, src)
    })
    .await;

    // The counters must not move once the truth is reached: re-reads within the
    // overlap window must not count twice. Watch them for longer than the overlap.
    let stable = stays(Duration::from_secs(12), || async {
        let d = exp.diff(&agent.try_scrape().await?);
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(d) = stable {
        panic!(
            "counters moved after reaching the ground truth (double counting on re-read?):\n{d}"
        );
    }

    drop(agent);
    db.cleanup().await;
}

/// The outbox ground-truth test body for one dialect.
pub async fn outbox_ground_truth(db: &Db, short: &str) {
    let tables = db.fresh_tables(short).await;
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: tables.outbox.clone(),
    };
    let adopt = seed_outbox_history(&target, db.now_ms().await).await;
    let source = format!("{short}-outbox");
    let agent = Agent::start(&outbox_source_toml(&source, &db.dsn, &tables.outbox));
    agent.wait_ready(READY_TIMEOUT).await;

    let clock = Clock::new(db.now_ms().await + 5);
    let truth = OutboxWorkload::standard(adopt).run(&target, clock).await;
    eprintln!("ground truth: {}", truth.summary());

    let exp = truth.expectations(&source);
    wait_for_expectations(&agent, &exp, CONVERGE, "outbox counters and histograms").await;
    let (outbox, src) = (tables.outbox.as_str(), source.as_str());
    wait_for_live(&agent, Duration::from_secs(15), "outbox gauges", || {
        outbox_gauge_expectations(db, outbox, src)
    })
    .await;

    drop(agent);
    db.cleanup().await;
}

fn ts_col(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')")
        }
        Dialect::Mysql => format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"),
        Dialect::Sqlite => col.to_string(),
    }
}

/// Harness self-check: the table holds exactly the states the generator believes it
/// wrote (so a later mismatch with /metrics is the agent's, not the harness's).
pub async fn inbox_table_diff(db: &Db, table: &str, truth: &InboxTruth) -> Vec<String> {
    let d = db.dialect;
    let sql = format!(
        "SELECT CAST(event_id AS {{text}}), CAST(event_type AS {{text}}), CAST(status AS {{text}}), {}, {}, {}, \
         CAST(attempts AS {{text}}), CAST(deliveries AS {{text}}), {} FROM {table}",
        ts_col(d, "received_at"),
        ts_col(d, "started_at"),
        ts_col(d, "finished_at"),
        ts_col(d, "updated_at"),
    );
    let rows = db.query(&sql, &[]).await;
    let by_id: std::collections::HashMap<&str, &Vec<Option<String>>> =
        rows.iter().map(|r| (txt(&r[0]), r)).collect();
    let mut out = Vec::new();
    let t = |v: &Option<String>| v.as_deref().and_then(super::parse_ts);
    for e in &truth.events {
        let Some(r) = by_id.get(e.id.as_str()) else {
            out.push(format!("{}: not in the table", e.id));
            continue;
        };
        let have = (
            r[1].clone(),
            txt(&r[2]).to_string(),
            t(&r[3]),
            t(&r[4]),
            t(&r[5]),
            num(&r[6]) as i32,
            num(&r[7]) as i32,
            t(&r[8]),
        );
        let want = (
            e.event_type.clone(),
            e.status.word().to_string(),
            Some(e.received_ms),
            e.started_ms,
            e.finished_ms,
            e.attempts,
            e.deliveries,
            Some(e.updated_ms),
        );
        if have != want {
            out.push(format!("{}: table {have:?} != model {want:?}", e.id));
        }
    }
    out
}

/// Error texts a workload writes, each with the class the agent must give it under
/// [`ERROR_CLASSES_TOML`] and the built-in classes, and whether that class is retryable.
pub const CLASSED_ERRORS: &[(Option<&str>, &str, bool)] = &[
    (
        Some("TimeoutError: upstream did not answer within 5s"),
        "timeout",
        true,
    ),
    (
        Some("ConnectionResetError: payment gateway reset the connection"),
        "connection",
        true,
    ),
    (
        Some("Rate limit exceeded (429) by billing"),
        "throttled",
        true,
    ),
    (
        Some("HttpError: 503 Service Unavailable from inventory"),
        "server_error",
        true,
    ),
    (
        Some("ValidationError: field `amount` must be positive"),
        "invalid",
        false,
    ),
    (
        Some("HTTP 403 Forbidden: missing scope orders:write"),
        "permission",
        false,
    ),
    (
        Some("duplicate key value violates unique constraint \"orders_pkey\""),
        "conflict",
        false,
    ),
    (
        Some("FraudCheckFailed: card flagged <b>\"4242\"</b>"),
        "fraud_check",
        false,
    ),
    (
        Some("DeadlockDetected: retry the transaction"),
        "other",
        true,
    ),
    (None, "unknown", true),
];

/// A source's own error class, tried before the built-in ones.
pub const ERROR_CLASSES_TOML: &str = "owner = \"team-payments\"\n\
     [[sources.error_classes]]\nclass = \"fraud_check\"\npattern = 'fraud[ _-]?check'\nretryable = false\n";

/// Error classes and owner against the truth: a workload of events that each fail
/// with one fixed text of [`CLASSED_ERRORS`] (or none) for a known number of attempts
/// and end succeeded, dead, failed or in processing, written step by step while the
/// agent polls. `inbox_attempt_failures_total{error_class}`,
/// `inbox_dead_letters_total{error_class}` and
/// `inbox_permanent_error_retries_total{error_class}` must equal the counts the
/// counting rules give for the final rows (each event's text never changes, so the
/// class of every counted failure is its text's), per event type and class, and no
/// other series of them may be non-zero; the info series carries the owner.
pub async fn error_classes_ground_truth(db: &Db, short: &str) {
    use super::workload::{InboxEvent, Status};
    let tables = db.fresh_tables(short).await;
    let source = format!("{short}-classes");
    let config = format!(
        "{}{ERROR_CLASSES_TOML}",
        inbox_source_toml(&source, &db.dsn, &tables.inbox)
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let clock = Clock::new(db.now_ms().await + 5);

    // Event i: 1 + i mod 4 attempts, final status by i mod 5, text (i / 5) mod 10.
    const EVENTS: usize = 120;
    let finals = [
        Status::Dead,
        Status::Succeeded,
        Status::Dead,
        Status::Failed,
        Status::Processing,
    ];
    let mut events: Vec<(InboxEvent, Vec<Status>, usize)> = (0..EVENTS)
        .map(|i| {
            let ev = InboxEvent::pending(
                format!("{short}-cls-{i:04}"),
                Some(["order.created", "order.paid"][i % 2].to_string()),
                clock.now(),
            );
            let attempts = 1 + i % 4;
            let last = finals[i % finals.len()];
            let mut steps = Vec::new();
            for a in 1..=attempts {
                steps.push(Status::Processing);
                if a < attempts {
                    steps.push(Status::Failed);
                    steps.push(Status::Pending);
                }
            }
            match last {
                Status::Failed => steps.push(Status::Failed),
                Status::Processing => {}
                done => steps.push(done),
            }
            (ev, steps, (i / finals.len()) % CLASSED_ERRORS.len())
        })
        .collect();
    for (ev, _, _) in &events {
        let (sql, args) = ev.insert_stmt(db.dialect, &tables.inbox);
        db.pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // Round-robin over the events, one step each, so the agent sees every mix of
    // intermediate and final rows.
    let mut step = 0;
    loop {
        let round = events
            .iter_mut()
            .map(|(ev, steps, text)| (ev, steps.as_slice(), CLASSED_ERRORS[*text].0));
        if !write_step(db, &tables.inbox, &clock, step, round).await {
            break;
        }
        step += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The truth, by the counting rules, from each event's final row.
    let mut truth: std::collections::BTreeMap<(String, &str), [f64; 3]> = Default::default();
    for (ev, _, text) in &events {
        let (_, class, retryable) = CLASSED_ERRORS[*text];
        let failures = ev.attempt_failures();
        let retries = match ev.status {
            Status::Failed | Status::Pending => (failures - 1).max(0),
            _ => failures,
        };
        let t = truth.entry((ev.label(), class)).or_default();
        t[0] += failures as f64;
        t[1] += f64::from(u8::from(ev.status == Status::Dead));
        if !retryable {
            t[2] += retries as f64;
        }
    }
    let mut exp = Expectations::default();
    for ((event_type, class), [failures, dead, retries]) in &truth {
        let l = [
            ("source", source.as_str()),
            ("event_type", event_type.as_str()),
            ("error_class", class),
        ];
        exp.push("inbox_attempt_failures_total", &l, *failures, Tol::Exact);
        exp.push("inbox_dead_letters_total", &l, *dead, Tol::Exact);
        exp.push(
            "inbox_permanent_error_retries_total",
            &l,
            *retries,
            Tol::Exact,
        );
    }
    let dead: f64 = truth.values().map(|t| t[1]).sum();
    exp.push(
        "inbox_messages_completed_total",
        &[("source", &source), ("outcome", "dead_lettered")],
        dead,
        Tol::Exact,
    );
    for name in [
        "inbox_attempt_failures_total",
        "inbox_dead_letters_total",
        "inbox_permanent_error_retries_total",
    ] {
        exp.close(name, &[("source", &source)]);
    }
    exp.push(
        "inboxwatch_source_info",
        &[
            ("source", &source),
            ("kind", "inbox"),
            ("owner", "team-payments"),
            ("service", &source),
        ],
        1.0,
        Tol::Exact,
    );
    let permanent: f64 = truth.values().map(|t| t[2]).sum();
    eprintln!(
        "error classes: {} (event type, class) pairs, {dead} dead letters, {permanent} retries on permanent errors",
        truth.len()
    );
    assert!(
        permanent > 0.0 && dead > 0.0,
        "HARNESS BUG: the workload has no permanent retry or no dead letter"
    );
    let m = wait_for_expectations(&agent, &exp, CONVERGE, "counters by error class").await;
    // Retryable classes have no permanent-retries series at all.
    for (_, class, retryable) in CLASSED_ERRORS {
        if *retryable {
            assert_eq!(
                m.get(
                    "inbox_permanent_error_retries_total",
                    &[("source", &source), ("error_class", class)]
                ),
                None,
                "a retryable class ({class}) has a permanent-retries series"
            );
        }
    }
    let stable = stays(Duration::from_secs(5), || async {
        let d = exp.diff(&agent.try_scrape().await?);
        if d.is_empty() {
            Ok(())
        } else {
            Err(render_diff(&d))
        }
    })
    .await;
    if let Err(d) = stable {
        panic!("counters by class moved after reaching the truth:\n{d}");
    }
}

/// A move to `dead` without a new attempt against the truth: events that fail three
/// attempts with a permanent error, each attempt seen in `processing` and then
/// `failed`, then go from `failed` to `dead` with `attempts` unchanged (the
/// consumer gives up after the third failure), beside events whose last attempt
/// goes from `processing` to `dead` (a new attempt, dead-lettered at once). Each
/// step is written after the agent polled the one before, so the agent sees every
/// status. The move to dead completes the attempt the row showed failed: the retries
/// on permanent errors are `attempts − 1` per event (not one more), the failed
/// attempts are the ones the rows showed failed, each event is delivered once,
/// completes once with `attempts` in the histogram and one dead letter, and
/// `/api/v1/events/{id}` shows exactly `attempts` attempts, the last dead-lettered.
pub async fn dead_without_new_attempt_ground_truth(db: &Db, short: &str) {
    use super::workload::{InboxEvent, Status};
    let tables = db.fresh_tables(short).await;
    let source = format!("{short}-ended");
    let agent = Agent::start(&inbox_source_toml(&source, &db.dsn, &tables.inbox));
    agent.wait_ready(READY_TIMEOUT).await;
    let clock = Clock::new(db.now_ms().await + 5);
    let (text, class, retryable) = CLASSED_ERRORS[4];
    assert!(!retryable, "HARNESS BUG: {class} is retryable");

    // Event i makes 2 + i mod 2 attempts; the first 10 end failed → dead, the
    // other 4 processing → dead.
    const EVENTS: usize = 14;
    const FROM_FAILED: usize = 10;
    let mut events: Vec<(InboxEvent, Vec<Status>)> = (0..EVENTS)
        .map(|i| {
            let ev = InboxEvent::pending(
                format!("{short}-ended-{i:02}"),
                Some("order.paid".to_string()),
                clock.now(),
            );
            let attempts = 2 + i % 2;
            let mut steps = Vec::new();
            for a in 1..=attempts {
                steps.push(Status::Processing);
                if a < attempts || i < FROM_FAILED {
                    steps.push(Status::Failed);
                }
            }
            steps.push(Status::Dead);
            (ev, steps)
        })
        .collect();
    for (ev, _) in &events {
        let (sql, args) = ev.insert_stmt(db.dialect, &tables.inbox);
        db.pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    agent.wait_polls(&source, 2, Duration::ZERO).await;
    let mut step = 0;
    loop {
        let round = events
            .iter_mut()
            .map(|(ev, steps)| (ev, steps.as_slice(), text));
        if !write_step(db, &tables.inbox, &clock, step, round).await {
            break;
        }
        // Two polls: one that began after this step was written.
        agent.wait_polls(&source, 2, Duration::ZERO).await;
        step += 1;
    }

    // The truth, counted from the workload itself.
    let (mut failures, mut retries, mut attempts) = (0.0, 0.0, 0.0);
    for (i, (ev, _)) in events.iter().enumerate() {
        let a = f64::from(ev.attempts);
        attempts += a;
        retries += a - 1.0;
        failures += if i < FROM_FAILED { a } else { a - 1.0 };
    }
    let n = EVENTS as f64;
    let et = [("source", source.as_str()), ("event_type", "order.paid")];
    let classed = [et[0], et[1], ("error_class", class)];
    let mut exp = Expectations::default();
    exp.push(
        "inbox_permanent_error_retries_total",
        &classed,
        retries,
        Tol::Exact,
    );
    exp.push(
        "inbox_attempt_failures_total",
        &classed,
        failures,
        Tol::Exact,
    );
    exp.push("inbox_dead_letters_total", &classed, n, Tol::Exact);
    exp.push("inbox_messages_received_total", &et, n, Tol::Exact);
    exp.push("inbox_deliveries_total", &et, n, Tol::Exact);
    let dead = [et[0], et[1], ("outcome", "dead_lettered")];
    exp.push("inbox_messages_completed_total", &dead, n, Tol::Exact);
    exp.push("inbox_delivery_attempts_count", &et, n, Tol::Exact);
    exp.push("inbox_delivery_attempts_sum", &et, attempts, Tol::Exact);
    for name in [
        "inbox_permanent_error_retries_total",
        "inbox_attempt_failures_total",
        "inbox_dead_letters_total",
    ] {
        exp.close(name, &[("source", &source)]);
    }
    wait_for_expectations(
        &agent,
        &exp,
        CONVERGE,
        "a move to dead without a new attempt",
    )
    .await;

    for (ev, _) in &events {
        let (code, body) = agent
            .get(&format!("/api/v1/events/{}", ev.id))
            .await
            .expect("GET /api/v1/events");
        assert_eq!(code, 200, "{}: {body}", ev.id);
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let shown: Vec<(u64, String)> = v["trajectories"][0]["attempts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        let outcome = x["outcome"].as_str().expect("outcome");
                        (x["number"].as_u64().expect("number"), outcome.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let want: Vec<(u64, String)> = (1..=u64::try_from(ev.attempts).expect("attempts"))
            .map(|k| {
                let last = k == u64::try_from(ev.attempts).expect("attempts");
                (k, if last { "dead_lettered" } else { "failed" }.to_string())
            })
            .collect();
        assert_eq!(
            shown, want,
            "{}: the table says attempts = {}",
            ev.id, ev.attempts
        );
    }
}

/// Writes step `step` of each event that has one — a new attempt in
/// `processing`, the error in `failed` or `dead`, the finish time of a final
/// status — at the clock's time; false when no event had one.
async fn write_step<'a>(
    db: &Db,
    table: &str,
    clock: &Clock,
    step: usize,
    events: impl Iterator<
        Item = (
            &'a mut super::workload::InboxEvent,
            &'a [super::workload::Status],
            Option<&'a str>,
        ),
    >,
) -> bool {
    use super::workload::Status;
    let mut wrote = false;
    for (ev, steps, error) in events {
        let Some(next) = steps.get(step).copied() else {
            continue;
        };
        let t = clock.now();
        ev.updated_ms = t;
        ev.status = next;
        match next {
            Status::Processing => {
                ev.attempts += 1;
                ev.started_ms = Some(t);
            }
            Status::Failed => ev.last_error = error.map(str::to_string),
            Status::Dead => {
                ev.last_error = error.map(str::to_string);
                ev.finished_ms = Some(t);
            }
            Status::Succeeded => ev.finished_ms = Some(t),
            Status::Pending => {}
        }
        let (sql, args) = ev.update_stmt(db.dialect, table);
        db.pool
            .execute(&sql, &args)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        wrote = true;
    }
    wrote
}
