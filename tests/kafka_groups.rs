//! KIP-848 consumer groups (issue 15) against the fake Kafka broker of
//! `tests/common/fake_kafka.rs` (kafka-protocol's broker half; no broker here
//! speaks KIP-848: tansu 0.6.0 and librdkafka's mock cluster have neither
//! ListGroups v5 nor ConsumerGroupDescribe). Its answers are shaped from the
//! protocol's JSON specs: `ListGroups` v5 with each group's `GroupType`,
//! `ConsumerGroupDescribe` with members, assignments and the group epoch,
//! `FindCoordinator` v4 with `Coordinators`, `OffsetFetch` v8 with `Groups`
//! (the fake's `Cluster` model). Every number checked is one the test's
//! cluster fixed.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake_kafka::{Cluster, FakeConfig, FakeGroup, FakeKafka, GroupProtocol};
use common::{Agent, Cmd, Metrics, READY_TIMEOUT, wait_until};
use kafka_protocol::messages::ApiKey;

const TOPIC: &str = "orders";
/// High watermark of each partition of `orders`.
const HWM: [i64; 2] = [100, 50];
/// The KIP-848 group: committed offsets, members, group epoch.
const KIP848: &str = "payments";
const KIP848_COMMITTED: [i64; 2] = [90, 50];
const KIP848_MEMBERS: usize = 2;
const KIP848_EPOCH: i32 = 7;
/// The classic group: committed on partition 0 only, no members.
const CLASSIC: &str = "audit";
const CLASSIC_COMMITTED: i64 = 95;
/// A share group (KIP-932): not watched.
const SHARE: &str = "notifications";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// The timestamp (ms) of the record at `offset` of partition `p`: fixed, an
/// hour ago plus the offset in seconds.
fn timestamp(base: i64, p: i32, offset: i64) -> i64 {
    base + p as i64 * 100_000 + offset * 1_000
}

/// The fake's cluster: `orders` with [`HWM`] records on its two partitions,
/// the KIP-848 group (listed from ListGroups v5 on), the classic group and
/// the share group.
fn cluster(base: i64) -> Arc<Mutex<Cluster>> {
    let mut c = Cluster::default();
    c.topics.insert(
        TOPIC.to_string(),
        (0..2)
            .map(|p| {
                (0..HWM[p as usize])
                    .map(|o| timestamp(base, p, o))
                    .collect()
            })
            .collect(),
    );
    let committed = |offsets: &[i64]| -> BTreeMap<(String, i32), i64> {
        offsets
            .iter()
            .enumerate()
            .map(|(p, &o)| ((TOPIC.to_string(), p as i32), o))
            .collect()
    };
    c.groups.insert(
        KIP848.to_string(),
        FakeGroup {
            members: KIP848_MEMBERS,
            committed: committed(&KIP848_COMMITTED),
            protocol: GroupProtocol::Consumer {
                epoch: KIP848_EPOCH,
            },
        },
    );
    c.groups.insert(
        CLASSIC.to_string(),
        FakeGroup {
            members: 0,
            committed: committed(&[CLASSIC_COMMITTED]),
            protocol: GroupProtocol::Classic,
        },
    );
    c.groups.insert(
        SHARE.to_string(),
        FakeGroup {
            members: 1,
            committed: BTreeMap::new(),
            protocol: GroupProtocol::Share,
        },
    );
    Arc::new(Mutex::new(c))
}

/// The versions of `key` the agent sent, sorted, once each.
fn asked(fake: &FakeKafka, key: ApiKey) -> Vec<i16> {
    let mut v: Vec<i16> = fake.requests_of(key).iter().map(|r| r.version).collect();
    v.sort();
    v.dedup();
    v
}

fn config(fake: &FakeKafka) -> String {
    format!(
        "[[sources]]\nname = \"kg\"\nkind = \"kafka\"\nbrokers = [\"{}\"]\n\
         poll_interval = \"500ms\"\nstatus_window = \"2s\"\n",
        fake.addr()
    )
}

fn status(m: &Metrics, group: &str) -> Option<String> {
    m.series(
        "kafka_consumer_group_status",
        &[("cluster", "kg"), ("group", group)],
    )
    .find(|s| s.value == 1.0)
    .map(|s| s.labels["status"].clone())
}

/// Guards KIP-848 groups (issue 15): ListGroups v5 names `payments` a
/// `consumer` group, `audit` a classic one and `notifications` a share group.
/// `payments` is described by ConsumerGroupDescribe (its 2 members; the
/// classic DescribeGroups would show none), `audit` by DescribeGroups (no
/// members); the share group is not watched. Lag, lag seconds and
/// uncommitted partitions are exact; with offsets that do not move and lag
/// left, `payments` (2 members) stalls and `audit` (none) stops after the
/// window — the status rules fed the right member count. The info series says
/// each group's protocol; `doctor` lists it with members and group epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_groups_are_described_with_their_members_and_judged_by_them() {
    let base = now_ms() - 3_600_000;
    let fake = FakeKafka::start(FakeConfig::default(), Cluster::handler(cluster(base))).await;
    let agent = Agent::start(&config(&fake));
    agent.wait_ready(READY_TIMEOUT).await;

    let m = wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        let want = [(KIP848, "stall"), (CLASSIC, "stop")];
        for (g, st) in want {
            let got = status(&m, g);
            if got.as_deref() != Some(st) {
                return Err(format!("{g}: status {got:?}, want {st}"));
            }
        }
        Ok(m)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let now = now_ms();

    let members = |g: &str| {
        m.get(
            "kafka_consumer_group_members",
            &[("cluster", "kg"), ("group", g)],
        )
    };
    assert_eq!(members(KIP848), Some(KIP848_MEMBERS as f64));
    assert_eq!(members(CLASSIC), Some(0.0));
    let protocol = |g: &str| {
        m.series(
            "kafka_consumer_group_info",
            &[("cluster", "kg"), ("group", g)],
        )
        .map(|s| s.labels["protocol"].clone())
        .collect::<Vec<_>>()
    };
    assert_eq!(protocol(KIP848), ["consumer"]);
    assert_eq!(protocol(CLASSIC), ["classic"]);
    assert!(protocol(SHARE).is_empty(), "a share group is not watched");
    assert!(
        m.series("kafka_consumer_group_status", &[("group", SHARE)])
            .next()
            .is_none()
    );

    let mut want: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    want.insert((KIP848, 0), KIP848_COMMITTED[0]);
    want.insert((KIP848, 1), KIP848_COMMITTED[1]);
    want.insert((CLASSIC, 0), CLASSIC_COMMITTED);
    for (&(g, p), &committed) in &want {
        let part = p.to_string();
        let labels = [
            ("cluster", "kg"),
            ("group", g),
            ("topic", TOPIC),
            ("partition", part.as_str()),
        ];
        let lag = HWM[p as usize] - committed;
        assert_eq!(
            m.get("kafka_consumer_group_lag_messages", &labels),
            Some(lag as f64),
            "{g}/{p}"
        );
        let seconds = m
            .get("kafka_consumer_group_lag_seconds", &labels)
            .unwrap_or_else(|| panic!("{g}/{p}: no lag seconds"));
        let want_s = if lag == 0 {
            0.0
        } else {
            (now - timestamp(base, p, committed)) as f64 / 1000.0
        };
        assert!(
            (seconds - want_s).abs() <= 2.0,
            "{g}/{p}: lag seconds {seconds}, want {want_s}"
        );
    }
    let uncommitted = |g: &str| {
        m.get(
            "kafka_consumer_group_uncommitted_partitions",
            &[("cluster", "kg"), ("group", g), ("topic", TOPIC)],
        )
    };
    assert_eq!(uncommitted(KIP848), Some(0.0));
    assert_eq!(uncommitted(CLASSIC), Some(1.0));
    assert_eq!(asked(&fake, ApiKey::ListGroups), [5]);
    assert_eq!(asked(&fake, ApiKey::ConsumerGroupDescribe), [1]);
    assert_eq!(asked(&fake, ApiKey::FindCoordinator), [4]);
    // The source reads offsets batched: OffsetFetch v8 or later only.
    let fetches = asked(&fake, ApiKey::OffsetFetch);
    assert!(
        !fetches.is_empty() && fetches.iter().all(|&v| v >= 8),
        "OffsetFetch versions {fetches:?}"
    );
    // Coordinators are kept between cycles: the source (not its election,
    // client id `inboxwatch-election`) sent one FindCoordinator in all, for
    // both groups.
    let polls = m.get(
        "inboxwatch_poll_duration_seconds_count",
        &[("source", "kg")],
    );
    assert!(polls.is_some_and(|n| n >= 4.0), "{polls:?} polls");
    let finds = fake
        .requests_of(ApiKey::FindCoordinator)
        .into_iter()
        .filter(|r| r.client_id.as_deref() == Some("inboxwatch"))
        .count();
    assert_eq!(finds, 1);
    drop(agent);

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("doctor.toml");
    std::fs::write(&path, config(&fake)).expect("write the config");
    let out = Cmd::new(["doctor", "--config"])
        .arg(&path)
        .timeout(Duration::from_secs(60))
        .output();
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let groups: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("group \""))
        .collect();
    assert_eq!(
        groups,
        [
            "  ok:      group \"audit\": classic protocol, 0 members",
            "  ok:      group \"payments\": consumer protocol (KIP-848), 2 members, group epoch 7",
        ],
        "{}",
        out.stdout
    );
}

/// A broker without ListGroups v5 and ConsumerGroupDescribe (before Kafka
/// 3.8): ListGroups v4 is sent, every group is taken as classic and
/// described by DescribeGroups (a share group, `protocol_type` "share", is
/// still left out), nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_without_kip848_fall_back_to_classic_groups() {
    let base = now_ms() - 3_600_000;
    let mut fake_config = FakeConfig::default();
    fake_config
        .api_versions
        .retain(|(k, _, _)| *k != ApiKey::ConsumerGroupDescribe);
    for v in fake_config.api_versions.iter_mut() {
        if v.0 == ApiKey::ListGroups {
            v.2 = 4;
        }
    }
    let fake = FakeKafka::start(fake_config, Cluster::handler(cluster(base))).await;
    let agent = Agent::start(&config(&fake));
    agent.wait_ready(READY_TIMEOUT).await;
    let m = wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        m.get(
            "kafka_consumer_group_lag_messages",
            &[("cluster", "kg"), ("group", CLASSIC), ("partition", "0")],
        )
        .map(|_| m)
        .ok_or_else(|| "no lag yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(
        m.get(
            "kafka_consumer_group_lag_messages",
            &[("cluster", "kg"), ("group", CLASSIC), ("partition", "0")],
        ),
        Some((HWM[0] - CLASSIC_COMMITTED) as f64)
    );
    let protocols: Vec<(String, String)> = m
        .series("kafka_consumer_group_info", &[("cluster", "kg")])
        .map(|s| (s.labels["group"].clone(), s.labels["protocol"].clone()))
        .collect();
    // The share group is known by its protocol type below v5 too.
    assert_eq!(protocols, [(CLASSIC.to_string(), "classic".to_string())]);
    assert_eq!(
        m.get("inboxwatch_source_up", &[("source", "kg")]),
        Some(1.0)
    );
    let versions: Vec<i16> = fake
        .requests_of(ApiKey::ListGroups)
        .iter()
        .map(|r| r.version)
        .collect();
    assert!(versions.iter().all(|v| *v == 4), "{versions:?}");
    assert!(fake.requests_of(ApiKey::ConsumerGroupDescribe).is_empty());
    let fetches = asked(&fake, ApiKey::OffsetFetch);
    assert!(
        !fetches.is_empty() && fetches.iter().all(|&v| v >= 8),
        "OffsetFetch versions {fetches:?}"
    );
}

/// Guards connection reuse (issue 15): the source keeps its connections from
/// one cycle to the next (far fewer connections than requests), and when the
/// broker closes them while idle (as `connections.max.idle.ms` does), the
/// next request opens a new one and is sent again: five closes, no failed
/// poll, the source never down, the lag exact throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_are_reused_and_reopened_after_the_broker_closes_them() {
    let base = now_ms() - 3_600_000;
    let fake = FakeKafka::start(FakeConfig::default(), Cluster::handler(cluster(base))).await;
    let agent = Agent::start(&config(&fake));
    agent.wait_ready(READY_TIMEOUT).await;
    let lag_of = |m: &Metrics| {
        m.get(
            "kafka_consumer_group_lag_messages",
            &[("cluster", "kg"), ("group", KIP848), ("partition", "0")],
        )
    };
    let polls = |m: &Metrics| {
        m.get(
            "inboxwatch_poll_duration_seconds_count",
            &[("source", "kg")],
        )
        .unwrap_or(0.0)
    };
    let m = wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        (lag_of(&m).is_some() && polls(&m) >= 3.0)
            .then_some(m)
            .ok_or_else(|| "not three polls yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // Reused: the connections opened so far serve every later cycle.
    let opened = fake.connections();
    let requests = fake.requests().len();
    let start = polls(&m);
    wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        (polls(&m) >= start + 4.0)
            .then_some(())
            .ok_or_else(|| "four more polls".to_string())
    })
    .await
    .unwrap();
    assert_eq!(fake.connections(), opened, "no new connection in 4 polls");
    assert!(
        fake.requests().len() > requests + 4 * 5,
        "the polls sent requests"
    );

    let mut opened_before_last_close = 0;
    for _ in 0..5 {
        let m = agent.scrape().await;
        let before = polls(&m);
        opened_before_last_close = fake.connections();
        fake.close_connections();
        wait_until(Duration::from_secs(20), || async {
            let m = agent.try_scrape().await?;
            (polls(&m) >= before + 2.0)
                .then_some(())
                .ok_or_else(|| "two more polls".to_string())
        })
        .await
        .unwrap();
        let m = agent.scrape().await;
        assert_eq!(
            m.get("inboxwatch_source_up", &[("source", "kg")]),
            Some(1.0),
            "{}",
            agent.stderr()
        );
        assert_eq!(lag_of(&m), Some((HWM[0] - KIP848_COMMITTED[0]) as f64));
    }
    // The agent's election heartbeats (every 2 s) met closed connections too:
    // they reconnect without giving the source up. Waits for the evidence: a
    // heartbeat answered on a connection opened after the last close.
    wait_until(Duration::from_secs(20), || async {
        let reopened = fake
            .requests_of(ApiKey::Heartbeat)
            .iter()
            .filter(|r| r.conn > opened_before_last_close)
            .count();
        (reopened > 0).then_some(()).ok_or_else(|| {
            format!(
                "no heartbeat on a connection opened after the last close (connections {opened_before_last_close} before it, {} now)",
                fake.connections()
            )
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let m = agent.scrape().await;
    assert_eq!(
        m.sum("inboxwatch_poll_errors_total", &[("source", "kg")]),
        0.0,
        "{}",
        agent.stderr()
    );
    assert!(
        !agent.stderr().contains("Lost the source's lock"),
        "the election gave the source up when the broker closed its connection:\n{}",
        agent.stderr()
    );
    assert!(
        fake.connections() > opened,
        "closed connections were opened again"
    );
}
