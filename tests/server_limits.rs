//! The listener's and the pages' documented limits and numbers, through the binary
//! (issue 29, item 3).
//!
//! * The status history: `/api/v1/status`'s `history` and the status page's
//!   sparklines hold one sample per 30 s of what `/metrics` said then, and the
//!   idempotency hit rate is duplicates over deliveries (docs/pages.md).
//! * `[server]` keys set to other values than their defaults take effect:
//!   `header_read_timeout`, `max_http_connections`, `max_connections_per_database`
//!   (docs/configuration.md; `tests/http.rs` checks the defaults).
//! * A page request that finds both lookup turns taken gets 503 with `Retry-After`,
//!   while `/metrics` and `/healthz` keep answering.
//!
//! PostgreSQL, except the listener's limits (SQLite). Timings are measured and
//! printed (`--no-capture` shows them).

use crate::common;
// One statement on the test's table (`{t}` is its name).
use common::table_sql as sql;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::http::{HALF_A_SCRAPE, closed_within, connect, read_response, scrape_on};
use common::scenarios::inbox_source_toml;
use common::{Agent, Db, Metrics, READY_TIMEOUT, wait_until};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SOURCE: &str = "limits";

/// How often the status history takes a sample (docs/pages.md: "a sample of those
/// numbers every 30 s").
const SAMPLE_EVERY: Duration = Duration::from_secs(30);

/// The source's sum of `name` over its other labels; `None` when it has no series.
fn sum_of(m: &Metrics, name: &str) -> Option<f64> {
    let labels = [("source", SOURCE)];
    let mut found = m.series(name, &labels).peekable();
    found.peek()?;
    Some(found.map(|s| s.value).sum())
}

/// One series of a source's `history`: a value or null per sample, the current one last.
fn history_of(source: &Value, series: &str) -> Result<Vec<Option<f64>>, String> {
    source["history"][series]
        .as_array()
        .ok_or_else(|| format!("no history.{series} in {source}"))?
        .iter()
        .map(|v| match v {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| format!("history.{series} holds {v}")),
        })
        .collect()
}

/// Samples the history holds now (its backlog series without the current value).
async fn samples_taken(agent: &Agent) -> Result<usize, String> {
    let source = agent.api_source(SOURCE).await?;
    Ok(history_of(&source, "backlog")?.len().saturating_sub(1))
}

/// The points of the sparkline in the status page's `field` row, one list per
/// drawn line (a lone value is a dot), as the page's markup gives them.
fn sparkline_points(page: &str, field: &str) -> Result<Vec<Vec<(f64, f64)>>, String> {
    let cell = format!("<td data-field=\"{field}\">");
    let at = page
        .find(&cell)
        .ok_or_else(|| format!("no {cell} on the page"))?;
    let rest = &page[at + cell.len()..];
    let spark = rest
        .split_once("</td><td>")
        .map(|(_, s)| s)
        .ok_or_else(|| format!("no sparkline cell after {cell}"))?;
    let spark = spark.split_once("</td>").map_or(spark, |(s, _)| s);
    let number = |s: &str| -> Result<f64, String> {
        s.parse()
            .map_err(|e| format!("bad coordinate {s:?} in {spark}: {e}"))
    };
    let mut lines = Vec::new();
    for element in spark.split('<').skip(1) {
        let attr = |name: &str| -> Option<&str> {
            let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
            element[start..].split('"').next()
        };
        if element.starts_with("polyline") {
            let points = attr("points").ok_or_else(|| format!("no points in <{element}"))?;
            let mut line = Vec::new();
            for pair in points.split_whitespace() {
                let (x, y) = pair
                    .split_once(',')
                    .ok_or_else(|| format!("bad point {pair:?}"))?;
                line.push((number(x)?, number(y)?));
            }
            lines.push(line);
        } else if element.starts_with("circle") {
            let x = attr("cx").ok_or_else(|| format!("no cx in <{element}"))?;
            let y = attr("cy").ok_or_else(|| format!("no cy in <{element}"))?;
            lines.push(vec![(number(x)?, number(y)?)]);
        }
    }
    Ok(lines)
}

/// Where a 120 × 24 sparkline puts `values` (docs/pages.md's sparklines: a point per
/// sample, left to right, scaled from min(0, smallest) to the largest; a missing value
/// breaks the line).
fn expected_points(values: &[Option<f64>]) -> Vec<Vec<(f64, f64)>> {
    let finite: Vec<f64> = values.iter().flatten().copied().collect();
    let lo = finite.iter().copied().fold(0.0, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let step = 120.0 / (values.len().max(2) - 1) as f64;
    let mut lines: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => current.push((i as f64 * step, 23.0 - (v - lo) / span * 22.0)),
            None if !current.is_empty() => lines.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// Guards the status history (docs/pages.md: "a sample of those numbers every 30 s
/// for the last hour … they start empty when the agent starts"): the backlog is
/// moved through 2, 5 and 1 pending events, each held across one sample; the
/// history of `/api/v1/status` then holds exactly the samples taken, one per 30 s,
/// each equal to what `/metrics` showed then (a sample that fell between a change
/// and `/metrics` showing it may hold either value), with the current value last;
/// and the status page draws the same values as its backlog sparkline.
///
/// The sample period is a constant (`SAMPLE_EVERY`, no key or variable shortens
/// it), so this takes about 90 s; that the ring keeps at most an hour (120
/// samples) is a unit test of `src/http/status.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_history_holds_a_sample_every_30s_of_what_metrics_showed() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("hist").await.inbox;
    let spawned = Instant::now();
    let agent = Agent::start(&inbox_source_toml(SOURCE, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    let ready = Instant::now();
    let metrics_backlog = || async {
        let m = agent.try_scrape().await?;
        Ok::<_, String>(sum_of(&m, "inbox_backlog_messages"))
    };
    // The empty table's backlog, as /metrics shows it; the startup sample may also
    // predate the first poll (no series yet).
    let empty = metrics_backlog().await.expect("scrape");
    let first = samples_taken(&agent).await.expect("the history at startup");
    assert!(
        first <= 1,
        "{first} samples in the history {:?} after the agent started (one is taken at start)",
        ready - spawned
    );
    // Per sample, the values it may hold: one, or two when it fell between a change
    // and /metrics showing it.
    let mut expected: Vec<Vec<Option<f64>>> = vec![vec![None, empty]; first];
    let mut sampled_at = Vec::new();
    let mut shown = empty;
    let steps: [(&str, &str, f64); 3] = [
        (
            "2 pending events",
            "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
             SELECT 'h' || i, 'order.paid', 'pending', clock_timestamp(), 0, 1, clock_timestamp() \
             FROM generate_series(1, 2) AS i",
            2.0,
        ),
        (
            "3 more pending events",
            "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
             SELECT 'h' || i, 'order.paid', 'pending', clock_timestamp(), 0, 1, clock_timestamp() \
             FROM generate_series(3, 5) AS i",
            5.0,
        ),
        (
            "4 of them completed",
            "UPDATE {t} SET status = 'succeeded', attempts = 1, started_at = clock_timestamp(), \
             finished_at = clock_timestamp(), updated_at = clock_timestamp() \
             WHERE event_id IN ('h1', 'h2', 'h3', 'h4')",
            1.0,
        ),
    ];
    for (what, stmt, backlog) in steps {
        let before = samples_taken(&agent).await.expect("the history");
        while expected.len() < before {
            expected.push(vec![shown]);
        }
        sql(&db, &t, stmt).await;
        wait_until(Duration::from_secs(15), || async {
            match metrics_backlog().await? {
                Some(b) if b == backlog => Ok(()),
                other => Err(format!("backlog {other:?}, want {backlog}")),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("/metrics after {what}: {e}"));
        let after = samples_taken(&agent).await.expect("the history");
        while expected.len() < after {
            expected.push(vec![shown, Some(backlog)]);
        }
        shown = Some(backlog);
        // The next sample is taken while /metrics shows this backlog, and nothing
        // changes it until the sample is in.
        let next = wait_until(SAMPLE_EVERY * 2, || async {
            match samples_taken(&agent).await? {
                n if n > after => Ok(n),
                n => Err(format!("{n} samples")),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("no sample taken after {what}: {e}"));
        sampled_at.push((next, Instant::now()));
        assert_eq!(
            next,
            after + 1,
            "the history grew from {after} to {next} samples at once"
        );
        expected.push(vec![shown]);
        eprintln!(
            "after {what}: sample {next} taken {:?} after the agent was ready",
            ready.elapsed()
        );
    }
    // The samples are SAMPLE_EVERY apart: each awaited one was seen within 100 ms
    // or so of being taken.
    for pair in sampled_at.windows(2) {
        let ((a, at_a), (b, at_b)) = (pair[0], pair[1]);
        let gap = at_b - at_a;
        let want = SAMPLE_EVERY * u32::try_from(b - a).expect("a few samples");
        assert!(
            gap > want - Duration::from_secs(2) && gap < want + Duration::from_secs(2),
            "samples {a} and {b} taken {gap:?} apart (one every {SAMPLE_EVERY:?})"
        );
    }

    // The page and the API read at once (the next sample is some 30 s away).
    let (code, page) = agent.get("/").await.expect("GET /");
    assert_eq!(code, 200, "{page}");
    let source = agent.api_source(SOURCE).await.expect("the status API");
    let history = history_of(&source, "backlog").expect("the backlog history");
    let m = agent.scrape().await;
    assert_eq!(
        sum_of(&m, "inbox_backlog_messages"),
        Some(1.0),
        "the backlog /metrics shows at the end"
    );
    assert_eq!(
        history.len(),
        expected.len() + 1,
        "history.backlog {history:?}: want the {} samples taken and the current value",
        expected.len()
    );
    let wrong: Vec<String> = expected
        .iter()
        .zip(&history)
        .enumerate()
        .filter(|(_, (allowed, got))| !allowed.contains(got))
        .map(|(i, (allowed, got))| format!("sample {i}: {got:?}, want one of {allowed:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "history.backlog {history:?}:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        history.last(),
        Some(&Some(1.0)),
        "the current value ends the history"
    );
    assert_eq!(
        source["numbers"]["backlog"]["pending"].as_f64(),
        Some(1.0),
        "numbers.backlog"
    );

    // The page's sparkline carries the same points.
    let drawn = sparkline_points(&page, "backlog").unwrap_or_else(|e| panic!("{e}\n{page}"));
    let want = expected_points(&history);
    let same = drawn.len() == want.len()
        && drawn.iter().zip(&want).all(|(d, w)| {
            d.len() == w.len()
                && d.iter()
                    .zip(w)
                    .all(|(a, b)| (a.0 - b.0).abs() < 0.051 && (a.1 - b.1).abs() < 0.051)
        });
    assert!(
        same,
        "the page's backlog sparkline {drawn:?} does not draw the history {history:?} (want {want:?})"
    );
    eprintln!(
        "history of {} samples: {history:?}; sparkline {drawn:?}",
        expected.len()
    );
    agent.kill();
    db.cleanup().await;
}

/// Guards the idempotency hit rate of the status API and page (docs/pages.md:
/// `inbox_duplicate_deliveries_total` over `inbox_deliveries_total` since the agent
/// started): 5 events delivered 1, 1, 2, 2 and 2 times (8 deliveries, 3
/// duplicates) give 3/8 on `/metrics`, in the API and on the page (37.5 %); one more
/// redelivery of one of them gives 4/9 (44.4 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_hit_rate_is_duplicates_over_deliveries() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("hitrate").await.inbox;
    let agent = Agent::start(&inbox_source_toml(SOURCE, &db.dsn, &t));
    agent.wait_ready(READY_TIMEOUT).await;
    sql(
        &db,
        &t,
        "INSERT INTO {t} (event_id, event_type, status, received_at, attempts, deliveries, updated_at) \
         VALUES ('d1', 'order.paid', 'pending', clock_timestamp(), 0, 1, clock_timestamp()), \
                ('d2', 'order.paid', 'pending', clock_timestamp(), 0, 1, clock_timestamp()), \
                ('d3', 'order.paid', 'pending', clock_timestamp(), 0, 2, clock_timestamp()), \
                ('d4', 'order.shipped', 'pending', clock_timestamp(), 0, 2, clock_timestamp()), \
                ('d5', 'order.shipped', 'pending', clock_timestamp(), 0, 2, clock_timestamp())",
    )
    .await;
    check_hit_rate(
        &agent,
        "8 deliveries, 3 of them duplicates",
        8.0,
        3.0,
        "37.5",
    )
    .await;
    sql(
        &db,
        &t,
        "UPDATE {t} SET deliveries = deliveries + 1, updated_at = clock_timestamp() \
         WHERE event_id = 'd4'",
    )
    .await;
    check_hit_rate(&agent, "one more redelivery", 9.0, 4.0, "44.4").await;
    agent.kill();
    db.cleanup().await;
}

/// Waits until `/metrics` shows `deliveries` and `duplicates`, then checks the rate
/// they make, the API's numbers and the page's row.
async fn check_hit_rate(
    agent: &Agent,
    step: &str,
    deliveries: f64,
    duplicates: f64,
    percent: &str,
) {
    let rate = duplicates / deliveries;
    let m = wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        let got = (
            sum_of(&m, "inbox_deliveries_total"),
            sum_of(&m, "inbox_duplicate_deliveries_total"),
        );
        if got == (Some(deliveries), Some(duplicates)) {
            Ok(m)
        } else {
            Err(format!(
                "(deliveries, duplicates) = {got:?}, want ({deliveries}, {duplicates})"
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("/metrics after {step}: {e}"));
    let from_scrape = m.sum("inbox_duplicate_deliveries_total", &[("source", SOURCE)])
        / m.sum("inbox_deliveries_total", &[("source", SOURCE)]);
    assert_eq!(
        from_scrape, rate,
        "{step}: duplicates / deliveries on /metrics"
    );

    let source = agent.api_source(SOURCE).await.expect("the status API");
    let n = &source["numbers"];
    let got = (
        n["deliveries_total"].as_f64(),
        n["duplicate_deliveries_total"].as_f64(),
        n["idempotency_hit_rate"].as_f64(),
    );
    assert_eq!(
        got,
        (Some(deliveries), Some(duplicates), Some(rate)),
        "{step}: (deliveries_total, duplicate_deliveries_total, idempotency_hit_rate) of /api/v1/status"
    );

    let (code, page) = agent.get("/").await.expect("GET /");
    assert_eq!(code, 200, "{page}");
    let row = page
        .split_once("<td data-field=\"idempotency_hit_rate\">")
        .and_then(|(_, r)| r.split_once("</td>"))
        .map(|(cell, _)| cell)
        .unwrap_or_else(|| panic!("no idempotency hit rate row on the page:\n{page}"));
    let want = format!(
        "{percent}% <span class=\"muted\">(<span data-value=\"duplicate_deliveries_total\">{duplicates}</span> \
         duplicate of <span data-value=\"deliveries_total\">{deliveries}</span> deliveries since start)</span>"
    );
    assert_eq!(row, want, "{step}: the page's idempotency hit rate");
    eprintln!("{step}: hit rate {rate} on /metrics, the API and the page ({percent}%)");
}

// ---------------------------------------------------------------------------------
// The listener's limits, set to other values than the defaults
// ---------------------------------------------------------------------------------

/// Starts an agent on a fresh SQLite inbox with `server` as its `[server]` section
/// and waits until it is ready.
async fn sqlite_agent(short: &str, server: &str) -> (Agent, Db) {
    let db = Db::sqlite().await;
    let tables = db.fresh_tables(short).await;
    let config = format!(
        "[server]\n{server}\n{}",
        inbox_source_toml(SOURCE, &db.dsn, &tables.inbox)
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    (agent, db)
}

/// Guards `[server] header_read_timeout` set below its default: at `"2s"` a request
/// whose headers never end is closed about 2 s after the connection opened (not
/// before 1.5 s, and long before the default 10 s), while a request whose headers
/// take 1 s to arrive, in two pieces, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_read_timeout_of_2s_closes_a_half_sent_request_after_2s() {
    let (agent, db) = sqlite_agent("hdr", "header_read_timeout = \"2s\"").await;

    let mut half_sent = connect(agent.port).await;
    let opened = Instant::now();
    half_sent
        .write_all(HALF_A_SCRAPE)
        .await
        .expect("write half a request");

    // The control, meanwhile: the same half, the rest 1 s later, is answered.
    let mut slow = connect(agent.port).await;
    slow.write_all(HALF_A_SCRAPE).await.expect("write half");
    tokio::time::sleep(Duration::from_secs(1)).await;
    slow.write_all(b"\r\n").await.expect("write the end");
    assert_eq!(
        read_response(&mut slow).await,
        "HTTP/1.1 200 OK",
        "a request whose headers took 1 s (header_read_timeout 2s)"
    );
    drop(slow);

    let closed = closed_within(&mut half_sent, Duration::from_secs(15))
        .await
        .expect("a half-sent request still open 15 s after it began (header_read_timeout 2s)");
    let after = closed - opened;
    eprintln!("header_read_timeout 2s: the half-sent request was closed after {after:?}");
    assert!(
        after >= Duration::from_millis(1500),
        "a half-sent request was closed after {after:?}, before the 2 s timeout"
    );
    assert!(
        after < Duration::from_secs(6),
        "a half-sent request was closed after {after:?}: not the 2 s timeout (default 10 s)"
    );
    let (code, _) = agent.get("/healthz").await.expect("GET /healthz");
    assert_eq!(code, 200);
    db.cleanup().await;
}

/// Guards `[server] max_http_connections` set below its default: at 3, with 2
/// connections held open a third is served (the control), and with that one kept
/// open too a scrape on a 4th waits; it is answered once one of the 3 closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_http_connections_3_makes_a_4th_connection_wait() {
    // Held connections stay well within the header-read timeout.
    let (agent, db) = sqlite_agent(
        "conns",
        "max_http_connections = 3\nheader_read_timeout = \"60s\"",
    )
    .await;
    let silent_a = connect(agent.port).await;
    let silent_b = connect(agent.port).await;
    let mut third = connect(agent.port).await;
    let third_answer = tokio::time::timeout(Duration::from_secs(10), scrape_on(&mut third))
        .await
        .expect("a scrape on a 3rd connection while 2 are held (max_http_connections 3)");
    assert_eq!(third_answer, "HTTP/1.1 200 OK");

    let mut fourth = connect(agent.port).await;
    let scrape = tokio::spawn(async move {
        let status = scrape_on(&mut fourth).await;
        (status, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !scrape.is_finished(),
        "a scrape on a 4th connection was answered while 3 were held (max_http_connections 3)"
    );
    let released = Instant::now();
    drop(silent_a);
    let (status, answered) = tokio::time::timeout(Duration::from_secs(10), scrape)
        .await
        .expect("the waiting scrape was answered within 10 s of a held connection closing")
        .expect("the scrape task");
    assert_eq!(status, "HTTP/1.1 200 OK");
    eprintln!(
        "max_http_connections 3: the 4th connection's scrape was answered {:?} after one of 3 closed",
        answered - released
    );
    drop((silent_b, third));
    let (code, _) = agent.get("/healthz").await.expect("GET /healthz");
    assert_eq!(code, 200);
    db.cleanup().await;
}

/// Takes an `ACCESS EXCLUSIVE` lock on `table` in a transaction of its own, which
/// the server ends if it stays idle for 20 s: a test that fails while holding it
/// must not leave the lock to block the cleanup's `DROP TABLE` for ever.
async fn lock_table(db: &Db, table: &str) -> common::Conn {
    let mut holder = db.pool.acquire().await;
    holder.raw("BEGIN").await.expect("BEGIN");
    holder
        .raw("SET LOCAL idle_in_transaction_session_timeout = '20s'")
        .await
        .expect("a timeout for the lock's transaction");
    holder
        .execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"), &[])
        .await
        .expect("lock the table");
    holder
}

/// Ends the transaction of [`lock_table`].
async fn release(mut holder: common::Conn) {
    holder.raw("ROLLBACK").await.expect("ROLLBACK");
}

// ---------------------------------------------------------------------------------
// max_connections_per_database
// ---------------------------------------------------------------------------------

/// A PostgreSQL role of its own for one agent, with read access to `table`, so
/// that `pg_stat_activity` tells its sessions from other tests'; returns its name
/// and DSN.
async fn own_role(db: &Db, table: &str) -> (String, String) {
    let role = common::unique_name("iw_pool", "r");
    let dsn = db.select_only_role(&role, "pool", "", table).await;
    (role, dsn)
}

/// The sessions of `role` by `application_name`.
async fn sessions_of(db: &Db, role: &str) -> BTreeMap<String, usize> {
    db.query(
        &format!(
            "SELECT application_name::text, CAST(count(*) AS text) FROM pg_stat_activity \
             WHERE usename = '{role}' GROUP BY application_name"
        ),
        &[],
    )
    .await
    .into_iter()
    .map(|r| {
        let name = r[0].clone().unwrap_or_default();
        let n = r[1].as_deref().and_then(|n| n.parse().ok()).unwrap_or(0);
        (name, n)
    })
    .collect()
}

/// The most sessions of each kind an agent held, over many samples.
#[derive(Debug, Default)]
struct Peak {
    /// Poll sessions (`application_name` `inboxwatch`).
    poll: usize,
    /// The lock session (`inboxwatch-leader`).
    locks: usize,
    /// Every session of the agent's role (one still being set up has no name yet).
    all: usize,
    samples: usize,
}

/// Counts the sessions of `role` into `peak`, then waits 50 ms; returns the poll
/// sessions counted.
async fn sample(db: &Db, role: &str, peak: &mut Peak) -> usize {
    let s = sessions_of(db, role).await;
    let poll = s.get("inboxwatch").copied().unwrap_or(0);
    peak.poll = peak.poll.max(poll);
    peak.locks = peak
        .locks
        .max(s.get("inboxwatch-leader").copied().unwrap_or(0));
    peak.all = peak.all.max(s.values().sum());
    peak.samples += 1;
    tokio::time::sleep(Duration::from_millis(50)).await;
    poll
}

/// Runs 6 sources on one table of one database under `server`, and samples the
/// agent's sessions every 50 ms: 2 s of polling, then while another transaction
/// holds an `ACCESS EXCLUSIVE` lock on the table (every poll waits on it with its
/// session, so the pool opens as many as it may) until `full` poll sessions are
/// open and for 2 s more, then 2 s of polling again.
async fn peak_sessions(server: &str, full: usize) -> Peak {
    let db = Db::postgres().await;
    let t = db.fresh_tables("pool").await.inbox;
    let (role, dsn) = own_role(&db, &t).await;
    let mut config = format!("[server]\n{server}\n");
    for i in 0..6 {
        // A statement timeout longer than the lock is held: no poll fails.
        config.push_str(
            &inbox_source_toml(&format!("{SOURCE}{i}"), &dsn, &t)
                .replace("timeout = \"2s\"", "timeout = \"30s\""),
        );
    }
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    let mut peak = Peak::default();
    let polling = Instant::now();
    while polling.elapsed() < Duration::from_secs(2) {
        sample(&db, &role, &mut peak).await;
    }
    let holder = lock_table(&db, &t).await;
    let locked = Instant::now();
    let mut filled = None;
    while locked.elapsed() < Duration::from_secs(15) {
        let poll = sample(&db, &role, &mut peak).await;
        if poll >= full && filled.is_none() {
            filled = Some(Instant::now());
        }
        if filled.is_some_and(|f| f.elapsed() > Duration::from_secs(2)) {
            break;
        }
    }
    release(holder).await;
    let released = Instant::now();
    while released.elapsed() < Duration::from_secs(2) {
        sample(&db, &role, &mut peak).await;
    }
    let m = agent.scrape().await;
    let errors = m.sum("inboxwatch_poll_errors_total", &[]);
    eprintln!(
        "[server] {server:?}: peak sessions {peak:?}; {full} poll sessions open {:?} after the lock",
        filled.map(|f| f - locked)
    );
    assert_eq!(errors, 0.0, "poll errors under [server] {server:?}");
    assert!(
        filled.is_some(),
        "[server] {server:?}: 6 sources waiting on a locked table never held {full} poll sessions ({peak:?})"
    );
    agent.kill();
    db.cleanup().await;
    peak
}

/// Guards `[server] max_connections_per_database` set below its default: at 2, 6
/// sources on one database never hold more than 2 poll sessions there (plus the
/// one lock session; config/inboxwatch.toml), counted in `pg_stat_activity` by the
/// agent's `application_name` every 50 ms, even while every poll waits on a locked
/// table. The control: at the default (4) the same agent opens 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_per_database_2_bounds_the_poll_sessions() {
    let bounded = peak_sessions("max_connections_per_database = 2", 2).await;
    assert_eq!(
        bounded.poll, 2,
        "poll sessions with max_connections_per_database = 2 ({bounded:?})"
    );
    assert_eq!(bounded.locks, 1, "lock sessions ({bounded:?})");
    assert!(
        bounded.all <= 3,
        "the agent held {} sessions with max_connections_per_database = 2 (2 + 1 for the locks): {bounded:?}",
        bounded.all
    );
    let default = peak_sessions("", 4).await;
    assert_eq!(
        default.poll, 4,
        "poll sessions with the default max_connections_per_database (4): {default:?}"
    );
}

// ---------------------------------------------------------------------------------
// Lookup turns
// ---------------------------------------------------------------------------------

/// One GET with a deadline of its own: status code, response head and body.
async fn get_within(
    port: u16,
    path: &str,
    deadline: Duration,
) -> Result<(u16, String, String), String> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: inboxwatch\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| format!("GET {path}: no answer within {deadline:?}"))??;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no end of headers in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("GET {path}: bad status line in {head:?}"))?;
    Ok((code, head.to_string(), body.to_string()))
}

/// A response header's value.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The event ids a `/api/v1/dead-letters` answer lists, and its errors.
fn dead_letter_ids(body: &str) -> Result<(Vec<String>, Value), String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    let ids = v["dead_letters"]
        .as_array()
        .ok_or_else(|| format!("no dead_letters in {body}"))?
        .iter()
        .map(|d| d["event_id"].as_str().unwrap_or_default().to_string())
        .collect();
    Ok((ids, v["errors"].clone()))
}

/// Guards the lookup turns of the pages (docs/pages.md: "at most two such page
/// requests do at once … one that finds both turns taken waits up to 5 s, then gets
/// 503 with `Retry-After`"): two `/api/v1/dead-letters` requests hang on the inbox
/// table, locked `ACCESS EXCLUSIVE` by another transaction (both seen waiting on
/// the lock in `pg_locks`); a third API request and a `/dead-letters` page request
/// then get 503 with `Retry-After` and the reason, while `/metrics` and `/healthz`
/// answer throughout. Once the lock is released the two hanging requests answer
/// with the table's dead letter, and so does a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_request_that_finds_both_lookup_turns_taken_gets_503() {
    let db = Db::postgres().await;
    let t = db.fresh_tables("turns").await.inbox;
    sql(
        &db,
        &t,
        "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, finished_at, \
         attempts, deliveries, last_error, updated_at) VALUES ('dl-1', 'order.paid', 'dead', \
         clock_timestamp() - interval '2 minutes', clock_timestamp() - interval '1 minute', \
         clock_timestamp() - interval '1 minute', 3, 1, 'TimeoutError: upstream', \
         clock_timestamp() - interval '1 minute')",
    )
    .await;
    // A statement timeout past the pages' own 10 s limit per source.
    let config =
        inbox_source_toml(SOURCE, &db.dsn, &t).replace("timeout = \"2s\"", "timeout = \"30s\"");
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let port = agent.port;
    let lists_the_dead_letter = |what: &str, code: u16, body: &str| {
        assert_eq!(code, 200, "{what}: {body}");
        let (ids, errors) = dead_letter_ids(body).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            ids,
            ["dl-1"],
            "{what}: the dead letters listed (errors {errors})"
        );
    };
    let (code, _, body) = get_within(port, "/api/v1/dead-letters", Duration::from_secs(15))
        .await
        .expect("the dead letters before the lock");
    lists_the_dead_letter("before the lock", code, &body);

    let holder = lock_table(&db, &t).await;
    let locked_at = db
        .query("SELECT CAST(clock_timestamp() AS text)", &[])
        .await[0][0]
        .clone()
        .expect("clock_timestamp()");
    let started = Instant::now();
    let hanging: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                get_within(port, "/api/v1/dead-letters", Duration::from_secs(30)).await
            })
        })
        .collect();
    // Both lookups wait on the lock in sessions opened after it was taken (the
    // agent's poll waits there too, in its older pool session).
    let waiting = format!(
        "SELECT CAST(count(*) AS text) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.relation = '{t}'::regclass AND NOT l.granted AND a.backend_start > '{locked_at}'::timestamptz"
    );
    wait_until(Duration::from_secs(8), || async {
        let n = db.query(&waiting, &[]).await[0][0]
            .clone()
            .unwrap_or_default();
        if n == "2" {
            Ok(())
        } else {
            Err(format!("{n} lookups waiting on the lock"))
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!("the two dead-letter lookups never waited on the locked table: {e}")
    });
    let both_waiting = started.elapsed();

    let third = Instant::now();
    let refused: Vec<_> = [
        "/api/v1/dead-letters",
        &format!("/dead-letters?source={SOURCE}"),
    ]
    .map(|path| {
        let path = path.to_string();
        tokio::spawn(async move {
            let answer = get_within(port, &path, Duration::from_secs(30)).await;
            (path, answer, Instant::now())
        })
    })
    .into_iter()
    .collect();
    // /metrics and /healthz take no turn: they answer while the page requests wait.
    let mut probes = 0;
    while refused.iter().any(|r| !r.is_finished()) {
        for path in ["/metrics", "/healthz"] {
            let (code, body) = agent
                .get(path)
                .await
                .unwrap_or_else(|e| panic!("{path} while both lookup turns are taken: {e}"));
            assert_eq!(
                code, 200,
                "{path} while both lookup turns are taken: {body}"
            );
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut answers = Vec::new();
    for r in refused {
        let (path, answer, at) = r.await.expect("the request task");
        let (code, head, body) = answer.unwrap_or_else(|e| panic!("{path}: {e}"));
        eprintln!(
            "{path}: {code} after {:?} (both turns taken {both_waiting:?} after the lock)",
            at - third
        );
        answers.push((path, code, head, body, at));
    }
    let codes: Vec<(&str, u16)> = answers.iter().map(|a| (a.0.as_str(), a.1)).collect();
    assert!(
        codes.iter().all(|(_, code)| *code == 503),
        "page requests while both lookup turns are taken: {codes:?}, want 503 for each"
    );
    for (path, _, head, body, at) in answers {
        let retry = header(&head, "retry-after")
            .unwrap_or_else(|| panic!("{path}: a 503 without Retry-After: {head}"));
        assert!(
            retry.parse::<u64>().is_ok_and(|s| s > 0),
            "{path}: Retry-After {retry:?} is not a number of seconds"
        );
        assert_eq!(
            body,
            "the agent is already reading the databases for 2 other page requests; retry in a few seconds\n",
            "{path}: the 503's reason"
        );
        assert!(
            at - third >= Duration::from_secs(4),
            "{path}: refused after {:?}, without waiting for a turn (up to 5 s)",
            at - third
        );
    }
    eprintln!("/metrics and /healthz answered {probes} times while the turns were taken");

    release(holder).await;
    let released = started.elapsed();
    for (i, h) in hanging.into_iter().enumerate() {
        let (code, _, body) = h
            .await
            .expect("the request task")
            .unwrap_or_else(|e| panic!("hanging request {i}: {e}"));
        // Each waits 10 s for its source, from after it took its turn.
        if released < Duration::from_secs(9) {
            lists_the_dead_letter(
                &format!("hanging request {i}, lock released after {released:?}"),
                code,
                &body,
            );
        } else {
            assert_eq!(code, 200, "hanging request {i}: {body}");
            eprintln!(
                "hanging request {i}: the lock was held {released:?}, past its 10 s limit: {body}"
            );
        }
    }
    let (code, _, body) = get_within(port, "/api/v1/dead-letters", Duration::from_secs(15))
        .await
        .expect("the dead letters after the lock");
    lists_the_dead_letter("after the lock", code, &body);
    let (code, _, body) = get_within(
        port,
        &format!("/dead-letters?source={SOURCE}"),
        Duration::from_secs(15),
    )
    .await
    .expect("the dead-letters page after the lock");
    assert_eq!(code, 200, "the dead-letters page after the lock: {body}");
    assert!(
        body.contains("dl-1"),
        "the dead-letters page after the lock: {body}"
    );
    agent.kill();
    db.cleanup().await;
}
