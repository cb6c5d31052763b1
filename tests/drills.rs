//! The fault drills of `inboxwatch demo --drill NAME`, end to end: the demo
//! (on SQLite, or with `--dsn` on PostgreSQL or MariaDB) scraped every second by
//! a real Prometheus that evaluates the repository's rules (`alerts/*.yml`, as
//! they are). For each drill:
//!
//! * before the fault (the first 30 s) no critical alert is pending and nothing
//!   fires but `InboxDeadLetter` (info): the demo's own consumer is quiet;
//! * the alert the drill names goes pending (or firing) after the fault starts,
//!   within the drill's documented time (the deadline here is more generous;
//!   the measured time is printed);
//! * no critical alert the drill does not name is pending or firing;
//! * after the fault's end the consumer recovers by itself: no stuck row, the
//!   backlog drained, no parked key, the replayed batch no longer dead-lettered
//!   (all 60 of it listed before the replay).
//!
//! A quiet run (no drill) fires nothing but `InboxDeadLetter` (info: the demo
//! dead-letters its poison events on purpose). And, through the binary:
//! `--drill list`, an unknown drill, and `--dsn`'s own table — created, dropped
//! at SIGTERM, a foreign table of that name refused untouched, the password
//! never printed — on PostgreSQL and MariaDB, and the tables a `kill -9`'d demo
//! left refused too, with how to drop them (PostgreSQL).
//!
//! Needs `/usr/bin/prometheus` (Debian package `prometheus`), PostgreSQL and
//! MariaDB. Each drill takes about a minute; run with
//! `cargo nextest run --test drills --no-capture` to see the timelines.

use crate::common;

use std::time::{Duration, Instant, SystemTime};

use common::agent::run;
use common::db::Dialect;
use common::library::{drop_database, fresh_database};
use common::stack::{
    PromAlert, Prometheus, START_TIMEOUT, prometheus_yml, render_alerts, rule_file_paths, secs,
};
use common::{Agent, Db, READY_TIMEOUT, wait_until};

/// When every drill's fault starts (docs/drills.md).
const FAULT_START: Duration = Duration::from_secs(30);
/// Added to a drill's documented time for the deadline here: the machine runs
/// four such tests at once on two cores.
const SLACK: Duration = Duration::from_secs(45);
/// The demo's own table on a real database.
const TABLE: &str = "inboxwatch_demo_inbox";
const AUDIT_TABLE: &str = "inboxwatch_demo_inbox_actions";
/// The one alert a quiet demo may fire, and why.
const QUIET_ALLOWED: (&str, &str) = (
    "InboxDeadLetter",
    "info, routed nowhere: the demo's consumer dead-letters a few poison events on purpose",
);

/// The drills as docs/drills.md documents them: name, the alert, within how
/// long of the fault's start it goes pending, and how long the fault lasts.
const DRILLS: &[(&str, &str, u64, u64)] = &[
    ("kill-after-commit", "InboxStuckMessages", 45, 40),
    ("ack-timeout", "InboxAckFailures", 45, 60),
    ("concurrent-delivery", "InboxDuplicateRatioHigh", 45, 60),
    ("downstream-throttling", "InboxRetryStorm", 50, 45),
    ("dead-letter-replay", "InboxDeadLetterSpike", 40, 20),
    ("rebalance", "InboxBacklogNotDraining", 50, 45),
    ("poison-key", "InboxParkedKeys", 30, 60),
];
/// The batch of `dead-letter-replay`: its size and the prefix of its ids.
const BATCH: (usize, &str) = (60, "drill-batch-");
/// After the fault's end, the consumer is back to normal within this long.
const RECOVERY: Duration = Duration::from_secs(90);

fn drill(name: &str) -> (&'static str, Duration, Duration) {
    let (_, alert, within, length) = DRILLS
        .iter()
        .find(|(n, ..)| *n == name)
        .unwrap_or_else(|| panic!("no drill {name} in DRILLS"));
    (
        alert,
        Duration::from_secs(*within),
        Duration::from_secs(*length),
    )
}

/// The sum of a metric's series on the demo.
async fn total(demo: &Agent, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    let m = demo.try_scrape().await?;
    Ok(m.series(name, labels).map(|s| s.value).sum())
}

/// The ids of `dead-letter-replay`'s batch that the dead-letter API lists.
async fn batch_dead_letters(demo: &Agent) -> Result<usize, String> {
    let (code, body) =
        common::http_get(demo.port, "/api/v1/dead-letters?source=demo-inbox&since=1h").await?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("HTTP {code}, not JSON ({e}): {body}"))?;
    Ok(v["dead_letters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| {
            d["event_id"]
                .as_str()
                .is_some_and(|i| i.starts_with(BATCH.1))
        })
        .count())
}

/// What the drill left behind is gone: `Ok(what)` once it is, `Err(what is
/// still there)` before.
async fn recovered(name: &str, demo: &Agent) -> Result<String, String> {
    let stuck = total(demo, "inbox_stuck_messages", &[]).await?;
    let backlog = total(demo, "inbox_backlog_messages", &[]).await?;
    let age = {
        let m = demo.try_scrape().await?;
        m.series("inbox_oldest_unprocessed_age_seconds", &[])
            .map(|s| s.value)
            .fold(0.0, f64::max)
    };
    let state = format!("{stuck} stuck, backlog {backlog}, oldest {age:.1} s");
    let drained = backlog < 60.0 && age < 10.0;
    let ok = match name {
        "kill-after-commit" => stuck == 0.0 && drained,
        "downstream-throttling" | "rebalance" => drained,
        "poison-key" => {
            let parked = total(demo, "inbox_parked_messages", &[]).await?;
            let keys = total(demo, "inbox_parked_keys", &[]).await?;
            if parked != 0.0 || keys != 0.0 {
                return Err(format!("{parked} parked messages of {keys} keys; {state}"));
            }
            drained
        }
        "dead-letter-replay" => {
            let listed = batch_dead_letters(demo).await?;
            let replayed = demo
                .stdout()
                .lines()
                .filter(|l| l.starts_with("replayed ") && l.contains(BATCH.1))
                .count();
            if listed != 0 || replayed != BATCH.0 {
                return Err(format!(
                    "{listed} of the batch still dead-lettered, {replayed} replayed; {state}"
                ));
            }
            drained
        }
        // Nothing stays behind: the duplicates stop with the fault (the test
        // does not wait for its end).
        _ => true,
    };
    if ok { Ok(state) } else { Err(state) }
}

/// An alert's `activeAt` as a time.
fn active_at(a: &PromAlert) -> SystemTime {
    humantime::parse_rfc3339_weak(
        a.active_at
            .trim_end_matches('Z')
            .split('.')
            .next()
            .unwrap_or(""),
    )
    .unwrap_or_else(|e| panic!("activeAt {:?} of {}: {e}", a.active_at, a.brief()))
}

fn is_active(a: &PromAlert) -> bool {
    a.state == "pending" || a.state == "firing"
}

/// Prometheus on the repository's rules, scraping `port`; waits for the first scrape.
async fn prometheus(port: u16) -> Prometheus {
    let rules = rule_file_paths();
    // No Alertmanager: what is pending or firing is read from Prometheus itself.
    let prom = Prometheus::start(&prometheus_yml(&rules, &[port], 9));
    prom.wait_ready().await;
    let p = &prom;
    wait_until(START_TIMEOUT, || async move {
        match p.query("up{job=\"inboxwatch\"} == 1").await? {
            0 => Err("up{job=\"inboxwatch\"} is not 1 yet".to_string()),
            _ => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("Prometheus does not scrape the demo: {e}"));
    // Before its first scrape Prometheus finds no agent up: InboxwatchAbsent goes
    // pending, and clears at the next evaluation.
    wait_until(START_TIMEOUT, || async move {
        let active = p.alerts().await?;
        match active.iter().find(|a| a.name == "InboxwatchAbsent") {
            Some(a) => Err(a.brief()),
            None => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("InboxwatchAbsent does not clear: {e}"));
    prom
}

/// Runs one drill: see the file's comment. `args` are extra arguments (`--dsn`).
async fn drill_case(name: &str, args: &[&str]) {
    let (alert, within, length) = drill(name);
    let t0 = Instant::now();
    let mut all = vec!["--drill", name];
    all.extend_from_slice(args);
    let demo = Agent::demo_with(&all).start();
    demo.wait_ready(READY_TIMEOUT).await;
    let prom = prometheus(demo.port).await;
    eprintln!(
        "+{} {name}: Prometheus scrapes the demo",
        secs(t0.elapsed())
    );

    // The fault starts when the demo says so.
    let fault_start = loop {
        if demo
            .stdout()
            .contains(&format!("Drill {name}: the fault starts now"))
        {
            break (Instant::now(), SystemTime::now());
        }
        if let Some(status) = demo.exited() {
            panic!("the demo exited with {status}:\n{}", demo.stderr());
        }
        // Meanwhile the baseline is quiet: nothing critical, nothing firing but
        // QUIET_ALLOWED. (A warning may go pending: InboxBacklogGrowing's
        // predict_linear over a new source's first samples does, and a ratio over
        // the first seconds' few deliveries; both resolve without firing. The
        // drill's alert counts only if it went pending after the fault's start.)
        let active = prom.alerts().await.unwrap_or_default();
        let loud: Vec<String> = active
            .iter()
            .filter(|a| {
                is_active(a)
                    && (a.severity() == "critical"
                        || (a.state == "firing" && a.name != QUIET_ALLOWED.0))
            })
            .map(PromAlert::brief)
            .collect();
        assert!(
            loud.is_empty(),
            "{name}: before the fault, the demo has alerts pending or firing:\n{}",
            loud.join("\n")
        );
        assert!(
            t0.elapsed() < FAULT_START + READY_TIMEOUT + START_TIMEOUT,
            "{name}: the demo never said that the fault starts:\n{}",
            demo.stdout()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("+{} {name}: the fault starts", secs(t0.elapsed()));
    let deadline = within + SLACK;
    let seen = loop {
        if let Some(status) = demo.exited() {
            panic!("the demo exited with {status}:\n{}", demo.stderr());
        }
        prom.proc.assert_running();
        let active = prom.alerts().await.unwrap_or_default();
        let other_critical: Vec<String> = active
            .iter()
            .filter(|a| is_active(a) && a.severity() == "critical" && a.name != alert)
            .map(PromAlert::brief)
            .collect();
        assert!(
            other_critical.is_empty(),
            "{name}: critical alerts the drill does not name are pending or firing:\n{}",
            other_critical.join("\n")
        );
        // Pending since the fault: the baseline was checked quiet above, and an
        // alert active from before the fault would not be the drill's doing.
        let named = active.iter().find(|a| {
            a.name == alert
                && is_active(a)
                && a.labels.get("source").map(String::as_str) == Some("demo-inbox")
                && active_at(a) + Duration::from_secs(1) >= fault_start.1
        });
        if let Some(a) = named {
            break (fault_start.0.elapsed(), a.clone(), active);
        }
        if fault_start.0.elapsed() > deadline {
            panic!(
                "{name}: {alert} did not go pending within {} of the fault's start \
                 (documented: {}).\nPrometheus alerts:\n{}\ndemo stdout:\n{}",
                secs(deadline),
                secs(within),
                render_alerts(&active),
                demo.stdout()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let (took, a, active) = seen;
    if name == "dead-letter-replay" {
        // Ground truth: the whole batch is dead-lettered before the replay.
        let d = &demo;
        let listed = wait_until(Duration::from_secs(30), || async move {
            match batch_dead_letters(d).await? {
                n if n == BATCH.0 => Ok(n),
                n => Err(format!("{n} of the batch listed")),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: the batch is not dead-lettered: {e}"));
        eprintln!("{name}: {listed} dead letters of the batch listed before the replay");
    }
    // The fault ends, and the consumer recovers by itself; still no critical
    // alert the drill does not name.
    let end = fault_start.0 + length;
    let leaves_state = !matches!(name, "ack-timeout" | "concurrent-delivery");
    let state = loop {
        let now = Instant::now();
        let critical: Vec<String> = prom
            .alerts()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|a| is_active(a) && a.severity() == "critical" && a.name != alert)
            .map(PromAlert::brief)
            .collect();
        assert!(
            critical.is_empty(),
            "{name}: critical alerts the drill does not name are pending or firing:\n{}",
            critical.join("\n")
        );
        if !leaves_state {
            break recovered(name, &demo).await.unwrap_or_default();
        }
        if now >= end {
            match recovered(name, &demo).await {
                Ok(state) => break state,
                Err(e) if now > end + RECOVERY => panic!(
                    "{name}: not recovered within {} of the fault's end: {e}\ndemo stdout:\n{}",
                    secs(RECOVERY),
                    demo.stdout()
                ),
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let recovered_after = Instant::now().saturating_duration_since(end);
    eprintln!(
        "\n===== drill {name}: {alert} {} {} after the fault's start (documented: within {}) \
         =====\n{}\nalerts pending or firing then:\n{}recovered {} after the fault's end ({state})\n\
         total test time: {}\n",
        a.state,
        secs(took),
        secs(within),
        a.brief(),
        render_alerts(&active),
        secs(recovered_after),
        secs(t0.elapsed())
    );
    let status = demo
        .terminate(Duration::from_secs(25))
        .expect("the demo exits within 25 s of SIGTERM");
    assert!(status.success(), "demo exit status after SIGTERM: {status}");
}

/// Runs a drill with `--dsn` on a fresh database of `admin`'s server, checks
/// that the demo's tables are gone afterwards, and drops the database.
async fn drill_on_own_database(admin: Db, drill: &str) {
    let (name, db) = fresh_database(&admin, "drill").await;
    drill_case(drill, &["--dsn", &db.dsn]).await;
    assert_tables_gone(&db).await;
    drop(db);
    drop_database(&admin, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_commit_on_postgres_leaves_stuck_rows() {
    drill_on_own_database(Db::postgres().await, "kill-after-commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_timeout_duplicates_after_completion() {
    drill_case("ack-timeout", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_delivery_duplicates_in_flight() {
    drill_case("concurrent-delivery", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_throttling_is_a_retry_storm() {
    drill_case("downstream-throttling", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_replay_spikes_then_replays() {
    drill_case("dead-letter-replay", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_on_mariadb_ages_the_backlog() {
    drill_on_own_database(Db::mysql().await, "rebalance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_key_is_parked() {
    drill_case("poison-key", &[]).await;
}

/// A quiet run: for as long as a drill's fault would take to start and end,
/// nothing fires but [`QUIET_ALLOWED`], and no critical alert is even pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_demo_fires_nothing() {
    // Longer with INBOXWATCH_TEST_QUIET_SECS (past the 5-minute `for:` of the
    // warnings a new source may set pending).
    let quiet = std::env::var("INBOXWATCH_TEST_QUIET_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90);
    let quiet = Duration::from_secs(quiet);
    let t0 = Instant::now();
    let demo = Agent::demo();
    demo.wait_ready(READY_TIMEOUT).await;
    let prom = prometheus(demo.port).await;
    let start = Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    while start.elapsed() < quiet {
        assert!(
            demo.exited().is_none(),
            "the demo exited:\n{}",
            demo.stderr()
        );
        let active = prom.alerts().await.unwrap_or_default();
        for a in active.iter().filter(|a| is_active(a)) {
            seen.insert(format!("{} {} ({})", a.name, a.state, a.severity()));
            assert!(
                a.severity() != "critical",
                "a quiet demo has a critical alert {}:\n{}",
                a.state,
                render_alerts(&active)
            );
            assert!(
                a.state != "firing" || a.name == QUIET_ALLOWED.0,
                "a quiet demo fires {}:\n{}",
                a.name,
                render_alerts(&active)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "quiet demo, {} watched by Prometheus (test time {}): alerts seen active: {:?} \
         ({} is allowed: {})",
        secs(quiet),
        secs(t0.elapsed()),
        seen,
        QUIET_ALLOWED.0,
        QUIET_ALLOWED.1
    );
}

// ---------------------------------------------------------------------------------
// Through the binary, without Prometheus
// ---------------------------------------------------------------------------------

#[test]
fn drill_list_names_every_drill_with_its_alert() {
    let out = run(["demo", "--drill", "list"]);
    assert!(out.success(), "{}", out.describe());
    for (name, alert, within, length) in DRILLS {
        assert_eq!(
            out.stdout.matches(&format!("\n{name}\n")).count(),
            1,
            "{name} in:\n{}",
            out.stdout
        );
        let block = out
            .stdout
            .split(&format!("\n{name}\n"))
            .nth(1)
            .unwrap_or("");
        let block = block.split("\n\n").next().unwrap_or("");
        assert!(
            block.contains(&format!("alert:  {alert} (pending within {within} s")),
            "{name}'s alert is not {alert} within {within} s:\n{block}"
        );
        assert!(
            block.contains(&format!("fault:  {length} s from +30 s")) && block.contains("signal: "),
            "{name}'s fault does not last {length} s:\n{block}"
        );
    }
    assert_eq!(
        out.stdout.matches("\n  alert:  ").count(),
        DRILLS.len(),
        "{}",
        out.stdout
    );
}

#[test]
fn an_unknown_drill_exits_2_listing_the_drills() {
    let out = run(["demo", "--drill", "kill-9", "--listen", "127.0.0.1:1"]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    let expected = format!(
        "--drill: unknown drill \"kill-9\" (expected one of {}, or list)\n",
        DRILLS.iter().map(|d| d.0).collect::<Vec<_>>().join(", ")
    );
    assert_eq!(out.stderr, expected);
    assert!(out.stdout.is_empty(), "{}", out.describe());
}

/// Tables of `db`'s database named like the demo's.
async fn demo_tables(db: &Db) -> Vec<String> {
    let sql = match db.dialect {
        Dialect::Postgres => format!(
            "SELECT tablename::text FROM pg_tables WHERE tablename IN ('{TABLE}', '{AUDIT_TABLE}') \
             ORDER BY 1"
        ),
        _ => format!(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = \
             DATABASE() AND table_name IN ('{TABLE}', '{AUDIT_TABLE}') ORDER BY 1"
        ),
    };
    db.query(&sql, &[])
        .await
        .into_iter()
        .map(|r| r[0].clone().unwrap_or_default())
        .collect()
}

async fn assert_tables_gone(db: &Db) {
    assert_eq!(
        demo_tables(db).await,
        Vec::<String>::new(),
        "the demo left its tables behind"
    );
}

/// `demo --dsn`: its two tables exist while it runs and the agent reads them;
/// SIGTERM drops them; the password is never printed.
async fn dsn_creates_and_drops(admin: Db, dsn_of: impl Fn(&str) -> String, password: Option<&str>) {
    let (name, db) = fresh_database(&admin, "demo").await;
    let dsn = dsn_of(&db.dsn);
    let demo = Agent::demo_with(&["--dsn", &dsn]).start();
    demo.wait_ready(READY_TIMEOUT).await;
    assert_eq!(demo_tables(&db).await, [TABLE, AUDIT_TABLE]);
    let d = &demo;
    let received = wait_until(Duration::from_secs(30), || async move {
        let m = d.try_scrape().await?;
        let n: f64 = m
            .series("inbox_messages_received_total", &[])
            .map(|s| s.value)
            .sum();
        if n >= 20.0 {
            Ok(n)
        } else {
            Err(format!("{n} received"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the agent does not count the demo's events: {e}"));
    eprintln!("{received} events counted from {TABLE}");
    let status = demo
        .terminate(Duration::from_secs(25))
        .expect("the demo exits within 25 s of SIGTERM");
    assert!(
        status.success(),
        "exit status after SIGTERM: {status}\n{}",
        demo.stderr()
    );
    assert_tables_gone(&db).await;
    if let Some(p) = password {
        for (what, text) in [("stdout", demo.stdout()), ("stderr", demo.stderr())] {
            assert!(
                !text.contains(p),
                "the password is in the demo's {what}:\n{text}"
            );
        }
        assert!(demo.stdout().contains(":***@"), "{}", demo.stdout());
    }
    drop(db);
    drop_database(&admin, &name).await;
}

/// A table of that name that is not the demo's: refused, exit 1, untouched.
async fn foreign_table_refused(admin: Db) {
    let (name, db) = fresh_database(&admin, "foreign").await;
    for sql in [
        format!("CREATE TABLE {TABLE} (id VARCHAR(20) PRIMARY KEY, note VARCHAR(20))"),
        format!("INSERT INTO {TABLE} VALUES ('7', 'mine')"),
    ] {
        db.pool.raw(&sql).await.expect("the user's table");
    }
    let out = run(["demo", "--listen", "127.0.0.1:1", "--dsn", &db.dsn]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "table {TABLE} already exists and was not created by inboxwatch demo"
        )),
        "{}",
        out.describe()
    );
    let rows = db
        .query(&format!("SELECT id, note FROM {TABLE}"), &[])
        .await;
    assert_eq!(
        rows,
        vec![vec![Some("7".to_string()), Some("mine".to_string())]],
        "the user's table was touched"
    );
    assert_eq!(
        demo_tables(&db).await,
        [TABLE],
        "only the user's table is there"
    );
    drop(db);
    drop_database(&admin, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_on_postgres_creates_and_drops_its_table() {
    // Trust authentication takes any password: it must not be printed anyway.
    const PASSWORD: &str = "s3cret-Demo-pw";
    dsn_creates_and_drops(
        Db::postgres().await,
        |dsn| dsn.replacen("://postgres@", &format!("://postgres:{PASSWORD}@"), 1),
        Some(PASSWORD),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_on_mariadb_creates_and_drops_its_table() {
    dsn_creates_and_drops(Db::mysql().await, str::to_owned, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_on_postgres_refuses_a_foreign_table() {
    foreign_table_refused(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_on_mariadb_refuses_a_foreign_table() {
    foreign_table_refused(Db::mysql().await).await;
}

/// A demo killed with SIGKILL leaves its tables: the next demo refuses them too
/// (another demo may be running on them) and says how to drop them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_on_postgres_refuses_a_killed_demos_table_and_says_so() {
    let admin = Db::postgres().await;
    let (name, db) = fresh_database(&admin, "killed").await;
    let demo = Agent::demo_with(&["--dsn", &db.dsn]).start();
    demo.wait_ready(READY_TIMEOUT).await;
    demo.sigkill();
    assert_eq!(
        demo_tables(&db).await,
        [TABLE, AUDIT_TABLE],
        "a killed demo drops nothing"
    );
    let out = run(["demo", "--listen", "127.0.0.1:1", "--dsn", &db.dsn]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "table {TABLE} already exists, created by inboxwatch demo: another demo runs on this \
             database, or one was killed before it could drop it; if none runs, drop it (DROP \
             TABLE {TABLE}) and start again"
        )),
        "{}",
        out.describe()
    );
    assert_eq!(
        demo_tables(&db).await,
        [TABLE, AUDIT_TABLE],
        "refused untouched"
    );
    drop(db);
    drop_database(&admin, &name).await;
}
