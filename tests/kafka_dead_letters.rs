//! The latest records of Kafka dead-letter topics (issue 13), against a real
//! Kafka-protocol broker (tansu, in memory) with records produced by rdkafka:
//! exact partitions, offsets, timestamps, keys, headers (Spring Kafka's and
//! Kafka Connect's) and value prefixes, newest first, bounded per partition
//! and in all; read without a consumer group (the broker lists the same
//! groups before and after); and `inboxwatch dead-letters` printing them.
//! The same reads run against librdkafka's mock cluster, a second
//! implementation of the broker side (it has no ListGroups).

use crate::common;
use crate::kafka_support;

use std::collections::BTreeSet;
use std::time::{Duration, UNIX_EPOCH};

use common::{Cmd, unique_name};
use inboxwatch::sources::kafka::client::Connector;
use inboxwatch::sources::kafka::config::KafkaSecurity;
use inboxwatch::sources::kind::{DeadRecord, DeadRecords};
use kafka_protocol::messages::ListGroupsRequest;
use kafka_support::{Broker, Produced, Producer, kafka_source_toml, now_ms, producer_for};

/// The groups the broker lists (ListGroups, as the agent's client sends it).
async fn groups(broker: &Broker) -> BTreeSet<String> {
    let connector = Connector::new(
        "inboxwatch-test".into(),
        KafkaSecurity::default(),
        Duration::from_secs(10),
    );
    let mut conn = connector
        .connect(&broker.bootstrap())
        .await
        .expect("connect to the broker");
    let resp = conn
        .send(&ListGroupsRequest::default())
        .await
        .expect("ListGroups");
    assert_eq!(resp.error_code, 0, "ListGroups error");
    resp.groups
        .iter()
        .map(|g| g.group_id.0.to_string())
        .collect()
}

const SPRING_CLASS: &str = "com.example.InvalidOrderException";
const SPRING_MESSAGE: &str = "bad\tamount\n";
const CONNECT_CLASS: &str = "org.apache.kafka.connect.errors.DataException";
const CONNECT_MESSAGE: &str = "Converting byte[] to Kafka Connect data failed";

/// What was produced to the dead-letter topic, as `DeadRecord`s.
struct Truth {
    records: Vec<DeadRecord>,
}

impl Truth {
    /// The latest `per_partition` of each partition, newest first, at most `total`.
    fn latest(&self, per_partition: usize, total: usize) -> Vec<DeadRecord> {
        let mut out: Vec<DeadRecord> = Vec::new();
        for p in [0, 1] {
            let mine: Vec<&DeadRecord> = self.records.iter().filter(|r| r.partition == p).collect();
            let skip = mine.len().saturating_sub(per_partition);
            out.extend(mine.into_iter().skip(skip).cloned());
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.timestamp));
        out.truncate(total);
        out
    }
}

/// Partition 0: seven Spring Kafka dead letters (one with a null key, one
/// with a 300-byte binary value); partition 1: three Kafka Connect ones (one
/// a tombstone). Timestamps interleave the partitions.
async fn produce(producer: &Producer, topic: &str) -> Truth {
    let base = now_ms() - 60_000;
    let mut records = Vec::new();
    for i in 0..7i64 {
        let key = format!("order-{i}");
        let key = (i != 5).then_some(key.as_bytes());
        let value = if i == 6 {
            let mut v = vec![0u8, 1];
            v.extend(std::iter::repeat_n(b'x', 298));
            v
        } else {
            format!("{{\"order\":{i}}}").into_bytes()
        };
        let offset_bytes = i.to_be_bytes();
        let headers: [(&str, &[u8]); 4] = [
            ("kafka_dlt-original-topic", b"payments"),
            ("kafka_dlt-exception-fqcn", SPRING_CLASS.as_bytes()),
            ("kafka_dlt-exception-message", SPRING_MESSAGE.as_bytes()),
            ("kafka_dlt-original-offset", &offset_bytes),
        ];
        let r = Produced {
            partition: 0,
            timestamp_ms: base + i * 2_000,
            key,
            headers: &headers,
            value: Some(&value),
        };
        let offset = producer.send_record(topic, &r).await;
        assert_eq!(offset, i, "offsets are dense on a fresh partition");
        let said = ["payments", SPRING_CLASS, SPRING_MESSAGE];
        records.push(dead_record(topic, &r, offset, said));
    }
    for i in 0..3i64 {
        let key = format!("acct-{i}");
        let headers: [(&str, &[u8]); 3] = [
            ("__connect.errors.topic", b"billing"),
            (
                "__connect.errors.exception.class.name",
                CONNECT_CLASS.as_bytes(),
            ),
            (
                "__connect.errors.exception.message",
                CONNECT_MESSAGE.as_bytes(),
            ),
        ];
        let value = format!("not json {i}");
        let r = Produced {
            partition: 1,
            timestamp_ms: base + 1_000 + i * 4_000,
            key: Some(key.as_bytes()),
            headers: &headers,
            value: (i != 2).then_some(value.as_bytes()),
        };
        let offset = producer.send_record(topic, &r).await;
        assert_eq!(offset, i, "offsets are dense on a fresh partition");
        let said = ["billing", CONNECT_CLASS, CONNECT_MESSAGE];
        records.push(dead_record(topic, &r, offset, said));
    }
    Truth { records }
}

/// The record `r` as read back; `said`: the original topic, exception class
/// and message its headers carry.
fn dead_record(topic: &str, r: &Produced<'_>, offset: i64, said: [&str; 3]) -> DeadRecord {
    let [original_topic, class, message] = said.map(|s| Some(s.to_string()));
    DeadRecord {
        topic: topic.to_string(),
        partition: r.partition,
        offset,
        timestamp: r.timestamp_ms,
        key: r.key.map(|k| k.to_vec()),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect(),
        value_prefix: r
            .value
            .map(|v| v[..v.len().min(256)].to_vec())
            .unwrap_or_default(),
        value_len: r.value.map(|v| v.len()),
        original_topic,
        exception_class: class,
        exception_message: message,
    }
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// A record as the API lists it: topic, partition, offset, key, value bytes.
type Listed = (String, i64, i64, Option<String>, Option<u64>);

/// Reads the records through the library and the command, and compares
/// them with `truth`.
async fn check_reads(bootstrap: &str, dlq: &str, truth: &Truth) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("inboxwatch.toml");
    std::fs::write(&path, kafka_source_toml("kd", bootstrap, "")).expect("config");
    let config = inboxwatch::config::load(&path).expect("config loads");
    let spec = config
        .sources
        .iter()
        .find(|s| s.name() == "kd")
        .expect("source kd");
    let topics = spec
        .dead_letter_topics()
        .expect("kafka offers its dead-letter topics");

    for (per_partition, total) in [(5, 100), (20, 100), (5, 4), (1, 100)] {
        let got = topics
            .dead_letter_records(per_partition, total)
            .await
            .expect("dead-letter records");
        assert_eq!(
            got,
            DeadRecords {
                records: truth.latest(per_partition, total),
                problems: Vec::new(),
            },
            "per_partition {per_partition}, total {total}"
        );
    }
    let all = topics.dead_letter_records(20, 100).await.expect("records");
    let first = &all.records[0];
    assert_eq!(
        (first.partition, first.offset, first.value_len),
        (0, 6, Some(300))
    );
    assert_eq!(first.value_prefix.len(), 256);
    assert_eq!(first.original_topic.as_deref(), Some("payments"));
    assert_eq!(first.exception_class.as_deref(), Some(SPRING_CLASS));
    assert_eq!(first.exception_message.as_deref(), Some(SPRING_MESSAGE));
    let connect = all.records.iter().find(|r| r.partition == 1).expect("p1");
    assert_eq!(connect.original_topic.as_deref(), Some("billing"));
    assert_eq!(connect.exception_class.as_deref(), Some(CONNECT_CLASS));

    // The command: the table section (no table source: its header alone),
    // then the records, newest first, at most --limit.
    let out = Cmd::new([
        "dead-letters",
        "--config",
        path.to_str().expect("utf-8 path"),
        "--source",
        "kd",
        "--per-partition",
        "2",
        "--limit",
        "3",
    ])
    .output();
    assert_eq!(out.code, Some(0), "dead-letters: {}", out.stderr);
    let t = |offset: usize| rfc3339(truth.records[offset].timestamp);
    let spring_headers = |i: u8| {
        format!(
            "kafka_dlt-original-topic=payments kafka_dlt-exception-fqcn={SPRING_CLASS} kafka_dlt-exception-message=bad\\x09amount\\x0a kafka_dlt-original-offset=\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x0{i}"
        )
    };
    let want = format!(
        "source\tevent_id\tevent_type\tfirst_received\tdead_lettered\tattempts\ttrace_id\tlast_error\n\
         \n\
         source\ttopic\tpartition\toffset\ttimestamp\tkey\toriginal_topic\texception_class\texception_message\theaders\tvalue_bytes\tvalue\n\
         kd\t{dlq}\t0\t6\t{}\torder-6\tpayments\t{SPRING_CLASS}\tbad\\x09amount\\x0a\t{}\t300\t\\x00\\x01{}…\n\
         kd\t{dlq}\t0\t5\t{}\t-\tpayments\t{SPRING_CLASS}\tbad\\x09amount\\x0a\t{}\t11\t{{\"order\":5}}\n\
         kd\t{dlq}\t1\t2\t{}\tacct-2\tbilling\t{CONNECT_CLASS}\t{CONNECT_MESSAGE}\t__connect.errors.topic=billing __connect.errors.exception.class.name={CONNECT_CLASS} __connect.errors.exception.message={CONNECT_MESSAGE}\t-\t-\n",
        t(6),
        spring_headers(6),
        "x".repeat(254),
        t(5),
        spring_headers(5),
        t(9),
    );
    assert_eq!(out.stdout, want);

    // The agent's dead-letter page and API list the same records, each with
    // the source's owner (issue 35: it was in the JSON only).
    let agent = common::Agent::start(&kafka_source_toml(
        "kd",
        bootstrap,
        "owner = \"team-dlq\"\n",
    ));
    agent.wait_ready(common::READY_TIMEOUT).await;
    let (code, body) = agent
        .get("/api/v1/dead-letters?source=kd")
        .await
        .expect("GET /api/v1/dead-letters");
    assert_eq!(code, 200, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let listed: Vec<Listed> = api["topic_records"]
        .as_array()
        .expect("topic_records")
        .iter()
        .map(|r| {
            (
                r["topic"].as_str().expect("topic").to_string(),
                r["partition"].as_i64().expect("partition"),
                r["offset"].as_i64().expect("offset"),
                r["key"].as_str().map(str::to_string),
                r["value_bytes"].as_u64(),
            )
        })
        .collect();
    let expected: Vec<Listed> = truth
        .latest(5, 50)
        .into_iter()
        .map(|r| {
            (
                r.topic,
                i64::from(r.partition),
                r.offset,
                r.key.map(|k| String::from_utf8(k).expect("UTF-8 keys")),
                r.value_len.map(|n| n as u64),
            )
        })
        .collect();
    assert_eq!(listed, expected, "/api/v1/dead-letters topic_records");
    assert_eq!(
        api["topic_records"][0]["exception_class"].as_str(),
        Some(SPRING_CLASS)
    );
    let (code, page) = agent
        .get("/dead-letters?source=kd")
        .await
        .expect("GET /dead-letters");
    assert_eq!(code, 200);
    assert_eq!(
        page.matches("<tr class=\"dead-record\">").count(),
        expected.len(),
        "rows of the page"
    );
    assert_eq!(
        page.matches("<td data-field=\"owner\">team-dlq</td>")
            .count(),
        expected.len(),
        "the owner on every row of the page:\n{page}"
    );
}

/// Guards the dead-letter records of a Kafka source: the latest records of
/// each partition of the dead-letter topics (and nothing of other topics),
/// exactly as produced, newest first and bounded; no group appears on the
/// broker; `dead-letters` prints them with headers and bytes escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_dead_letter_records_are_read_exactly_and_without_a_group() {
    let broker = Broker::start().await;
    let dlq = format!("{}.DLQ", unique_name("payments", "p"));
    let other = unique_name("payments", "p");
    broker.create_topic(&dlq, 2).await;
    broker.create_topic(&other, 1).await;
    let producer = broker.producer();
    let truth = produce(&producer, &dlq).await;
    // An ordinary topic and a group of its own: neither is a dead letter.
    producer.send(&other, 0, now_ms()).await;
    broker
        .committer("payments-consumer")
        .consume_and_commit(&other, 0, 1);

    let before = groups(&broker).await;
    assert!(
        before.contains("payments-consumer"),
        "the broker lists groups: {before:?}"
    );
    check_reads(&broker.bootstrap(), &dlq, &truth).await;
    // Nothing of the reads stays on the broker: no group was created.
    let after = groups(&broker).await;
    assert_eq!(after, before, "groups before and after the reads");

    // The status page lists the cluster's groups with the lag /metrics has.
    let agent = common::Agent::start(&kafka_source_toml(
        "kd",
        &broker.bootstrap(),
        "owner = \"team-payments\"\n",
    ));
    agent.wait_ready(common::READY_TIMEOUT).await;
    let lag = |m: &common::Metrics| {
        m.get(
            "kafka_consumer_group_lag_messages",
            &[("cluster", "kd"), ("group", "payments-consumer")],
        )
    };
    common::wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag(&m)
            .map(|_| ())
            .ok_or("no lag of payments-consumer yet".to_string())
    })
    .await
    .expect("the agent exports the group's lag");
    let m = agent.scrape().await;
    let (code, body) = agent
        .get("/api/v1/status")
        .await
        .expect("GET /api/v1/status");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let source = &v["sources"][0];
    assert_eq!(source["name"], "kd");
    assert_eq!(source["kind"], "kafka");
    assert_eq!(source["owner"], "team-payments");
    let group = source["numbers"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["group"] == "payments-consumer")
        .expect("the group on the status page")
        .clone();
    let status = m
        .series(
            "kafka_consumer_group_status",
            &[("cluster", "kd"), ("group", "payments-consumer")],
        )
        .find(|s| s.value == 1.0)
        .and_then(|s| s.labels.get("status").cloned());
    assert_eq!(
        (
            group["lag_messages"].as_f64(),
            group["status"].as_str().map(str::to_string)
        ),
        (lag(&m), status),
        "the group's lag and status on the page and in /metrics"
    );
}

/// The same reads against librdkafka's mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_dead_letter_records_are_read_exactly_from_the_mock_cluster() {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("librdkafka's mock cluster");
    let dlq = format!("{}.DLQ", unique_name("payments", "p"));
    let other = unique_name("payments", "p");
    mock.create_topic(&dlq, 2, 1).expect("create the DLQ topic");
    mock.create_topic(&other, 1, 1).expect("create a topic");
    let producer = producer_for(&mock.bootstrap_servers());
    let truth = produce(&producer, &dlq).await;
    producer.send(&other, 0, now_ms()).await;
    check_reads(&mock.bootstrap_servers(), &dlq, &truth).await;
}
