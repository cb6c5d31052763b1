//! The Kafka source (SPEC §3.3) against a real Kafka-protocol broker (tansu,
//! one per test, in memory) with real rdkafka producers and consumers:
//! lag in messages and in exact seconds, topic granularity, never-committed
//! partitions, group status over the window, dead-letter and retry topics,
//! the broker going away, and security config errors.

use crate::common;
use crate::kafka_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Agent, Cmd, Metrics, READY_TIMEOUT, stays, unique_name, wait_until};
use kafka_support::{Broker, kafka_source_toml, now_ms};

const LAG: &str = "kafka_consumer_group_lag_messages";
const LAG_S: &str = "kafka_consumer_group_lag_seconds";
const COMMITTED: &str = "kafka_consumer_group_committed_offset";
const HWM: &str = "kafka_topic_partition_high_watermark";
const STATUS: &str = "kafka_consumer_group_status";

fn status_of(m: &Metrics, cluster: &str, group: &str) -> Option<String> {
    m.series(STATUS, &[("cluster", cluster), ("group", group)])
        .find(|s| s.value == 1.0)
        .map(|s| s.labels["status"].clone())
}

/// The age in seconds of a record stamped `ts` (ms) as seen at `from` and at
/// `to`: the bounds of a lag-seconds value computed between the two.
fn ages(ts: i64, from: i64, to: i64) -> (f64, f64) {
    ((from - ts) as f64 / 1000.0, (to - ts) as f64 / 1000.0)
}

/// Ground truth: records with known CreateTime timestamps on three
/// partitions; group `billing` commits 4 of 10 on p0, all 5 on p1 and
/// nothing on p2; group `audit` commits 10 on p0 and 1 on p2. Checked on a
/// partition-granularity source and a topic-granularity source side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lag_in_messages_and_exact_seconds_per_partition_and_topic() {
    let broker = Broker::start().await;
    let topic = unique_name("orders", "o");
    broker.create_topic(&topic, 3).await;
    let producer = broker.producer();
    let base = now_ms() - 600_000;
    // ts[p][offset]
    let mut ts: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, n) in [(0, 10), (1, 5), (2, 4)] {
        for i in 0..n {
            let t = base + p as i64 * 100_000 + i * 7_000;
            let off = producer.send(&topic, p, t).await;
            assert_eq!(off, i, "offsets are dense on a fresh partition");
            ts.entry(p).or_default().push(t);
        }
    }
    let billing = broker.committer("billing");
    billing.consume_and_commit(&topic, 0, 4);
    billing.consume_and_commit(&topic, 1, 5);
    let audit = broker.committer("audit");
    audit.consume_and_commit(&topic, 0, 10);
    audit.consume_and_commit(&topic, 2, 1);

    let config = format!(
        "{}{}",
        kafka_source_toml("kp", &broker.bootstrap(), ""),
        kafka_source_toml("kt", &broker.bootstrap(), "granularity = \"topic\"")
    );
    // The agent reads its clock for lag seconds after it starts and before the
    // scrape that shows the value: the value lies between the two ages, to the
    // millisecond, however long the cycle took on a loaded machine.
    let started = now_ms();
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    let t = topic.as_str();
    let m = wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        let want = [
            ("billing", "0", 6.0),
            ("billing", "1", 0.0),
            ("audit", "0", 0.0),
            ("audit", "2", 3.0),
        ];
        for (g, p, lag) in want {
            let got = m.get(
                LAG,
                &[
                    ("cluster", "kp"),
                    ("group", g),
                    ("topic", t),
                    ("partition", p),
                ],
            );
            if got != Some(lag) {
                return Err(format!("{g}/{p}: lag {got:?}, want {lag}"));
            }
            if m.get(LAG_S, &[("cluster", "kp"), ("group", g), ("partition", p)])
                .is_none()
            {
                return Err(format!("{g}/{p}: no lag seconds yet"));
            }
        }
        Ok(m)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let now = now_ms();

    // Lag seconds: now minus the timestamp of the record at the committed offset.
    for (g, p, committed) in [("billing", 0, 4), ("audit", 2, 1)] {
        let got = m
            .get(
                LAG_S,
                &[
                    ("cluster", "kp"),
                    ("group", g),
                    ("topic", t),
                    ("partition", &p.to_string()),
                ],
            )
            .unwrap();
        let (low, high) = ages(ts[&p][committed as usize], started, now);
        assert!(
            (low..=high).contains(&got),
            "{g}/{p}: lag seconds {got}, want between {low} and {high} (record at offset {committed})"
        );
    }
    for (g, p) in [("billing", "1"), ("audit", "0")] {
        assert_eq!(
            m.get(LAG_S, &[("cluster", "kp"), ("group", g), ("partition", p)]),
            Some(0.0),
            "{g}/{p}: caught up, lag seconds 0"
        );
    }
    // Committed offsets and high watermarks.
    for (g, p, c) in [
        ("billing", "0", 4.0),
        ("billing", "1", 5.0),
        ("audit", "0", 10.0),
        ("audit", "2", 1.0),
    ] {
        assert_eq!(
            m.get(
                COMMITTED,
                &[("cluster", "kp"), ("group", g), ("partition", p)]
            ),
            Some(c),
            "{g}/{p} committed"
        );
    }
    for (p, h) in [("0", 10.0), ("1", 5.0), ("2", 4.0)] {
        assert_eq!(
            m.get(HWM, &[("cluster", "kp"), ("topic", t), ("partition", p)]),
            Some(h),
            "high watermark of {p}"
        );
    }
    // Never-committed partitions: no sample (never -1), counted per topic.
    assert!(
        m.series(
            LAG,
            &[("cluster", "kp"), ("group", "billing"), ("partition", "2")]
        )
        .next()
        .is_none(),
        "billing never committed on partition 2: no lag sample"
    );
    assert!(
        m.series(COMMITTED, &[("cluster", "kp")])
            .all(|s| s.value >= 0.0),
        "no negative committed offset"
    );
    let uncommitted = "kafka_consumer_group_uncommitted_partitions";
    assert_eq!(
        m.get(
            uncommitted,
            &[("cluster", "kp"), ("group", "billing"), ("topic", t)]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.get(
            uncommitted,
            &[("cluster", "kp"), ("group", "audit"), ("topic", t)]
        ),
        Some(1.0)
    );

    // Topic granularity: sums of lag and offsets, the maximum of lag seconds,
    // no partition label.
    let m = wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        m.get(LAG, &[("cluster", "kt"), ("group", "audit"), ("topic", t)])
            .map(|_| m)
            .ok_or_else(|| "no topic-granularity series yet".to_string())
    })
    .await
    .unwrap();
    assert!(
        m.series(LAG, &[("cluster", "kt")])
            .all(|s| !s.labels.contains_key("partition")),
        "topic granularity drops the partition label"
    );
    let now = now_ms();
    assert_eq!(
        m.get(
            LAG,
            &[("cluster", "kt"), ("group", "billing"), ("topic", t)]
        ),
        Some(6.0)
    );
    assert_eq!(
        m.get(LAG, &[("cluster", "kt"), ("group", "audit"), ("topic", t)]),
        Some(3.0)
    );
    assert_eq!(
        m.get(
            COMMITTED,
            &[("cluster", "kt"), ("group", "billing"), ("topic", t)]
        ),
        Some(9.0)
    );
    assert_eq!(m.get(HWM, &[("cluster", "kt"), ("topic", t)]), Some(19.0));
    let max_age = m
        .get(
            LAG_S,
            &[("cluster", "kt"), ("group", "billing"), ("topic", t)],
        )
        .unwrap();
    let (low, high) = ages(ts[&0][4], started, now);
    assert!(
        (low..=high).contains(&max_age),
        "topic lag seconds {max_age}, want between {low} and {high}"
    );
    for g in ["billing", "audit"] {
        assert_eq!(status_of(&m, "kp", g).as_deref(), Some("ok"), "{g} status");
    }
    // The agent never joined or created a group of its own on the cluster:
    // the groups it sees are exactly the two the test made.
    let groups: std::collections::BTreeSet<String> = m
        .series(STATUS, &[("cluster", "kp")])
        .map(|s| s.labels["group"].clone())
        .collect();
    assert_eq!(
        groups,
        ["audit", "billing"].iter().map(|s| s.to_string()).collect()
    );
    // The record-read cache: the two partitions with a lag (billing/0, audit/2) had
    // their record at the committed offset read once; with no offset moving, no
    // later cycle reads it again. The later scrape waits for at least four more
    // cycles (polls counted by the agent), so the cycles it reasons about ran.
    let reads = |m: &Metrics| m.sum("inboxwatch_kafka_record_reads_total", &[("source", "kp")]);
    let polls = |m: &Metrics| {
        m.sum(
            "inboxwatch_poll_duration_seconds_count",
            &[("source", "kp")],
        )
    };
    let m = agent.scrape().await;
    let (first, first_polls) = (reads(&m), polls(&m));
    let later = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let ran = polls(&m) - first_polls;
        (ran >= 4.0)
            .then(|| reads(&m))
            .ok_or_else(|| format!("{ran} cycles since the first scrape"))
    })
    .await
    .unwrap();
    assert_eq!(
        (first, later),
        (2.0, 2.0),
        "records read for lag seconds: one per lagging partition, never again while \
         its committed offset stays"
    );
}

/// ok → stop when the consumer stops committing while records keep coming
/// (within one window of 4 s, after at least one), → ok when it resumes,
/// → rewind when its offset is reset backwards; a group on an idle topic
/// stays ok throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_status_follows_a_consumer_that_stops_resumes_and_rewinds() {
    let broker = Broker::start().await;
    let topic = unique_name("payments", "p");
    let idle_topic = unique_name("idle", "i");
    broker.create_topic(&topic, 1).await;
    broker.create_topic(&idle_topic, 1).await;
    let producer = broker.producer();
    for _ in 0..3 {
        producer.send(&idle_topic, 0, now_ms()).await;
    }
    let idle = broker.committer("idle-group");
    idle.consume_and_commit(&idle_topic, 0, 3);
    let worker = broker.committer("worker");
    let mut next = 0i64;
    for _ in 0..5 {
        next = producer.send(&topic, 0, now_ms()).await + 1;
    }
    worker.commit(&topic, 0, next - 1);

    let agent = Agent::start(&kafka_source_toml("ks", &broker.bootstrap(), ""));
    agent.wait_ready(READY_TIMEOUT).await;
    let window = Duration::from_secs(4);
    let mut idle_statuses = Vec::new();

    // Phase 1: the consumer keeps up (one record behind, offsets moving). It
    // commits the offset of the record about to come before it is sent: the
    // agent reads the high watermark before the committed offsets, so it sees
    // a lag of 1 (or 0, between the two), never 2 — sending first would let a
    // poll falling between the send and the commit see 2 after a window of
    // 1s, which is a rising lag, rightly warn.
    let phase = Instant::now();
    while phase.elapsed() < Duration::from_secs(6) {
        worker.commit(&topic, 0, next);
        next = producer.send(&topic, 0, now_ms()).await + 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let m = agent.scrape().await;
        idle_statuses.push(status_of(&m, "ks", "idle-group"));
        assert_eq!(
            status_of(&m, "ks", "worker").as_deref(),
            Some("ok"),
            "a consumer one record behind with moving offsets is ok (and, the agent being \
             ready, has a status)"
        );
    }
    // Phase 2: it stops committing; records keep arriving.
    let stopped = Instant::now();
    let mut seen_stop = None;
    while stopped.elapsed() < window + Duration::from_secs(4) {
        producer.send(&topic, 0, now_ms()).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let m = agent.scrape().await;
        idle_statuses.push(status_of(&m, "ks", "idle-group"));
        let s = status_of(&m, "ks", "worker").unwrap_or_default();
        if s == "stop" {
            seen_stop = Some(stopped.elapsed());
            break;
        }
        assert!(
            s == "ok" || s == "warn",
            "before a full window without commits the group is ok, or warn as its lag rises: {s}"
        );
    }
    let after = seen_stop.expect("the group never went to stop");
    assert!(
        after >= window - Duration::from_millis(600),
        "stop came {after:?} after the last commit, before one window ({window:?})"
    );
    // The last commit was made just before `stopped` (a phase-1 loop lasts 250 ms
    // and more); the agent sees it at its next poll (every 500 ms) and reports the age
    // at its latest poll: between the time since it and that minus a poll and the
    // phase-1 loop, with 0.5 s for the scrape.
    let before = stopped.elapsed().as_secs_f64();
    let m = agent.scrape().await;
    let after = stopped.elapsed().as_secs_f64();
    let age = m
        .get(
            "kafka_consumer_group_last_commit_age_seconds",
            &[("cluster", "ks"), ("group", "worker")],
        )
        .expect("the group has a last commit age");
    assert!(
        (before - 1.0 - 0.5..=after + 1.0).contains(&age),
        "last commit age {age} s, the last commit was made {before:.2}..{after:.2} s (plus up \
         to one phase-1 loop) before the scrape"
    );
    assert_eq!(
        m.get(
            "kafka_consumer_group_members",
            &[("cluster", "ks"), ("group", "worker")]
        ),
        Some(0.0),
        "a consumer that assigns partitions by hand is no member: stop, not stall"
    );

    // Phase 3: it resumes.
    let next = producer.send(&topic, 0, now_ms()).await + 1;
    worker.commit(&topic, 0, next);
    wait_until(Duration::from_secs(5), || async {
        let m = agent.try_scrape().await?;
        match status_of(&m, "ks", "worker").as_deref() {
            Some("ok") => Ok(()),
            s => Err(format!("status {s:?}")),
        }
    })
    .await
    .expect("a resumed consumer is ok again");

    // Phase 4: reset backwards.
    worker.commit(&topic, 0, 1);
    wait_until(Duration::from_secs(5), || async {
        let m = agent.try_scrape().await?;
        match status_of(&m, "ks", "worker").as_deref() {
            Some("rewind") => Ok(()),
            s => Err(format!("status {s:?}")),
        }
    })
    .await
    .expect("an offset reset backwards is a rewind");
    let m = agent.scrape().await;
    assert_eq!(
        m.series(STATUS, &[("cluster", "ks"), ("group", "worker")])
            .count(),
        6,
        "one series per status"
    );
    idle_statuses.push(status_of(&m, "ks", "idle-group"));
    assert!(
        idle_statuses.iter().all(|s| s.as_deref() == Some("ok")),
        "the group on the idle topic must stay ok: {idle_statuses:?}"
    );
    assert!(idle_statuses.len() > 20);
}

/// Records produced to dead-letter and retry topics after the agent started
/// are counted exactly, retry topics by tier, and so are those of a dead-letter
/// topic created after the start; records that were there before and records of
/// ordinary topics are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_and_retry_topics_are_counted_per_topic_and_tier() {
    let broker = Broker::start().await;
    let dlq = "orders.DLQ";
    let dlq2 = "billing-dlq";
    let r10 = "orders.retry.10s";
    let r5m = "orders.retry.5m";
    let plain = "orders";
    for t in [dlq, dlq2, r10, r5m, plain] {
        broker.create_topic(t, 2).await;
    }
    let producer = broker.producer();
    // Before the agent: not counted.
    for p in 0..2 {
        producer.send(dlq, p, now_ms()).await;
    }
    let agent = Agent::start(&kafka_source_toml("kd", &broker.bootstrap(), ""));
    agent.wait_ready(READY_TIMEOUT).await;
    // A dead-letter topic created after the agent started: everything in it came
    // after the start, so all of it counts (produced before the agent next reads
    // the topic list).
    let late = "payments.DLQ";
    broker.create_topic(late, 1).await;
    for _ in 0..3 {
        producer.send(late, 0, now_ms()).await;
    }
    // After the agent's first cycle.
    let want = [(dlq, 7), (dlq2, 2), (r10, 3), (r5m, 5), (plain, 4)];
    for (t, n) in want {
        for i in 0..n {
            producer.send(t, i % 2, now_ms()).await;
        }
    }
    wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        let got = |name: &str, labels: &[(&str, &str)]| m.get(name, labels);
        let checks = [
            (
                got(
                    "kafka_dead_letter_messages_total",
                    &[("cluster", "kd"), ("topic", dlq)],
                ),
                7.0,
            ),
            (
                got(
                    "kafka_dead_letter_messages_total",
                    &[("cluster", "kd"), ("topic", dlq2)],
                ),
                2.0,
            ),
            (
                got(
                    "kafka_dead_letter_messages_total",
                    &[("cluster", "kd"), ("topic", late)],
                ),
                3.0,
            ),
            (
                got(
                    "kafka_retry_messages_total",
                    &[("cluster", "kd"), ("topic", r10), ("tier", "10s")],
                ),
                3.0,
            ),
            (
                got(
                    "kafka_retry_messages_total",
                    &[("cluster", "kd"), ("topic", r5m), ("tier", "5m")],
                ),
                5.0,
            ),
        ];
        for (i, (g, w)) in checks.iter().enumerate() {
            if *g != Some(*w) {
                return Err(format!("check {i}: {g:?}, want {w}"));
            }
        }
        if m.series("kafka_dead_letter_messages_total", &[("topic", plain)])
            .next()
            .is_some()
            || m.series("kafka_retry_messages_total", &[("topic", plain)])
                .next()
                .is_some()
        {
            return Err("an ordinary topic was counted".into());
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // And they stay exact (nothing counted twice on later cycles, which ran).
    let m = agent.wait_polls("kd", 3, Duration::from_secs(2)).await;
    assert_eq!(
        m.get(
            "kafka_dead_letter_messages_total",
            &[("cluster", "kd"), ("topic", dlq)]
        ),
        Some(7.0)
    );
    assert_eq!(
        m.sum("kafka_retry_messages_total", &[("cluster", "kd")]),
        8.0
    );
}

/// The broker killed mid-run: the Kafka source is down within two polls and
/// its series are gone, the SQLite inbox beside it keeps counting, and the
/// source recovers when the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_marks_the_source_down_and_others_continue() {
    let mut broker = Broker::start().await;
    let topic = "events";
    broker.create_topic(topic, 1).await;
    let producer = broker.producer();
    for _ in 0..3 {
        producer.send(topic, 0, now_ms()).await;
    }
    broker.committer("g").commit(topic, 0, 1);

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inbox.db");
    let db_url = format!("sqlite://{}?mode=rwc", db.display());
    let pool = sqlx::SqlitePool::connect(&db_url).await.unwrap();
    sqlx::query(
        "CREATE TABLE inbox (event_id TEXT PRIMARY KEY, event_type TEXT, status TEXT, \
         received_at TEXT, started_at TEXT, finished_at TEXT, attempts INTEGER, deliveries INTEGER, \
         last_error TEXT, traceparent TEXT, updated_at TEXT)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let insert = |id: String| {
        let pool = pool.clone();
        async move {
            let now = common::fmt_ts(now_ms());
            sqlx::query("INSERT INTO inbox VALUES (?, 'order.created', 'pending', ?, NULL, NULL, 0, 1, NULL, NULL, ?)")
                .bind(id)
                .bind(&now)
                .bind(&now)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    insert("e1".into()).await;
    let config = format!(
        "{}[[sources]]\nname = \"db\"\nkind = \"inbox\"\ndsn = \"sqlite://{}\"\ntable = \"inbox\"\npoll_interval = \"500ms\"\n{}",
        kafka_source_toml("kb", &broker.bootstrap(), ""),
        db.display(),
        common::scenarios::INBOX_COLUMNS
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let up = |m: &Metrics, s: &str| m.get("inboxwatch_source_up", &[("source", s)]);
    wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        (m.get(LAG, &[("cluster", "kb"), ("group", "g")]) == Some(2.0) && up(&m, "kb") == Some(1.0))
            .then_some(())
            .ok_or_else(|| "kafka series not there yet".to_string())
    })
    .await
    .unwrap();

    broker.kill();
    let killed = Instant::now();
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        if up(&m, "kb") != Some(0.0) {
            return Err(format!("kb up = {:?}", up(&m, "kb")));
        }
        if m.series(LAG, &[("cluster", "kb")]).next().is_some() {
            return Err("lag series of a down cluster still exported".into());
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // The connect timeout bounds the first failed poll; how soon is a
    // measurement (a loaded machine stretches it), printed.
    eprintln!(
        "MEASURED: down {:?} after the broker was killed",
        killed.elapsed()
    );
    // The table source beside it keeps working: e2 is new (e1 predates the
    // agent and is a baseline).
    insert("e2".into()).await;
    wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        let n = m.sum("inbox_messages_received_total", &[("source", "db")]);
        (n == 1.0 && up(&m, "db") == Some(1.0))
            .then_some(())
            .ok_or_else(|| format!("db received {n}, up {:?}", up(&m, "db")))
    })
    .await
    .unwrap();

    broker.restart().await;
    let p2 = broker.producer();
    broker.create_topic(topic, 1).await;
    for _ in 0..4 {
        p2.send(topic, 0, now_ms()).await;
    }
    broker.committer("g").commit(topic, 0, 3);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        (up(&m, "kb") == Some(1.0) && m.get(LAG, &[("cluster", "kb"), ("group", "g")]) == Some(1.0))
            .then_some(())
            .ok_or_else(|| format!("kb up {:?}", up(&m, "kb")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// A topic deleted mid-run takes its series with it (high watermarks, the
/// lag of the groups on it); a deleted group's series go too — nothing
/// freezes at its last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleted_topics_and_groups_disappear_from_metrics() {
    let broker = Broker::start().await;
    for t in ["keep", "drop"] {
        broker.create_topic(t, 1).await;
    }
    let producer = broker.producer();
    for t in ["keep", "drop"] {
        for _ in 0..3 {
            producer.send(t, 0, now_ms()).await;
        }
    }
    let a = broker.committer("a");
    a.commit("keep", 0, 1);
    a.commit("drop", 0, 1);
    broker.committer("gone").commit("keep", 0, 2);
    let agent = Agent::start(&kafka_source_toml("kx", &broker.bootstrap(), ""));
    agent.wait_ready(READY_TIMEOUT).await;
    wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        let n = m.series(LAG, &[("cluster", "kx")]).count();
        (n == 3 && m.get(HWM, &[("topic", "drop")]) == Some(3.0))
            .then_some(())
            .ok_or_else(|| format!("{n} lag series"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));

    drop(a);
    broker.delete_topic("drop").await;
    broker.delete_group("gone").await;
    wait_until(Duration::from_secs(10), || async {
        let m = agent.try_scrape().await?;
        let left: Vec<String> = m
            .samples
            .iter()
            .filter(|s| {
                s.labels.get("topic").map(String::as_str) == Some("drop")
                    || s.labels.get("group").map(String::as_str) == Some("gone")
            })
            .map(|s| s.series())
            .collect();
        if !left.is_empty() {
            return Err(format!("still exported: {left:?}"));
        }
        (m.get(LAG, &[("cluster", "kx"), ("group", "a"), ("topic", "keep")]) == Some(2.0))
            .then_some(())
            .ok_or_else(|| "the remaining group's lag is gone too".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// With `[tracing] export_metrics`, the Kafka series are pushed over OTLP
/// too, with the values and labels `/metrics` shows (gauges and counters).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_series_are_pushed_over_otlp_like_the_scrape() {
    let broker = Broker::start().await;
    broker.create_topic("orders", 2).await;
    broker.create_topic("orders.DLQ", 1).await;
    let producer = broker.producer();
    for p in 0..2 {
        for _ in 0..4 {
            producer.send("orders", p, now_ms()).await;
        }
    }
    broker.committer("billing").commit("orders", 0, 1);
    broker.committer("billing").commit("orders", 1, 3);
    let receiver = common::otlp::Receiver::start().await;
    let config = format!(
        "{}[tracing]\notlp_endpoint = \"{}\"\nprotocol = \"grpc\"\nexport_metrics = true\nmetrics_interval = \"1s\"\n",
        kafka_source_toml("ko", &broker.bootstrap(), ""),
        receiver.grpc_endpoint()
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    for _ in 0..3 {
        producer.send("orders.DLQ", 0, now_ms()).await;
    }
    let compared = [
        (LAG, "kafka.consumer.group.lag.messages"),
        (COMMITTED, "kafka.consumer.group.committed.offset"),
        (HWM, "kafka.topic.partition.high.watermark"),
        (
            "kafka_dead_letter_messages_total",
            "kafka.dead.letter.messages",
        ),
    ];
    wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        if m.get(
            "kafka_dead_letter_messages_total",
            &[("topic", "orders.DLQ")],
        ) != Some(3.0)
        {
            return Err("dead letters not counted yet".into());
        }
        let points = receiver.latest_points();
        let mut n = 0;
        for (prom, otel) in compared {
            for s in m.series(prom, &[("cluster", "ko")]) {
                n += 1;
                match points.get(&(otel.to_string(), s.labels.clone())) {
                    Some(p) if p.value == s.value => {}
                    other => {
                        return Err(format!(
                            "{}: scrape {} vs OTLP {other:?}",
                            s.series(),
                            s.value
                        ));
                    }
                }
            }
        }
        (n >= 8)
            .then_some(())
            .ok_or_else(|| format!("only {n} series compared"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

fn check_config(toml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Cmd::new(["check-config"]).arg(&path).output();
    (out.code.unwrap_or(-1), out.stderr + &out.stdout)
}

/// Security settings that cannot work are config errors naming their key;
/// a SASL password never appears in the output.
#[test]
fn bad_security_settings_are_config_errors_naming_the_key() {
    let base = "[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"127.0.0.1:9092\"]\n";
    let (code, out) = check_config(&format!(
        "{base}[sources.sasl]\nmechanism = \"SCRAM-SHA-1\"\nusername = \"u\"\npassword = \"hunter2-secret\"\n"
    ));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("sources[0].sasl.mechanism"), "{out}");
    assert!(out.contains("SCRAM-SHA-1"), "{out}");
    assert!(
        !out.contains("hunter2-secret"),
        "the password was printed: {out}"
    );

    let (code, out) = check_config(&format!(
        "{base}[sources.tls]\nca_file = \"/nonexistent/ca.pem\"\n"
    ));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("sources[0].tls.ca_file"), "{out}");
    assert!(out.contains("/nonexistent/ca.pem"), "{out}");

    let (code, out) = check_config(&format!(
        "{base}retry_topics = '.*\\.retry\\.[0-9]+s$'\ngranularity = \"broker\"\n"
    ));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("sources[0].retry_topics"), "{out}");
    assert!(out.contains("sources[0].granularity"), "{out}");

    let (code, out) = check_config(&format!(
        "{base}[sources.sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"u\"\npassword = \"${{IW_TEST_UNSET_PASSWORD}}\"\n"
    ));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("sources[0].sasl.password"), "{out}");

    let (code, out) = check_config(&format!(
        "{base}[sources.sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"u\"\npassword = \"p\"\n[sources.tls]\n"
    ));
    assert_eq!(code, 0, "a valid SASL_SSL source: {out}");
}

/// Guards `inboxwatch doctor` on a Kafka source (issue 18): against a broker with one
/// topic of 3 partitions, one group lagging on two of them (records at its committed
/// offsets to read for lag seconds) and one caught up, it prints the source, the
/// broker's negotiated API versions and one full cycle that read exactly the 2 records
/// at the lagging group's committed offsets, and exits 0; with no broker listening it
/// prints an error naming the broker and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_a_kafka_source_with_one_real_cycle() {
    let broker = Broker::start().await;
    let topic = unique_name("doctor", "d");
    broker.create_topic(&topic, 3).await;
    let producer = broker.producer();
    for p in 0..3 {
        for _ in 0..4 {
            producer.send(&topic, p, now_ms()).await;
        }
    }
    let lagging = broker.committer("lagging");
    lagging.commit(&topic, 0, 1);
    lagging.commit(&topic, 1, 3);
    lagging.commit(&topic, 2, 4);
    let done = broker.committer("done");
    for p in 0..3 {
        done.commit(&topic, p, 4);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |toml: String| {
        let path = dir.path().join("doctor.toml");
        std::fs::write(&path, toml).expect("write the config");
        Cmd::new(["doctor", "--config"])
            .arg(&path)
            .timeout(Duration::from_secs(60))
            .output()
    };
    let out = run(kafka_source_toml("kd", &broker.bootstrap(), ""));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("source \"kd\" (kafka, brokers {}):", broker.bootstrap()).as_str()),
        "{}",
        out.stdout
    );
    let versions = lines.get(1).copied().unwrap_or_default();
    let prefix = format!("  ok:      {}: Metadata v", broker.bootstrap());
    assert!(
        versions.starts_with(&prefix)
            && [
                "ListOffsets v",
                "ListGroups v",
                "DescribeGroups v",
                "OffsetFetch v",
                "Fetch v"
            ]
            .iter()
            .all(|api| versions.contains(api)),
        "the API versions line: {versions:?}\n{}",
        out.stdout
    );
    let cycle = lines
        .iter()
        .find(|l| l.contains("one cycle in "))
        .unwrap_or_else(|| panic!("no cycle line:\n{}", out.stdout));
    assert!(
        cycle.starts_with("  ok:      one cycle in ")
            && cycle.ends_with(" series, 2 records read for lag seconds"),
        "the cycle line: {cycle:?}"
    );
    assert!(
        !out.stdout.contains("error:"),
        "no check fails on a healthy broker:\n{}",
        out.stdout
    );

    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let out = run(kafka_source_toml("kd", &format!("127.0.0.1:{closed}"), ""));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let error = out
        .stdout
        .lines()
        .find(|l| l.starts_with("  error:   "))
        .unwrap_or_else(|| panic!("no error line:\n{}", out.stdout));
    assert!(
        error.contains(&format!("127.0.0.1:{closed}")),
        "the error names the broker: {error}"
    );
}

/// Guards the group statuses `warn` and `stall` end to end, and that a group's status
/// is its worst partition's (issue 18): a group with a live member on a topic of two
/// partitions, partition 1 always caught up (ok on its own). First the member commits
/// on partition 0 while records arrive faster than it commits (lag rising, offsets
/// moving): `warn`; then it stops committing with records still arriving and the
/// member still there: `stall` (a consumer alive but not advancing), never `stop`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_member_falling_behind_warns_then_stalls_and_the_worst_partition_wins() {
    let broker = Broker::start().await;
    let topic = unique_name("stall", "s");
    broker.create_topic(&topic, 2).await;
    let producer = broker.producer();
    let member = broker.member("slow", &topic);
    wait_until(Duration::from_secs(30), || {
        let n = member.assigned();
        async move {
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} partitions assigned"))
            }
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the member never got both partitions: {e}\n{}",
            broker.log()
        )
    });
    let mut next0 = 0;
    for _ in 0..3 {
        next0 = producer.send(&topic, 0, now_ms()).await + 1;
    }
    let next1 = producer.send(&topic, 1, now_ms()).await + 1;
    member.commit(&topic, 0, next0 - 1);
    member.commit(&topic, 1, next1);

    let agent = Agent::start(&kafka_source_toml("kw", &broker.bootstrap(), ""));
    agent.wait_ready(READY_TIMEOUT).await;
    let members = |m: &Metrics| {
        m.get(
            "kafka_consumer_group_members",
            &[("cluster", "kw"), ("group", "slow")],
        )
    };

    // Falling behind: 3 records a round, 1 committed.
    let mut committed0 = next0 - 1;
    let behind = Instant::now();
    let mut seen_warn = None;
    while behind.elapsed() < Duration::from_secs(12) {
        for _ in 0..3 {
            producer.send(&topic, 0, now_ms()).await;
        }
        committed0 += 1;
        member.commit(&topic, 0, committed0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let m = agent.scrape().await;
        let s = status_of(&m, "kw", "slow").unwrap_or_default();
        assert!(
            s == "ok" || s == "warn",
            "a member committing while it falls behind is ok, then warn; got {s}"
        );
        if s == "warn" {
            assert_eq!(members(&m), Some(1.0), "the group has its member");
            seen_warn = Some(behind.elapsed());
            break;
        }
    }
    let warned = seen_warn.expect("the group never went to warn while its lag rose");
    eprintln!("warn {warned:?} after the member began falling behind");

    // Not advancing at all, the member still there: stall.
    let stopped = Instant::now();
    let mut seen_stall = None;
    while stopped.elapsed() < Duration::from_secs(12) {
        producer.send(&topic, 0, now_ms()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let m = agent.scrape().await;
        let s = status_of(&m, "kw", "slow").unwrap_or_default();
        assert!(
            ["ok", "warn", "stall"].contains(&s.as_str()),
            "a live member that stopped committing is never {s}"
        );
        if s == "stall" {
            assert_eq!(
                members(&m),
                Some(1.0),
                "stall is judged with the member there"
            );
            assert_eq!(
                m.get(
                    LAG,
                    &[
                        ("cluster", "kw"),
                        ("group", "slow"),
                        ("topic", topic.as_str()),
                        ("partition", "1")
                    ]
                ),
                Some(0.0),
                "partition 1 is caught up: the group's status is partition 0's"
            );
            seen_stall = Some(stopped.elapsed());
            break;
        }
    }
    let stalled = seen_stall.expect("the group never went to stall");
    eprintln!("stall {stalled:?} after the last commit (window 4 s)");
    assert!(
        stalled >= Duration::from_millis(3400),
        "stall came {stalled:?} after the last commit, before one window (4 s)"
    );
    drop(member);
}

/// Guards clock sanity against a real broker (issue 15, item 6): rdkafka
/// produces records whose CreateTime is an hour ahead of the agent's clock (a
/// producer's clock skew) at the committed offsets of partitions 0 and 1, and
/// a record 2 minutes old at partition 2's. Lag seconds are 0 on the first
/// two, never negative, and the record's exact age on the third;
/// `inboxwatch_kafka_future_timestamps_total` is exactly 2 and stays 2 over
/// the following cycles (each record counted once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_produced_with_a_future_create_time_are_zero_seconds_old_and_counted_once() {
    let broker = Broker::start().await;
    let topic = unique_name("skew", "s");
    broker.create_topic(&topic, 3).await;
    let producer = broker.producer();
    let now = now_ms();
    let old = now - 120_000;
    for p in 0..3 {
        assert_eq!(producer.send(&topic, p, old).await, 0);
        let at_commit = if p < 2 { now + 3_600_000 } else { old + 1_000 };
        assert_eq!(producer.send(&topic, p, at_commit).await, 1);
        assert_eq!(producer.send(&topic, p, now).await, 2);
    }
    let group = broker.committer("skewed");
    for p in 0..3 {
        group.commit(&topic, p, 1);
    }
    let agent = Agent::start(&kafka_source_toml("ks", &broker.bootstrap(), ""));
    let t = topic.as_str();
    let lag_s = |m: &Metrics, p: &str| {
        m.get(
            LAG_S,
            &[
                ("cluster", "ks"),
                ("group", "skewed"),
                ("topic", t),
                ("partition", p),
            ],
        )
    };
    let future = |m: &Metrics| {
        m.get(
            "inboxwatch_kafka_future_timestamps_total",
            &[("source", "ks")],
        )
    };
    let m = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let seen = (lag_s(&m, "0"), lag_s(&m, "1"), lag_s(&m, "2"), future(&m));
        match seen {
            (Some(_), Some(_), Some(_), Some(n)) if n >= 2.0 => Ok(m),
            other => Err(format!("lag seconds p0, p1, p2 and the count: {other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let scraped = now_ms();
    assert_eq!(
        lag_s(&m, "0"),
        Some(0.0),
        "a record from the future is 0 s old"
    );
    assert_eq!(
        lag_s(&m, "1"),
        Some(0.0),
        "a record from the future is 0 s old"
    );
    let want = (scraped - (old + 1_000)) as f64 / 1000.0;
    let got = lag_s(&m, "2").unwrap();
    assert!(
        (got - want).abs() <= 1.0,
        "p2: lag seconds {got}, want {want}"
    );
    assert_eq!(future(&m), Some(2.0));
    stays(Duration::from_secs(3), || async {
        let m = agent.try_scrape().await?;
        let seen = (future(&m), lag_s(&m, "0"), lag_s(&m, "1"));
        (seen == (Some(2.0), Some(0.0), Some(0.0)))
            .then_some(())
            .ok_or(format!("count, p0, p1: {seen:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}
