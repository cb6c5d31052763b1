//! The OTLP client the agent sends with — linked spans, the metrics push and
//! its own poll spans alike: the endpoint, gRPC or HTTP/protobuf, headers,
//! timeout and TLS (the web PKI roots, an extra CA, a client certificate).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};

use crate::dsn::redact;

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// The config / environment spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how to reach the OTLP collector (validated `[tracing]` keys).
#[derive(Clone)]
pub struct Collector {
    /// Where spans go: the full URL of the traces endpoint (for HTTP, with `/v1/traces`).
    pub traces_endpoint: String,
    /// Where metrics are pushed (for HTTP, with `/v1/metrics`); `None`: no push.
    pub metrics_endpoint: Option<String>,
    pub protocol: Protocol,
    /// Header name and value; values may be secrets and are never printed.
    pub headers: Vec<(String, String)>,
    /// Timeout of one export request.
    pub timeout: Duration,
    /// PEM of extra trust anchors.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Collector")
            .field("traces_endpoint", &redact(&self.traces_endpoint))
            .field(
                "metrics_endpoint",
                &self.metrics_endpoint.as_deref().map(redact),
            )
            .field("protocol", &self.protocol)
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field(
                "tls",
                &(self.ca_pem.is_some(), self.client_identity.is_some()),
            )
            .finish()
    }
}

impl Collector {
    /// Whether the endpoint asks for TLS.
    pub fn is_tls(&self) -> bool {
        self.traces_endpoint.starts_with("https://")
    }
}

/// One OTLP span exporter to the collector.
pub fn span_exporter(c: &Collector) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
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

/// One OTLP metric exporter to `endpoint` of the collector.
pub fn metric_exporter(
    c: &Collector,
    endpoint: &str,
) -> anyhow::Result<opentelemetry_otlp::MetricExporter> {
    let exporter = match c.protocol {
        Protocol::Grpc => {
            let mut b = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.to_string())
                .with_timeout(c.timeout)
                .with_metadata(metadata(c)?);
            if let Some(tls) = tonic_tls(c) {
                b = b.with_tls_config(tls);
            }
            b.build()?
        }
        Protocol::HttpProtobuf => opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint.to_string())
            .with_timeout(c.timeout)
            .with_headers(c.headers.iter().cloned().collect())
            .with_http_client(http_client(c)?)
            .build()?,
    };
    Ok(exporter)
}

/// The configured headers as gRPC metadata.
pub fn metadata(
    c: &Collector,
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
    c: &Collector,
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
    c: &Collector,
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
    c: &Collector,
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
