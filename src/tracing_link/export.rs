//! The export task: takes spans from the bounded queue, batches them per
//! source (one OTLP resource each, so a consumer's spans appear under its own
//! `service.name`), and sends them with `opentelemetry-otlp` over gRPC or
//! HTTP/protobuf.
//!
//! While a batch is in flight the queue fills and sources drop (and count)
//! what does not fit, so memory stays flat and no poll ever waits on the
//! collector. A failed export drops its batch and counts it: the spans are
//! re-derived with the same ids if their rows are read again, and a retry
//! queue would only hold memory while the collector is down.

use std::time::Duration;

use anyhow::Context;
use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::config::TracingConfig;
use super::{Queued, SourceIdentity};
use crate::telemetry::catalogue as metric;
use crate::telemetry::collector::span_exporter;

/// Spans sent in one export request at most.
pub const MAX_BATCH: usize = 512;
/// How long a span may wait for a batch to fill.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// One source's exporter: its resource is set once.
struct Target {
    source: String,
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Vec<SpanData>,
}

/// The running export task and the queue's sending side.
pub struct Exporter {
    tx: mpsc::Sender<Queued>,
    rx: mpsc::Receiver<Queued>,
    targets: Vec<Target>,
    config: TracingConfig,
}

impl Exporter {
    /// An exporter with an empty queue of the configured size.
    pub fn new(config: TracingConfig) -> Exporter {
        let (tx, rx) = mpsc::channel(config.queue_size);
        Exporter {
            tx,
            rx,
            targets: Vec::new(),
            config,
        }
    }

    /// Adds a source with its resource attributes; returns the resource index
    /// and the queue's sender for its [`super::SpanSink`].
    pub fn add_source(
        &mut self,
        identity: &SourceIdentity,
        resource: &[(String, String)],
    ) -> anyhow::Result<(usize, mpsc::Sender<Queued>)> {
        let mut exporter = span_exporter(&self.config.collector).with_context(|| {
            format!(
                "building the OTLP exporter of source \"{}\"",
                identity.source
            )
        })?;
        let attrs = resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(identity.service.clone())
                .with_attributes(attrs)
                .with_attribute(KeyValue::new("telemetry.sdk.name", "inboxwatch"))
                .with_attribute(KeyValue::new("telemetry.sdk.language", "rust"))
                .build(),
        );
        self.targets.push(Target {
            source: identity.source.clone(),
            exporter,
            batch: Vec::new(),
        });
        Ok((self.targets.len() - 1, self.tx.clone()))
    }

    /// Runs until `stop`, then drains what is queued and exports it once more
    /// (bounded by the export timeout).
    pub async fn run(mut self, stop: CancellationToken) {
        info!(
            endpoint = %crate::dsn::redact(&self.config.collector.traces_endpoint),
            protocol = self.config.collector.protocol.as_str(),
            sample_ratio = self.config.sample_ratio,
            "Exporting spans over OTLP."
        );
        // Only the sources hold senders from now on.
        drop(std::mem::replace(&mut self.tx, mpsc::channel(1).0));
        let mut healthy = true;
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => self.send_all(&mut healthy).await,
                got = self.rx.recv() => match got {
                    Some((i, span)) => {
                        if self.push(i, span) {
                            self.send_all(&mut healthy).await;
                        }
                    }
                    None => break,
                },
            }
        }
        while let Ok((i, span)) = self.rx.try_recv() {
            self.push(i, span);
            if self.targets.iter().any(|t| t.batch.len() >= MAX_BATCH) {
                self.send_all(&mut healthy).await;
            }
        }
        self.send_all(&mut healthy).await;
        for t in &mut self.targets {
            let _ = t.exporter.shutdown_with_timeout(Duration::from_secs(1));
        }
    }

    /// Adds a span to its batch; true when that batch is full.
    fn push(&mut self, i: usize, span: SpanData) -> bool {
        match self.targets.get_mut(i) {
            Some(t) => {
                t.batch.push(span);
                t.batch.len() >= MAX_BATCH
            }
            None => false,
        }
    }

    async fn send_all(&mut self, healthy: &mut bool) {
        let timeout = self.config.collector.timeout;
        for t in &mut self.targets {
            while !t.batch.is_empty() {
                let n = t.batch.len().min(MAX_BATCH);
                let batch: Vec<SpanData> = t.batch.drain(..n).collect();
                let result = tokio::time::timeout(timeout, t.exporter.export(batch)).await;
                let label = t.source.clone();
                match result {
                    Ok(Ok(())) => {
                        metrics::counter!(metric::SPANS_EXPORTED, "source" => label)
                            .increment(n as u64);
                        if !*healthy {
                            info!("Span export works again.");
                            *healthy = true;
                        }
                    }
                    Ok(Err(e)) => {
                        metrics::counter!(metric::SPANS_DROPPED, "source" => label)
                            .increment(n as u64);
                        if *healthy {
                            warn!(error = %e, "Span export failed; dropping spans until it works again.");
                            *healthy = false;
                        }
                    }
                    Err(_) => {
                        metrics::counter!(metric::SPANS_DROPPED, "source" => label)
                            .increment(n as u64);
                        if *healthy {
                            warn!(timeout = ?timeout, "Span export timed out; dropping spans until it works again.");
                            *healthy = false;
                        }
                    }
                }
            }
        }
    }
}
