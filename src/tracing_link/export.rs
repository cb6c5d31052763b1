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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::config::{Protocol, TracingConfig};
use super::{Queued, SourceIdentity};
use crate::telemetry::catalogue as m;

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
        let mut exporter = build(&self.config).with_context(|| {
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
            endpoint = %crate::config::redact(&self.config.traces_endpoint),
            protocol = self.config.protocol.as_str(),
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
        let timeout = self.config.timeout;
        for t in &mut self.targets {
            while !t.batch.is_empty() {
                let n = t.batch.len().min(MAX_BATCH);
                let batch: Vec<SpanData> = t.batch.drain(..n).collect();
                let result = tokio::time::timeout(timeout, t.exporter.export(batch)).await;
                let label = t.source.clone();
                match result {
                    Ok(Ok(())) => {
                        metrics::counter!(m::SPANS_EXPORTED, "source" => label).increment(n as u64);
                        if !*healthy {
                            info!("Span export works again.");
                            *healthy = true;
                        }
                    }
                    Ok(Err(e)) => {
                        metrics::counter!(m::SPANS_DROPPED, "source" => label).increment(n as u64);
                        if *healthy {
                            warn!(error = %e, "Span export failed; dropping spans until it works again.");
                            *healthy = false;
                        }
                    }
                    Err(_) => {
                        metrics::counter!(m::SPANS_DROPPED, "source" => label).increment(n as u64);
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

/// Builds one OTLP span exporter from the validated settings.
pub fn build(c: &TracingConfig) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    let exporter = match c.protocol {
        Protocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(c.traces_endpoint.clone())
                .with_timeout(c.timeout)
                .with_metadata(metadata(c)?);
            if let Some(tls) = tonic_tls(c) {
                b = b.with_tls_config(tls);
            }
            b.build()?
        }
        Protocol::HttpProtobuf => {
            let headers: HashMap<String, String> = c.headers.iter().cloned().collect();
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(c.traces_endpoint.clone())
                .with_timeout(c.timeout)
                .with_headers(headers)
                .with_http_client(http_client(c)?)
                .build()?
        }
    };
    Ok(exporter)
}

/// The configured headers as gRPC metadata.
pub fn metadata(
    c: &TracingConfig,
) -> anyhow::Result<opentelemetry_otlp::tonic_types::metadata::MetadataMap> {
    let mut headers = http::HeaderMap::new();
    for (k, v) in &c.headers {
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("tracing.headers.{k}: not a header name"))?;
        let value = http::HeaderValue::from_str(v)
            .with_context(|| format!("tracing.headers.{k}: not a header value"))?;
        headers.insert(name, value);
    }
    Ok(opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(headers))
}

/// TLS settings of the gRPC channel, for `https://` endpoints or when
/// certificates are configured: the web PKI roots, `ca_file`, the client identity.
pub fn tonic_tls(
    c: &TracingConfig,
) -> Option<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig> {
    use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
    if !(c.is_tls() || c.ca_pem.is_some() || c.client_identity.is_some()) {
        return None;
    }
    let mut tls = ClientTlsConfig::new().with_webpki_roots();
    if let Some(ca) = &c.ca_pem {
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &c.client_identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Some(tls)
}

/// The HTTP client of the HTTP/protobuf exporters: hyper on the agent's runtime.
pub fn http_client(
    c: &TracingConfig,
) -> anyhow::Result<
    opentelemetry_http::hyper::HyperClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
> {
    Ok(opentelemetry_http::hyper::HyperClient::new(
        https_connector(c)?,
        c.timeout,
        None,
    ))
}

/// An HTTP(S) connector on rustls/ring: the web PKI roots plus `ca_file`,
/// and the client certificate when one is configured.
fn https_connector(
    c: &TracingConfig,
) -> anyhow::Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>>
{
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(ca) = &c.ca_pem {
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots
                .add(cert.context("tracing.ca_file: unreadable certificate")?)
                .context("tracing.ca_file: unusable certificate")?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    let tls = match &c.client_identity {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .context("tracing.client_cert_file: unreadable certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .context("tracing.client_key_file: unreadable key")?;
            builder
                .with_client_auth_cert(chain, key)
                .context("tracing.client_cert_file: unusable certificate or key")?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build())
}
