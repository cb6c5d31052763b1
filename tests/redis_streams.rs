//! The Redis Streams source (issue 31) against the machine's Redis 7.0 (each
//! test on keys of its own prefix) and private `redis-server`s the tests
//! stop, restart, give a password or TLS: every queue_* series against the
//! ground truth the test wrote (ids with known times, deliveries,
//! acknowledgements, claims, deletions, dead letters), the status of a
//! group that stalls, stops and resumes, the faults (a restart, a stream
//! deleted and made again, a wrong password, a TLS failure), `doctor`, and
//! one owner across agents.

use crate::common;

use std::time::{Duration, Instant};

use common::redis_streams::{PrivateRedis, Redis, ms_of, now_ms, shared_url};
use common::{Agent, Cmd, Metrics, READY_TIMEOUT, unique_name, wait_until};

const MESSAGES: &str = "queue_messages";
const PUBLISHED: &str = "queue_messages_published_total";
const LAG: &str = "queue_consumer_lag_messages";
const LAG_S: &str = "queue_consumer_lag_seconds";
const UNACKED: &str = "queue_consumer_unacked_messages";
const OLDEST: &str = "queue_consumer_oldest_unacked_age_seconds";
const REDELIVERED: &str = "queue_consumer_redelivered_messages";
const SCAN_CUT: &str = "queue_consumer_redelivered_scan_cut";
const CONSUMERS: &str = "queue_consumer_consumers";
const DEAD: &str = "queue_dead_letters_total";
const STATUS: &str = "queue_consumer_status";

/// A `redis_streams` source entry.
fn source(name: &str, url: &str, extra: &str) -> String {
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"redis_streams\"\nurl = \"{url}\"\n\
         poll_interval = \"500ms\"\n{extra}\n"
    )
}

/// A TOML list of strings.
fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// What names one consumer group's series: source, broker, stream, group.
type Labels<'a> = [(&'a str, &'a str); 4];

/// The labels of one consumer group's series.
fn group<'a>(src: &'a str, stream: &'a str, g: &'a str) -> Labels<'a> {
    [
        ("source", src),
        ("broker", "redis"),
        ("queue", stream),
        ("consumer", g),
    ]
}

fn status_of(m: &Metrics, src: &str, stream: &str, g: &str) -> Option<String> {
    m.series(STATUS, &group(src, stream, g))
        .find(|s| s.value == 1.0)
        .map(|s| s.labels["status"].clone())
}

/// The age in seconds of an id stamped `ms`, seen at `from` and at `to`:
/// the bounds of a value the agent computed between the two.
fn ages(ms: u64, from: u64, to: u64) -> std::ops::RangeInclusive<f64> {
    (from as f64 - ms as f64) / 1000.0..=(to as f64 - ms as f64) / 1000.0
}

/// Ground truth: two streams with two groups each, written with ids of
/// known times, and a third written with explicit ids that are no times.
/// `orders`: group `billing` was delivered 120 entries, acknowledged 80, 10
/// of its pending ones were claimed by a second consumer (redelivered), and
/// 5 of its undelivered entries were deleted (Redis then cannot say its lag:
/// it is counted from ids); group `audit` read and acknowledged everything.
/// `payments`: `billing` read and acknowledged 50 of 200; `audit` has no
/// consumer and read nothing. After the first poll, entries are added to
/// `orders` and to both dead-letter streams (`payments:dead` had 3 entries
/// before the agent started, which are not counted). Every series equals the
/// truth: counts exact, seconds between the ages at the writes and at the
/// scrape, on the same clock as the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_equals_the_ground_truth_of_two_streams_and_two_groups() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let p = unique_name("rs", "gt");
    let (orders, payments, manual) = (
        format!("{p}:orders"),
        format!("{p}:payments"),
        format!("{p}:manual"),
    );
    let (orders_dead, payments_dead) = (format!("{p}:orders:dead"), format!("{p}:payments:dead"));
    let base = now_ms() - 600_000;
    let t: Vec<u64> = (0..300).map(|i| base + i * 1000).collect();
    let pt: Vec<u64> = (0..200).map(|i| base + 50 + i * 1500).collect();
    let ids: Vec<String> = t.iter().map(|ms| r.add_at(&orders, *ms)).collect();
    assert_eq!(ms_of(&ids[7]), t[7], "an entry's id is its time");
    for ms in &pt {
        r.add_at(&payments, *ms);
    }
    r.group(&orders, "billing", "0");
    r.group(&orders, "audit", "0");
    let delivered = r.deliver(&orders, "billing", "c1", 120);
    assert_eq!(delivered, ids[..120]);
    r.ack(&orders, "billing", &delivered[..80]);
    r.claim(&orders, "billing", "c2", &delivered[80..90]);
    let all = r.deliver(&orders, "audit", "a1", 300);
    r.ack(&orders, "audit", &all);
    let mut xdel = vec!["XDEL", orders.as_str()];
    xdel.extend(ids[200..205].iter().map(String::as_str));
    let deleted: i64 = r.cmd(&xdel);
    assert_eq!(deleted, 5);
    let info: redis::Value = r.cmd(&["XINFO", "GROUPS", &orders]);
    assert!(
        format!("{info:?}").contains("nil"),
        "Redis cannot say billing's lag after the XDEL: {info:?}"
    );
    r.group(&payments, "billing", "0");
    r.group(&payments, "audit", "0");
    let read = r.deliver(&payments, "billing", "b1", 50);
    r.ack(&payments, "billing", &read);
    for seq in 1..=5 {
        let _: String = r.cmd(&["XADD", &manual, &format!("1-{seq}"), "n", "1"]);
    }
    r.group(&manual, "g", "0");
    let m1 = r.deliver(&manual, "g", "c1", 2);
    r.ack(&manual, "g", &m1[..1]);
    for _ in 0..3 {
        r.add(&payments_dead);
    }

    let config = source(
        "rgt",
        &url,
        &format!(
            "streams = {}\ndead_letter_streams = {{ \"{orders}\" = \"{orders_dead}\", \"{payments}\" = \"{payments_dead}\" }}\n",
            list(&[&orders, &payments, &manual])
        ),
    ) + &source(
        // The same streams with tight bounds: the redelivery scan and the
        // count of a lag Redis cannot say both cut.
        "rgc",
        &url,
        &format!(
            "streams = {}\nredelivery_scan_limit = 5\nlag_count_limit = 100\n",
            list(&[&orders])
        ),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let o = orders.as_str();
    let first = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        m.get(LAG, &group("rgt", o, "billing"))
            .map(|_| m.clone())
            .ok_or_else(|| "no lag yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let published_before = first
        .get(PUBLISHED, &[("source", "rgt"), ("queue", o)])
        .expect("orders has a published counter");

    // After the first poll: 4 entries more on orders, 7 dead letters of
    // orders (its dead-letter stream is new), 2 more of payments.
    let written = now_ms();
    let more: Vec<u64> = (0..4).map(|k| base + 300_000 + k * 1000).collect();
    for ms in &more {
        r.add_at(&orders, *ms);
    }
    for _ in 0..7 {
        r.add(&orders_dead);
    }
    for _ in 0..2 {
        r.add(&payments_dead);
    }

    let (ps, ms_, mn) = (payments.as_str(), manual.as_str(), "rgt");
    let exact: Vec<(&str, Labels<'_>, f64)> = vec![
        (LAG, group(mn, o, "billing"), 179.0),
        (UNACKED, group(mn, o, "billing"), 40.0),
        (REDELIVERED, group(mn, o, "billing"), 10.0),
        (CONSUMERS, group(mn, o, "billing"), 2.0),
        (LAG, group(mn, o, "audit"), 4.0),
        (UNACKED, group(mn, o, "audit"), 0.0),
        (OLDEST, group(mn, o, "audit"), 0.0),
        (REDELIVERED, group(mn, o, "audit"), 0.0),
        (CONSUMERS, group(mn, o, "audit"), 1.0),
        (LAG, group(mn, ps, "billing"), 150.0),
        (UNACKED, group(mn, ps, "billing"), 0.0),
        (CONSUMERS, group(mn, ps, "billing"), 1.0),
        (LAG, group(mn, ps, "audit"), 200.0),
        (UNACKED, group(mn, ps, "audit"), 0.0),
        (CONSUMERS, group(mn, ps, "audit"), 0.0),
        (LAG, group(mn, ms_, "g"), 3.0),
        (UNACKED, group(mn, ms_, "g"), 1.0),
        (SCAN_CUT, group(mn, o, "billing"), 0.0),
        (SCAN_CUT, group("rgc", o, "billing"), 1.0),
        (REDELIVERED, group("rgc", o, "billing"), 5.0),
        (LAG, group("rgc", o, "billing"), 100.0),
    ];
    let m = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let mut diffs = Vec::new();
        for (name, labels, want) in &exact {
            let got = m.get(name, labels);
            if got != Some(*want) {
                diffs.push(format!("{name}{labels:?}: {got:?}, want {want}"));
            }
        }
        for (q, want) in [(o, 299.0), (ps, 200.0), (ms_, 5.0)] {
            let got = m.get(
                MESSAGES,
                &[("source", mn), ("broker", "redis"), ("queue", q)],
            );
            if got != Some(want) {
                diffs.push(format!("{MESSAGES} {q}: {got:?}, want {want}"));
            }
        }
        for (q, want) in [(o, 7.0), (ps, 2.0)] {
            let got = m.get(
                DEAD,
                &[
                    ("source", mn),
                    ("queue", q),
                    ("reason", "dead_letter_stream"),
                ],
            );
            if got != Some(want) {
                diffs.push(format!("{DEAD} {q}: {got:?}, want {want}"));
            }
        }
        let published = m.get(PUBLISHED, &[("source", mn), ("queue", o)]);
        if published != Some(published_before + 4.0) {
            diffs.push(format!(
                "{PUBLISHED} orders: {published:?}, want {published_before} + 4"
            ));
        }
        if diffs.is_empty() {
            Ok(m)
        } else {
            Err(diffs.join("\n"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let scraped = now_ms();

    for (labels, ms, what) in [
        (
            group(mn, o, "billing"),
            t[120],
            "lag seconds: the first undelivered entry",
        ),
        (
            group(mn, o, "audit"),
            more[0],
            "lag seconds: the first added entry",
        ),
        (
            group(mn, ps, "billing"),
            pt[50],
            "lag seconds: the 51st entry",
        ),
        (
            group(mn, ps, "audit"),
            pt[0],
            "lag seconds: the first entry",
        ),
    ] {
        let got = m.get(LAG_S, &labels).unwrap_or(f64::NAN);
        let want = ages(ms, written, scraped);
        assert!(
            want.contains(&got),
            "{labels:?} {what}: {got}, want {want:?}"
        );
    }
    let got = m.get(OLDEST, &group(mn, o, "billing")).unwrap_or(f64::NAN);
    let want = ages(t[80], written, scraped);
    assert!(
        want.contains(&got),
        "oldest unacknowledged of billing: {got}, want {want:?} (entry 80)"
    );
    assert_eq!(
        m.get(LAG_S, &group(mn, ps, "billing")).map(|_| ()),
        Some(()),
        "a lagging group has lag seconds"
    );
    assert_eq!(m.get(OLDEST, &group(mn, ps, "billing")), Some(0.0));
    // Explicit ids are not times: no seconds, and a warning naming the stream.
    assert_eq!(m.get(LAG_S, &group(mn, ms_, "g")), None);
    assert_eq!(m.get(OLDEST, &group(mn, ms_, "g")), None);
    let stderr = agent.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("not times") && l.contains(ms_) && l.contains("source=rgt"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning naming the stream of explicit ids, once:\n{stderr}"
    );

    // The bounds: 5 pending entries scanned of 40 (all 5 redelivered: the
    // claimed ones come first), said cut; 100 ids counted of 179, said in a
    // warning once.
    let cut_warnings = stderr
        .lines()
        .filter(|l| l.contains("lag_count_limit = 100") && l.contains("source=rgc"))
        .count();
    assert_eq!(cut_warnings, 1, "{stderr}");

    // The status card and its API read the same numbers.
    let api = agent.api_source("rgt").await.expect("the source's status");
    let billing = api["numbers"]["consumers"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["queue"] == o && c["consumer"] == "billing")
        })
        .cloned()
        .unwrap_or_else(|| panic!("no orders/billing on the card: {api}"));
    assert_eq!(billing["lag_messages"], 179.0, "{api}");
    assert_eq!(billing["unacked"], 40.0, "{api}");
    r.del(&[&orders, &payments, &manual, &orders_dead, &payments_dead]);
}

/// ok while the consumer acknowledges; stall once it keeps reading without
/// acknowledging for a window (consumers present); ok when it acknowledges
/// again; stop once its consumer is deleted (`XGROUP DELCONSUMER`) with
/// entries undelivered; a group on an idle stream with nothing pending
/// stays ok throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stalls_stops_and_resumes_and_an_idle_one_stays_ok() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let p = unique_name("rs", "st");
    let (s, idle) = (format!("{p}:work"), format!("{p}:idle"));
    r.group(&s, "worker", "$");
    r.group(&idle, "idle", "$");
    for _ in 0..3 {
        r.add(&idle);
    }
    let read = r.deliver(&idle, "idle", "i1", 10);
    r.ack(&idle, "idle", &read);
    let config = source(
        "rst",
        &url,
        &format!("streams = {}\nstatus_window = \"4s\"\n", list(&[&s, &idle])),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let window = Duration::from_secs(4);
    let mut idle_statuses = Vec::new();
    let (sv, iv) = (s.as_str(), idle.as_str());

    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        status_of(&m, "rst", sv, "worker")
            .and(status_of(&m, "rst", iv, "idle"))
            .ok_or("no status yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    // Phase 1: it keeps up.
    let phase = Instant::now();
    while phase.elapsed() < Duration::from_secs(6) {
        r.add(&s);
        let got = r.deliver(&s, "worker", "w1", 10);
        r.ack(&s, "worker", &got);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let m = agent.scrape().await;
        idle_statuses.push(status_of(&m, "rst", iv, "idle"));
        if phase.elapsed() > Duration::from_secs(2) {
            assert_eq!(
                status_of(&m, "rst", sv, "worker").as_deref(),
                Some("ok"),
                "a consumer that acknowledges all is ok\n{}",
                agent.stderr()
            );
        }
    }
    // Phase 2: it reads and acknowledges nothing.
    let stopped = Instant::now();
    let mut stalled = None;
    while stopped.elapsed() < window + Duration::from_secs(6) {
        r.add(&s);
        r.deliver(&s, "worker", "w1", 10);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let m = agent.scrape().await;
        idle_statuses.push(status_of(&m, "rst", iv, "idle"));
        let st = status_of(&m, "rst", sv, "worker").unwrap_or_default();
        if st == "stall" {
            stalled = Some(stopped.elapsed());
            break;
        }
        assert!(st == "ok" || st == "warn", "before a window: {st}");
    }
    let after = stalled.unwrap_or_else(|| panic!("never stalled\n{}", agent.stderr()));
    assert!(
        after >= window - Duration::from_millis(600),
        "stall {after:?} after the last acknowledgement, before a window"
    );
    // Phase 3: it acknowledges again.
    let pending: redis::Value = r.cmd(&["XPENDING", &s, "worker", "-", "+", "1000"]);
    let ids: Vec<String> = match pending {
        redis::Value::Array(items) => items
            .iter()
            .filter_map(|e| match e {
                redis::Value::Array(f) => match f.first() {
                    Some(redis::Value::BulkString(b)) => {
                        Some(String::from_utf8_lossy(b).into_owned())
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    r.ack(&s, "worker", &ids);
    wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        match status_of(&m, "rst", sv, "worker").as_deref() {
            Some("ok") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("a consumer acknowledging again is ok: {e}"));
    // Phase 4: its consumer is deleted; entries keep coming.
    let _: i64 = r.cmd(&["XGROUP", "DELCONSUMER", &s, "worker", "w1"]);
    let gone = Instant::now();
    let mut stop = None;
    while gone.elapsed() < window + Duration::from_secs(8) {
        r.add(&s);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let m = agent.scrape().await;
        idle_statuses.push(status_of(&m, "rst", iv, "idle"));
        if status_of(&m, "rst", sv, "worker").as_deref() == Some("stop") {
            assert_eq!(m.get(CONSUMERS, &group("rst", sv, "worker")), Some(0.0));
            stop = Some(gone.elapsed());
            break;
        }
    }
    stop.unwrap_or_else(|| panic!("never stopped\n{}", agent.stderr()));
    assert!(
        idle_statuses.iter().all(|s| s.as_deref() == Some("ok")),
        "the idle group stays ok: {idle_statuses:?}"
    );
    assert!(idle_statuses.len() > 20);
    r.del(&[&s, &idle]);
}

/// The private server restarted under the agent: the source goes down
/// (`inboxwatch_source_up 0`, its series gone), comes back when the server
/// does, and its numbers are exact again (the server kept its streams).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_takes_the_source_down_and_back_with_exact_numbers() {
    let mut server = PrivateRedis::start();
    let url = format!("{}/0", server.url());
    let mut r = Redis::connect(&url);
    r.group("jobs", "workers", "0");
    for _ in 0..20 {
        r.add("jobs");
    }
    let got = r.deliver("jobs", "workers", "w1", 8);
    r.ack("jobs", "workers", &got[..5]);
    drop(r);
    let agent = Agent::start(&source(
        "rrs",
        &url,
        "streams = [\"jobs\"]\ntimeout = \"1s\"",
    ));
    agent.wait_ready(READY_TIMEOUT).await;
    let exact = |m: &Metrics| {
        let labels = group("rrs", "jobs", "workers");
        let got = (
            m.get(LAG, &labels),
            m.get(UNACKED, &labels),
            m.get(MESSAGES, &[("source", "rrs"), ("queue", "jobs")]),
        );
        if got == (Some(12.0), Some(3.0), Some(20.0)) {
            Ok(())
        } else {
            Err(format!("lag, unacked, messages: {got:?}"))
        }
    };
    wait_until(Duration::from_secs(30), || async {
        exact(&agent.try_scrape().await?)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    server.stop();
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let up = m.get("inboxwatch_source_up", &[("source", "rrs")]);
        let lag = m.get(LAG, &group("rrs", "jobs", "workers"));
        (up == Some(0.0) && lag.is_none())
            .then_some(())
            .ok_or(format!("up {up:?}, lag {lag:?}"))
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the source goes down with its server: {e}\n{}",
            agent.stderr()
        )
    });
    server.restart();
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        if m.get("inboxwatch_source_up", &[("source", "rrs")]) != Some(1.0) {
            return Err("not up yet".into());
        }
        exact(&m)
    })
    .await
    .unwrap_or_else(|e| panic!("back with exact numbers: {e}\n{}", agent.stderr()));
}

/// A stream deleted under the agent: its series go; made again (a new
/// group, new entries), they come back with the new numbers, and the
/// published counter carries on from its total, counting the new stream's
/// entries as growth (docs/queues.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_and_made_again_is_read_afresh() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let s = unique_name("rs", "dr");
    r.group(&s, "g", "0");
    for _ in 0..10 {
        r.add(&s);
    }
    let agent = Agent::start(&source("rdr", &url, &format!("streams = [\"{s}\"]")));
    agent.wait_ready(READY_TIMEOUT).await;
    let sv = s.as_str();
    let published = |m: &Metrics| m.get(PUBLISHED, &[("source", "rdr"), ("queue", sv)]);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = (m.get(LAG, &group("rdr", sv, "g")), published(&m));
        (got == (Some(10.0), Some(0.0)))
            .then_some(())
            .ok_or(format!("lag, published: {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    r.add(&s);
    r.add(&s);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = published(&m);
        (got == Some(2.0))
            .then_some(())
            .ok_or(format!("published {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("two entries published: {e}\n{}", agent.stderr()));
    r.del(&[&s]);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = (
            m.get(LAG, &group("rdr", sv, "g")),
            m.get(MESSAGES, &[("source", "rdr"), ("queue", sv)]),
        );
        (got == (None, None))
            .then_some(())
            .ok_or(format!("lag, messages: {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("a deleted stream's series go: {e}\n{}", agent.stderr()));
    r.group(&s, "g2", "0");
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        // The published total carries on: the new stream's count is growth.
        let got = (m.get(LAG, &group("rdr", sv, "g2")), published(&m));
        (got == (Some(0.0), Some(2.0)))
            .then_some(())
            .ok_or(format!("g2 lag, published: {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("the stream made again is seen: {e}\n{}", agent.stderr()));
    for _ in 0..3 {
        r.add(&s);
    }
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = (
            m.get(LAG, &group("rdr", sv, "g2")),
            m.get(LAG, &group("rdr", sv, "g")),
            m.get(MESSAGES, &[("source", "rdr"), ("queue", sv)]),
            published(&m),
        );
        (got == (Some(3.0), None, Some(3.0), Some(5.0)))
            .then_some(())
            .ok_or(format!("g2 lag, g lag, messages, published: {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("read afresh: {e}\n{}", agent.stderr()));
    r.del(&[&s]);
}

/// A wrong password: `doctor` and the running agent say authentication
/// failed, naming the `password` key, and never print the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_said_by_key_without_the_secret() {
    let server = PrivateRedis::with_password("right-horse-battery");
    let config = source(
        "rpw",
        &format!("redis://127.0.0.1:{}/0", server.port),
        "streams = [\"s\"]\npassword = \"${RS_TEST_PASSWORD}\"",
    );
    let secret = "wrong-staple-9f3k";
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("inboxwatch.toml");
    std::fs::write(&path, &config).expect("write the config");
    let out = Cmd::new(["doctor", "--config"])
        .arg(&path)
        .env("RS_TEST_PASSWORD", secret)
        .output();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(!out.success(), "{}", out.describe());
    assert!(
        text.contains("WRONGPASS") && text.contains("sources[0].password"),
        "{text}"
    );
    assert!(!text.contains(secret), "the password is printed:\n{text}");

    let agent = Agent::run(&config).env("RS_TEST_PASSWORD", secret).start();
    let readyz = wait_until(Duration::from_secs(30), || async {
        let (_, body) = agent.get("/readyz").await?;
        body.contains("WRONGPASS")
            .then_some(body.clone())
            .ok_or(body)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert!(readyz.contains("sources[0].password"), "{readyz}");
    let m = agent.scrape().await;
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", "rpw")]),
        Some(0.0)
    );
    let (_, api) = agent.get("/api/v1/status").await.expect("the API answers");
    for said in [agent.stderr(), readyz, api, format!("{m:?}")] {
        assert!(!said.contains(secret), "the password is printed:\n{said}");
    }
}

/// TLS: a `rediss://` source with the server's CA connects over TLS
/// (`doctor` says so); without it the certificate is refused, and the
/// error names the `tls.ca_file` key; a `redis://` URL against the TLS
/// port fails without hanging, and so does `rediss://` to a plain server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_with_its_ca_and_a_failure_names_the_key() {
    let server = PrivateRedis::with_tls();
    let dir = tempfile::tempdir().expect("temp dir");
    let doctor = |config: String| {
        let path = dir.path().join("inboxwatch.toml");
        std::fs::write(&path, config).expect("write the config");
        let out = Cmd::new(["doctor", "--config"]).arg(&path).output();
        (out.success(), format!("{}{}", out.stdout, out.stderr))
    };
    let ca = server.ca();
    let (ok, text) = doctor(source(
        "rtls",
        &format!("rediss://localhost:{}/0", server.port),
        &format!(
            "streams = [\"s\"]\n[sources.tls]\nca_file = \"{}\"",
            ca.display()
        ),
    ));
    assert!(text.contains("connected over TLS"), "{text}");
    assert!(ok || text.contains("no such key"), "{text}");
    let (ok, text) = doctor(source(
        "rtls",
        &format!("rediss://localhost:{}/0", server.port),
        "streams = [\"s\"]",
    ));
    assert!(!ok, "{text}");
    assert!(
        text.contains("TLS handshake failed") && text.contains("sources[0].tls.ca_file"),
        "{text}"
    );
    let (ok, text) = doctor(source(
        "rtls",
        &format!("redis://127.0.0.1:{}/0", server.port),
        "streams = [\"s\"]\ntimeout = \"2s\"",
    ));
    assert!(!ok, "plain TCP to a TLS port fails: {text}");
    let (ok, text) = doctor(source(
        "rtls",
        &format!("{}/0", shared_url().replacen("redis://", "rediss://", 1)),
        "streams = [\"s\"]\ntimeout = \"2s\"",
    ));
    assert!(
        !ok && text.contains("no TLS handshake") && text.contains("sources[0].url"),
        "TLS to a plain server fails by key: {text}"
    );
}

/// `doctor` on a real server: the version, each group with its consumers
/// and pending count, a missing stream as an error, a stream of explicit
/// ids and a dead-letter stream not there yet as warnings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_lists_the_groups_and_says_what_is_wrong() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let p = unique_name("rs", "dc");
    let (s, manual, missing) = (format!("{p}:s"), format!("{p}:m"), format!("{p}:none"));
    r.group(&s, "billing", "0");
    r.add(&s);
    r.deliver(&s, "billing", "c1", 1);
    let _: String = r.cmd(&["XADD", &manual, "1-1", "n", "1"]);
    r.group(&manual, "g", "0");
    let config = source(
        "rdc",
        &url,
        &format!(
            "streams = {}\ndead_letter_streams = {{ \"{s}\" = \"{p}:dead\" }}",
            list(&[&s, &manual, &missing])
        ),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("inboxwatch.toml");
    std::fs::write(&path, &config).expect("write the config");
    let out = Cmd::new(["doctor", "--config"]).arg(&path).output();
    let text = out.stdout.clone();
    assert!(text.contains("Redis 7."), "{}", out.describe());
    assert!(
        text.contains(&format!(
            "stream \"{s}\" group \"billing\": 1 consumers, 1 pending"
        )),
        "{}",
        out.describe()
    );
    assert!(
        text.contains(&format!("stream \"{missing}\"")) && text.contains("error"),
        "{}",
        out.describe()
    );
    assert!(
        text.contains(&format!(
            "stream \"{manual}\" has entry ids that are not times"
        )),
        "{}",
        out.describe()
    );
    assert!(text.contains("does not exist yet"), "{}", out.describe());
    r.del(&[&s, &manual]);
}

/// `discover = "pattern"`: every stream `SCAN` finds for the glob is
/// watched, streams made later too, and a key of another type that matches
/// is not; bad settings are check-config errors naming their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_found_by_pattern_are_watched_and_bad_settings_name_their_keys() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let p = unique_name("rs", "pt");
    let (a, b, later, other) = (
        format!("{p}:a"),
        format!("{p}:b"),
        format!("{p}:later"),
        format!("{p}:string"),
    );
    for s in [&a, &b] {
        r.group(s, "g", "0");
        r.add(s);
    }
    let _: String = r.cmd(&["SET", &other, "x"]);
    let agent = Agent::start(&source(
        "rpt",
        &url,
        &format!("discover = \"pattern\"\npattern = \"{p}:*\""),
    ));
    agent.wait_ready(READY_TIMEOUT).await;
    r.group(&later, "g", "0");
    r.add(&later);
    r.add(&later);
    let m = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got: Vec<Option<f64>> = [&a, &b, &later]
            .iter()
            .map(|s| m.get(LAG, &group("rpt", s, "g")))
            .collect();
        (got == [Some(1.0), Some(1.0), Some(2.0)])
            .then_some(m)
            .ok_or(format!("lags {got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(
        m.series(MESSAGES, &[("source", "rpt")]).count(),
        3,
        "three streams, not the string key"
    );
    r.del(&[&a, &b, &later, &other]);

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[sources]]\nname = \"bad\"\nkind = \"redis_streams\"\n\
         url = \"redis://:hunter2-secret@127.0.0.1:6379/x\"\n\
         discover = \"pattern\"\nstreams = [\"a\"]\nredelivery_scan_limit = 0\n",
    )
    .expect("write the config");
    let out = Cmd::new(["check-config"]).arg(&path).output();
    assert_eq!(out.code, Some(2), "{}", out.describe());
    let text = format!("{}{}", out.stdout, out.stderr);
    for key in [
        "sources[0].url",
        "sources[0].streams",
        "sources[0].pattern",
        "sources[0].redelivery_scan_limit",
    ] {
        assert!(text.contains(key), "{key}:\n{text}");
    }
    assert!(!text.contains("hunter2-secret"), "{text}");
}

/// One owner across agents: two agents on one config, exactly one exports
/// the source; when it stops (SIGTERM releases the key), the other takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_owns_a_source_and_the_other_takes_over() {
    let url = format!("{}/0", shared_url());
    let mut r = Redis::connect(&url);
    let s = unique_name("rs", "el");
    r.group(&s, "g", "0");
    r.add(&s);
    let name = unique_name("rel", "e");
    let config = source(&name, &url, &format!("streams = [\"{s}\"]"));
    let a = Agent::run(&config).name("a").start();
    let b = Agent::run(&config).name("b").start();
    a.wait_ready(READY_TIMEOUT).await;
    b.wait_ready(READY_TIMEOUT).await;
    let leader = |m: &Metrics| m.get("inboxwatch_source_leader", &[("source", name.as_str())]);
    let (first, second) = wait_until(Duration::from_secs(30), || async {
        let (ma, mb) = (a.try_scrape().await?, b.try_scrape().await?);
        match (leader(&ma), leader(&mb)) {
            (Some(1.0), Some(0.0)) => Ok((&a, &b)),
            (Some(0.0), Some(1.0)) => Ok((&b, &a)),
            other => Err(format!("leaders {other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", a.stderr(), b.stderr()));
    let m = second.scrape().await;
    assert_eq!(
        m.get(LAG, &[("source", name.as_str())]),
        None,
        "the standby exports nothing"
    );
    first.terminate(Duration::from_secs(20));
    wait_until(Duration::from_secs(30), || async {
        let m = second.try_scrape().await?;
        (leader(&m) == Some(1.0) && m.get(LAG, &group(&name, &s, "g")) == Some(1.0))
            .then_some(())
            .ok_or("not the owner yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", second.stderr()));
    r.del(&[&s, &format!("inboxwatch:election:{name}")]);
}
