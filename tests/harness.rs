//! Self-checks of the integration-test harness, independent of the agent: the
//! Prometheus parser, timestamp formatting, the cutting proxy, and the ground-truth
//! generator (the table must hold exactly the states the generator believes it wrote),
//! and the fake Kafka broker.

use crate::common;

use std::time::{Duration, Instant};

use common::checks::render_diff;
use common::fake_kafka::{self, FakeConfig, FakeKafka, Outcome, SaslVerdict};
use common::scenarios::inbox_table_diff;
use common::workload::{Clock, InboxWorkload, Target};
use common::{Db, Metrics, Proxy, fmt_ts, parse_ts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Guards the scrape parser: labels with escapes, `le="+Inf"`, NaN, timestamps, and
/// subset label matching with numeric `le`/`quantile`.
#[test]
fn prometheus_parser_reads_labels_escapes_and_special_values() {
    let text = "# HELP x_total help\n# TYPE x_total counter\n\
        x_total{source=\"a\",event_type=\"o.c\"} 3\n\
        x_total{source=\"a\",event_type=\"we\\\"ird\\\\\"} 4 1700000000000\n\
        h_bucket{source=\"a\",le=\"1.0\"} 2\nh_bucket{source=\"a\",le=\"+Inf\"} 5\n\
        g NaN\nup 1e0\n";
    let m = Metrics::parse(text).expect("parse");
    assert_eq!(m.get("x_total", &[("event_type", "o.c")]), Some(3.0));
    assert_eq!(m.get("x_total", &[("event_type", "we\"ird\\")]), Some(4.0));
    assert_eq!(m.sum("x_total", &[("source", "a")]), 7.0);
    assert_eq!(m.get("h_bucket", &[("le", "1")]), Some(2.0));
    assert_eq!(m.get("h_bucket", &[("le", "+Inf")]), Some(5.0));
    assert!(m.get("g", &[]).is_some_and(f64::is_nan));
    assert_eq!(m.get("up", &[]), Some(1.0));
    assert_eq!(m.get("x_total", &[("source", "b")]), None);
}

/// Guards the generator's timestamps: canonical UTC text with milliseconds, parsed back
/// from every dialect's rendering.
#[test]
fn timestamps_round_trip_through_canonical_text() {
    let ms = 1_795_000_000_123;
    let s = fmt_ts(ms);
    assert_eq!(s.len(), "YYYY-MM-DD HH:MM:SS.SSS".len());
    assert_eq!(parse_ts(&s), Some(ms));
    assert_eq!(parse_ts(&format!("{s}+00")), Some(ms));
    assert_eq!(parse_ts(&format!("{s}456")), Some(ms));
    assert_eq!(parse_ts("1970-01-01 00:00:00"), Some(0));
    assert_eq!(fmt_ts(951_782_400_000), "2000-02-29 00:00:00.000");
}

async fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

async fn echo_once(port: u16) -> Result<(), String> {
    let io = async {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        if &buf == b"ping" {
            Ok(())
        } else {
            Err("wrong echo".to_string())
        }
    };
    tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .map_err(|_| "timeout".to_string())?
}

/// Guards the proxy used by the connection-loss test: it relays, `cut()` closes an
/// open connection and refuses new ones, `restore()` relays again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_relays_cuts_open_connections_refuses_new_ones_and_restores() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(&format!("127.0.0.1:{upstream}")).await;
    echo_once(proxy.port).await.expect("relays before a cut");

    let mut open = TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    open.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    open.read_exact(&mut buf)
        .await
        .expect("echo on the open connection");

    proxy.cut();
    let closed = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "an open connection must be closed by cut(), got {closed:?}"
    );
    assert!(
        echo_once(proxy.port).await.is_err(),
        "new connections are refused while cut"
    );

    proxy.restore();
    echo_once(proxy.port).await.expect("relays after restore");
}

async fn workload_matches_table(db: Db) {
    let tables = db.fresh_tables("selftest").await;
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: tables.inbox.clone(),
    };
    let mut w = InboxWorkload::small(400, 4);
    w.late_batches = 2;
    let started = Instant::now();
    let truth = w.run(&target, Clock::new(db.now_ms().await + 5)).await;
    eprintln!(
        "{:?}: {} in {:?}",
        db.dialect,
        truth.summary(),
        started.elapsed()
    );
    let d = inbox_table_diff(&db, &tables.inbox, &truth).await;
    assert!(
        d.is_empty(),
        "table differs from the model:\n{}",
        render_diff(&d)
    );
    assert_eq!(truth.events.len(), 400);
    db.cleanup().await;
}

/// Guards the ground-truth generator on PostgreSQL (late transactions held open 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workload_model_equals_table_contents_postgres() {
    workload_matches_table(Db::postgres().await).await;
}

/// Guards the ground-truth generator on MariaDB (late transactions held open 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workload_model_equals_table_contents_mariadb() {
    workload_matches_table(Db::mysql().await).await;
}

/// Guards the ground-truth generator on SQLite (late rows stamped 2 s in the past).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workload_model_equals_table_contents_sqlite() {
    workload_matches_table(Db::sqlite().await).await;
}

/// A connector of the agent's own Kafka client, with PLAIN `user` / `secret`
/// when `sasl`.
fn kafka_connector(sasl: bool) -> inboxwatch::sources::kafka::client::Connector {
    use inboxwatch::sources::kafka::config::{
        Credentials, KafkaSecurity, SaslMechanism, SaslSettings, Secret,
    };
    let security = KafkaSecurity {
        tls: None,
        sasl: sasl.then(|| SaslSettings {
            mechanism: SaslMechanism::Plain,
            credentials: Credentials::Password {
                username: "user".into(),
                password: Secret::new("secret".into()),
            },
        }),
    };
    inboxwatch::sources::kafka::client::Connector::new(
        "harness".into(),
        security,
        Duration::from_secs(5),
    )
}

/// A `Metadata` answer naming the fake itself as broker 7, no topics.
fn metadata_of_self(req: &fake_kafka::Req) -> fake_kafka::Reply {
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
    use kafka_protocol::messages::{ApiKey, BrokerId, MetadataResponse};
    use kafka_protocol::protocol::StrBytes;
    match req.api_key {
        ApiKey::Metadata => req.answer(&MetadataResponse::default().with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(7))
                .with_host(StrBytes::from_string(req.broker.ip().to_string()))
                .with_port(i32::from(req.broker.port())),
        ])),
        _ => fake_kafka::Reply::Close,
    }
}

/// Guards the fake Kafka broker: it negotiates versions, hands other requests
/// to the test's handler (here `Metadata`, answered with itself as broker 7)
/// and records each request with its connection and version; an API the
/// handler does not answer closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kafka_answers_through_the_handler_and_records_requests() {
    use kafka_protocol::messages::{ApiKey, ListGroupsRequest, MetadataRequest};
    let fake = FakeKafka::start(FakeConfig::default(), metadata_of_self).await;
    let mut conn = kafka_connector(false)
        .connect(&fake.addr())
        .await
        .expect("connect to the fake broker");
    let md = conn
        .send(&MetadataRequest::default())
        .await
        .expect("Metadata answered");
    assert_eq!(md.brokers.len(), 1);
    assert_eq!(md.brokers[0].node_id.0, 7);
    assert_eq!(md.brokers[0].port, i32::from(fake.port()));
    let metadata_version = conn
        .version::<MetadataRequest>()
        .expect("Metadata negotiated");
    assert!(
        conn.send(&ListGroupsRequest::default()).await.is_err(),
        "an unanswered API closes the connection"
    );
    let seen: Vec<(u64, i16, i16, Outcome)> = fake
        .requests()
        .iter()
        .map(|r| (r.conn, r.api_key, r.version, r.outcome))
        .collect();
    let list_groups_version = seen.last().map(|r| r.2).unwrap_or(-1);
    assert_eq!(
        seen,
        vec![
            (1, ApiKey::ApiVersions as i16, 0, Outcome::Answered),
            (
                1,
                ApiKey::Metadata as i16,
                metadata_version,
                Outcome::Answered
            ),
            (
                1,
                ApiKey::ListGroups as i16,
                list_groups_version,
                Outcome::ClosedByHandler
            ),
        ]
    );
    assert_eq!(
        fake.requests()[0].client_id.as_deref(),
        Some("harness"),
        "the request header is decoded"
    );
}

/// Guards the fake Kafka broker's SASL: PLAIN checked by the test's function
/// (the exact bytes recorded), and KIP-368's rule that a connection whose
/// session ran out is closed on its next request that is not a
/// re-authentication. The broker advertises only `SaslAuthenticate` v0, so
/// the client cannot learn the lifetime and does not re-authenticate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kafka_closes_a_connection_whose_sasl_session_ran_out() {
    use kafka_protocol::messages::{ApiKey, MetadataRequest};
    let mut config = FakeConfig::default().with_sasl(&["PLAIN"], 300, |step| {
        if step.auth_bytes == b"\0user\0secret" {
            SaslVerdict::Accept
        } else {
            SaslVerdict::Reject("bad password".into())
        }
    });
    for v in &mut config.api_versions {
        if v.0 == ApiKey::SaslAuthenticate {
            v.2 = 0;
        }
    }
    let fake = FakeKafka::start(config, metadata_of_self).await;
    let mut conn = kafka_connector(true)
        .connect(&fake.addr())
        .await
        .expect("PLAIN accepted");
    let authenticated = Instant::now();
    conn.send(&MetadataRequest::default())
        .await
        .expect("Metadata within the session");
    tokio::time::sleep(Duration::from_millis(400).saturating_sub(authenticated.elapsed())).await;
    assert!(
        conn.send(&MetadataRequest::default()).await.is_err(),
        "the expired session's connection is closed"
    );
    let outcomes: Vec<(i16, Outcome)> = fake
        .requests()
        .iter()
        .map(|r| (r.api_key, r.outcome))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (ApiKey::ApiVersions as i16, Outcome::Answered),
            (ApiKey::SaslHandshake as i16, Outcome::Answered),
            (ApiKey::SaslAuthenticate as i16, Outcome::Answered),
            (ApiKey::Metadata as i16, Outcome::Answered),
            (ApiKey::Metadata as i16, Outcome::ClosedExpired),
        ]
    );
    let steps = fake.sasl_steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].mechanism, "PLAIN");
    assert_eq!(steps[0].auth_bytes, b"\0user\0secret");
    assert!(!steps[0].reauthentication);

    let wrong = FakeKafka::start(
        FakeConfig::default().with_sasl(&["SCRAM-SHA-512"], 0, |_| SaslVerdict::Accept),
        metadata_of_self,
    )
    .await;
    let err = kafka_connector(true)
        .connect(&wrong.addr())
        .await
        .err()
        .expect("PLAIN is not offered");
    assert!(err.to_string().contains("SCRAM-SHA-512"), "{err}");
}
