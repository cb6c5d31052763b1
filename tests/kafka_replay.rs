//! `dead-letters replay --topic` (issue 36, item 4) against a real
//! Kafka-protocol broker (tansu, in memory): a dead-letter topic of 100
//! records from two original topics (Spring Kafka's headers), produced by
//! rdkafka; a replay by offset range sends exactly those records back to
//! their original topics — key, whole value and headers kept, the replay
//! headers added, each in the partition Kafka's default partitioner gives
//! its key — read back by an rdkafka consumer and compared with what the
//! test produced; one audit row per record in an SQLite audit table; no
//! faster than `--rate`; without `--yes`, or without an audit table, nothing
//! is produced and nothing audited; a Produce sent twice within a run is
//! written once (the idempotent producer).
//!
//! Not tested: that the agent's read credentials cannot write. tansu 0.6.0
//! keeps no ACLs (its CreateAcls answers success and stores nothing) and
//! lets every authenticated user produce, so a read-only user cannot be
//! made on it. `kafka_fake::run_never_authenticates_as_the_replay_write_user`
//! shows the agent never authenticates as the write user.

use crate::common;
use crate::kafka_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Cmd, unique_name};
use inboxwatch::sources::SourceSpec;
use inboxwatch::sources::kafka::replay::{self, key_partition};
use inboxwatch::sources::kind::{ReplayRecord, ReplayRun};
use kafka_support::{Broker, Produced, kafka_source_toml, now_ms, producer_for};
use rdkafka::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers as _;
use rdkafka::{Offset, TopicPartitionList};
use sqlx::{Connection as _, Row as _, SqliteConnection};

const DLQ_PARTITIONS: i32 = 2;
const ORDERS_PARTITIONS: i32 = 3;
const BILLING_PARTITIONS: i32 = 2;
const AUDIT_TABLE: &str = "inboxwatch_dead_letter_actions";

/// One record produced to the dead-letter topic.
#[derive(Debug, Clone)]
struct Dead {
    partition: i32,
    offset: i64,
    original: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    message: String,
}

/// One record read back from an original topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Back {
    topic: String,
    partition: i32,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

struct Topics {
    dlq: String,
    orders: String,
    billing: String,
    /// A dead-letter topic that does not exist.
    nope: String,
    /// A dead-letter topic of one record without headers.
    bare: String,
}

/// 100 dead letters, alternating partitions 0 and 1; records 0, 1 of every
/// four from `orders`, 2, 3 from `billing`; every seventh with a null key;
/// values of 40 to 640 bytes (past the listing's 256-byte prefix).
async fn produce(bootstrap: &str, t: &Topics) -> Vec<Dead> {
    let producer = producer_for(bootstrap);
    let base = now_ms() - 600_000;
    let mut out = Vec::new();
    for i in 0..100usize {
        let partition = (i % 2) as i32;
        let original = if i % 4 < 2 { &t.orders } else { &t.billing };
        let key = (i % 7 != 3).then(|| format!("order-{}", i * 31).into_bytes());
        let value: Vec<u8> = (0..40 + (i * 6)).map(|n| (n * 7 + i) as u8).collect();
        let message = format!("amount {i} is negative");
        let headers: Vec<(String, Vec<u8>)> = vec![
            (
                "kafka_dlt-original-topic".into(),
                original.clone().into_bytes(),
            ),
            (
                "kafka_dlt-original-partition".into(),
                (i as i32 % 3).to_be_bytes().to_vec(),
            ),
            (
                "kafka_dlt-exception-fqcn".into(),
                b"com.example.InvalidOrderException".to_vec(),
            ),
            (
                "kafka_dlt-exception-message".into(),
                message.clone().into_bytes(),
            ),
            (
                "traceparent".into(),
                format!("00-{i:032x}-{i:016x}-01").into_bytes(),
            ),
        ];
        let borrowed: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let offset = producer
            .send_record(
                &t.dlq,
                &Produced {
                    partition,
                    timestamp_ms: base + i as i64 * 1_000,
                    key: key.as_deref(),
                    headers: &borrowed,
                    value: Some(&value),
                },
            )
            .await;
        assert_eq!(
            offset,
            (i / 2) as i64,
            "offsets are dense on a fresh partition"
        );
        out.push(Dead {
            partition,
            offset,
            original: original.clone(),
            key,
            value: Some(value),
            headers,
            message,
        });
    }
    out
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", unique_name("replay", "check"))
        .set("enable.auto.commit", "false")
        .set("socket.timeout.ms", "10000")
        .create()
        .expect("consumer")
}

/// The records of every partition of `topics` (name, partitions), read
/// from the start until `want` records were read, or what there is after
/// the wait when `want` is 0.
fn read_back(bootstrap: &str, topics: &[(&str, i32)], want: usize) -> Vec<Back> {
    let c = consumer(bootstrap);
    let mut tpl = TopicPartitionList::new();
    for (t, n) in topics {
        for p in 0..*n {
            tpl.add_partition_offset(t, p, Offset::Beginning)
                .expect("tpl");
        }
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let started = Instant::now();
    let wait = if want == 0 {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(30)
    };
    while started.elapsed() < wait && (want == 0 || out.len() < want) {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("consume");
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Back {
            topic: m.topic().to_string(),
            partition: m.partition(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    out.sort();
    out
}

/// What the replay of `dead` by run `run_id` must have produced: in the
/// order it sent them (partition 0's offsets in order), null keys going
/// round-robin per destination from partition 0.
fn expected(
    dead: &[&Dead],
    dlq: &str,
    run_id: &str,
    partitions: &BTreeMap<String, i32>,
) -> Vec<Back> {
    let mut round_robin: BTreeMap<&str, i32> = BTreeMap::new();
    let mut out: Vec<Back> = dead
        .iter()
        .map(|d| {
            let count = partitions[&d.original];
            let partition = match &d.key {
                Some(k) => key_partition(k, count as usize),
                None => {
                    let next = round_robin.entry(&d.original).or_insert(0);
                    let p = *next % count;
                    *next += 1;
                    p
                }
            };
            let mut headers: Vec<(String, Option<Vec<u8>>)> = d
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect();
            headers.push((
                "inboxwatch-replay-run-id".into(),
                Some(run_id.as_bytes().to_vec()),
            ));
            headers.push(("inboxwatch-replay-operator".into(), Some(b"alice".to_vec())));
            headers.push((
                "inboxwatch-replay-original".into(),
                Some(format!("{dlq}/{}/{}", d.partition, d.offset).into_bytes()),
            ));
            Back {
                topic: d.original.clone(),
                partition,
                key: d.key.clone(),
                value: d.value.clone(),
                headers,
            }
        })
        .collect();
    out.sort();
    out
}

/// The audit rows: (source, event_id, action, operator, reason,
/// previous_status, attempts, last_error), in the order written.
type AuditRow = (
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
);

async fn audit_rows(db: &Path) -> Vec<AuditRow> {
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the audit database");
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT source, event_id, action, operator, reason, previous_status, attempts, last_error, at FROM {AUDIT_TABLE} ORDER BY id"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("read the audit rows");
    rows.iter()
        .map(|r| {
            let at: String = r.get(8);
            assert!(at.starts_with("20"), "a time in the at column: {at}");
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
                r.get(7),
            )
        })
        .collect()
}

/// Writes the config: source `kr` on `bootstrap`, with
/// `[sources.dead_letter_actions]` auditing to `audit` (none: no audit DSN).
fn config(dir: &Path, bootstrap: &str, audit: Option<&Path>) -> std::path::PathBuf {
    let actions = match audit {
        Some(db) => format!(
            "[sources.dead_letter_actions]\naudit_dsn = \"sqlite://{}\"\n",
            db.display()
        ),
        None => "[sources.dead_letter_actions]\n".to_string(),
    };
    let path = dir.join(if audit.is_some() {
        "inboxwatch.toml"
    } else {
        "no-audit.toml"
    });
    std::fs::write(&path, kafka_source_toml("kr", bootstrap, &actions)).expect("config");
    path
}

/// Creates the audit table with the DDL `schema --config` prints.
async fn create_audit_table(config: &Path, db: &Path) {
    let out = Cmd::new(["schema", "--config", config.to_str().expect("utf-8")]).output();
    assert_eq!(out.code, Some(0), "schema --config: {}", out.stderr);
    assert!(
        out.stdout
            .contains("-- source \"kr\": the audit table of dead-letters replay --topic"),
        "{}",
        out.stdout
    );
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", db.display()))
        .await
        .expect("create the audit database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(out.stdout))
        .execute(&mut conn)
        .await
        .expect("the printed DDL runs on SQLite");
}

fn replay_args<'a>(config: &'a str, dlq: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "dead-letters",
        "replay",
        "--config",
        config,
        "--source",
        "kr",
        "--operator",
        "alice",
        "--reason",
        "fix 1234 deployed",
        "--topic",
        dlq,
    ];
    args.extend_from_slice(extra);
    args
}

/// Guards `dead-letters replay --topic`: the dry run writes nothing, a run
/// without an audit table is refused before anything is sent, and a run by
/// offset range sends exactly those records back (key, value, headers kept,
/// replay headers added, Kafka's partition for the key), no faster than
/// `--rate`, with one audit row each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_by_offset_range_sends_exactly_those_records_back_audited() {
    let broker = Broker::start().await;
    let t = topics();
    broker.create_topic(&t.dlq, DLQ_PARTITIONS).await;
    broker.create_topic(&t.orders, ORDERS_PARTITIONS).await;
    broker.create_topic(&t.billing, BILLING_PARTITIONS).await;
    broker.create_topic(&t.bare, 1).await;
    check_replay(&broker.bootstrap(), &t).await;
}

/// The same against librdkafka's mock cluster, a second implementation of
/// the broker side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_by_offset_range_sends_exactly_those_records_back_on_the_mock_cluster() {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("librdkafka's mock cluster");
    let t = topics();
    mock.create_topic(&t.dlq, DLQ_PARTITIONS, 1)
        .expect("create the DLQ");
    mock.create_topic(&t.orders, ORDERS_PARTITIONS, 1)
        .expect("create orders");
    mock.create_topic(&t.billing, BILLING_PARTITIONS, 1)
        .expect("create billing");
    mock.create_topic(&t.bare, 1, 1)
        .expect("create the bare DLQ");
    check_replay(&mock.bootstrap_servers(), &t).await;
}

fn topics() -> Topics {
    let name = unique_name("orders", "r");
    Topics {
        dlq: format!("{name}.DLQ"),
        orders: format!("{name}-orders"),
        billing: format!("{name}-billing"),
        nope: format!("{name}-nope.DLQ"),
        bare: format!("{name}-bare.DLQ"),
    }
}

async fn check_replay(bootstrap: &str, t: &Topics) {
    let dead = produce(bootstrap, t).await;
    let originals = [
        (t.orders.as_str(), ORDERS_PARTITIONS),
        (t.billing.as_str(), BILLING_PARTITIONS),
    ];
    let partitions: BTreeMap<String, i32> =
        originals.iter().map(|(n, p)| (n.to_string(), *p)).collect();

    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let path = config(dir.path(), bootstrap, Some(&db));
    let path_s = path.to_str().expect("utf-8 path").to_string();
    let range = [
        "--partition",
        "0",
        "--from-offset",
        "5",
        "--to-offset",
        "34",
    ];

    // Without an audit table: refused, nothing sent.
    SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", db.display()))
        .await
        .expect("an empty audit database");
    let missing = Cmd::new(replay_args(
        &path_s,
        &t.dlq,
        &[&range[..], &["--yes"]].concat(),
    ))
    .output();
    assert_eq!(missing.code, Some(2), "{}", missing.stdout);
    assert!(
        missing.stderr.contains(&format!(
            "audit table \"{AUDIT_TABLE}\" cannot be read with sources[0].dead_letter_actions.audit_dsn"
        )),
        "{}",
        missing.stderr
    );
    create_audit_table(&path, &db).await;

    // No audit DSN at all: refused, with or without --yes.
    let no_audit = config(dir.path(), bootstrap, None);
    let no_audit_s = no_audit.to_str().expect("utf-8 path").to_string();
    for yes in [&[][..], &["--yes"][..]] {
        let out = Cmd::new(replay_args(
            &no_audit_s,
            &t.dlq,
            &[&range[..], yes].concat(),
        ))
        .output();
        assert_eq!(out.code, Some(2), "{}", out.stdout);
        assert_eq!(
            out.stderr,
            "error: source \"kr\" has no audit DSN ([sources.dead_letter_actions] audit_dsn): \
             every record sent back is recorded in an audit table, so the replay is refused; \
             nothing was sent\n"
        );
    }

    // The dry run: the count, the first twenty, the command; nothing written.
    let dry = Cmd::new(replay_args(
        &path_s,
        &t.dlq,
        &[&range[..], &["--rate", "10/s"]].concat(),
    ))
    .output();
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    let picked: Vec<&Dead> = dead
        .iter()
        .filter(|d| d.partition == 0 && (5..=34).contains(&d.offset))
        .collect();
    assert_eq!(picked.len(), 30);
    let mut want = format!("30 records of \"{}\" would be sent back\n", t.dlq);
    for d in picked.iter().take(20) {
        want.push_str(&format!("{}/0/{} -> {}\n", t.dlq, d.offset, d.original));
    }
    want.push_str(&format!(
        "… and 10 more\nto apply: inboxwatch dead-letters replay --config {path_s} --source kr \
         --operator alice --reason 'fix 1234 deployed' --topic {} --partition 0 --from-offset 5 \
         --to-offset 34 --rate 10/s --yes\n",
        t.dlq
    ));
    assert_eq!(dry.stdout, want);
    assert!(
        read_back(bootstrap, &originals, 0).is_empty(),
        "the dry run produced"
    );
    assert!(audit_rows(&db).await.is_empty(), "the dry run audited");

    // The run: 30 records at 10/s take at least three seconds.
    let started = Instant::now();
    let run = Cmd::new(replay_args(
        &path_s,
        &t.dlq,
        &[&range[..], &["--rate", "10/s", "--yes"]].concat(),
    ))
    .output();
    let took = started.elapsed();
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        took >= Duration::from_secs(3),
        "30 records at 10/s in {took:?}"
    );
    let run_id = run
        .stdout
        .strip_prefix("replay: 30 of 30 records sent back (run id ")
        .and_then(|r| r.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("the summary: {}", run.stdout))
        .to_string();

    let got = read_back(bootstrap, &originals, 30);
    assert_eq!(got, expected(&picked, &t.dlq, &run_id, &partitions));
    // Nothing more than those 30 arrives.
    assert_eq!(read_back(bootstrap, &originals, 0).len(), 30);

    let rows = audit_rows(&db).await;
    let want_rows: Vec<AuditRow> = picked
        .iter()
        .map(|d| {
            (
                "kr".to_string(),
                format!("{}/0/{}", t.dlq, d.offset),
                "replay".to_string(),
                "alice".to_string(),
                "fix 1234 deployed".to_string(),
                None,
                None,
                Some(d.message.clone()),
            )
        })
        .collect();
    assert_eq!(rows, want_rows);

    // Errors name what was wrong, and nothing is sent.
    for (extra, error) in [
        (
            vec![
                "--partition",
                "1",
                "--from-offset",
                "40",
                "--to-offset",
                "60",
            ],
            format!(
                "offsets 40 to 60 are outside partition {}/1, which holds offsets 0 to 49",
                t.dlq
            ),
        ),
        (
            vec!["--partition", "7"],
            format!(
                "--partition: topic \"{}\" has no partition 7 (it has 2)",
                t.dlq
            ),
        ),
        (
            vec!["--partition", "1", "--to", "nowhere.topic"],
            "would go to no such topic \"nowhere.topic\": nothing was sent".to_string(),
        ),
    ] {
        let out = Cmd::new(replay_args(
            &path_s,
            &t.dlq,
            &[&extra[..], &["--yes"]].concat(),
        ))
        .output();
        assert_eq!(out.code, Some(2), "{extra:?}: {}", out.stdout);
        assert!(out.stderr.contains(&error), "{extra:?}: {}", out.stderr);
    }
    let nope = &t.nope;
    let out = Cmd::new(replay_args(&path_s, nope, &["--yes"])).output();
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains(&format!("--topic: no such topic \"{nope}\"")),
        "{}",
        out.stderr
    );
    // A header match and --to, in a dry run.
    let out = Cmd::new(replay_args(
        &path_s,
        &t.dlq,
        &[
            "--header",
            "kafka_dlt-exception-message=amount 7 is negative",
            "--to",
            &t.orders,
        ],
    ))
    .output();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.starts_with(&format!(
            "1 records of \"{}\" would be sent back\n{}/1/3 -> {}\n",
            t.dlq, t.dlq, t.orders
        )),
        "{}",
        out.stdout
    );
    // A record without an original topic: --to says where it goes.
    let bare = Produced {
        partition: 0,
        timestamp_ms: now_ms(),
        key: None,
        headers: &[],
        value: Some(b"no headers"),
    };
    assert_eq!(producer_for(bootstrap).send_record(&t.bare, &bare).await, 0);
    let out = Cmd::new(replay_args(&path_s, &t.bare, &["--yes"])).output();
    assert_eq!(out.code, Some(2), "{}", out.stdout);
    assert_eq!(
        out.stderr,
        format!(
            "error: source \"kr\": record {}/0/0 has no original topic (none of the headers \
             kafka_dlt-original-topic, __connect.errors.topic): give --to TOPIC\n",
            t.bare
        )
    );
    let out = Cmd::new(replay_args(&path_s, &t.bare, &["--to", &t.billing])).output();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.starts_with(&format!(
            "1 records of \"{}\" would be sent back\n{}/0/0 -> {}\n",
            t.bare, t.bare, t.billing
        )),
        "{}",
        out.stdout
    );
    assert_eq!(read_back(bootstrap, &originals, 0).len(), 30);
    assert_eq!(audit_rows(&db).await.len(), 30);
}

/// Guards the idempotent producer: the same batch produced twice within a
/// run (a retry after a lost answer) is written once. tansu only: the mock
/// cluster checks sequence numbers of transactional producers alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_retried_within_a_run_is_written_once() {
    let broker = Broker::start().await;
    let topic = unique_name("retry", "r");
    broker.create_topic(&topic, 1).await;
    check_retry(&broker.bootstrap(), &topic).await;
}

async fn check_retry(bootstrap: &str, topic: &str) {
    sqlx::any::install_default_drivers();
    let topic = topic.to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let path = config(dir.path(), bootstrap, Some(&db));
    create_audit_table(&path, &db).await;
    let config = inboxwatch::config::load(&path).expect("config loads");
    let Some(SourceSpec::Kafka(spec)) = config.sources.first() else {
        panic!("source kr is a Kafka source");
    };
    let run = ReplayRun {
        run_id: "test-run".into(),
        operator: "alice".into(),
        reason: "retry".into(),
    };
    let mut replayer = replay::open(spec, &run).await.expect("open a run");
    let record = ReplayRecord {
        topic: "x.DLQ".into(),
        partition: 0,
        offset: 9,
        timestamp: now_ms(),
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        headers: Vec::new(),
        exception_message: None,
        destination: topic.clone(),
    };
    let batch = replayer.batch(&record, 0).expect("a batch");
    let first = replayer
        .produce(&topic, 0, batch.clone())
        .await
        .expect("produced");
    assert_eq!(first, Some(0));
    let again = replayer
        .produce(&topic, 0, batch)
        .await
        .expect("produced again");
    // tansu answers DUPLICATE_SEQUENCE_NUMBER; Kafka acknowledges one of a
    // partition's last five batches again with its first offset.
    assert!(
        again.is_none() || again == first,
        "the broker had the batch already: {again:?}"
    );
    let got = read_back(bootstrap, &[(topic.as_str(), 1)], 0);
    assert_eq!(got.len(), 1, "{got:?}");
}

/// Guards the checks of a Kafka source's `[sources.dead_letter_actions]`:
/// each problem named by its full key, every one in one run.
#[test]
fn kafka_dead_letter_actions_problems_are_named_by_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        kafka_source_toml(
            "kr",
            "127.0.0.1:9092",
            "[sources.dead_letter_actions]\naudit_dsn = \"redis://x\"\naudit_table = \"a;b\"\n\
             [sources.dead_letter_actions.sasl]\nmechanism = \"PLAIN\"\nusername = \"w\"\n",
        ),
    )
    .expect("config");
    let out = Cmd::new(["check-config", path.to_str().expect("utf-8")]).output();
    assert_eq!(out.code, Some(2), "{}", out.stdout);
    for key in [
        "sources[0].dead_letter_actions.audit_dsn:",
        "sources[0].dead_letter_actions.audit_table: \"a;b\" is not a table name",
        "sources[0].dead_letter_actions.sasl.password: required (or password_file)",
    ] {
        assert!(out.stderr.contains(key), "{key}: {}", out.stderr);
    }
}
