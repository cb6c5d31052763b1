//! The RabbitMQ source (issue 32) against the machine's RabbitMQ 3.10, each
//! test in a vhost of its own read by a `monitoring` user of its own, with a
//! real AMQP workload (lapin): every series equals the workload's own
//! counts; lag seconds from the head message's timestamp within a second;
//! quorum queues without lag seconds (and `doctor` says why); dead letters
//! counted from the dead-letter target; stop / stall / ok; the management
//! API unreachable, a URL that is not the API, a wrong password printed
//! nowhere; the broker's application restarted under the agent.

use crate::common;

use std::time::Duration;

use common::rabbitmq::{Monitor, Vhost, enc, mgmt, mgmt_ok, now_s, source_toml};
use common::{Agent, Cmd, Metrics, READY_TIMEOUT, stays, wait_until};
use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};

const MESSAGES: &str = "queue_messages";
const PUBLISHED: &str = "queue_messages_published_total";
const REDELIVERIES: &str = "queue_redeliveries_total";
const LAG: &str = "queue_consumer_lag_messages";
const LAG_S: &str = "queue_consumer_lag_seconds";
const UNACKED: &str = "queue_consumer_unacked_messages";
const CONSUMERS: &str = "queue_consumer_consumers";
const STATUS: &str = "queue_consumer_status";
const DEAD: &str = "queue_dead_letters_total";
const INFO: &str = "queue_consumer_info";

/// The `queue` label of a queue of a vhost other than `/`.
fn q(vh: &Vhost, name: &str) -> String {
    format!("{}/{name}", vh.name)
}

/// Declares a durable queue through the management API.
fn declare_queue(vh: &Vhost, name: &str, arguments: &str) {
    mgmt_ok(
        "PUT",
        &format!("/api/queues/{}/{}", enc(&vh.name), enc(name)),
        Some(&format!(r#"{{"durable":true,"arguments":{arguments}}}"#)),
    );
}

/// A fanout exchange bound to one queue: a dead-letter exchange and its queue.
fn dead_letter_pair(vh: &Vhost, exchange: &str, queue: &str) {
    mgmt_ok(
        "PUT",
        &format!("/api/exchanges/{}/{}", enc(&vh.name), enc(exchange)),
        Some(r#"{"type":"fanout","durable":true}"#),
    );
    declare_queue(vh, queue, "{}");
    mgmt_ok(
        "POST",
        &format!(
            "/api/bindings/{}/e/{}/q/{}",
            enc(&vh.name),
            enc(exchange),
            enc(queue)
        ),
        Some(r#"{"routing_key":""}"#),
    );
}

async fn publish(ch: &Channel, queue: &str, n: u64, timestamp: impl Fn(u64) -> Option<u64>) {
    for i in 0..n {
        let mut props = BasicProperties::default().with_delivery_mode(2);
        if let Some(t) = timestamp(i) {
            props = props.with_timestamp(t);
        }
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            format!("m{i}").as_bytes(),
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("publisher confirm");
    }
}

/// `n` basic.gets (manual acknowledgement), each answered by `then`.
async fn get_each(
    ch: &Channel,
    queue: &str,
    n: usize,
    then: Then,
) -> Vec<lapin::message::Delivery> {
    let mut got = Vec::new();
    for _ in 0..n {
        let m = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get")
            .unwrap_or_else(|| panic!("{queue}: empty"));
        got.push(m.delivery);
    }
    for d in &got {
        let tag = d.delivery_tag;
        match then {
            Then::Ack => ch.basic_ack(tag, BasicAckOptions::default()).await,
            Then::Reject => {
                ch.basic_reject(tag, BasicRejectOptions { requeue: false })
                    .await
            }
            Then::Requeue => {
                ch.basic_nack(
                    tag,
                    BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    },
                )
                .await
            }
        }
        .expect("answer");
    }
    got
}

#[derive(Clone, Copy)]
enum Then {
    Ack,
    Reject,
    Requeue,
}

/// The status of the queue's consumer row, if any.
fn status_of(m: &Metrics, source: &str, queue: &str) -> Option<String> {
    m.series(
        STATUS,
        &[("source", source), ("queue", queue), ("consumer", "")],
    )
    .find(|s| s.value == 1.0)
    .map(|s| s.labels["status"].clone())
}

/// Every expected value of `(metric, queue, value)`, or the differences.
fn diff(m: &Metrics, source: &str, want: &[(&str, &str, f64)]) -> Result<(), String> {
    let mut out = Vec::new();
    for (name, queue, value) in want {
        let got = m.get(
            name,
            &[("source", source), ("broker", "rabbitmq"), ("queue", queue)],
        );
        if got != Some(*value) {
            out.push(format!("{name}{{queue={queue}}}: {got:?}, want {value}"));
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n"))
    }
}

/// Ground truth: a classic and a quorum queue, each dead-lettering into a
/// classic queue of its own through a fanout exchange; published, acked,
/// rejected (dead-lettered), requeued (redelivered), held unacked by a
/// consumer, and on the quorum queue driven over `x-delivery-limit`. Every
/// series equals the workload's own count; the classic queue's lag seconds
/// is now − its head message's timestamp (the oldest message it holds,
/// unacknowledged ones included); the quorum queue has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_series_equals_the_workloads_own_counts() {
    let vh = Vhost::create("truth");
    let mon = Monitor::create(&vh);
    dead_letter_pair(&vh, "dlx.classic", "orders.classic.dlq");
    dead_letter_pair(&vh, "dlx.quorum", "orders.quorum.dlq");
    declare_queue(
        &vh,
        "orders.classic",
        r#"{"x-dead-letter-exchange":"dlx.classic"}"#,
    );
    declare_queue(
        &vh,
        "orders.quorum",
        r#"{"x-queue-type":"quorum","x-dead-letter-exchange":"dlx.quorum","x-delivery-limit":2}"#,
    );
    let (classic, quorum) = (q(&vh, "orders.classic"), q(&vh, "orders.quorum"));
    let config = source_toml(
        "rt",
        &vh.name,
        &mon.name,
        "RT_PASSWORD",
        "queues = \"orders\\\\.(classic|quorum)\"\npoll_interval = \"1s\"\nstatus_window = \"30s\"\n",
    );
    let agent = Agent::start_with_env(&config, &[("RT_PASSWORD", &mon.password)]);
    agent.wait_ready(READY_TIMEOUT).await;
    // Every baseline is taken before the workload: the counters start at 0.
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        diff(
            &m,
            "rt",
            &[
                (PUBLISHED, &classic, 0.0),
                (PUBLISHED, &quorum, 0.0),
                (DEAD, &classic, 0.0),
                (DEAD, &quorum, 0.0),
            ],
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    let (_conn, ch) = vh.connect().await;
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    let base = now_s() as u64 - 600;
    // Classic: 300 messages stamped base + i seconds.
    publish(&ch, "orders.classic", 300, |i| Some(base + i)).await;
    // 10 requeued (back to the head), then 50 acked (the first 10 of them
    // redelivered), 20 rejected into the dead-letter queue.
    get_each(&ch, "orders.classic", 10, Then::Requeue).await;
    get_each(&ch, "orders.classic", 50, Then::Ack).await;
    get_each(&ch, "orders.classic", 20, Then::Reject).await;
    // Quorum: 200 without timestamps; 30 acked, 5 rejected, and 10 requeued
    // three times: the third return passes x-delivery-limit 2 and dead-letters them.
    publish(&ch, "orders.quorum", 200, |_| None).await;
    get_each(&ch, "orders.quorum", 30, Then::Ack).await;
    get_each(&ch, "orders.quorum", 5, Then::Reject).await;
    for _ in 0..3 {
        get_each(&ch, "orders.quorum", 10, Then::Requeue).await;
    }
    // A consumer that holds 15 of the classic queue unacknowledged.
    let (_held_conn, held) = vh.connect().await;
    held.basic_qos(15, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = held
        .basic_consume(
            "orders.classic".into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut holding = Vec::new();
    while holding.len() < 15 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("deliveries")
            .expect("a delivery")
            .expect("ok");
        holding.push(d);
    }
    // The head RabbitMQ reports is the oldest message the queue still holds,
    // delivered or not: message 70, the first of the 15 held (0-69 are
    // acked or dead-lettered).
    let head = base + 70;
    let quorum_redelivered = 20.0; // rounds two and three
    let quorum_dead = 15.0;

    let started = now_s();
    let m = wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        diff(
            &m,
            "rt",
            &[
                (MESSAGES, &classic, 230.0),
                (PUBLISHED, &classic, 300.0),
                (REDELIVERIES, &classic, 10.0),
                (LAG, &classic, 215.0),
                (UNACKED, &classic, 15.0),
                (CONSUMERS, &classic, 1.0),
                (DEAD, &classic, 20.0),
                (MESSAGES, &quorum, 155.0),
                (PUBLISHED, &quorum, 200.0),
                (REDELIVERIES, &quorum, quorum_redelivered),
                (LAG, &quorum, 155.0),
                (UNACKED, &quorum, 0.0),
                (CONSUMERS, &quorum, 0.0),
                (DEAD, &quorum, quorum_dead),
            ],
        )?;
        let lag_s = m.get(LAG_S, &[("source", "rt"), ("queue", &classic)]);
        let (low, high) = (started - head as f64 - 1.0, now_s() - head as f64 + 1.0);
        match lag_s {
            Some(s) if (low..=high).contains(&s) => Ok(m),
            other => Err(format!("classic lag seconds {other:?}, want {low}..{high}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(
        m.get(LAG_S, &[("source", "rt"), ("queue", &quorum)]),
        None,
        "a quorum queue has no head timestamp: lag seconds absent, never estimated"
    );
    for queue in [&classic, &quorum] {
        assert!(
            m.get(
                DEAD,
                &[
                    ("source", "rt"),
                    ("queue", queue.as_str()),
                    ("consumer", ""),
                    ("reason", "dead_letter_queue")
                ]
            )
            .is_some(),
            "{queue}: dead letters by reason"
        );
        assert_eq!(
            m.get(
                INFO,
                &[
                    ("source", "rt"),
                    ("queue", queue.as_str()),
                    ("consumer", "")
                ]
            ),
            Some(1.0)
        );
    }
    // The dead-letter queues are not watched (queues = …): no series of theirs.
    assert_eq!(
        m.get(MESSAGES, &[("queue", &q(&vh, "orders.classic.dlq"))]),
        None
    );
    // Counters stay put while nothing happens.
    stays(Duration::from_secs(7), || async {
        let m = agent.try_scrape().await?;
        diff(
            &m,
            "rt",
            &[
                (PUBLISHED, &classic, 300.0),
                (DEAD, &classic, 20.0),
                (DEAD, &quorum, quorum_dead),
                (REDELIVERIES, &quorum, quorum_redelivered),
            ],
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    drop(holding);
}

/// stop when the last consumer leaves with messages ready; stall while a
/// consumer holds messages unacknowledged and acknowledges nothing; ok
/// when idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_stall_and_ok() {
    let vh = Vhost::create("status");
    let mon = Monitor::create(&vh);
    for name in ["left", "held", "idle"] {
        declare_queue(&vh, name, "{}");
    }
    let (_conn, ch) = vh.connect().await;
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    publish(&ch, "left", 5, |_| None).await;
    publish(&ch, "held", 8, |_| None).await;
    // `left`: a consumer that goes away, leaving 5 ready.
    let (left_conn, left) = vh.connect().await;
    let _c = left
        .basic_consume(
            "left".into(),
            "gone".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    // `held`: a consumer that holds 3 and acknowledges nothing; 5 stay ready.
    let (_held_conn, held) = vh.connect().await;
    held.basic_qos(3, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = held
        .basic_consume(
            "held".into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for _ in 0..3 {
        consumer.next().await.expect("delivery").expect("ok");
    }
    left_conn.close(200, "bye".into()).await.expect("close");
    let config = source_toml(
        "rs",
        &vh.name,
        &mon.name,
        "RS_PASSWORD",
        "poll_interval = \"1s\"\nstatus_window = \"8s\"\n",
    );
    let agent = Agent::start_with_env(&config, &[("RS_PASSWORD", &mon.password)]);
    agent.wait_ready(READY_TIMEOUT).await;
    let (left_q, held_q, idle_q) = (q(&vh, "left"), q(&vh, "held"), q(&vh, "idle"));
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let got = [
            status_of(&m, "rs", &left_q),
            status_of(&m, "rs", &held_q),
            status_of(&m, "rs", &idle_q),
        ];
        let want = [Some("stop"), Some("stall"), Some("ok")].map(|s| s.map(str::to_string));
        diff(
            &m,
            "rs",
            &[
                (LAG, &left_q, 5.0),
                (CONSUMERS, &left_q, 0.0),
                (LAG, &held_q, 5.0),
                (UNACKED, &held_q, 3.0),
                (CONSUMERS, &held_q, 1.0),
                (LAG, &idle_q, 0.0),
                (LAG_S, &idle_q, 0.0),
            ],
        )?;
        if got == want {
            Ok(())
        } else {
            Err(format!("statuses {got:?}, want {want:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// The management API closed (the plugin disabled), a URL that is not the
/// API (404), a wrong password and a closed stream port: each source is
/// down with an error that names the URL; the password is printed nowhere; a good source beside
/// them goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_api_wrong_path_and_wrong_password() {
    let vh = Vhost::create("faults");
    let mon = Monitor::create(&vh);
    declare_queue(&vh, "orders", "{}");
    declare_queue(&vh, "log", r#"{"x-queue-type":"stream"}"#);
    let closed = common::free_port();
    let secret = "wrong-Secret-4f1c9e";
    let entry = |name: &str, url: &str, pw_env: &str| {
        format!(
            "[[sources]]\nname = \"{name}\"\nkind = \"rabbitmq\"\nmanagement_url = \"{url}\"\n\
             username = \"{}\"\npassword = \"${{{pw_env}}}\"\npoll_interval = \"1s\"\n",
            mon.name
        )
    };
    let config = format!(
        "{}{}{}{}{}",
        entry("closed", &format!("http://127.0.0.1:{closed}"), "GOOD_PW"),
        entry("notapi", "http://127.0.0.1:15672/nothing-here", "GOOD_PW"),
        entry("badpw", "http://127.0.0.1:15672", "BAD_PW"),
        source_toml(
            "nostream",
            &vh.name,
            &mon.name,
            "GOOD_PW",
            &format!(
                "poll_interval = \"1s\"\nstreams_url = \"rabbitmq-stream://127.0.0.1:{closed}\"\n"
            ),
        ),
        source_toml(
            "good",
            &vh.name,
            &mon.name,
            "GOOD_PW",
            "poll_interval = \"1s\"\n"
        ),
    );
    let agent = Agent::start_with_env(
        &config,
        &[("GOOD_PW", mon.password.as_str()), ("BAD_PW", secret)],
    );
    agent.wait_ready(READY_TIMEOUT).await;
    let want = [
        ("closed", format!("http://127.0.0.1:{closed}/api/vhosts")),
        (
            "notapi",
            "http://127.0.0.1:15672/nothing-here/api/vhosts".to_string(),
        ),
        ("badpw", "http://127.0.0.1:15672/api/vhosts".to_string()),
        ("nostream", format!("rabbitmq-stream://127.0.0.1:{closed}")),
    ];
    let m = wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        for (source, url) in &want {
            let up = m.get("inboxwatch_source_up", &[("source", source)]);
            if up != Some(0.0) {
                return Err(format!("{source}: up {up:?}"));
            }
            let s = agent.api_source(source).await?;
            let text = s.to_string();
            if !text.contains(url.as_str()) {
                return Err(format!("{source}: no {url} in {text}"));
            }
        }
        if m.get("inboxwatch_source_up", &[("source", "good")]) != Some(1.0) {
            return Err("good: not up".into());
        }
        m.get(
            MESSAGES,
            &[("source", "good"), ("queue", &q(&vh, "orders"))],
        )
        .map(|_| m.clone())
        .ok_or_else(|| "good: no queue_messages".into())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let bad = agent.api_source("badpw").await.unwrap().to_string();
    assert!(bad.contains("401"), "{bad}");
    let notapi = agent.api_source("notapi").await.unwrap().to_string();
    assert!(notapi.contains("404"), "{notapi}");
    drop(m);
    // The password is printed nowhere: log, metrics, API, check-config, doctor.
    let (_, metrics) = agent.get("/metrics").await.unwrap();
    let (_, api) = agent.get("/api/v1/status").await.unwrap();
    let path = agent.dir().join("inboxwatch.toml");
    let doctor = Cmd::new(["doctor", "--config"])
        .arg(&path)
        .env("GOOD_PW", &mon.password)
        .env("BAD_PW", secret)
        .output();
    let check = Cmd::new(["check-config", "--config"])
        .arg(&path)
        .env("GOOD_PW", &mon.password)
        .env("BAD_PW", secret)
        .output();
    for (what, text) in [
        ("stderr", agent.stderr()),
        ("stdout", agent.stdout()),
        ("/metrics", metrics),
        ("/api/v1/status", api),
        ("doctor", format!("{}{}", doctor.stdout, doctor.stderr)),
        ("check-config", format!("{}{}", check.stdout, check.stderr)),
    ] {
        for pw in [secret, mon.password.as_str()] {
            assert!(!text.contains(pw), "{what} prints a password:\n{text}");
        }
    }
    assert!(
        doctor.stdout.contains("401") || doctor.stderr.contains("401"),
        "doctor names the refusal:\n{}{}",
        doctor.stdout,
        doctor.stderr
    );
}

/// `doctor`: the broker and user, one poll, and per queue whether lag
/// seconds can be given and why not (quorum; a publisher without
/// timestamps), its dead-letter target, and a queue without consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doctor_says_what_each_queue_can_and_cannot_say() {
    let vh = Vhost::create("doctor");
    let mon = Monitor::create(&vh);
    dead_letter_pair(&vh, "dlx", "dead");
    declare_queue(&vh, "stamped", r#"{"x-dead-letter-exchange":"dlx"}"#);
    declare_queue(&vh, "plain", "{}");
    declare_queue(
        &vh,
        "lost",
        r#"{"x-dead-letter-exchange":"no-such-exchange"}"#,
    );
    declare_queue(&vh, "raft", r#"{"x-queue-type":"quorum"}"#);
    // A dead-letter exchange from a policy rather than arguments.
    mgmt_ok(
        "PUT",
        &format!("/api/policies/{}/dl", enc(&vh.name)),
        Some(
            r#"{"pattern":"^plain$","apply-to":"queues","definition":{"dead-letter-exchange":"dlx","dead-letter-routing-key":"gone"}}"#,
        ),
    );
    let (_conn, ch) = vh.connect().await;
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    publish(&ch, "stamped", 2, |i| Some(now_s() as u64 - 60 + i)).await;
    publish(&ch, "plain", 2, |_| None).await;
    publish(&ch, "raft", 1, |_| None).await;
    // The broker emits queue statistics every 5 s.
    wait_until(Duration::from_secs(30), || async {
        let row = vh.queue("plain");
        (row["messages"] == 2
            && vh.queue("raft")["messages"] == 1
            && row["effective_policy_definition"]["dead-letter-exchange"] == "dlx")
            .then_some(())
            .ok_or_else(|| format!("{row}"))
    })
    .await
    .unwrap();
    let config = source_toml(
        "rd",
        &vh.name,
        &mon.name,
        "RD_PASSWORD",
        "queues = \"stamped|plain|lost|raft\"\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, &config).unwrap();
    let out = Cmd::new(["doctor", "--config"])
        .arg(&path)
        .env("RD_PASSWORD", &mon.password)
        .output();
    let text = common::strip_ansi(&format!("{}{}", out.stdout, out.stderr));
    let line = |queue: &str| -> String {
        let needle = format!("queue \"{}\"", q(&vh, queue));
        text.lines()
            .filter(|l| l.contains(&needle))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let expect = [
        ("stamped", "lag seconds from its head message's timestamp"),
        ("stamped", "dead letters go to exchange \"dlx\" → \"dead\""),
        ("plain", "its head message has no timestamp property"),
        (
            "plain",
            "dead letters go to exchange \"dlx\" with routing key \"gone\"",
        ),
        ("raft", "a quorum queue reports no head message timestamp"),
        ("lost", "\"no-such-exchange\", which does not exist"),
        ("plain", "has no consumer: 2 messages wait"),
    ];
    for (queue, words) in expect {
        assert!(
            line(queue).contains(words),
            "{queue}: want {words:?} in:\n{text}"
        );
    }
    assert!(text.contains("tags: monitoring"), "{text}");
    assert!(text.contains("one poll in"), "{text}");
}

/// Publishes `orders` messages to `orders` and gets and rejects `rejected`
/// of them, then publishes `logged` to the stream `log`; returns the
/// connection and its channel, which the caller keeps open until the agent
/// has seen its counts: when RabbitMQ's core-metrics GC (every 120 s) runs
/// between a channel's close and the management statistics' next collection
/// (every 5 s), the channel's publishes never reach `message_stats.publish`
/// (docs/rabbitmq.md, "What the broker can lose"). lapin closes a channel
/// when its last handle is dropped, so keeping the connection alone is not
/// enough.
async fn orders_and_log(
    vh: &Vhost,
    orders: u64,
    rejected: usize,
    logged: u64,
) -> (lapin::Connection, lapin::Channel) {
    let (conn, ch) = vh.connect().await;
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    publish(&ch, "orders", orders, |_| None).await;
    get_each(&ch, "orders", rejected, Then::Reject).await;
    publish(&ch, "log", logged, |_| None).await;
    (conn, ch)
}

/// The broker's application stopped and started under the agent (`rabbitmqctl
/// stop_app; start_app`, the nextest group `rabbitmq-restart` runs it alone):
/// the source goes down naming the URL, comes back by itself (its stream
/// protocol connection too), and its counters neither jump nor go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_broker_under_the_agent() {
    let vh = Vhost::create("restart");
    let mon = Monitor::create(&vh);
    dead_letter_pair(&vh, "dlx", "dead");
    declare_queue(&vh, "orders", r#"{"x-dead-letter-exchange":"dlx"}"#);
    // A stream beside it, read over the stream protocol: its kept
    // connection dies with the broker and is opened again.
    declare_queue(&vh, "log", r#"{"x-queue-type":"stream"}"#);
    mgmt_ok(
        "PUT",
        &format!("/api/permissions/{}/{}", enc(&vh.name), enc(&mon.name)),
        Some(r#"{"configure":"","write":"","read":"^log$"}"#),
    );
    let (orders, log) = (q(&vh, "orders"), q(&vh, "log"));
    let config = source_toml(
        "rr",
        &vh.name,
        &mon.name,
        "RR_PASSWORD",
        "poll_interval = \"1s\"\nstreams_url = \"rabbitmq-stream://127.0.0.1:5552\"\n",
    );
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new("rabbitmqctl")
            .args(args)
            .output()
            .expect("rabbitmqctl");
        assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
    };
    // The core-metrics GC run at once after the publishes, before the next
    // collection of statistics: the counts of an open channel survive it
    // (a closed one's would not: docs/rabbitmq.md).
    let gc = || ctl(&["eval", "rabbit_core_metrics_gc ! start_gc."]);
    let agent = Agent::start_with_env(&config, &[("RR_PASSWORD", &mon.password)]);
    agent.wait_ready(READY_TIMEOUT).await;
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        diff(
            &m,
            "rr",
            &[
                (PUBLISHED, &orders, 0.0),
                (DEAD, &orders, 0.0),
                (PUBLISHED, &log, 0.0),
            ],
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let (conn, _ch) = orders_and_log(&vh, 12, 4, 5).await;
    gc();
    let before = [
        (MESSAGES, orders.as_str(), 8.0),
        (PUBLISHED, &orders, 12.0),
        (DEAD, &orders, 4.0),
        (PUBLISHED, &log, 5.0),
    ];
    wait_until(Duration::from_secs(60), || async {
        diff(&agent.try_scrape().await?, "rr", &before)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    conn.close(200, "bye".into()).await.ok();

    ctl(&["stop_app"]);
    let down = wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let s = agent.api_source("rr").await?.to_string();
        (m.get("inboxwatch_source_up", &[("source", "rr")]) == Some(0.0)
            && s.contains("http://127.0.0.1:15672/api/vhosts"))
        .then_some(())
        .ok_or(s)
    })
    .await;
    ctl(&["start_app"]);
    down.unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // Back by itself; the durable queue's 8 persistent messages are there;
    // the broker's statistics were reset, the counters are not.
    wait_until(Duration::from_secs(90), || async {
        let m = agent.try_scrape().await?;
        if m.get("inboxwatch_source_up", &[("source", "rr")]) != Some(1.0) {
            return Err("not up".into());
        }
        diff(&m, "rr", &before)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // And counting goes on from there.
    let _kept = orders_and_log(&vh, 3, 2, 3).await;
    gc();
    wait_until(Duration::from_secs(60), || async {
        diff(
            &agent.try_scrape().await?,
            "rr",
            &[
                (MESSAGES, &orders, 9.0),
                (PUBLISHED, &orders, 15.0),
                (DEAD, &orders, 6.0),
                (PUBLISHED, &log, 8.0),
            ],
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let _ = mgmt("GET", "/api/overview", None);
}

/// One owner per source: two agents with `[sources.election]` (a user that
/// may configure only the lock queue's name); exactly one exports the
/// queues; killed, the other takes over at once (the broker drops the
/// exclusive queue with the dead agent's connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_agent_owns_the_source_and_another_takes_over() {
    let vh = Vhost::create("elect");
    let mon = Monitor::create(&vh);
    declare_queue(&vh, "orders", "{}");
    let locker = Monitor::create(&vh);
    mgmt_ok(
        "PUT",
        &format!("/api/permissions/{}/{}", enc(&vh.name), enc(&locker.name)),
        Some(r#"{"configure":"^inboxwatch\\.election\\..*","write":"","read":""}"#),
    );
    let election = format!(
        "poll_interval = \"1s\"\n[sources.election]\nurl = \"amqp://127.0.0.1:5672/{}\"\nusername = \"{}\"\npassword = \"${{RE_LOCK}}\"\n",
        enc(&vh.name),
        locker.name
    );
    let config = source_toml("re", &vh.name, &mon.name, "RE_PASSWORD", &election);
    let env = [
        ("RE_PASSWORD", mon.password.as_str()),
        ("RE_LOCK", locker.password.as_str()),
    ];
    let a = Agent::start_with_env(&config, &env);
    let b = Agent::start_with_env(&config, &env);
    a.wait_ready(READY_TIMEOUT).await;
    b.wait_ready(READY_TIMEOUT).await;
    let orders = q(&vh, "orders");
    let leader = |m: &Metrics| m.get("inboxwatch_source_leader", &[("source", "re")]);
    let (owner, standby) = wait_until(Duration::from_secs(60), || async {
        let (ma, mb) = (a.try_scrape().await?, b.try_scrape().await?);
        let exported = |m: &Metrics| {
            m.get(MESSAGES, &[("source", "re"), ("queue", &orders)])
                .is_some()
        };
        match (leader(&ma), leader(&mb)) {
            (Some(1.0), Some(0.0)) if exported(&ma) && !exported(&mb) => Ok((&a, &b)),
            (Some(0.0), Some(1.0)) if exported(&mb) && !exported(&ma) => Ok((&b, &a)),
            other => Err(format!("leaders {other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", a.stderr(), b.stderr()));
    // The lock is an exclusive queue of the owner's connection.
    let lock = vh.queue("inboxwatch.election.re");
    assert_eq!(lock["exclusive"], true, "{lock}");
    // `doctor` sees the lock held.
    let doctor = Cmd::new(["doctor", "--config"])
        .arg(a.dir().join("inboxwatch.toml"))
        .envs(env)
        .output();
    assert!(
        doctor
            .stdout
            .contains("an agent holds the lock queue inboxwatch.election.re"),
        "{}{}",
        doctor.stdout,
        doctor.stderr
    );
    // One owner for a while.
    stays(Duration::from_secs(6), || async {
        let (mo, ms) = (owner.try_scrape().await?, standby.try_scrape().await?);
        (leader(&mo) == Some(1.0) && leader(&ms) == Some(0.0))
            .then_some(())
            .ok_or_else(|| "two owners or none".into())
    })
    .await
    .unwrap();
    owner.sigkill();
    wait_until(Duration::from_secs(30), || async {
        let m = standby.try_scrape().await?;
        (leader(&m) == Some(1.0)
            && m.get(MESSAGES, &[("source", "re"), ("queue", &orders)])
                .is_some())
        .then_some(())
        .ok_or_else(|| "no takeover yet".into())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", standby.stderr()));
    for text in [a.stderr(), b.stderr()] {
        assert!(
            !text.contains(&locker.password),
            "the lock's password printed"
        );
    }
}

/// `python tests/libraries/python/rstream_workload.py --vhost … --stream …
/// --phase <phase>` (rstream, the stream protocol's Python client) to
/// completion: its report.
async fn stream_workload(vh: &Vhost, stream: &str, phase: &str) -> serde_json::Value {
    let mut cmd = stream_workload_cmd(vh, stream, phase);
    common::library::report(
        &common::library::run_workload(&format!("rstream_workload.py --phase {phase}"), &mut cmd)
            .await,
    )
}

fn stream_workload_cmd(vh: &Vhost, stream: &str, phase: &str) -> std::process::Command {
    let python = common::repo_path("tests/libraries/python/.venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: scripts/test.sh creates the venv from tests/libraries/python/requirements.txt",
        python.display()
    );
    let dir = common::repo_path("tests/libraries/python");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(dir.join("rstream_workload.py"))
        .args(["--vhost", &vh.name, "--stream", stream, "--phase", phase])
        .current_dir(&dir);
    cmd
}

/// A stream queue read over the stream protocol, against rstream's own
/// ground truth: three batches of 100 messages 3 s apart; consumer
/// "billing" stores offset 199 (the last of the second batch), "audit" 39,
/// "done" 299. Lag in messages = the last offset (299) less the stored one;
/// lag seconds within a second of the publishing of the batch holding the
/// first offset not stored (the third for billing: the chunk of the stored
/// offset itself would be the second; the first for audit), 0 for done;
/// the published counter grows by the 300; a name that stored nothing has
/// no row. With no subscription the
/// consumers read `stop` once the window passes; with billing attached and
/// storing nothing, `stall`. The monitoring user may read the stream only
/// (reading it takes nothing from it), and `doctor` says what it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_consumers_lag_in_offsets_and_chunk_time() {
    let vh = Vhost::create("stream");
    let mon = Monitor::create(&vh);
    mgmt_ok(
        "PUT",
        &format!("/api/permissions/{}/{}", enc(&vh.name), enc(&mon.name)),
        Some(r#"{"configure":"","write":"","read":"^orders\\.log$"}"#),
    );
    stream_workload(&vh, "orders.log", "create").await;
    let log = q(&vh, "orders.log");
    let config = source_toml(
        "rsm",
        &vh.name,
        &mon.name,
        "RSM_PASSWORD",
        "queues = \"orders\\\\.log\"\npoll_interval = \"1s\"\nstatus_window = \"6s\"\n\
         streams_url = \"rabbitmq-stream://127.0.0.1:5552\"\n\
         stream_consumers = [\"billing\", \"audit\", \"done\", \"nobody\"]\n",
    );
    let agent = Agent::start_with_env(&config, &[("RSM_PASSWORD", &mon.password)]);
    agent.wait_ready(READY_TIMEOUT).await;
    // The empty stream's baseline, before anything is published.
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        diff(&m, "rsm", &[(PUBLISHED, &log, 0.0)])
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    let truth = stream_workload(&vh, "orders.log", "run").await;
    let batches = truth["batches"].as_array().expect("batches");
    assert_eq!(truth["stored"]["billing"], 199, "{truth}");
    assert_eq!(truth["stored"]["audit"], 39, "{truth}");
    assert_eq!(truth["stored"]["done"], 299, "{truth}");
    let consumer = |m: &Metrics, name: &str, c: &str| {
        m.get(
            name,
            &[
                ("source", "rsm"),
                ("broker", "rabbitmq"),
                ("queue", log.as_str()),
                ("consumer", c),
            ],
        )
    };
    // Where a scrape's lag seconds put the chunk's time: the value was
    // worked out at the last poll, at most 1.5 s before the scrape.
    let within = |v: Option<f64>, batch: usize, scraped: f64| -> Result<(), String> {
        let v = v.ok_or("no lag seconds")?;
        let b = &batches[batch];
        let (start, end) = (b["start"].as_f64().unwrap(), b["end"].as_f64().unwrap());
        let written = scraped - v;
        if written >= start - 0.2 && written <= end + 1.5 {
            Ok(())
        } else {
            Err(format!(
                "lag seconds {v:.3} put the chunk at {written:.3}, batch {batch} was published in [{start:.3}, {end:.3}]"
            ))
        }
    };
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let scraped = now_s();
        diff(&m, "rsm", &[(PUBLISHED, &log, 300.0)])?;
        let got = [
            consumer(&m, LAG, "billing"),
            consumer(&m, LAG, "audit"),
            consumer(&m, LAG, "done"),
            consumer(&m, LAG_S, "done"),
            consumer(&m, LAG, "nobody"),
        ];
        if got != [Some(100.0), Some(260.0), Some(0.0), Some(0.0), None] {
            return Err(format!(
                "lag billing, audit, done, done's seconds, nobody: {got:?}"
            ));
        }
        within(consumer(&m, LAG_S, "billing"), 2, scraped)?;
        within(consumer(&m, LAG_S, "audit"), 0, scraped)?;
        let status = |c: &str| {
            m.series(
                STATUS,
                &[("source", "rsm"), ("queue", log.as_str()), ("consumer", c)],
            )
            .find(|s| s.value == 1.0)
            .map(|s| s.labels["status"].clone())
        };
        // Nothing attached, nothing stored for longer than the window.
        let got = (
            status("billing"),
            consumer(&m, CONSUMERS, "billing"),
            status("audit"),
        );
        if got == (Some("stop".into()), Some(0.0), Some("stop".into())) {
            Ok(())
        } else {
            Err(format!("status, consumers: {got:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    // billing attached again, reading on and storing nothing: stalled.
    let dir = tempfile::tempdir().unwrap();
    let hold = common::process::Proc::spawn(
        "rstream_workload.py --phase hold",
        &mut stream_workload_cmd(&vh, "orders.log", "hold"),
        dir.path(),
        "hold",
    );
    wait_until(Duration::from_secs(60), || async {
        if let Some(s) = hold.exited() {
            panic!("the hold phase exited: {s}\n{}", hold.output_tail());
        }
        let m = agent.try_scrape().await?;
        let got = consumer(&m, CONSUMERS, "billing");
        let status = m
            .series(
                STATUS,
                &[
                    ("source", "rsm"),
                    ("queue", log.as_str()),
                    ("consumer", "billing"),
                ],
            )
            .find(|s| s.value == 1.0)
            .map(|s| s.labels["status"].clone());
        if got == Some(1.0) && status.as_deref() == Some("stall") {
            Ok(())
        } else {
            Err::<(), String>(format!("consumers {got:?}, status {status:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    drop(hold);

    let path = dir.path().join("c.toml");
    std::fs::write(&path, &config).unwrap();
    let out = Cmd::new(["doctor", "--config"])
        .arg(&path)
        .env("RSM_PASSWORD", &mon.password)
        .output();
    let text = common::strip_ansi(&format!("{}{}", out.stdout, out.stderr));
    for want in [
        format!("queue \"{log}\" (stream): last message at offset 299"),
        "consumers \"billing\" stored 199 (lag 100), \"audit\" stored 39 (lag 260), \"done\" stored 299 (lag 0)".to_string(),
        "no offset stored by \"nobody\"".to_string(),
    ] {
        assert!(text.contains(&want), "doctor lacks {want:?}:\n{text}");
    }
    assert!(!text.contains(&mon.password), "{text}");
}
