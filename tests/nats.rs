//! The NATS JetStream source (issue 31) against real servers: the machine's
//! NATS 2.9 with JetStream on 127.0.0.1:4222 for the ground truth and the
//! statuses (each test on streams of its own names), and private
//! `nats-server -js` processes for the faults (restart, a stream deleted and
//! recreated, a wrong password, TLS). Every expected number is the truth the
//! test computed from its own publishes, pulls and acknowledgements.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use common::nats::{Delivery, Js, SHARED_URL, Server, certificates};
use common::{Agent, Cmd, Metrics, READY_TIMEOUT, unique_name, wait_until};
use serde_json::json;

const MESSAGES: &str = "queue_messages";
const PUBLISHED: &str = "queue_messages_published_total";
const LAG: &str = "queue_consumer_lag_messages";
const LAG_S: &str = "queue_consumer_lag_seconds";
const UNACKED: &str = "queue_consumer_unacked_messages";
const OLDEST: &str = "queue_consumer_oldest_unacked_age_seconds";
const REDELIVERED: &str = "queue_consumer_redelivered_messages";
const SCAN_CUT: &str = "queue_consumer_redelivered_scan_cut";
const CONSUMERS: &str = "queue_consumer_consumers";
const STATUS: &str = "queue_consumer_status";
const INFO: &str = "queue_consumer_info";
const DEAD: &str = "queue_dead_letters_total";
const GAPS: &str = "inboxwatch_counting_gaps_total";

fn source_toml(name: &str, url: &str, streams: &str, extra: &str) -> String {
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"nats\"\nurl = \"{url}\"\nstreams = \"{streams}\"\n\
         owner = \"team-js\"\npoll_interval = \"500ms\"\nstatus_window = \"3s\"\n{extra}"
    )
}

/// Seconds from `then` to `now`.
fn secs(now: SystemTime, then: SystemTime) -> f64 {
    now.duration_since(then).unwrap_or_default().as_secs_f64()
}

fn status_of(m: &Metrics, source: &str, queue: &str, consumer: &str) -> Option<String> {
    m.series(
        STATUS,
        &[("source", source), ("queue", queue), ("consumer", consumer)],
    )
    .find(|s| s.value == 1.0)
    .map(|s| s.labels["status"].clone())
}

/// What one consumer's series must be.
#[derive(Debug, Clone, Default)]
struct Expect {
    lag: u64,
    /// The stored time of the next undelivered message (None: lag 0).
    next: Option<SystemTime>,
    unacked: u64,
    /// The stored time of the oldest unacknowledged message.
    oldest: Option<SystemTime>,
    redelivered: u64,
    consumers: u64,
    dead: BTreeMap<&'static str, u64>,
}

/// The differences between the consumer's series on `m` and `e`, at
/// `now` (ages within 1 s).
fn consumer_diff(
    m: &Metrics,
    source: &str,
    queue: &str,
    consumer: &str,
    e: &Expect,
    now: SystemTime,
) -> Vec<String> {
    let l = [
        ("source", source),
        ("broker", "nats"),
        ("queue", queue),
        ("consumer", consumer),
    ];
    let mut out = Vec::new();
    let mut exact = |name: &str, want: f64| {
        let got = m.get(name, &l);
        if got != Some(want) {
            out.push(format!("{queue}/{consumer} {name}: {got:?}, want {want}"));
        }
    };
    exact(LAG, e.lag as f64);
    exact(UNACKED, e.unacked as f64);
    exact(REDELIVERED, e.redelivered as f64);
    exact(SCAN_CUT, 0.0);
    exact(CONSUMERS, e.consumers as f64);
    for (reason, n) in &e.dead {
        let got = m.get(DEAD, &[l[0], l[1], l[2], l[3], ("reason", reason)]);
        if got != Some(*n as f64) {
            out.push(format!(
                "{queue}/{consumer} dead letters {reason}: {got:?}, want {n}"
            ));
        }
    }
    for (name, at) in [(LAG_S, e.next), (OLDEST, e.oldest)] {
        let want = at.map_or(0.0, |t| secs(now, t));
        match m.get(name, &l) {
            Some(got) if (got - want).abs() <= 1.0 => {}
            got => out.push(format!(
                "{queue}/{consumer} {name}: {got:?}, want {want:.3} ± 1"
            )),
        }
    }
    let owner = m.get(INFO, &[l[0], l[1], l[2], l[3], ("owner", "team-js")]);
    if owner != Some(1.0) {
        out.push(format!("{queue}/{consumer} {INFO} with owner: {owner:?}"));
    }
    out
}

/// Publishes `n` messages on `subject(i)` (i counted from `first`), and
/// returns the time each was acknowledged, by stream sequence.
async fn publish(
    js: &Js,
    n: u64,
    first: u64,
    subject: impl Fn(u64) -> String,
    times: &mut BTreeMap<u64, SystemTime>,
) {
    for i in first..first + n {
        let (seq, at) = js.publish(&subject(i)).await;
        times.insert(seq, at);
    }
}

/// Ground truth on two streams: `A…` with a durable pull consumer (explicit
/// ack, `max_deliver = 3`) that acknowledges some, terminates some, drives
/// three to max deliveries through naks and redeliveries and leaves the
/// rest unacknowledged; `B…` with a consumer on one of its two subjects
/// (a filter subject) that acknowledges, terminates and leaves some. Every
/// `queue_*` series equals what the test's own actions make it: counts
/// exact, ages within 1 s of the known publish times, dead letters exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_series_equals_the_truth_of_the_workload() {
    let id = unique_name("gt", "js").replace('_', "");
    let (a, b) = (format!("A{id}"), format!("B{id}"));
    let js = Js::connect(SHARED_URL).await;
    js.create_stream(&a, &[&format!("{a}.>")]).await;
    js.create_stream(&b, &[&format!("{b}.>")]).await;
    js.create_consumer(&a, "worker", json!({"max_deliver": 3}))
        .await;
    js.create_consumer(
        &b,
        "payments",
        json!({"max_deliver": 3, "filter_subject": format!("{b}.y")}),
    )
    .await;
    // A: three batches 2 s apart (1–40, 41–100, 101–200); B: 1–60, then
    // 61–150, its even sequences on `y`.
    let mut ta = BTreeMap::new();
    let mut tb = BTreeMap::new();
    let a_subject = |_| format!("{a}.orders");
    let b_subject = |i: u64| format!("{b}.{}", if i.is_multiple_of(2) { "y" } else { "x" });
    publish(&js, 40, 1, a_subject, &mut ta).await;
    publish(&js, 60, 1, b_subject, &mut tb).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    publish(&js, 60, 41, a_subject, &mut ta).await;
    publish(&js, 90, 61, b_subject, &mut tb).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    publish(&js, 100, 101, a_subject, &mut ta).await;

    let source = "gt";
    let agent = Agent::start(&source_toml(source, SHARED_URL, &format!("{a}|{b}"), ""));
    agent.wait_ready(READY_TIMEOUT).await;
    // Listening before any message is given up on.
    agent
        .wait_for_polls(&[source], Duration::ZERO, 20, |m| {
            m.get(MESSAGES, &[("queue", a.as_str())])
                .map(|_| ())
                .ok_or("no stream yet".into())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    // A: 1–50 delivered; 1–20 acked, 21–22 terminated, 23–25 nak'd three
    // times (delivered 3 times: the next pull gives them up), 26–50 held.
    let first = js.fetch(&a, "worker", 50).await;
    assert_eq!(
        first.iter().map(|d| d.stream_seq).collect::<Vec<_>>(),
        (1..=50).collect::<Vec<_>>()
    );
    for d in &first[..20] {
        js.ack(d).await;
    }
    for d in &first[20..22] {
        js.term(d).await;
    }
    for d in &first[22..25] {
        js.nak(d).await;
    }
    for round in 2..=3 {
        let again = js.fetch(&a, "worker", 3).await;
        assert_eq!(
            again
                .iter()
                .map(|d| (d.stream_seq, d.delivered))
                .collect::<Vec<_>>(),
            vec![(23, round), (24, round), (25, round)]
        );
        for d in &again {
            js.nak(d).await;
        }
    }
    // 23–25 exceed max_deliver here: given up, and 51–60 delivered.
    let more = js.fetch(&a, "worker", 10).await;
    assert_eq!(
        more.iter().map(|d| d.stream_seq).collect::<Vec<_>>(),
        (51..=60).collect::<Vec<_>>()
    );
    // B: the first 30 `y` messages (2, 4, …, 60) delivered; 2–20 acked, 22
    // terminated, 24–60 held.
    let got = js.fetch(&b, "payments", 30).await;
    assert_eq!(
        got.iter().map(|d| d.stream_seq).collect::<Vec<_>>(),
        (1..=30).map(|i| 2 * i).collect::<Vec<_>>()
    );
    for d in &got[..10] {
        js.ack(d).await;
    }
    js.term(&got[10]).await;
    // Published while watched: 10 more on A.
    publish(&js, 10, 201, a_subject, &mut ta).await;

    let expect_a = Expect {
        lag: 210 - 60,
        next: Some(ta[&61]),
        unacked: 35,
        oldest: Some(ta[&26]),
        // 23–25, delivered three times and never acknowledged (a 2.9 server
        // keeps counting a message it gave up on as redelivered).
        redelivered: 3,
        consumers: 0,
        dead: BTreeMap::from([("max_deliveries", 3), ("terminated", 2)]),
    };
    let expect_b = Expect {
        lag: 75 - 30,
        next: Some(tb[&62]),
        unacked: 19,
        oldest: Some(tb[&24]),
        redelivered: 0,
        consumers: 0,
        dead: BTreeMap::from([("terminated", 1)]),
    };
    let result = agent
        .wait_for_polls(&[source], Duration::from_secs(2), 6, |m| {
            let now = SystemTime::now();
            let mut diff = consumer_diff(m, source, &a, "worker", &expect_a, now);
            diff.extend(consumer_diff(m, source, &b, "payments", &expect_b, now));
            for (q, messages, published) in [(&a, 210.0, 10.0), (&b, 150.0, 0.0)] {
                let l = [
                    ("source", source),
                    ("broker", "nats"),
                    ("queue", q.as_str()),
                ];
                if m.get(MESSAGES, &l) != Some(messages) {
                    diff.push(format!(
                        "{q} {MESSAGES}: {:?}, want {messages}",
                        m.get(MESSAGES, &l)
                    ));
                }
                if m.get(PUBLISHED, &l) != Some(published) {
                    diff.push(format!(
                        "{q} {PUBLISHED}: {:?}, want {published}",
                        m.get(PUBLISHED, &l)
                    ));
                }
            }
            for (q, c) in [(&a, "worker"), (&b, "payments")] {
                let s = status_of(m, source, q, c);
                if s.as_deref() != Some("ok") {
                    diff.push(format!(
                        "{q}/{c} status {s:?}, want ok (it moved within the window)"
                    ));
                }
            }
            if m.get(GAPS, &[("source", source), ("reason", "advisories")]) != Some(0.0) {
                diff.push(format!(
                    "advisory gaps: {:?}",
                    m.get(GAPS, &[("source", source), ("reason", "advisories")])
                ));
            }
            if diff.is_empty() {
                Ok(())
            } else {
                Err(diff.join("\n"))
            }
        })
        .await;
    // The status card says the same (/api/v1/status).
    let api = agent.api_source(source).await;
    let info_a = js.consumer_info(&a, "worker").await;
    let info_b = js.consumer_info(&b, "payments").await;
    js.delete_stream(&a).await;
    js.delete_stream(&b).await;
    result.unwrap_or_else(|e| panic!("{e}\nserver says: {info_a}\n{info_b}\n{}", agent.stderr()));
    let api = api.expect("the source in /api/v1/status");
    let card: Vec<(String, String, f64, f64)> = api["numbers"]["consumers"]
        .as_array()
        .unwrap_or_else(|| panic!("no consumers on the card: {api}"))
        .iter()
        .map(|c| {
            (
                c["queue"].as_str().unwrap_or_default().to_string(),
                c["consumer"].as_str().unwrap_or_default().to_string(),
                c["lag_messages"].as_f64().unwrap_or(-1.0),
                c["unacked"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    assert_eq!(
        card,
        vec![
            (a.clone(), "worker".into(), 150.0, 35.0),
            (b.clone(), "payments".into(), 45.0, 19.0),
        ],
        "{api}"
    );
}

/// Statuses over the window: a consumer holding its `max_ack_pending`
/// messages with a pull waiting goes `stall` (members present), one
/// holding messages with no pull waiting goes `stop`, each back to `ok`
/// once it acknowledges; a consumer that has everything acknowledged stays
/// `ok` through several windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stall_stop_and_ok_by_the_window() {
    let id = unique_name("st", "js").replace('_', "");
    let s = format!("S{id}");
    let js = Js::connect(SHARED_URL).await;
    js.create_stream(&s, &[&format!("{s}.>")]).await;
    js.create_consumer(&s, "held", json!({"max_ack_pending": 5}))
        .await;
    js.create_consumer(&s, "gone", json!({})).await;
    js.create_consumer(&s, "idle", json!({})).await;
    for _ in 0..20 {
        js.publish(&format!("{s}.m")).await;
    }
    let idle = js.fetch(&s, "idle", 20).await;
    for d in &idle {
        js.ack(d).await;
    }
    let held = js.fetch(&s, "held", 5).await;
    let _waiting = js.wait_pull(&s, "held", Duration::from_secs(120)).await;
    let gone = js.fetch(&s, "gone", 3).await;

    let source = "st";
    let agent = Agent::start(&source_toml(source, SHARED_URL, &s, ""));
    agent.wait_ready(READY_TIMEOUT).await;
    let want = |held: &str, gone: &str| {
        let (held, gone) = (held.to_string(), gone.to_string());
        let s = s.clone();
        move |m: &Metrics| {
            let got = (
                status_of(m, source, &s, "held"),
                status_of(m, source, &s, "gone"),
                status_of(m, source, &s, "idle"),
                m.get(CONSUMERS, &[("queue", s.as_str()), ("consumer", "held")]),
                m.get(CONSUMERS, &[("queue", s.as_str()), ("consumer", "gone")]),
            );
            let expected = (
                Some(held.clone()),
                Some(gone.clone()),
                Some("ok".to_string()),
                Some(1.0),
                Some(0.0),
            );
            if got == expected {
                Ok(())
            } else {
                Err(format!("{got:?}, want {expected:?}"))
            }
        }
    };
    // ok until a window passed without an acknowledgement, then stall / stop.
    agent
        .wait_for_polls(&[source], Duration::ZERO, 2, want("ok", "ok"))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    agent
        .wait_for_polls(&[source], Duration::from_secs(3), 6, want("stall", "stop"))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // They acknowledge: ok at once (the waiting pull gets one more message,
    // held by nobody, so "held" keeps a member until it expires).
    for d in held.iter().chain(&gone) {
        js.ack(d).await;
    }
    let result = agent
        .wait_for_polls(&[source], Duration::ZERO, 4, |m| {
            let got = (
                status_of(m, source, &s, "held"),
                status_of(m, source, &s, "gone"),
                status_of(m, source, &s, "idle"),
            );
            let ok = Some("ok".to_string());
            if got == (ok.clone(), ok.clone(), ok) {
                Ok(())
            } else {
                Err(format!("{got:?}, want all ok"))
            }
        })
        .await;
    js.delete_stream(&s).await;
    result.unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// The server restarted under the agent: the source goes down, comes back,
/// and its numbers are exact again (the store is kept); the advisories not
/// listened to meanwhile are a counting gap. Then the stream is deleted and
/// recreated: the new stream's numbers, and its publishes counted from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_and_a_recreated_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[]).await;
    let js = Js::connect(&server.url()).await;
    js.create_stream("ORDERS", &["orders.>"]).await;
    js.create_consumer("ORDERS", "billing", json!({})).await;
    for _ in 0..10 {
        js.publish("orders.new").await;
    }
    let got = js.fetch("ORDERS", "billing", 4).await;
    js.ack(&got[0]).await;
    js.ack(&got[1]).await;
    let source = "restart";
    let agent = Agent::start(&source_toml(source, &server.url(), "ORDERS", ""));
    agent.wait_ready(READY_TIMEOUT).await;
    let numbers = |lag: f64, unacked: f64, messages: f64| {
        move |m: &Metrics| {
            let got = (
                m.get("inboxwatch_source_up", &[("source", source)]),
                m.get(LAG, &[("queue", "ORDERS"), ("consumer", "billing")]),
                m.get(UNACKED, &[("queue", "ORDERS"), ("consumer", "billing")]),
                m.get(MESSAGES, &[("queue", "ORDERS")]),
            );
            let want = (Some(1.0), Some(lag), Some(unacked), Some(messages));
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}, want {want:?}"))
            }
        }
    };
    agent
        .wait_for_polls(&[source], Duration::ZERO, 4, numbers(6.0, 2.0, 10.0))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    server.stop();
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let up = m.get("inboxwatch_source_up", &[("source", source)]);
        (up == Some(0.0)).then_some(()).ok_or(format!("up {up:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    server.restart().await;
    agent
        .wait_for_polls(&[source], Duration::ZERO, 4, numbers(6.0, 2.0, 10.0))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let m = agent.scrape().await;
    let gaps = m
        .get(GAPS, &[("source", source), ("reason", "advisories")])
        .unwrap_or(0.0);
    assert!(
        gaps >= 1.0,
        "the outage is a counting gap of the advisories: {gaps}"
    );

    // Deleted and recreated, with a consumer of the same name.
    let js = Js::connect(&server.url()).await;
    js.delete_stream("ORDERS").await;
    js.create_stream("ORDERS", &["orders.>"]).await;
    js.create_consumer("ORDERS", "billing", json!({})).await;
    for _ in 0..5 {
        js.publish("orders.new").await;
    }
    let got = js.fetch("ORDERS", "billing", 1).await;
    agent
        .wait_for_polls(&[source], Duration::ZERO, 4, numbers(4.0, 1.0, 5.0))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let before = agent
        .scrape()
        .await
        .get(PUBLISHED, &[("queue", "ORDERS")])
        .unwrap_or(-1.0);
    for _ in 0..3 {
        js.publish("orders.new").await;
    }
    js.ack(&got[0]).await;
    agent
        .wait_for_polls(&[source], Duration::ZERO, 4, |m| {
            let got = (
                m.get(PUBLISHED, &[("queue", "ORDERS")]),
                m.get(LAG, &[("queue", "ORDERS")]),
                m.get(UNACKED, &[("queue", "ORDERS")]),
            );
            let want = (Some(before + 3.0), Some(7.0), Some(0.0));
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}, want {want:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// A wrong password and a TLS failure are said by key, and the secret is
/// printed nowhere (doctor, the agent's log); the right CA connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_password_and_a_tls_failure_name_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "hunter2-not-this-one";
    let server = Server::start(
        dir.path(),
        &["--user", "watcher", "--pass", "right-password"],
    )
    .await;
    let config = dir.path().join("pw.toml");
    std::fs::write(
        &config,
        source_toml(
            "pw",
            &server.url(),
            ".*",
            "user = \"watcher\"\npassword = \"${NATS_PASSWORD}\"\n",
        ),
    )
    .unwrap();
    let out = Cmd::new(["doctor", "--config"])
        .arg(&config)
        .env("NATS_PASSWORD", secret)
        .output();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(!out.success(), "{}", out.describe());
    assert!(
        text.contains("sources[0].user / sources[0].password"),
        "{text}"
    );
    assert!(!text.contains(secret), "{text}");
    let agent = Agent::run(&std::fs::read_to_string(&config).unwrap())
        .env("NATS_PASSWORD", secret)
        .start();
    wait_until(Duration::from_secs(30), || async {
        let log = agent.stderr();
        log.contains("sources[0].user / sources[0].password")
            .then_some(())
            .ok_or(log)
    })
    .await
    .unwrap_or_else(|e| panic!("no error by key: {e}"));
    assert!(!agent.stderr().contains(secret));
    let m = wait_until(Duration::from_secs(30), || agent.try_scrape())
        .await
        .expect("a scrape");
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", "pw")]),
        Some(0.0)
    );
    drop(agent);

    // TLS: a server whose certificate another CA signed.
    let tls_dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(tls_dir.path(), "right");
    let (other_ca, _, _) = certificates(tls_dir.path(), "other");
    let tls = Server::start(
        tls_dir.path(),
        &[
            "--tls",
            "--tlscert",
            cert.to_str().unwrap(),
            "--tlskey",
            key.to_str().unwrap(),
        ],
    )
    .await;
    let js = Js::connect_with(
        &tls.url(),
        async_nats::ConnectOptions::new()
            .add_root_certificates(ca.clone())
            .require_tls(true),
    )
    .await;
    js.create_stream("TLS", &["tls.>"]).await;
    js.create_consumer("TLS", "reader", json!({})).await;
    for (ca_file, ok) in [(&other_ca, false), (&ca, true)] {
        let config = tls_dir.path().join("tls.toml");
        std::fs::write(
            &config,
            source_toml(
                "tls",
                &tls.url(),
                ".*",
                &format!("[sources.tls]\nca_file = \"{}\"\n", ca_file.display()),
            ),
        )
        .unwrap();
        let out = Cmd::new(["doctor", "--config"]).arg(&config).output();
        let text = format!("{}{}", out.stdout, out.stderr);
        if ok {
            assert!(
                out.success() && text.contains("over TLS") && text.contains("one poll in"),
                "{text}"
            );
        } else {
            assert!(!out.success(), "{text}");
            assert!(
                text.contains("TLS failed, check sources[0].tls.ca_file"),
                "{text}"
            );
        }
    }
}

/// One owner per source across agents: of two agents with the same
/// source, one exports its series and the other stands by; the owner
/// leaving (SIGTERM gives the lease up) hands it to the other, whose
/// numbers are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_agent_owns_the_source_and_another_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    let js = Js::connect(&server.url()).await;
    js.create_stream("JOBS", &["jobs.>"]).await;
    js.create_consumer("JOBS", "runner", json!({})).await;
    for _ in 0..7 {
        js.publish("jobs.run").await;
    }
    let config = source_toml("owned", &server.url(), "JOBS", "");
    let first = Agent::start(&config);
    let second = Agent::start(&config);
    first.wait_ready(READY_TIMEOUT).await;
    second.wait_ready(READY_TIMEOUT).await;
    let leader = |m: &Metrics| m.get("inboxwatch_source_leader", &[("source", "owned")]);
    let lag = |m: &Metrics| m.get(LAG, &[("queue", "JOBS"), ("consumer", "runner")]);
    let (owner, standby) = wait_until(Duration::from_secs(30), || async {
        let (a, b) = (first.try_scrape().await?, second.try_scrape().await?);
        match (leader(&a), leader(&b), lag(&a), lag(&b)) {
            (Some(1.0), Some(0.0), Some(7.0), None) => Ok((&first, &second)),
            (Some(0.0), Some(1.0), None, Some(7.0)) => Ok((&second, &first)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .expect("one owner exporting, one standing by");
    // Still one owner a few heartbeats later.
    common::stays(Duration::from_secs(6), || async {
        let (a, b) = (owner.try_scrape().await?, standby.try_scrape().await?);
        let got = (leader(&a), leader(&b));
        (got == (Some(1.0), Some(0.0)))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await
    .expect("the owner keeps the source");
    // Given up at once, not left to expire (the lease lasts 20 s): the
    // standby takes it at its next try.
    owner.terminate(Duration::from_secs(15));
    wait_until(Duration::from_secs(12), || async {
        let m = standby.try_scrape().await?;
        let got = (leader(&m), lag(&m));
        (got == (Some(1.0), Some(7.0)))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("the standby did not take over: {e}\n{}", standby.stderr()));
}

/// A smaller workload on `stream` (a durable pull consumer, explicit ack,
/// `max_deliver = 3`): 30 published, 20 delivered, 10 acknowledged; then,
/// while watched ([`wait_for_small_workload`]), 2 terminated (the returned
/// deliveries) and 5 more published, 8 held. Returns what the consumer's
/// series must be.
async fn small_workload(js: &Js, stream: &str) -> (Expect, Vec<Delivery>) {
    js.create_stream(stream, &[&format!("{stream}.>")]).await;
    js.create_consumer(stream, "worker", json!({"max_deliver": 3}))
        .await;
    let mut times = BTreeMap::new();
    let subject = |_| format!("{stream}.orders");
    publish(js, 30, 1, subject, &mut times).await;
    let got = js.fetch(stream, "worker", 20).await;
    assert_eq!(
        got.iter().map(|d| d.stream_seq).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    for d in &got[..10] {
        js.ack(d).await;
    }
    let expect = Expect {
        // 21–35: the 5 published while watched included.
        lag: 15,
        next: Some(times[&21]),
        unacked: 8,
        oldest: Some(times[&13]),
        redelivered: 0,
        consumers: 0,
        dead: BTreeMap::from([("terminated", 2)]),
    };
    (expect, got[10..12].to_vec())
}

/// Terminates `to_term` and publishes 5 once the agent watches, then waits
/// until the agent's series of `stream`/worker equal `expect`, with 35
/// messages in the stream, and the agent owning the source (its lease in
/// the KV bucket).
async fn wait_for_small_workload(
    agent: &Agent,
    js: &Js,
    (source, stream): (&str, &str),
    expect: &Expect,
    to_term: &[Delivery],
) {
    agent.wait_ready(READY_TIMEOUT).await;
    agent
        .wait_for_polls(&[source], Duration::ZERO, 20, |m| {
            m.get(MESSAGES, &[("queue", stream)])
                .map(|_| ())
                .ok_or("no stream yet".into())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    for d in to_term {
        js.term(d).await;
    }
    let mut times = BTreeMap::new();
    publish(js, 5, 31, |_| format!("{stream}.orders"), &mut times).await;
    let result = agent
        .wait_for_polls(&[source], Duration::from_secs(2), 6, |m| {
            let mut diff = consumer_diff(m, source, stream, "worker", expect, SystemTime::now());
            let l = [("source", source), ("broker", "nats"), ("queue", stream)];
            for (name, want) in [(MESSAGES, 35.0), (PUBLISHED, 5.0)] {
                if m.get(name, &l) != Some(want) {
                    diff.push(format!("{name}: {:?}, want {want}", m.get(name, &l)));
                }
            }
            let leader = m.get("inboxwatch_source_leader", &[("source", source)]);
            if leader != Some(1.0) {
                diff.push(format!("leader: {leader:?}, want 1"));
            }
            if diff.is_empty() {
                Ok(())
            } else {
                Err(diff.join("\n"))
            }
        })
        .await;
    result.unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// An NKey user (`authorization { users = [ { nkey: U… } ] }`): the agent
/// with the user's seed (from `${VAR}`, and from a file) connects, owns the
/// source through the KV bucket and exports every series of the workload;
/// `doctor` reads it. Another valid seed is refused by the server: the
/// error names the key and says authorization failed, never the seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nkey_seed_logs_in_and_a_wrong_one_is_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let server_conf = dir.path().join("server.conf");
    std::fs::write(
        &server_conf,
        format!(
            "authorization {{\n  users = [ {{ nkey: {} }} ]\n}}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let server = Server::start(dir.path(), &["-c", server_conf.to_str().unwrap()]).await;
    let js = Js::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_nkey(seed.clone()),
    )
    .await;
    let stream = "NKEYS";
    let (expect, to_term) = small_workload(&js, stream).await;

    let seed_file = dir.path().join("seed");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let doctor_config = dir.path().join("doctor.toml");
    std::fs::write(
        &doctor_config,
        source_toml(
            "nk",
            &server.url(),
            stream,
            &format!("nkey_seed_file = \"{}\"\n", seed_file.display()),
        ),
    )
    .unwrap();
    let out = Cmd::new(["doctor", "--config"])
        .arg(&doctor_config)
        .output();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(out.success() && text.contains("one poll in"), "{text}");
    assert!(!text.contains(&seed), "{text}");

    let source = "nk";
    let agent = Agent::run(&source_toml(
        source,
        &server.url(),
        stream,
        "nkey_seed = \"${NATS_NKEY_SEED}\"\n",
    ))
    .env("NATS_NKEY_SEED", &seed)
    // The seed in no line of the log, however detailed.
    .env("INBOXWATCH_LOG", "trace")
    .start();
    wait_for_small_workload(&agent, &js, (source, stream), &expect, &to_term).await;
    assert!(!agent.stderr().contains(&seed));
    drop(agent);

    // Another valid user seed: the server does not know its public key.
    let wrong = nkeys::KeyPair::new_user().seed().unwrap();
    let config = source_toml(
        "wrong",
        &server.url(),
        stream,
        "nkey_seed = \"${NATS_NKEY_SEED}\"\n",
    );
    let wrong_config = dir.path().join("wrong.toml");
    std::fs::write(&wrong_config, &config).unwrap();
    let out = Cmd::new(["doctor", "--config"])
        .arg(&wrong_config)
        .env("NATS_NKEY_SEED", &wrong)
        .output();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(!out.success(), "{}", out.describe());
    assert!(
        text.contains("authorization failed")
            && text.contains("sources[0].nkey_seed")
            && text.contains("wrong"),
        "{text}"
    );
    assert!(!text.contains(&wrong), "{text}");
    let agent = Agent::run(&config).env("NATS_NKEY_SEED", &wrong).start();
    wait_until(Duration::from_secs(30), || async {
        let log = agent.stderr();
        (log.contains("authorization failed") && log.contains("sources[0].nkey_seed"))
            .then_some(())
            .ok_or(log)
    })
    .await
    .unwrap_or_else(|e| panic!("no error by key: {e}"));
    assert!(!agent.stderr().contains(&wrong));
    let m = wait_until(Duration::from_secs(30), || agent.try_scrape())
        .await
        .expect("a scrape");
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", "wrong")]),
        Some(0.0)
    );
}

/// A `.creds` file on an operator-mode server (the operator, account and
/// user JWTs the test signs; the account with JetStream): the agent reads
/// the consumers through it, owns the source through the KV bucket, and
/// `doctor` connects with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_creds_file_logs_in_to_an_operator_mode_server() {
    let dir = tempfile::tempdir().unwrap();
    let (server_text, creds) = common::nats::operator_mode();
    let server_conf = dir.path().join("server.conf");
    std::fs::write(&server_conf, server_text).unwrap();
    let server = Server::start(dir.path(), &["-c", server_conf.to_str().unwrap()]).await;
    let creds_file = dir.path().join("watcher.creds");
    std::fs::write(&creds_file, &creds).unwrap();
    let js = Js::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_credentials(&creds).expect("a .creds file"),
    )
    .await;
    let stream = "CREDS";
    let (expect, to_term) = small_workload(&js, stream).await;
    let source = "creds";
    let config = dir.path().join("creds.toml");
    std::fs::write(
        &config,
        source_toml(
            source,
            &server.url(),
            stream,
            &format!("credentials_file = \"{}\"\n", creds_file.display()),
        ),
    )
    .unwrap();
    let out = Cmd::new(["doctor", "--config"]).arg(&config).output();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(out.success() && text.contains("one poll in"), "{text}");
    let agent = Agent::run_file(&config)
        .env("INBOXWATCH_LOG", "trace")
        .start();
    wait_for_small_workload(&agent, &js, (source, stream), &expect, &to_term).await;
    let seed = creds
        .lines()
        .find(|l| l.starts_with("SU"))
        .expect("the seed");
    assert!(!agent.stderr().contains(seed) && !text.contains(seed));
}
