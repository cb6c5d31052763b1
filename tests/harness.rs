//! Self-checks of the integration-test harness, independent of the agent: the
//! Prometheus parser, timestamp formatting, the cutting proxy, and the ground-truth
//! generator (the table must hold exactly the states the generator believes it wrote).

mod common;

use std::time::{Duration, Instant};

use common::checks::render_diff;
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
