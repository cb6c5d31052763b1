//! The HTTP listener through the binary (issue 16): what a client can hold is
//! bounded — the time to send a request's headers (which is also how long an idle
//! keep-alive connection is kept), the time a connection may move no byte, and the
//! number of connections served at once — while `/metrics`, `/healthz` and
//! `/readyz` keep answering and shutdown still drains the listener.
//!
//! An SQLite source (PostgreSQL behind a proxy for the probes). Timings are measured and
//! printed (`--no-capture` shows them); the assertions only use generous deadlines.

use crate::common;

use std::time::{Duration, Instant};

use common::http::{closed_within, connect, half_sent, scrape_on};
use common::scenarios::inbox_source_toml;
use common::{Agent, Db, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// The listener's defaults (`[server] header_read_timeout`, `max_http_connections`).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 256;

/// Starts an agent on a fresh SQLite inbox with `server` as its `[server]` section
/// and waits until it is ready.
async fn agent(short: &str, server: &str) -> (Agent, Db) {
    let db = Db::sqlite().await;
    let tables = db.fresh_tables(short).await;
    let config = format!(
        "[server]\n{server}\n{}",
        inbox_source_toml("http", &db.dsn, &tables.inbox)
    );
    let agent = Agent::start(&config);
    agent.wait_ready(Duration::from_secs(30)).await;
    (agent, db)
}

/// Guards the slowloris defect of issue 16 (60 half-sent or idle connections held
/// for 75 s, none closed): with the default `header_read_timeout` (10 s) a request
/// whose headers never end, a connection that sends nothing, and a keep-alive
/// connection idle after its response are all closed by the server, within 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_silent_and_idle_keepalive_connections_are_closed() {
    let (agent, db) = agent("hsend", "").await;
    let deadline = Duration::from_secs(30);

    let mut half_sent = half_sent(agent.port).await;
    let half_sent_at = Instant::now();

    let mut silent = connect(agent.port).await;
    let silent_at = Instant::now();

    let mut keepalive = connect(agent.port).await;
    assert_eq!(scrape_on(&mut keepalive).await, "HTTP/1.1 200 OK");
    let idle_at = Instant::now();

    // The control: a connection opened with the others that sends its request 3 s
    // later, well within the header-read timeout, is answered — the closes below
    // are the timeout at work, not a server closing what is slow to start.
    let mut late = connect(agent.port).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        scrape_on(&mut late).await,
        "HTTP/1.1 200 OK",
        "a request sent 3 s after connecting (header_read_timeout {HEADER_READ_TIMEOUT:?})"
    );
    drop(late);

    let (half_sent_closed, silent_closed, idle_closed) = tokio::join!(
        closed_within(&mut half_sent, deadline),
        closed_within(&mut silent, deadline),
        closed_within(&mut keepalive, deadline),
    );
    let mut open = Vec::new();
    for (what, since, closed) in [
        ("half-sent request", half_sent_at, half_sent_closed),
        ("silent connection", silent_at, silent_closed),
        ("idle keep-alive connection", idle_at, idle_closed),
    ] {
        match closed {
            Some(at) => eprintln!(
                "{what}: closed by the server {:?} after it went quiet (header_read_timeout {HEADER_READ_TIMEOUT:?})",
                at - since
            ),
            None => open.push(what),
        }
    }
    assert!(
        open.is_empty(),
        "still open {deadline:?} after they went quiet: {open:?}"
    );
    let (code, _) = agent.get("/healthz").await.expect("GET /healthz");
    assert_eq!(code, 200);
    db.cleanup().await;
}

/// Guards the stalled-reader case the header timeout cannot see: a client that
/// pipelines scrapes and never reads the answers leaves the server blocked in a
/// write. With `idle_timeout = "2s"` the server closes it, long before it could
/// have delivered every answer, and goes on serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_after_the_idle_timeout() {
    let (agent, db) = agent("stall", "idle_timeout = \"2s\"").await;
    let body = agent.get("/metrics").await.expect("GET /metrics").1;
    // The control: a client that keeps the same connection busy for four times the
    // idle timeout (a scrape every second, each answer read) is answered throughout,
    // so a close below is the idle timeout at work, not a cap on every connection.
    let mut busy = connect(agent.port).await;
    let busy_since = Instant::now();
    for n in 1..=8 {
        assert_eq!(
            scrape_on(&mut busy).await,
            "HTTP/1.1 200 OK",
            "scrape {n} on a connection busy for {:?} (idle_timeout 2s)",
            busy_since.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(busy);
    // Far more than the socket buffers on both sides can hold (a few MB at most).
    let requests = (64 * 1024 * 1024 / body.len().max(1)).max(1_000);
    let socket = TcpSocket::new_v4().expect("a TCP socket");
    socket
        .set_recv_buffer_size(4096)
        .expect("shrink the receive buffer");
    let mut stalled = socket
        .connect(([127, 0, 0, 1], agent.port).into())
        .await
        .expect("connect");
    let pipelined = "GET /metrics HTTP/1.1\r\nHost: inboxwatch\r\n\r\n".repeat(requests);
    // The server reads its requests only as it answers them, so writing them all
    // may block too: write in the background and stop reading.
    let ours = stalled.local_addr().expect("local_addr").port();
    let (mut reader, mut writer) = stalled.split();
    let write = async {
        let _ = writer.write_all(pipelined.as_bytes()).await;
        std::future::pending::<()>().await;
    };
    // The connection is quiet once the server's answers fill its send buffer:
    // its queue stops growing. That took under 8 s on a fast machine; a debug
    // build on one twice as slow, beside the suite, still wrote answers after
    // 8 s. Then the idle timeout (2 s), and as much again.
    let blocked = async {
        let mut last = (0, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let queued = send_queue(agent.port, ours);
            if queued != last.0 {
                last = (queued, Instant::now());
            } else if queued > 0 && last.1.elapsed() >= Duration::from_secs(1) {
                return;
            }
        }
    };
    let stalled_at = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            _ = write => {}
            _ = blocked => {}
        }
    })
    .await;
    let blocked_after = stalled_at.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Now drain: a server that closed the connection leaves a finite tail.
    let mut received = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    let drained = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received += n,
            }
        }
    })
    .await;
    eprintln!(
        "stalled reader: {requests} scrapes pipelined, the server's send queue full after \
         {blocked_after:?}, {received} bytes received of {} before the close, drained {:?} after \
         the stall began",
        requests * body.len(),
        stalled_at.elapsed()
    );
    assert!(
        drained.is_ok(),
        "the server kept a connection that moved no byte for 5 s open (idle_timeout 2s)"
    );
    assert!(
        received < requests * body.len() / 2,
        "the server delivered {received} bytes: it never closed the stalled connection"
    );
    let (code, _) = agent.get("/healthz").await.expect("GET /healthz");
    assert_eq!(code, 200);
    drop(stalled);
    db.cleanup().await;
}

/// Guards the connection bound: with the default `max_http_connections` (256) held by
/// clients that send nothing, a scrape waits rather than being served by a 257th
/// connection; it is answered as soon as some of the others close. `/metrics`,
/// `/healthz` and `/readyz` answer before and after. All come from 127.0.0.1, so
/// the per-client cap is raised past the bound (tests/listener.rs tests that cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_bound_wait_and_a_scrape_succeeds_once_others_close() {
    let (agent, db) = agent("bound", "max_http_connections_per_client = 1000").await;
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (code, body) = agent.get(path).await.expect("GET before the flood");
        assert_eq!(code, 200, "{path}: {body}");
    }
    let started = Instant::now();
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(connect(agent.port).await);
    }
    let mut waiting = connect(agent.port).await;
    let scrape = tokio::spawn(async move {
        let status = scrape_on(&mut waiting).await;
        (status, Instant::now())
    });
    // Every held connection was opened after the clock started, so none of them
    // reached its header-read timeout within this wait.
    let wait = Duration::from_secs(1);
    tokio::time::sleep(wait).await;
    assert!(
        started.elapsed() < HEADER_READ_TIMEOUT,
        "opening {MAX_CONNECTIONS} connections took {:?}: the held ones may have timed out",
        started.elapsed()
    );
    assert!(
        !scrape.is_finished(),
        "a scrape on connection {} was answered while {MAX_CONNECTIONS} others were held",
        MAX_CONNECTIONS + 1
    );
    let released = Instant::now();
    held.truncate(MAX_CONNECTIONS - 8);
    let (status, answered) = tokio::time::timeout(Duration::from_secs(10), scrape)
        .await
        .expect("the waiting scrape was answered within 10 s of 8 connections closing")
        .expect("the scrape task");
    assert_eq!(status, "HTTP/1.1 200 OK");
    eprintln!(
        "connection bound: scrape {} waited until 8 of {MAX_CONNECTIONS} held connections closed, answered {:?} after",
        MAX_CONNECTIONS + 1,
        answered - released
    );
    drop(held);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (code, body) = agent.get(path).await.expect("GET after the flood");
        assert_eq!(code, 200, "{path}: {body}");
    }
    db.cleanup().await;
}

/// Guards graceful shutdown on the new listener: on SIGTERM an idle keep-alive
/// connection and a half-sent request do not hold the agent. It exits cleanly,
/// without reporting that HTTP did not stop in time, and before the half-sent
/// request's header-read timeout (10 s) could have closed it: hyper's graceful
/// shutdown alone waits for that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_not_held_by_idle_or_half_sent_connections() {
    let (agent, db) = agent("shut", "shutdown_grace = \"30s\"").await;
    let mut keepalive = connect(agent.port).await;
    assert_eq!(scrape_on(&mut keepalive).await, "HTTP/1.1 200 OK");
    let half_sent = half_sent(agent.port).await;
    let sent = Instant::now();
    let status = agent
        .terminate(Duration::from_secs(20))
        .expect("the agent exited within 20 s of SIGTERM");
    eprintln!(
        "shutdown with open connections: exited {:?} after SIGTERM",
        sent.elapsed()
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        sent.elapsed() < HEADER_READ_TIMEOUT - Duration::from_secs(2),
        "shutdown waited {:?} for a half-sent request",
        sent.elapsed()
    );
    let stderr = agent.stderr();
    assert!(
        !stderr.contains("did not stop in time"),
        "shutdown was not clean:\n{stderr}"
    );
    drop((keepalive, half_sent));
    db.cleanup().await;
}

/// Guards the probes a Kubernetes kubelet reads (issue 18): `/healthz` answers 200
/// `ok` whatever the sources do; `/readyz` answers 503 naming the source `starting`
/// while its first poll cannot finish (its database behind a proxy that drops every
/// packet), 200 `up` once it has polled, and 503 `shutting down` after SIGTERM while
/// the source still releases its lock (the database silent again); the agent then
/// exits within its grace period. PostgreSQL through `common::Proxy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_say_starting_ready_and_shutting_down() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("probes").await;
    let proxy = common::Proxy::start(&common::url_hostport(&db.dsn)).await;
    proxy.blackhole();
    let dsn = common::url_with_hostport(&db.dsn, &format!("127.0.0.1:{}", proxy.port));
    let mut source = inbox_source_toml("probes", &dsn, &tables.inbox);
    // Long enough that the first poll is still waiting while the test looks.
    source = source.replace("timeout = \"2s\"", "timeout = \"20s\"");
    let config = format!("[server]\nshutdown_grace = \"8s\"\n{source}");
    let agent = Agent::start(&config);

    // Starting: alive, not ready, for as long as the database stays silent.
    let alive = wait_until(Duration::from_secs(30), || async {
        agent.get("/healthz").await
    })
    .await
    .expect("/healthz answers once the agent listens");
    assert_eq!(alive, (200, "ok\n".to_string()));
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let (code, body) = agent.get("/readyz").await.expect("GET /readyz");
        assert_eq!(
            (code, body.as_str()),
            (503, "probes: starting\n"),
            "/readyz before the first poll could finish"
        );
        let (code, _) = agent.get("/healthz").await.expect("GET /healthz");
        assert_eq!(code, 200, "/healthz while starting");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The database answers again (the silent connections are closed first, as a
    // TCP timeout would): ready and up.
    proxy.cut();
    proxy.restore();
    wait_until(Duration::from_secs(60), || async {
        match agent.get("/readyz").await? {
            (200, body) if body == "probes: up\n" => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("/readyz never said 200 `probes: up`: {e}"));

    // Shutting down: the database silent, so releasing the lock waits; meanwhile the
    // agent says it is not ready, and says why.
    proxy.blackhole();
    let termed = agent.sigterm();
    let mut seen = None;
    while termed.elapsed() < Duration::from_secs(6) && agent.exited().is_none() {
        if let Ok((code, body)) = agent.get("/readyz").await
            && code != 200
        {
            seen = Some((code, body));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, body) = seen.expect("/readyz answered 503 at least once after SIGTERM");
    assert_eq!(code, 503, "/readyz after SIGTERM: {body}");
    assert!(
        body.starts_with("shutting down\n"),
        "/readyz after SIGTERM does not say it is shutting down: {body:?}"
    );
    let (code, _) = agent
        .get("/healthz")
        .await
        .expect("GET /healthz while stopping");
    assert_eq!(code, 200, "/healthz while stopping");
    let exit = agent
        .terminate(Duration::from_secs(20))
        .expect("the agent exits within 20 s of SIGTERM");
    eprintln!("exited {:?} after SIGTERM with {exit}", termed.elapsed());
    assert!(exit.success(), "exit status after SIGTERM: {exit}");
    drop(proxy);
    db.cleanup().await;
}

/// One GET with `Connection: close`: the status code, the head (lower-cased)
/// and the body.
async fn get_with_head(port: u16, path: &str) -> (u16, String, String) {
    let mut s = connect(port).await;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write a request");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("GET {path}: no answer within 30 s"))
        .expect("read the response");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: bad status line in {head:?}"));
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// Issue 35, hostile requests to the pages: every page and API answer (they show
/// row data) carries `X-Content-Type-Options: nosniff`, `Referrer-Policy:
/// no-referrer` and `Cache-Control: no-store`; a `since` past ten years is a 400
/// naming the parameter (was 200 with the database's range error), on the page,
/// the API and `dead-letters --since`; an event id holding NUL is a plain 404
/// on PostgreSQL, whose text cannot hold one (was the driver's "invalid byte
/// sequence" in the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_private_to_caches_and_refuse_hostile_parameters() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("hostile_http").await;
    let config = inbox_source_toml("hostile", &db.dsn, &tables.inbox);
    let agent = Agent::start(&config);
    agent.wait_ready(Duration::from_secs(30)).await;

    for path in [
        "/",
        "/dead-letters",
        "/events/some-id",
        "/api/v1/status",
        "/api/v1/dead-letters",
        "/api/v1/events/some-id",
    ] {
        let (code, head, body) = get_with_head(agent.port, path).await;
        assert!(code == 200 || code == 404, "GET {path}: {code}\n{body}");
        for header in [
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
            "cache-control: no-store",
        ] {
            assert!(
                head.lines().any(|l| l.trim() == header),
                "GET {path} lacks `{header}`:\n{head}"
            );
        }
    }

    for path in [
        "/dead-letters?since=99999999999d",
        "/api/v1/dead-letters?since=99999999999d",
    ] {
        let (code, _, body) = get_with_head(agent.port, path).await;
        assert_eq!(code, 400, "GET {path}:\n{body}");
        assert!(
            body.contains("since: \"99999999999d\" is longer than 3650d (ten years)"),
            "GET {path} does not name the parameter and its bound:\n{body}"
        );
    }
    // Ten years is still an answer.
    let (code, _, body) = get_with_head(agent.port, "/api/v1/dead-letters?since=3650d").await;
    assert_eq!(code, 200, "since=3650d:\n{body}");

    let (code, _, body) = get_with_head(agent.port, "/api/v1/events/%00").await;
    assert_eq!(code, 404, "/api/v1/events/%00:\n{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("the event report is JSON");
    assert_eq!(
        report["errors"],
        serde_json::json!([]),
        "a NUL in an event id reached the database:\n{body}"
    );
    let (code, _, body) = get_with_head(agent.port, "/events/%00").await;
    assert_eq!(code, 404, "/events/%00:\n{body}");
    assert!(
        !body.contains("invalid byte sequence"),
        "/events/%00:\n{body}"
    );

    let dir = agent.dir().join("inboxwatch.toml");
    let out = common::Cmd::new(["dead-letters", "--since", "99999999999d", "--config"])
        .arg(&dir)
        .output();
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("--since") && out.stderr.contains("is longer than 3650d (ten years)"),
        "dead-letters --since does not name its bound:\n{}",
        out.describe()
    );
    db.cleanup().await;
}

/// The bytes the server at 127.0.0.1:`server` has queued to send to our port
/// `ours` (`/proc/net/tcp`'s `tx_queue`); 0 when the connection is not listed.
fn send_queue(server: u16, ours: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let (local, remote) = (
        format!("0100007F:{server:04X}"),
        format!("0100007F:{ours:04X}"),
    );
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[1] == local && f[2] == remote)
        .and_then(|f| f[4].split(':').next().map(str::to_string))
        .and_then(|tx| u64::from_str_radix(&tx, 16).ok())
        .unwrap_or(0)
}
