//! `/metrics`, `/healthz`, `/readyz` and the pages (`pages`, `status`) on one
//! listener. A scrape only renders what the sources last recorded; it never polls. The listener bounds what a
//! client can hold: connections, the time to send a request's headers, and the
//! time a connection may stall (issue 16).

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub mod pages;
pub mod status;

use crate::config::{Config, HttpLimits};
use crate::coordination::Leadership;
use crate::health::Health;

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub metrics: PrometheusHandle,
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
    pub reads: Arc<Vec<Option<String>>>,
    /// The last hour of the status page's numbers.
    pub history: status::History,
    /// Turns to read the databases for the pages ([`pages::LOOKUPS_AT_ONCE`]).
    pub lookups: Arc<Semaphore>,
}

/// The router of the agent's HTTP endpoints.
pub fn router(state: AppState) -> Router {
    let mut r = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if state.config.pages {
        r = r.merge(
            Router::new()
                .route("/", get(pages::status_page))
                .route("/dead-letters", get(pages::dead_letters_page))
                .route("/events/{id}", get(pages::event_page))
                .route("/api/v1/status", get(pages::api_status))
                .route("/api/v1/dead-letters", get(pages::api_dead_letters))
                .route("/api/v1/events/{id}", get(pages::api_event))
                .layer(axum::middleware::map_response(private)),
        );
    }
    r.with_state(state)
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

/// Takes a sample of every source's numbers for the status page's
/// sparklines every [`status::SAMPLE_EVERY`], until `stop`.
pub async fn sample_history(state: AppState, stop: CancellationToken) {
    let mut tick = tokio::time::interval(status::SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let text = pages::exposition(&state);
                state.history.record(&status::numbers(&status::parse(&text)));
            }
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
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(state);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => {
                slot.expect("the connection semaphore is never closed")
            }
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it
                    // was accepted: wait a little rather than spin.
                    warn!(error = %e, "Failed to accept a connection.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        connections.spawn(connection(
            stream,
            app.clone(),
            limits,
            shutdown.clone(),
            slot,
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Serves one connection until the client closes it, a limit closes it, or
/// shutdown drains it. The slot is given back when this returns.
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
    _slot: OwnedSemaphorePermit,
) {
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

/// A stream that notes when it last moved a byte, for the idle timeout.
struct Watched {
    inner: TcpStream,
    started: Instant,
    /// Milliseconds after `started`.
    last_io: Arc<AtomicU64>,
}

impl Watched {
    fn moved(&self, bytes: usize) {
        if bytes > 0 {
            let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.last_io.store(ms, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Watched {
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

impl AsyncWrite for Watched {
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
