//! Wiring: install the recorder, start one loop per source, serve HTTP, and
//! shut down in order (stop polling, stop HTTP) on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::coordination::Leadership;
use crate::health::Health;
use crate::http::{self, AppState};
use crate::sources::kind::Runtime;
use crate::telemetry::catalogue::{self as metric, catalogue_recorder};
use crate::telemetry::values::Values;

/// A running agent.
pub struct Agent {
    /// The address actually bound.
    pub addr: SocketAddr,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
    http: tokio::task::JoinHandle<std::io::Result<()>>,
    stop_http: CancellationToken,
    grace: Duration,
    /// The span export task and its stop signal, when `[tracing]` is set.
    spans: Option<(tokio::task::JoinHandle<()>, CancellationToken)>,
    _owned_outright: Vec<watch::Sender<Option<bool>>>,
}

/// What the installed recorder gives the agent: the Prometheus handle
/// `/metrics` renders, and the same values, readable (the status cards).
#[derive(Clone)]
pub struct Recorded {
    pub prometheus: PrometheusHandle,
    pub values: Values,
}

/// Installs the global metrics recorder once and returns its handles.
pub fn install_recorder() -> anyhow::Result<Recorded> {
    install_recorder_with(None)
}

/// Installs the Prometheus recorder and, when given, the OTLP metrics bridge
/// beside it (every update goes to both), behind the layer that keeps the
/// values readable.
pub fn install_recorder_with(
    otlp: Option<crate::telemetry::otlp::Bridge>,
) -> anyhow::Result<Recorded> {
    let recorder = catalogue_recorder();
    let handle = recorder.handle();
    let values = Values::default();
    match otlp {
        None => metrics::set_global_recorder(values.layer(recorder))
            .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed")),
        Some(bridge) => metrics::set_global_recorder(
            values.layer(
                metrics_util::layers::FanoutBuilder::default()
                    .add_recorder(recorder)
                    .add_recorder(bridge)
                    .build(),
            ),
        )
        .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed")),
    }
    .context("installing the metrics recorder")?;
    metric::describe();
    metrics::gauge!(metric::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(Recorded {
        prometheus: handle,
        values,
    })
}

impl Agent {
    /// Binds the listener and starts every source.
    pub async fn start(config: Config, recorded: Recorded) -> anyhow::Result<Agent> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| listen_error(config.listen, &e))?;
        let addr = listener.local_addr()?;
        let web_config = match &config.web_config_file {
            None => crate::config::web::WebConfig::none(),
            Some(path) => crate::config::web::load(path).map_err(|problems| {
                let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
                anyhow::anyhow!(lines.join("\n"))
            })?,
        };
        let (pages, why) = http::pages_served(config.pages, addr, web_config.locked());
        let keep_locked = pages && config.pages.is_none() && !addr.ip().is_loopback();
        let web = Arc::new(http::web::Web::new(
            config.web_config_file.clone(),
            web_config,
            keep_locked,
        ));
        let health = Arc::new(Health::default());
        let cancel = CancellationToken::new();
        let leadership = Arc::new(Leadership::default());
        let linker = config
            .tracing
            .clone()
            .map(|t| crate::tracing_link::Linker::new(t, config.redact.clone()));
        let mut rt = Runtime::new(
            health.clone(),
            leadership.clone(),
            cancel.clone(),
            linker,
            config.max_connections_per_database,
        );
        let journal = rt.journal.clone();
        let config = Arc::new(config);
        // What each poll of a source reads follows from its configuration:
        // said once at start, and kept for the status page and API.
        let mut reads = Vec::with_capacity(config.sources.len());
        for spec in config.sources.iter().cloned() {
            leadership.register(spec.name());
            health.register(spec.name());
            let source_reads = spec.reads();
            info!(source = %spec.name(), "{source_reads}");
            reads.push(source_reads);
            spec.start(&mut rt)?;
        }
        let (tasks, linker, owned_outright) = rt.finish();
        let spans = linker.map(|l| {
            let stop = CancellationToken::new();
            (tokio::spawn(l.run(stop.clone())), stop)
        });
        let stop_http = CancellationToken::new();
        let state = AppState {
            metrics: recorded.prometheus,
            values: recorded.values,
            health,
            leadership,
            stopping: cancel.clone(),
            config: config.clone(),
            journal,
            reads: Arc::new(reads),
            history: http::history::History::started_now(),
            lookups: Arc::new(tokio::sync::Semaphore::new(http::pages::LOOKUPS_AT_ONCE)),
            pages,
        };
        let mut tasks = tasks;
        if pages {
            tasks.spawn(http::sample_history(state.clone(), cancel.clone()));
        }
        tasks.spawn(web.clone().watch(cancel.clone()));
        let locked = match (web.current().tls.is_some(), !web.current().users.is_empty()) {
            (true, true) => "TLS, basic auth",
            (true, false) => "TLS, no basic auth",
            (false, true) => "no TLS, basic auth",
            (false, false) => "no TLS, no basic auth",
        };
        let http = tokio::spawn(http::serve(
            listener,
            state,
            web,
            config.http,
            stop_http.clone(),
        ));
        if pages {
            info!(listen = %addr, security = locked, why = %why, "Serving the pages (/, /dead-letters, /events/…, /api/v1/…), /metrics, /healthz and /readyz.");
        } else {
            info!(listen = %addr, security = locked, why = %why, "Serving /metrics, /healthz and /readyz; not the pages (/, /dead-letters, /events/…, /api/v1/…).");
        }
        Ok(Agent {
            addr,
            cancel,
            tasks,
            http,
            stop_http,
            grace: config.shutdown_grace,
            spans,
            _owned_outright: owned_outright,
        })
    }

    /// Stops polling and releases the sources' locks, then stops the HTTP
    /// server after in-flight scrapes, then flushes the queued spans, all
    /// within the configured grace period.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        let loops = async { while self.tasks.join_next().await.is_some() {} };
        // One deadline for the whole shutdown: the loops (which release their
        // locks) get most of it, the HTTP server the rest.
        let deadline = tokio::time::Instant::now() + self.grace;
        if tokio::time::timeout(self.grace.mul_f64(0.75), loops)
            .await
            .is_err()
        {
            warn!("Sources did not stop in time; abandoning them.");
        }
        self.stop_http.cancel();
        match tokio::time::timeout_at(deadline, self.http).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "HTTP server failed."),
            Ok(Err(e)) => warn!(error = %e, "HTTP server task failed."),
            Err(_) => warn!("HTTP server did not stop in time."),
        }
        if let Some((task, stop)) = self.spans {
            stop.cancel();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                warn!("Queued spans were not exported in time.");
            }
        }
    }
}

/// Why `server.listen` (or `--listen`) cannot be bound, in one line naming the key.
fn listen_error(addr: SocketAddr, e: &std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "server.listen: {addr} is already in use by another process \
             (choose another address with server.listen or --listen)"
        )
    } else {
        anyhow::anyhow!(
            "server.listen: cannot listen on {addr}: {e} (see server.listen or --listen)"
        )
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    info!("Shutting down.");
}

/// `inboxwatch run`: the agent until a signal.
pub async fn run(config: Config) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let push = match &config.tracing {
        Some(t) => crate::telemetry::otlp::start(&t.collector, t.metrics_interval)?,
        None => None,
    };
    let (push, bridge) = push.unzip();
    let recorded = install_recorder_with(bridge)?;
    let own_spans = match &config.tracing {
        Some(t) if t.agent_spans => Some(crate::telemetry::agent_spans::enable(&t.collector)?),
        _ => None,
    };
    let agent = Agent::start(config, recorded).await?;
    shutdown_signal().await;
    agent.shutdown().await;
    // Flushing waits for the exporting tasks on the runtime: not on a worker.
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(push) = push {
            push.shutdown();
        }
        if let Some(p) = own_spans {
            let _ = p.shutdown();
        }
    })
    .await;
    Ok(())
}
