//! `/metrics`, `/healthz`, `/readyz` and the pages (`pages`, `status`) on one
//! listener. A scrape only renders what the sources last recorded; it never polls. The listener bounds what a
//! client can hold: connections (in all, and per client address), the time to
//! send a request's headers, and the time a connection may stall (issue 16);
//! and it serves TLS and asks for basic auth as the web config file says (`web`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub mod history;
pub mod pages;
pub mod web;

use crate::config::{Config, HttpLimits};
use crate::coordination::Leadership;
use crate::health::Health;
use crate::telemetry::values::Values;

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub metrics: PrometheusHandle,
    /// The same values `metrics` renders, readable: what the status cards read.
    pub values: Values,
    pub health: Arc<Health>,
    /// Which sources this agent exports; the others are hidden from `/metrics`.
    pub leadership: Arc<Leadership>,
    /// Cancelled when the agent begins to shut down: `/readyz` turns false first.
    pub stopping: CancellationToken,
    /// The configuration the agent runs: the pages list its sources and read
    /// their tables for dead letters and events.
    pub config: Arc<Config>,
    /// Recent failed events' attempts, for `/events/{id}`.
    pub journal: crate::journal::Journal,
    /// What each poll of each source reads ([`crate::sources::SourceSpec::reads`]),
    /// in the order of `config.sources`.
    pub reads: Arc<Vec<String>>,
    /// The last hour of the status cards' trends.
    pub history: history::History,
    /// Turns to read the databases for the pages ([`pages::LOOKUPS_AT_ONCE`]).
    pub lookups: Arc<Semaphore>,
    /// The pages and the JSON API are served ([`pages_served`]).
    pub pages: bool,
}

/// Whether the pages and the JSON API, which show row data, are served, and
/// why: `[server] pages` when written; unset, on a loopback listener, or on
/// one that asks every client for TLS and basic auth (`locked`), and not on a
/// listener other hosts reach in the clear.
pub fn pages_served(written: Option<bool>, listen: SocketAddr, locked: bool) -> (bool, String) {
    match written {
        Some(true) => (true, "[server] pages = true".into()),
        Some(false) => (false, "[server] pages = false".into()),
        None if listen.ip().is_loopback() => (true, format!("{listen} is a loopback address")),
        None if locked => (
            true,
            "the web config file asks every client for TLS and basic auth".into(),
        ),
        None => (
            false,
            format!(
                "{listen} is reachable from other hosts without TLS and basic auth \
                 (set server.web_config_file, or [server] pages = true)"
            ),
        ),
    }
}

/// The router of the agent's HTTP endpoints.
pub fn router(state: AppState, web: Arc<web::Web>) -> Router {
    let mut r = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if state.pages {
        r = r.merge(
            Router::new()
                .route("/", get(pages::status_page))
                .route("/dead-letters", get(pages::dead_letters_page))
                .route("/events/{id}", get(pages::event_page))
                .route("/api/v1/status", get(pages::api_status))
                .route("/api/v1/dead-letters", get(pages::api_dead_letters))
                .route(
                    "/api/v1/dead-letter-groups",
                    get(pages::api_dead_letter_groups),
                )
                .route("/api/v1/events/{id}", get(pages::api_event))
                .layer(axum::middleware::map_response(private)),
        );
    }
    r.fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(web, web::guard))
        .with_state(state)
}

/// The headers of every page and API answer, which show row data: the type
/// as sent (no sniffing), no address of the page in a link's `Referer`, and
/// nothing kept by a browser's or proxy's cache.
async fn private(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Takes a sample of every source's trends for the status page's
/// sparklines every [`history::SAMPLE_EVERY`], until `stop`.
pub async fn sample_history(state: AppState, stop: CancellationToken) {
    let mut tick = tokio::time::interval(history::SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => pages::record_history(&state),
        }
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        pages::exposition(&state),
    )
}

/// 200 once every source this agent owns has finished its first poll (a
/// source that is down is reported here and by `inboxwatch_source_up`; one
/// another agent owns is on standby), 503 before that and while shutting
/// down. The body lists each source's state.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let sources = state.health.snapshot();
    let mut body = String::new();
    let mut ready = !state.stopping.is_cancelled();
    if !ready {
        body.push_str("shutting down\n");
    }
    for (name, h) in &sources {
        let word = match (h.polled, h.up) {
            _ if h.standby => "standby (another agent owns it)",
            (false, _) => {
                ready = false;
                "starting"
            }
            (true, true) => "up",
            (true, false) => "down",
        };
        let _ = write!(body, "{name}: {word}");
        if let Some(e) = &h.error {
            let _ = write!(body, ": {e}");
        }
        body.push('\n');
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

/// The largest read buffer of a connection, and so the largest request head
/// (hyper answers 431 beyond it). hyper's default of 408 KiB times
/// `max_http_connections` would not fit the DaemonSet's 128 MiB.
pub const READ_BUFFER: usize = 16 * 1024;

/// Serves until `shutdown` fires, then finishes in-flight requests: each
/// connection ends after the response it is writing, idle ones at once, and
/// half-sent ones after [`DRAIN_QUIET`].
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    web: Arc<web::Web>,
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(state, web.clone());
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Clients::new(limits.max_connections_per_client);
    let mut connections = JoinSet::new();
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => {
                slot.expect("the connection semaphore is never closed")
            }
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it
                    // was accepted: wait a little rather than spin.
                    warn!(error = %e, "Failed to accept a connection.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(client) = clients.take(peer) else {
            debug!(client = %peer.ip(), "Closing a connection over max_http_connections_per_client.");
            continue;
        };
        while connections.try_join_next().is_some() {}
        let app = tower::ServiceExt::map_request(
            app.clone(),
            move |mut r: Request<hyper::body::Incoming>| {
                r.extensions_mut().insert(web::Peer(peer));
                r
            },
        );
        let tls = web.current().tls.clone();
        connections.spawn(secured(
            stream,
            tls,
            app,
            limits,
            shutdown.clone(),
            (slot, client),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// What serves a connection's requests: the router, with the client's address
/// put on each request.
trait App:
    tower::Service<
        Request<hyper::body::Incoming>,
        Response = Response,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<T> App for T where
    T: tower::Service<
            Request<hyper::body::Incoming>,
            Response = Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Serves one accepted connection, over TLS when the web config asks for it
/// (the handshake within `header_read_timeout`), holding its slots until it ends.
async fn secured(
    stream: tokio::net::TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: impl App,
    limits: HttpLimits,
    shutdown: CancellationToken,
    _slots: (tokio::sync::OwnedSemaphorePermit, ClientTurn),
) {
    let Some(tls) = tls else {
        return connection(stream, app, limits, shutdown).await;
    };
    let peer = stream.peer_addr().ok().map(|p| p.ip());
    let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
    tokio::select! {
        _ = shutdown.cancelled() => {}
        done = tokio::time::timeout(limits.header_read_timeout, handshake) => match done {
            Ok(Ok(stream)) => connection(stream, app, limits, shutdown).await,
            Ok(Err(e)) => debug!(client = ?peer, error = %e, "TLS handshake failed."),
            Err(_) => debug!(client = ?peer, "TLS handshake timed out."),
        },
    }
}

/// Serves one connection until the client closes it, a limit closes it, or
/// shutdown drains it.
async fn connection<S>(stream: S, app: impl App, limits: HttpLimits, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let last_io = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched {
        inner: stream,
        started,
        last_io: last_io.clone(),
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(READ_BUFFER)
        .serve_connection(io, TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    loop {
        let quiet = if draining {
            DRAIN_QUIET.min(limits.idle_timeout)
        } else {
            limits.idle_timeout
        };
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    debug!(error = %e, "Connection closed with an error.");
                }
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = quiet_for(started, &last_io, quiet) => {
                debug!(quiet = ?quiet, draining, "Closing a stalled connection.");
                return;
            }
        }
    }
}

/// Once shutdown begins, a connection that moves no byte for this long is
/// dropped: hyper lets a response in flight finish, but would wait out the
/// header-read timeout of a half-sent request. A scrape renders in memory, so
/// its answer starts within milliseconds.
const DRAIN_QUIET: Duration = Duration::from_secs(1);

/// Resolves once the stream has moved no byte for `limit`.
async fn quiet_for(started: Instant, last_io: &AtomicU64, limit: Duration) {
    loop {
        let last = started + Duration::from_millis(last_io.load(Ordering::Relaxed));
        let deadline = last + limit;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Open connections per client address, each at most `max`
/// (`max_http_connections_per_client`): one address holding many idle
/// connections cannot take the slots of another's scrapes.
#[derive(Clone)]
struct Clients {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    max: usize,
}

impl Clients {
    fn new(max: usize) -> Clients {
        Clients {
            open: Arc::default(),
            max,
        }
    }

    /// A turn for one more connection of `peer`'s address, or `None` at its cap.
    fn take(&self, peer: SocketAddr) -> Option<ClientTurn> {
        let mut open = self
            .open
            .lock()
            .expect("the client counts are not poisoned");
        let count = open.entry(peer.ip()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientTurn {
            clients: self.clone(),
            ip: peer.ip(),
        })
    }
}

/// One open connection of a client address; given back on drop.
struct ClientTurn {
    clients: Clients,
    ip: std::net::IpAddr,
}

impl Drop for ClientTurn {
    fn drop(&mut self) {
        let mut open = self
            .clients
            .open
            .lock()
            .expect("the client counts are not poisoned");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A stream that notes when it last moved a byte, for the idle timeout.
struct Watched<S> {
    inner: S,
    started: Instant,
    /// Milliseconds after `started`.
    last_io: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn moved(&self, bytes: usize) {
        if bytes > 0 {
            let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.last_io.store(ms, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.moved(buf.filled().len() - before);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.moved(n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.moved(n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::catalogue::{self as metric, catalogue_recorder};

    /// Guards the status page against showing what `/metrics` hides: a
    /// source another agent owns has no numbers, one out of this agent's
    /// reach none of what it counted, and the one it owns the very values
    /// its scrape shows.
    #[test]
    fn the_status_report_hides_what_metrics_hides() {
        let config = crate::config::parse_str(
            &["owned", "away", "other"]
                .map(|name| {
                    format!(
                        "[[sources]]\nname = \"{name}\"\nkind = \"inbox\"\ndsn = \"sqlite://x.db\"\ntable = \"t\"\n"
                    )
                })
                .concat(),
        )
        .expect("a valid configuration");
        let prometheus = catalogue_recorder();
        let values = Values::default();
        let state = AppState {
            metrics: prometheus.handle(),
            values: values.clone(),
            health: Arc::new(Health::default()),
            leadership: Arc::new(Leadership::default()),
            stopping: CancellationToken::new(),
            reads: Arc::new(config.sources.iter().map(|s| s.reads()).collect()),
            config: Arc::new(config),
            journal: crate::journal::Journal::default(),
            history: history::History::started_now(),
            lookups: Arc::new(Semaphore::new(1)),
            pages: true,
        };
        let layer = values.layer(prometheus);
        metrics::with_local_recorder(&layer, || {
            for (name, backlog) in [("owned", 3.0), ("away", 4.0), ("other", 5.0)] {
                state.leadership.register(name);
                state.health.set(
                    name,
                    crate::health::SourceHealth {
                        polled: true,
                        up: true,
                        ..Default::default()
                    },
                );
                metrics::gauge!(metric::INBOX_BACKLOG, "source" => name, "event_type" => "e", "status" => "pending")
                    .set(backlog);
            }
            state.leadership.set("owned", true);
            state.leadership.set_contending("away");
        });
        let report = pages::status_report(&state);
        let scrape = pages::exposition(&state);
        let pending = |i: usize| {
            report.sources[i]
                .numbers
                .as_ref()
                .map(|n| n["backlog"]["pending"].clone())
        };
        assert_eq!(pending(0), Some(serde_json::json!(3.0)));
        assert!(scrape.contains(
            "inbox_backlog_messages{source=\"owned\",event_type=\"e\",status=\"pending\"} 3\n"
        ));
        assert_eq!(pending(1), Some(serde_json::Value::Null), "out of reach");
        assert!(!scrape.contains("source=\"away\",event_type"));
        assert_eq!(
            (report.sources[2].state, pending(2)),
            ("standby", None),
            "another agent owns it"
        );
        assert!(!scrape.contains("source=\"other\",event_type"));
    }
}
