//! Without a change cursor a poll reads what can have changed, not the backlog
//! (issue 33, docs/metrics.md "Without a change cursor"): a backlog grown to 200,000
//! pending rows in four bulk inserts while consumers keep working on it, on
//! PostgreSQL and MariaDB (to 50,000 on SQLite), with every counter exact and the gauges equal to
//! the table at each of the four checkpoints — and, once it is quiet, each poll
//! reading no more rows than are in flight.
//!
//! Each phase inserts 50,000 pending rows and, on rows of the phase before, does
//! every change a consumer or an operator makes where no time column shows it:
//!
//! * tailed by `started_at` / `finished_at`: a row started and succeeded between two
//!   polls, one started, failed and back in pending between two polls (its attempt
//!   counts), one started and left failed, one started and left processing, one
//!   started and dead-lettered;
//! * seen by the look-up of the rows in flight: the failed rows of the phase before
//!   go back to pending, the processing ones fail with a redelivery (a duplicate
//!   delivery in flight);
//! * seen by the reconcile only: ten dead rows of the phase before re-driven to
//!   pending and 100 pending rows deleted by an operator (gone, not completed).
//!
//! Two sources watch the table: `growth` reconciles every 2 s and must equal the
//! whole truth; `in_flight` reconciles every hour, so what it gets right it gets
//! from the tails and the look-ups alone (a broken look-up leaves it wrong for
//! good), and it must equal the truth without what only a reconcile shows. The
//! counters' ground truth follows from the counting rules (docs/metrics.md) per
//! change; the gauges' is the table itself, read by the test.
//!
//! A backlog that takes longer than `timeout` to read (300,000 rows; `timeout`
//! half of what the test's own read of them takes) is taken by the first
//! poll and re-read and counted by a full reconcile, each within
//! `full_read_timeout`, on PostgreSQL and MariaDB.

use crate::common;

use std::time::{Duration, Instant};

use common::{Agent, Db, Dialect, Metrics, READY_TIMEOUT, schema_indexes, toml_str, wait_until};

/// The source that reconciles every 2 s, and the one that reconciles every hour.
const SOURCE: &str = "growth";
const IN_FLIGHT: &str = "in_flight";
/// Pending rows each phase inserts; four phases grow the backlog to 200,000 —
/// on SQLite to 50,000: without `xmin` every row of a bulk insert is read three
/// times (the tail and the two late-commit slices), and SQLite's time
/// expressions in a debug build under the suite's load take about 0.2 ms a row.
const BATCH: u32 = 50_000;
const SQLITE_BATCH: u32 = 12_500;
const PHASES: u32 = 4;
/// The sources' `overlap`: the longest a write may take to commit and still be
/// read. A statement of [`CHUNK`] rows commits within about 0.1 s on an idle
/// machine; 15 s leaves it room on a loaded one (and [`insert_batch`] checks it).
const OVERLAP_S: u64 = 15;
/// How long after a change no read of the overlap window sees it again: the
/// late-commit slices read up to `overlap` back, the tail up to its commit
/// look-back (1 s) behind a mark `overlap` behind the clock of the poll before,
/// and a poll here can take seconds.
const SETTLED: Duration = Duration::from_secs(OVERLAP_S + 10);

/// The ids `p{phase}-{from}` … `p{phase}-{to}` as an SQL list.
fn ids(phase: u32, from: u32, to: u32) -> String {
    let list: Vec<String> = (from..=to).map(|i| format!("'p{phase}-{i}'")).collect();
    format!("({})", list.join(", "))
}

/// The database's clock an hour ago.
fn an_hour_ago(d: Dialect) -> String {
    match d {
        Dialect::Postgres => format!("{} - INTERVAL '1 hour'", d.clock_sql()),
        Dialect::Mysql => format!("{} - INTERVAL 1 HOUR", d.clock_sql()),
        Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now','-1 hour')".into(),
    }
}

/// Rows per statement of a bulk insert: each statement's rows share one
/// `received_at` (the statement's start), a run that fills the tail's page
/// (`batch_size`, 5,000) and so makes it read the rest of that value.
const CHUNK: u32 = 5_000;

/// Inserts `batch` pending rows `p{phase}-1` … in statements of [`CHUNK`] rows, each
/// received at its statement's `now`. In a CI run beside seven other tests the
/// hourly-reconcile source never saw the rows of one 50,000-row statement on MariaDB:
/// most likely it committed more than 15 s (the `overlap`) after its stamp, so its
/// rows were older than any read of the window when they became visible. A
/// statement's commit must stay inside `overlap`, and each is checked.
async fn insert_batch(db: &Db, t: &str, phase: u32, batch: u32, now: &str) {
    let cols = "(event_id, event_type, status, received_at, attempts, deliveries, updated_at)";
    let mut from = 1;
    while from <= batch {
        let to = (from + CHUNK - 1).min(batch);
        let sql = match db.dialect {
            Dialect::Postgres => format!(
                "INSERT INTO {t} {cols} SELECT 'p{phase}-' || g, \
                 CASE WHEN g % 3 = 0 THEN 'payments.captured' ELSE 'orders.created' END, \
                 'pending', {now}, 0, 1, {now} FROM generate_series({from}, {to}) g"
            ),
            Dialect::Mysql => format!(
                "INSERT INTO {t} {cols} SELECT CONCAT('p{phase}-', seq), \
                 CASE WHEN seq % 3 = 0 THEN 'payments.captured' ELSE 'orders.created' END, \
                 'pending', {now}, 0, 1, {now} FROM seq_{from}_to_{to}"
            ),
            Dialect::Sqlite => format!(
                "WITH RECURSIVE s(g) AS (SELECT {from} UNION ALL SELECT g + 1 FROM s WHERE g < {to}) \
                 INSERT INTO {t} {cols} SELECT 'p{phase}-' || g, \
                 CASE WHEN g % 3 = 0 THEN 'payments.captured' ELSE 'orders.created' END, \
                 'pending', {now}, 0, 1, {now} FROM s"
            ),
        };
        let began = Instant::now();
        let n = db.exec(&sql, &[]).await;
        let took = began.elapsed();
        assert_eq!(
            n,
            u64::from(to - from + 1),
            "the bulk insert of phase {phase}"
        );
        assert!(
            took < Duration::from_secs(OVERLAP_S),
            "HARNESS: inserting rows {from}..={to} of phase {phase} took {took:?} to commit, \
             longer than the {OVERLAP_S} s overlap: rows that old when they commit are left \
             to the reconcile by design"
        );
        from = to + 1;
    }
}

/// The counters' ground truth.
#[derive(Debug, Default, Clone, Copy)]
struct Truth {
    received: f64,
    succeeded: f64,
    dead: f64,
    failures: f64,
    attempts_n: f64,
    attempts_sum: f64,
    deliveries: f64,
    duplicates: f64,
    /// What only a reconcile shows: failed attempts of re-driven rows, rows
    /// re-driven to pending and pending rows deleted.
    redriven_failures: f64,
    redriven: f64,
    deleted: f64,
}

/// Runs one change on rows `p{phase}-{from..=to}` and checks that it changed them all.
async fn change(db: &Db, t: &str, set: &str, phase: u32, range: (u32, u32)) -> f64 {
    let sql = format!(
        "UPDATE {t} SET {set}, updated_at = {} WHERE event_id IN {}",
        db.dialect.clock_sql(),
        ids(phase, range.0, range.1)
    );
    let n = db.exec(&sql, &[]).await;
    assert_eq!(n, u64::from(range.1 - range.0 + 1), "{sql}");
    n as f64
}

/// One phase of the workload: the changes, and what they add to the truth. Returns
/// when it dead-lettered its rows.
async fn phase(
    agent: &Agent,
    db: &Db,
    t: &str,
    k: u32,
    batch: u32,
    truth: &mut Truth,
    dead_before: Option<Instant>,
) -> Instant {
    let now = db.dialect.clock_sql();
    insert_batch(db, t, k, batch, now).await;
    truth.received += f64::from(batch);
    truth.deliveries += f64::from(batch);
    let start = format!("started_at = {now}, attempts = attempts + 1");
    // Started and succeeded between two polls: one attempt, none failed.
    let n = change(
        db,
        t,
        &format!("status = 'succeeded', {start}, finished_at = {now}"),
        k,
        (1, 400),
    )
    .await;
    truth.succeeded += n;
    truth.attempts_n += n;
    truth.attempts_sum += n;
    // Started, failed and back in pending between two polls: its attempt failed.
    let n = change(
        db,
        t,
        &format!("status = 'pending', {start}, last_error = 'TimeoutError: upstream'"),
        k,
        (401, 600),
    )
    .await;
    truth.failures += n;
    // Started and left failed, and started and left processing.
    let n = change(
        db,
        t,
        &format!("status = 'failed', {start}, last_error = 'TimeoutError: upstream'"),
        k,
        (601, 700),
    )
    .await;
    truth.failures += n;
    change(
        db,
        t,
        &format!("status = 'processing', {start}"),
        k,
        (701, 800),
    )
    .await;
    // Started and dead-lettered: one attempt, none failed before it.
    let n = change(
        db,
        t,
        &format!(
            "status = 'dead', {start}, finished_at = {now}, last_error = 'ValidationError: bad order'"
        ),
        k,
        (801, 850),
    )
    .await;
    truth.dead += n;
    truth.attempts_n += n;
    truth.attempts_sum += n;
    let dead_at = Instant::now();
    let Some(dead_before) = dead_before else {
        return dead_at;
    };
    let p = k - 1;
    // The rows in flight of the phase before, changed where no time shows it: the
    // failed ones back to pending (still one failed attempt), the processing ones
    // failed, with a redelivery while in flight.
    change(db, t, "status = 'pending'", p, (601, 700)).await;
    let n = change(
        db,
        t,
        "status = 'failed', last_error = 'TimeoutError: upstream', deliveries = deliveries + 1",
        p,
        (701, 800),
    )
    .await;
    truth.failures += n;
    truth.deliveries += n;
    truth.duplicates += n;
    // Ten dead rows re-driven to pending by hand: a dead row showed its one attempt
    // as the one that finished it, a pending one as failed. Once their times are
    // older than the overlap window, which the tails and their late-commit slices
    // re-read (a re-drive inside it is seen by them, not only by a reconcile).
    tokio::time::sleep_until((dead_before + SETTLED).into()).await;
    settled(agent).await;
    let n = change(db, t, "status = 'pending'", p, (801, 810)).await;
    truth.redriven_failures += n;
    truth.redriven += n;
    // 100 untouched pending rows deleted by an operator: gone, not completed.
    let n = db
        .exec(
            &format!("DELETE FROM {t} WHERE event_id IN {}", ids(p, 901, 1000)),
            &[],
        )
        .await;
    assert_eq!(n, 100);
    truth.deleted += 100.0;
    dead_at
}

/// Waits, after [`SETTLED`], until each source has finished two more polls: a
/// poll under way may have begun before it (one that reads a bulk insert takes
/// seconds beside other suites), and the next one's reads of the overlap window
/// start past the changes.
async fn settled(agent: &Agent) {
    agent.wait_polls(IN_FLIGHT, 2, Duration::ZERO).await;
    agent.wait_polls(SOURCE, 2, Duration::ZERO).await;
}

/// The unfinished rows by status, read from the table: the gauges' ground truth.
async fn backlog(db: &Db, t: &str) -> [f64; 3] {
    let rows = db
        .query(
            &format!(
                "SELECT status, CAST(COUNT(*) AS {{text}}) FROM {t} \
                 WHERE status IN ('pending', 'processing', 'failed') GROUP BY status"
            ),
            &[],
        )
        .await;
    let mut out = [0.0; 3];
    for r in rows {
        let status = r[0].clone().unwrap_or_default();
        let n: f64 = r[1].as_deref().unwrap_or("0").parse().expect("a count");
        let i = ["pending", "processing", "failed"]
            .iter()
            .position(|s| *s == status)
            .expect("an unfinished status");
        out[i] = n;
    }
    out
}

/// Every difference between a scrape and the truth, for `source`: the whole truth
/// for [`SOURCE`], without what only a reconcile shows for [`IN_FLIGHT`].
fn diff(m: &Metrics, source: &str, truth: &Truth, backlog: [f64; 3]) -> Vec<String> {
    let s = ("source", source);
    let (mut backlog, mut truth) = (backlog, *truth);
    if source == SOURCE {
        truth.failures += truth.redriven_failures;
    } else {
        backlog[0] += truth.deleted - truth.redriven;
    }
    let want = [
        ("inbox_messages_received_total", vec![s], truth.received),
        (
            "inbox_messages_completed_total",
            vec![s, ("outcome", "succeeded")],
            truth.succeeded,
        ),
        (
            "inbox_messages_completed_total",
            vec![s, ("outcome", "dead_lettered")],
            truth.dead,
        ),
        ("inbox_attempt_failures_total", vec![s], truth.failures),
        ("inbox_delivery_attempts_count", vec![s], truth.attempts_n),
        ("inbox_delivery_attempts_sum", vec![s], truth.attempts_sum),
        ("inbox_deliveries_total", vec![s], truth.deliveries),
        (
            "inbox_duplicate_deliveries_total",
            vec![s],
            truth.duplicates,
        ),
        (
            "inbox_backlog_messages",
            vec![s, ("status", "pending")],
            backlog[0],
        ),
        (
            "inbox_backlog_messages",
            vec![s, ("status", "processing")],
            backlog[1],
        ),
        (
            "inbox_backlog_messages",
            vec![s, ("status", "failed")],
            backlog[2],
        ),
    ];
    want.iter()
        .filter_map(|(name, labels, v)| {
            let got = m.sum(name, labels);
            (got != *v).then(|| format!("{name}{labels:?}: got {got}, want {v}"))
        })
        .collect()
}

/// Waits until the scrape equals the truth, then checks it still does five polls
/// later (a stalled agent would hold anything).
async fn exact(agent: &Agent, db: &Db, t: &str, truth: &Truth, when: &str) {
    let backlog = backlog(db, t).await;
    let both = |m: &Metrics| {
        let mut d = diff(m, SOURCE, truth, backlog);
        d.extend(diff(m, IN_FLIGHT, truth, backlog));
        d
    };
    // At least 90 s, and ten polls of each source: a full reconcile re-reads the
    // whole backlog, a minute and more beside other suites.
    let res = agent
        .wait_for_polls(&[SOURCE, IN_FLIGHT], Duration::from_secs(90), 10, |m| {
            let d = both(m);
            if d.is_empty() {
                Ok(())
            } else {
                Err(d.join("\n"))
            }
        })
        .await;
    if let Err(e) = res {
        panic!("{when}: the agent is not exact:\n{e}");
    }
    agent.wait_polls(IN_FLIGHT, 5, Duration::from_secs(1)).await;
    let m = agent.wait_polls(SOURCE, 5, Duration::from_secs(1)).await;
    let d = both(&m);
    assert!(d.is_empty(), "{when}, five polls later:\n{}", d.join("\n"));
}

/// `run`'s start line, `/api/v1/status` (`reads`) and the status card say what
/// each poll of a source reads; on PostgreSQL and SQLite the rows in flight
/// are read through the partial index `schema --config` printed, on MariaDB
/// the stuck ones checked through the index on (status, received_at) it
/// printed, and the log says so.
async fn says_what_each_poll_reads(agent: &Agent, dialect: Dialect) {
    let in_flight = match dialect {
        Dialect::Mysql => {
            "looks up the rows in flight by id (the stuck ones only when the index on (status, \
             received_at) shows they changed, where it serves)"
        }
        Dialect::Postgres | Dialect::Sqlite => {
            "reads the rows in flight through the partial index on their start (the stuck \
             ones as ids and statuses, looked up by id only when they changed; all by id where \
             no index serves them)"
        }
    };
    let reads = |every: &str| {
        format!(
            "cursor = \"none\": each poll reads the rows whose received_at, started_at or \
             finished_at passed its watermark, and {in_flight}; every unfinished row only when \
             the reconcile every {every} finds the kept backlog differs"
        )
    };
    let (status, body) = agent
        .get("/api/v1/status")
        .await
        .expect("GET /api/v1/status");
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("the status is JSON");
    let sources = report["sources"].as_array().expect("a list of sources");
    for (name, every) in [(SOURCE, "2s"), (IN_FLIGHT, "1h")] {
        let source = sources
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not in /api/v1/status: {body}"));
        assert_eq!(source["reads"], reads(every), "{name} in /api/v1/status");
        assert!(
            agent
                .stderr()
                .lines()
                .any(|l| l.contains(&reads(every)) && l.contains(&format!("source={name}"))),
            "run does not log what each poll of {name} reads:\n{}",
            agent.stderr()
        );
    }
    // The index each dialect reads the rows in flight through, as `schema
    // --config` names it.
    let (line, index) = match dialect {
        Dialect::Mysql => (
            "The stuck rows in flight are checked through the index on (status, received_at)",
            "_unfinished",
        ),
        Dialect::Postgres | Dialect::Sqlite => (
            "The rows in flight are read through a partial index.",
            "_in_flight",
        ),
    };
    for name in [SOURCE, IN_FLIGHT] {
        let found = wait_until(Duration::from_secs(30), || async {
            let log = agent.stderr();
            log.lines()
                .any(|l| {
                    l.contains(line) && l.contains(index) && l.contains(&format!("source={name}"))
                })
                .then_some(())
                .ok_or_else(|| "no line yet".to_string())
        })
        .await;
        assert!(
            found.is_ok(),
            "{name} does not read the rows in flight through the index:\n{}",
            agent.stderr()
        );
    }
    let (_, page) = agent.get("/").await.expect("GET /");
    let shown = reads("2s").replace('"', "&quot;");
    assert!(
        page.contains(&format!("data-field=\"reads\">{shown}</p>")),
        "the status card does not say what each poll reads:\n{page}"
    );
}

/// Creates the indexes the sources' queries need, as `schema --config` prints
/// them (the tails of received_at, started_at and finished_at), as a user would
/// create them when `doctor` asks.
async fn create_indexes(db: &Db, config: &str) {
    let indexes = schema_indexes(config);
    for column in ["received_at", "started_at", "finished_at"] {
        assert!(
            indexes.iter().any(|l| l.contains(&format!("_{column} ON"))),
            "schema --config prints no index for the tail of {column}:\n{}",
            indexes.join("\n")
        );
    }
    for stmt in &indexes {
        db.exec(stmt, &[]).await;
    }
}

async fn grows_exact(db: Db, batch: u32) {
    let t = db.fresh_tables("growth").await.inbox;
    // Every column but updated_at: cursor = "none".
    let source = |name: &str, reconcile: &str| {
        format!(
            "[[sources]]\nname = \"{name}\"\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
             poll_interval = \"300ms\"\noverlap = \"{OVERLAP_S}s\"\nstate_retention = \"15m\"\n\
             reconcile_every = \"{reconcile}\"\ntimeout = \"20s\"\nmax_tracked_events = 300000\n\
             columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
             received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
             attempts = \"attempts\", deliveries = \"deliveries\", last_error = \"last_error\" }}\n",
            toml_str(&db.dsn),
            toml_str(&t),
        )
    };
    let config = format!("{}\n{}", source(SOURCE, "2s"), source(IN_FLIGHT, "1h"));
    create_indexes(&db, &config).await;
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    says_what_each_poll_reads(&agent, db.dialect).await;
    let mut truth = Truth::default();
    let mut dead_at = None;
    for k in 1..=PHASES {
        dead_at = Some(phase(&agent, &db, &t, k, batch, &mut truth, dead_at).await);
        exact(
            &agent,
            &db,
            &t,
            &truth,
            &format!("after phase {k} ({} rows inserted)", k * batch),
        )
        .await;
    }

    // Quiet, past the overlap window (no late-commit slice left to read): each
    // poll reads the rows in flight (looked up by id) and nothing of the
    // backlog, whose size the aggregate and the count check every 2 s.
    tokio::time::sleep(SETTLED).await;
    settled(&agent).await;
    let [pending, processing, failed] = backlog(&db, &t).await;
    // Each phase's batch less the 650 rows it starts; from the second phase
    // on, 100 failed rows back, 10 dead ones re-driven, 100 deleted.
    let grown =
        f64::from(PHASES * batch) - 650.0 * f64::from(PHASES) + 10.0 * f64::from(PHASES - 1);
    assert_eq!(pending, grown, "the pending rows the workload leaves");
    let in_flight = processing + failed;
    // One window for both sources, a full reconcile (every tenth, 20 s) of
    // `growth` in it.
    let before = agent.scrape().await;
    let after = agent.wait_polls(SOURCE, 40, Duration::from_secs(21)).await;
    for name in [SOURCE, IN_FLIGHT] {
        let rows = |m: &Metrics| m.sum("inboxwatch_rows_read_total", &[("source", name)]);
        let polls = Agent::polls(&after, name) - Agent::polls(&before, name);
        assert!(polls >= 20.0, "{name} ran {polls} polls in 21 s");
        // A poll's duration is recorded before its rows are counted: a
        // scrape in between (the window's first) leaves that poll out of
        // the polls and its rows in. In a cold CI pass whose phases all fell
        // within `max(overlap, stuck_after)`, so that every row in flight was
        // looked up on every poll (exactly the bound), the window held 500
        // rows more than 64 polls' worth: one poll's look-ups, most likely
        // that one's. So at most one poll's more.
        let read = rows(&after) - rows(&before);
        assert!(
            read <= in_flight * (polls + 1.0),
            "{name}: over {polls} quiet polls (reconciles among them) read {read} rows: more \
             than the {in_flight} rows in flight a poll (and one poll's more), with {pending} \
             pending"
        );
        let d = diff(&after, name, &truth, [pending, processing, failed]);
        assert!(d.is_empty(), "{name}, quiet, at the end:\n{}", d.join("\n"));
        // Each reconcile finds the index of the rows in flight again
        // (`reconcile_every` 2 s for SOURCE): it was found every time, and
        // the source never fell back to looking them up by id.
        let fell_back = agent.stderr().lines().any(|l| {
            l.contains("The rows in flight are looked up by id")
                && l.contains(&format!("source={name}"))
        });
        assert!(
            !fell_back,
            "{name} fell back to looking the rows in flight up by id:\n{}",
            agent.stderr()
        );
    }
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_grown_to_200k_is_exact_throughout_postgres() {
    grows_exact(Db::postgres().await, BATCH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_grown_to_200k_is_exact_throughout_mariadb() {
    grows_exact(Db::mysql().await, BATCH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_grown_to_50k_is_exact_throughout_sqlite() {
    grows_exact(Db::sqlite().await, SQLITE_BATCH).await;
}

/// Pending rows received an hour before the agent starts: a backlog whose read
/// takes seconds in a debug build.
const LARGE: u32 = 300_000;
/// Rows that arrive at once once the agent runs: a poll reads them in about
/// a sixth of the time its read of [`LARGE`] takes, some ten times `timeout`.
const BURST: u32 = 50_000;

/// Bounds of `inboxwatch_poll_duration_seconds`' buckets the source's `timeout`
/// is chosen from, so that the buckets tell which polls took longer.
const TIMEOUTS: [f64; 4] = [0.1, 0.25, 0.5, 1.0];

/// The source's `timeout`: about half of what a read of every unfinished row
/// takes here through the test's own client (the agent's reads take more per
/// row: 22 s against the test's 1.5 s beside other suites), rounded down to a
/// bucket bound; its other polls (a count over an index, empty tails) take far
/// less. A third left them 0.5 s, and two cold CI passes on a slower machine
/// each saw one of them take longer beside the other suites.
async fn half_a_full_read(db: &Db, t: &str) -> f64 {
    let started = std::time::Instant::now();
    let columns = [
        "event_id",
        "event_type",
        "status",
        "received_at",
        "started_at",
        "finished_at",
        "attempts",
        "deliveries",
        "last_error",
    ]
    .map(|c| format!("CAST({c} AS {{text}})"))
    .join(", ");
    let rows = db
        .query(
            &format!(
                "SELECT {columns} FROM {t} WHERE status IN ('pending', 'processing', 'failed')"
            ),
            &[],
        )
        .await;
    assert_eq!(rows.len(), LARGE as usize);
    let half = started.elapsed().as_secs_f64() / 2.0;
    TIMEOUTS
        .into_iter()
        .rfind(|b| *b <= half)
        .unwrap_or(TIMEOUTS[0])
}

/// Waits until the source is up with `pending` rows pending and none in
/// flight; panics with `what` and the agent's output otherwise.
async fn up_with_backlog(agent: &Agent, pending: f64, what: &str) {
    let s = ("source", SOURCE);
    let up = wait_until(Duration::from_secs(90), || async {
        let m = agent.try_scrape().await?;
        let got = (
            m.sum("inboxwatch_source_up", &[s]),
            ["pending", "processing", "failed"]
                .map(|status| m.sum("inbox_backlog_messages", &[s, ("status", status)])),
        );
        if got == (1.0, [pending, 0.0, 0.0]) {
            Ok(())
        } else {
            Err(format!(
                "up and the backlog: {got:?}, want (1, [{pending}, 0, 0])"
            ))
        }
    })
    .await;
    if let Err(e) = up {
        panic!("{what}: {e}\n{}", agent.stderr());
    }
}

/// A backlog that takes longer than `timeout` to read: the first poll, which
/// takes it as it is, and a full reconcile, which re-reads and counts it, may
/// take `full_read_timeout`; the polls between stay within `timeout`. Before,
/// the first poll timed out on every try and the source never came up.
async fn full_reads_take_their_own_time_limit(db: Db) {
    let t = db.fresh_tables("fullread").await.inbox;
    let ago = an_hour_ago(db.dialect);
    insert_batch(&db, &t, 0, LARGE, &ago).await;
    if db.dialect == Dialect::Postgres {
        // As autovacuum would: the reconcile's count of the unfinished rows
        // becomes an index-only scan, well within `timeout` beside other suites.
        db.exec(&format!("VACUUM ANALYZE {t}"), &[]).await;
    }
    let timeout = half_a_full_read(&db, &t).await;
    eprintln!("timeout = {timeout} s: about half of a read of the {LARGE} rows here");
    let config = format!(
        "[[sources]]\nname = \"{SOURCE}\"\nkind = \"inbox\"\ndsn = {}\ntable = {}\n\
         poll_interval = \"1s\"\ntimeout = \"{}ms\"\nreconcile_every = \"2s\"\noverlap = \"2s\"\n\
         columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
         received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
         attempts = \"attempts\", deliveries = \"deliveries\", last_error = \"last_error\" }}\n",
        toml_str(&db.dsn),
        toml_str(&t),
        timeout * 1000.0,
    );
    create_indexes(&db, &config).await;
    let agent = Agent::start(&config);
    // Ready once the first poll has read the backlog: seconds here, more than a
    // minute beside other suites, and at most `full_read_timeout` (5 m).
    agent.wait_ready(Duration::from_secs(330)).await;
    let s = ("source", SOURCE);
    let gauges = |m: &Metrics| {
        ["pending", "processing", "failed"]
            .map(|status| m.sum("inbox_backlog_messages", &[s, ("status", status)]))
    };
    let pending = f64::from(LARGE);
    up_with_backlog(&agent, pending, "the first poll did not take the backlog").await;
    // Ten rows started and dead-lettered, read by the tails; once older than
    // the overlap window, seen only by a full reconcile: the ten re-driven to
    // pending (each showed its attempt as the one that finished it, now as
    // failed) and 50 pending rows deleted by an operator (gone, not completed).
    let now = db.dialect.clock_sql();
    change(
        &db,
        &t,
        &format!(
            "status = 'dead', started_at = {now}, finished_at = {now}, attempts = 1, \
             last_error = 'ValidationError: bad order'"
        ),
        0,
        (1, 10),
    )
    .await;
    let dead = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = m.sum(
            "inbox_messages_completed_total",
            &[s, ("outcome", "dead_lettered")],
        );
        if got == 10.0 {
            Ok(())
        } else {
            Err(format!("dead-lettered: {got}, want 10"))
        }
    })
    .await;
    if let Err(e) = dead {
        panic!(
            "the tails did not read the dead rows: {e}\n{}",
            agent.stderr()
        );
    }
    // Past every read of the overlap window (2 s, the tail's 1 s look-back
    // behind the mark of the poll before, a poll).
    tokio::time::sleep(Duration::from_secs(6)).await;
    change(&db, &t, "status = 'pending'", 0, (1, 10)).await;
    let n = db
        .exec(
            &format!("DELETE FROM {t} WHERE event_id IN {}", ids(0, 101, 150)),
            &[],
        )
        .await;
    assert_eq!(n, 50);
    let pending = f64::from(LARGE - 50);
    let want = [
        ("inbox_attempt_failures_total", 10.0),
        ("inbox_messages_received_total", 0.0),
        ("inbox_messages_completed_total", 10.0),
        ("inbox_deliveries_total", 0.0),
    ];
    // At least 90 s, and ten polls: the full reconcile re-reads the whole
    // backlog, as long as the first poll took.
    let reconciled = agent
        .wait_for_polls(&[SOURCE], Duration::from_secs(90), 10, |m| {
            let mut d: Vec<String> = want
                .iter()
                .filter(|(name, v)| m.sum(name, &[s]) != *v)
                .map(|(name, v)| format!("{name}: got {}, want {v}", m.sum(name, &[s])))
                .collect();
            if gauges(m) != [pending, 0.0, 0.0] {
                d.push(format!(
                    "backlog: got {:?}, want [{pending}, 0, 0]",
                    gauges(m)
                ));
            }
            if d.is_empty() {
                Ok(())
            } else {
                Err(d.join("\n"))
            }
        })
        .await;
    reconciled.unwrap_or_else(|e| {
        panic!(
            "the full reconcile did not re-read and count: {e}\n{}",
            agent.stderr()
        )
    });
    // The evidence that this tried what it is about: two polls (the first, the
    // re-read) took longer than `timeout`, and no poll failed. From a scrape after
    // one more poll: a poll's counts show before its duration is recorded (it
    // still commits and restores the statement timeout), and a scrape in between
    // missed the re-read's duration in a cold CI pass.
    let m = agent.wait_polls(SOURCE, 1, Duration::ZERO).await;
    let polls = Agent::polls(&m, SOURCE);
    let le = timeout.to_string();
    let within = m.sum("inboxwatch_poll_duration_seconds_bucket", &[s, ("le", &le)]);
    assert!(
        polls - within >= 2.0,
        "only {} of {polls} polls took longer than the {timeout} s timeout: the backlog of \
         {LARGE} rows was read faster, and this test shows nothing",
        polls - within
    );
    assert_eq!(
        m.sum("inboxwatch_poll_errors_total", &[s]),
        0.0,
        "{}",
        agent.stderr()
    );

    // A burst the next poll must read whole: 50,000 rows arriving at once,
    // longer to read than `timeout`. A poll cut short by its limit is retried
    // with twice the time, up to `full_read_timeout`; before, each retry read
    // the same rows and was cut again, and the burst was never counted. On an
    // agent that checks its backlog hourly (a poll that counts the backlog,
    // every 2 s above, may take `full_read_timeout` and would read the burst
    // whole) with a `timeout` of 100 ms, which its idle polls (a few empty
    // reads) keep and the burst's read does not: the agent's read of 50,000
    // rows took about 1 s here, several beside other suites.
    agent.kill();
    let burst_timeout = 0.1;
    let hourly = config
        .replace("reconcile_every = \"2s\"", "reconcile_every = \"1h\"")
        .replace(
            &format!("timeout = \"{}ms\"", timeout * 1000.0),
            &format!("timeout = \"{}ms\"", burst_timeout * 1000.0),
        );
    assert!(
        hourly.contains("\"1h\"") && hourly.contains("timeout = \"100ms\""),
        "{hourly}"
    );
    let agent = Agent::start(&hourly);
    agent.wait_ready(Duration::from_secs(330)).await;
    up_with_backlog(&agent, pending, "the second agent's first poll").await;
    insert_batch(&db, &t, 1, BURST, now).await;
    let pending = pending + f64::from(BURST);
    let counted = wait_until(Duration::from_secs(180), || async {
        let m = agent.try_scrape().await?;
        let got = (
            m.sum("inbox_messages_received_total", &[s]),
            m.sum("inbox_deliveries_total", &[s]),
            gauges(&m),
        );
        let want = (f64::from(BURST), f64::from(BURST), [pending, 0.0, 0.0]);
        if got == want {
            Ok(m)
        } else {
            Err(format!(
                "received, deliveries and the backlog: {got:?}, want {want:?}"
            ))
        }
    })
    .await;
    let m = counted.unwrap_or_else(|e| {
        panic!(
            "a burst longer to read than `timeout` was not counted: {e}\n{}",
            agent.stderr()
        )
    });
    // The evidence that this tried what it is about: a poll was cut short.
    assert!(
        m.sum("inboxwatch_poll_errors_total", &[s, ("kind", "timeout")]) >= 1.0,
        "no poll was cut short by the {burst_timeout} s timeout: the burst of {BURST} rows was \
         read faster, and this part shows nothing\n{}",
        agent.stderr()
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_reads_take_their_own_time_limit_postgres() {
    full_reads_take_their_own_time_limit(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_reads_take_their_own_time_limit_mariadb() {
    full_reads_take_their_own_time_limit(Db::mysql().await).await;
}
