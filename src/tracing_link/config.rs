//! The `[tracing]` section and the per-source `[sources.trace]` table: what
//! the file may say, and the validated settings the exporter runs on.
//!
//! Every key falls back to the standard `OTEL_EXPORTER_OTLP_*` variables
//! (the signal-specific `…_TRACES_…` one first), then to the OTLP defaults.
//! The file wins over the environment, as the OpenTelemetry specification
//! asks of programmatic configuration.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::dsn::redact;
use crate::telemetry::collector::{Collector, Protocol};
use crate::validation::{Validator, expand_env};

/// `[tracing]` as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawTracing {
    /// Base URL of the OTLP receiver, as `OTEL_EXPORTER_OTLP_ENDPOINT`: for
    /// HTTP/protobuf `/v1/traces` is appended (default `http://localhost:4317`
    /// for gRPC, `http://localhost:4318` for HTTP).
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default `grpc`).
    pub protocol: Option<String>,
    /// Share of successful, fast events whose spans are kept, 0 to 1 (default 1).
    /// Failed, dead-lettered and slow events are always kept.
    pub sample_ratio: Option<f64>,
    /// Extra request headers (gRPC metadata), e.g. an API key; `${VAR}` is expanded.
    pub headers: Option<BTreeMap<String, String>>,
    /// Timeout of one export request (default `10s`).
    pub timeout: Option<String>,
    /// Spans waiting for export; beyond it new spans are dropped and counted (default 4096).
    pub queue_size: Option<i64>,
    /// PEM file of the CA that signs the collector's certificate (default: the web PKI roots).
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (with `client_key_file`).
    pub client_cert_file: Option<String>,
    /// PEM private key of the client certificate.
    pub client_key_file: Option<String>,
    /// Also push the metric catalogue over OTLP, beside `/metrics` (default false).
    pub export_metrics: Option<bool>,
    /// How often metrics are pushed (default `60s`).
    pub metrics_interval: Option<String>,
    /// Also export the agent's own poll cycles as spans of `service.name = inboxwatch` (default false).
    pub agent_spans: Option<bool>,
}

/// `[sources.trace]` as written: how one consumer's spans describe it.
#[derive(Debug, Default, Deserialize)]
pub struct RawSourceTrace {
    /// `messaging.system` of the consumer's spans, e.g. `kafka` or `rabbitmq` (default `inbox`).
    pub messaging_system: Option<String>,
    /// `messaging.consumer.group.name` (default: the source's `service_name`, else its name).
    pub consumer_group: Option<String>,
    /// Extra resource attributes of the source's spans, e.g. `deployment.environment`.
    pub resource: Option<BTreeMap<String, String>>,
}

/// Validated `[tracing]`.
#[derive(Debug, Clone)]
pub struct TracingConfig {
    /// Where and how spans (and pushed metrics) are sent.
    pub collector: Collector,
    pub sample_ratio: f64,
    pub queue_size: usize,
    pub metrics_interval: Duration,
    /// Export the agent's own poll spans.
    pub agent_spans: bool,
}

/// Validated `[sources.trace]`.
#[derive(Debug, Clone, Default)]
pub struct SourceTrace {
    pub messaging_system: String,
    pub consumer_group: Option<String>,
    pub resource: Vec<(String, String)>,
}

const DEFAULT_GRPC: &str = "http://localhost:4317";
const DEFAULT_HTTP: &str = "http://localhost:4318";
/// Default bound of the export queue.
pub const DEFAULT_QUEUE: usize = 4096;

/// Validates `[tracing]`; `None` when the section is absent (no spans).
pub fn validate(raw: Option<&RawTracing>, v: &mut Validator<'_>) -> Option<TracingConfig> {
    let raw = raw?;
    let before = v.count();
    let protocol = protocol(raw, v);
    let (traces_endpoint, metrics_endpoint) = endpoints(raw, protocol, v);
    let metrics_interval = match raw.metrics_interval.as_deref() {
        None => Duration::from_secs(60),
        Some(t) => match humantime::parse_duration(t) {
            Ok(d) if d >= Duration::from_secs(1) => d,
            Ok(_) => {
                v.problem("tracing.metrics_interval", "must be at least 1s".into());
                Duration::from_secs(60)
            }
            Err(e) => {
                v.problem(
                    "tracing.metrics_interval",
                    format!("invalid duration \"{t}\": {e}"),
                );
                Duration::from_secs(60)
            }
        },
    };

    let sample_ratio = match raw.sample_ratio {
        None => 1.0,
        Some(r) if (0.0..=1.0).contains(&r) => r,
        Some(r) => {
            v.problem(
                "tracing.sample_ratio",
                format!("must be between 0 and 1, got {r}"),
            );
            1.0
        }
    };
    let headers = headers(raw, v);
    let timeout = timeout(raw, v);
    let queue_size = match raw.queue_size {
        None => DEFAULT_QUEUE,
        Some(n) if (1..=1_000_000).contains(&n) => n as usize,
        Some(n) => {
            v.problem(
                "tracing.queue_size",
                format!("must be between 1 and 1000000, got {n}"),
            );
            DEFAULT_QUEUE
        }
    };
    let (ca_pem, client_identity) = tls_files(raw, v);
    (v.count() == before).then_some(TracingConfig {
        collector: Collector {
            traces_endpoint,
            metrics_endpoint,
            protocol,
            headers,
            timeout,
            ca_pem,
            client_identity,
        },
        sample_ratio,
        queue_size,
        metrics_interval,
        agent_spans: raw.agent_spans.unwrap_or(false),
    })
}

/// The first of `names` set (and not empty) in the environment, with its value.
fn env_first(v: &Validator<'_>, names: &[&str]) -> Option<(String, String)> {
    names.iter().find_map(|n| {
        v.var(n)
            .filter(|s| !s.is_empty())
            .map(|s| (n.to_string(), s))
    })
}

/// `protocol`, else `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`, else gRPC.
fn protocol(raw: &RawTracing, v: &mut Validator<'_>) -> Protocol {
    match raw
        .protocol
        .clone()
        .map(|p| ("tracing.protocol".to_string(), p))
        .or_else(|| {
            env_first(
                v,
                &[
                    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                ],
            )
        }) {
        None => Protocol::Grpc,
        Some((_, p)) if p == "grpc" => Protocol::Grpc,
        Some((_, p)) if p == "http/protobuf" => Protocol::HttpProtobuf,
        Some((key, p)) => {
            v.problem(
                &key,
                format!("unknown protocol \"{p}\" (expected grpc or http/protobuf)"),
            );
            Protocol::Grpc
        }
    }
}

/// Where spans go and, with `export_metrics`, where metrics are pushed:
/// `otlp_endpoint`, else the `OTEL_EXPORTER_OTLP_*` variables, else the
/// protocol's default, with the signal's path for HTTP.
fn endpoints(
    raw: &RawTracing,
    protocol: Protocol,
    v: &mut Validator<'_>,
) -> (String, Option<String>) {
    let signal_path = match protocol {
        Protocol::Grpc => "",
        Protocol::HttpProtobuf => "/v1/traces",
    };
    let (endpoint_key, traces_endpoint) = if let Some(e) = &raw.otlp_endpoint {
        (
            "tracing.otlp_endpoint".to_string(),
            join_path(e, signal_path),
        )
    } else if let Some((k, e)) = env_first(v, &["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]) {
        // The signal-specific variable is the full URL, used as it is.
        (k, e)
    } else if let Some((k, e)) = env_first(v, &["OTEL_EXPORTER_OTLP_ENDPOINT"]) {
        (k, join_path(&e, signal_path))
    } else {
        let base = match protocol {
            Protocol::Grpc => DEFAULT_GRPC,
            Protocol::HttpProtobuf => DEFAULT_HTTP,
        };
        (
            "tracing.otlp_endpoint".to_string(),
            join_path(base, signal_path),
        )
    };
    if !(traces_endpoint.starts_with("http://") || traces_endpoint.starts_with("https://"))
        || traces_endpoint.parse::<http::Uri>().is_err()
    {
        v.problem(
            &endpoint_key,
            format!(
                "\"{}\" is not an http:// or https:// URL",
                redact(&traces_endpoint)
            ),
        );
    }

    let metrics_endpoint = raw.export_metrics.unwrap_or(false).then(|| {
        let path = match protocol {
            Protocol::Grpc => "",
            Protocol::HttpProtobuf => "/v1/metrics",
        };
        if let Some(e) = &raw.otlp_endpoint {
            join_path(e, path)
        } else if let Some((_, e)) = env_first(v, &["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]) {
            e
        } else if let Some((_, e)) = env_first(v, &["OTEL_EXPORTER_OTLP_ENDPOINT"]) {
            join_path(&e, path)
        } else {
            let base = match protocol {
                Protocol::Grpc => DEFAULT_GRPC,
                Protocol::HttpProtobuf => DEFAULT_HTTP,
            };
            join_path(base, path)
        }
    });
    // A configured endpoint is checked above; the metrics variable here.
    if let Some(e) = &metrics_endpoint
        && raw.otlp_endpoint.is_none()
        && (!(e.starts_with("http://") || e.starts_with("https://"))
            || e.parse::<http::Uri>().is_err())
    {
        v.problem(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            format!("\"{}\" is not an http:// or https:// URL", redact(e)),
        );
    }
    (traces_endpoint, metrics_endpoint)
}

/// `headers`, `${VAR}` expanded; names checked, values fit for a header.
fn headers(raw: &RawTracing, v: &mut Validator<'_>) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    for (name, value) in raw.headers.iter().flatten() {
        let key = format!("tracing.headers.{name}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            v.problem(&key, "not a valid header name".into());
            continue;
        }
        match expand_env(value, v.env()) {
            Ok(v) if v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) => {
                headers.push((name.to_ascii_lowercase(), v))
            }
            Ok(_) => v.problem(
                &key,
                "the value has characters a header cannot carry".into(),
            ),
            Err(var) => v.problem(&key, format!("environment variable {var} is not set")),
        }
    }
    headers
}

/// `timeout`, else `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (milliseconds), else 10 s.
fn timeout(raw: &RawTracing, v: &mut Validator<'_>) -> Duration {
    match (
        &raw.timeout,
        env_first(
            v,
            &[
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ],
        ),
    ) {
        (Some(t), _) => match humantime::parse_duration(t) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                v.problem("tracing.timeout", "must be greater than zero".into());
                Duration::from_secs(10)
            }
            Err(e) => {
                v.problem("tracing.timeout", format!("invalid duration \"{t}\": {e}"));
                Duration::from_secs(10)
            }
        },
        // The variables are in milliseconds.
        (None, Some((k, ms))) => match ms.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                v.problem(&k, format!("\"{ms}\" is not a number of milliseconds"));
                Duration::from_secs(10)
            }
        },
        (None, None) => Duration::from_secs(10),
    }
}

/// A PEM certificate and its key.
type Pem = (Vec<u8>, Vec<u8>);

/// The CA and the client certificate and key (files, or the
/// `OTEL_EXPORTER_OTLP_*` variables that name them), read as PEM.
fn tls_files(raw: &RawTracing, v: &mut Validator<'_>) -> (Option<Vec<u8>>, Option<Pem>) {
    let mut read = |key: &str, var: &str, path: &Option<String>| -> Option<Vec<u8>> {
        let (key, path) = match path {
            Some(p) => (key.to_string(), p.clone()),
            None => {
                let p = v.var(var).filter(|v| !v.is_empty())?;
                (var.to_string(), p)
            }
        };
        match std::fs::read(&path) {
            Ok(b) if b.windows(10).any(|w| w == b"-----BEGIN") => Some(b),
            Ok(_) => {
                v.problem(&key, format!("\"{path}\" is not a PEM file"));
                None
            }
            Err(e) => {
                v.problem(&key, format!("cannot read \"{path}\": {e}"));
                None
            }
        }
    };
    let ca_pem = read(
        "tracing.ca_file",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        &raw.ca_file,
    );
    let cert = read(
        "tracing.client_cert_file",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        &raw.client_cert_file,
    );
    let key = read(
        "tracing.client_key_file",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        &raw.client_key_file,
    );
    let client_identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => {
            v.problem(
                "tracing.client_key_file",
                "required with client_cert_file".into(),
            );
            None
        }
        (None, Some(_)) => {
            v.problem(
                "tracing.client_cert_file",
                "required with client_key_file".into(),
            );
            None
        }
    };
    (ca_pem, client_identity)
}

/// Validates one source's `[sources.trace]`.
pub fn validate_source(
    key: &str,
    raw: Option<&RawSourceTrace>,
    v: &mut Validator<'_>,
) -> SourceTrace {
    let Some(raw) = raw else {
        return SourceTrace {
            messaging_system: "inbox".into(),
            ..SourceTrace::default()
        };
    };
    let mut resource = Vec::new();
    for (name, value) in raw.resource.iter().flatten() {
        if name.is_empty() {
            v.problem(
                &format!("{key}.trace.resource"),
                "attribute names must not be empty".into(),
            );
        } else if name == "service.name" {
            v.problem(
                &format!("{key}.trace.resource.service.name"),
                "set the source's service_name instead".into(),
            );
        } else {
            resource.push((name.clone(), value.clone()));
        }
    }
    let mut nonempty = |field: &str, value: &Option<String>| match value {
        Some(s) if s.trim().is_empty() => {
            v.problem(&format!("{key}.trace.{field}"), "must not be empty".into());
            None
        }
        other => other.clone(),
    };
    SourceTrace {
        messaging_system: nonempty("messaging_system", &raw.messaging_system)
            .unwrap_or_else(|| "inbox".into()),
        consumer_group: nonempty("consumer_group", &raw.consumer_group),
        resource,
    }
}

/// `base` with the signal path appended, without doubling the slash.
fn join_path(base: &str, path: &str) -> String {
    if path.is_empty() {
        return base.to_string();
    }
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Environment, Problem};

    fn check(raw: RawTracing, vars: &[(&str, &str)]) -> Result<TracingConfig, Vec<Problem>> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |n: &str| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let mut v = Validator::new("", Environment::Process, &env);
        let c = validate(Some(&raw), &mut v);
        let problems = v.into_problems();
        c.ok_or(problems)
    }

    #[test]
    fn the_endpoint_is_a_base_url_and_http_appends_the_signal_path() {
        let c = check(
            RawTracing {
                otlp_endpoint: Some("http://collector:4318/".into()),
                protocol: Some("http/protobuf".into()),
                ..RawTracing::default()
            },
            &[],
        )
        .expect("valid");
        assert_eq!(
            c.collector.traces_endpoint,
            "http://collector:4318/v1/traces"
        );
        let c = check(RawTracing::default(), &[]).expect("valid");
        assert_eq!(c.collector.traces_endpoint, "http://localhost:4317");
        assert_eq!(c.collector.protocol, Protocol::Grpc);
        assert_eq!(c.sample_ratio, 1.0);
    }

    #[test]
    fn the_standard_variables_apply_when_the_file_is_silent() {
        let c = check(
            RawTracing::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ],
        )
        .expect("valid");
        assert_eq!(
            c.collector.traces_endpoint,
            "https://otel.example:4318/v1/traces"
        );
        assert_eq!(c.collector.timeout, Duration::from_millis(2500));
        assert!(c.collector.is_tls());
        let c = check(
            RawTracing::default(),
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a:1/custom"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://b:2"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
        )
        .expect("valid");
        assert_eq!(c.collector.traces_endpoint, "http://a:1/custom");
    }

    #[test]
    fn every_problem_names_its_key_or_variable() {
        let mut headers = BTreeMap::new();
        headers.insert("x-api-key".to_string(), "${NOPE}".to_string());
        let err = check(
            RawTracing {
                protocol: Some("http/json".into()),
                sample_ratio: Some(1.5),
                headers: Some(headers),
                timeout: Some("soon".into()),
                queue_size: Some(0),
                ca_file: Some("/nonexistent/ca.pem".into()),
                client_cert_file: Some("/nonexistent/c.pem".into()),
                ..RawTracing::default()
            },
            &[],
        )
        .expect_err("invalid");
        let keys: Vec<&str> = err.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "tracing.protocol",
                "tracing.sample_ratio",
                "tracing.headers.x-api-key",
                "tracing.timeout",
                "tracing.queue_size",
                "tracing.ca_file",
                "tracing.client_cert_file",
            ]
        );
        let err = check(
            RawTracing::default(),
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
        )
        .expect_err("invalid");
        assert_eq!(err[0].key, "OTEL_EXPORTER_OTLP_PROTOCOL");
    }

    #[test]
    fn header_values_never_reach_debug_output() {
        let mut headers = BTreeMap::new();
        headers.insert("authorization".to_string(), "Bearer ${TOKEN}".to_string());
        let c = check(
            RawTracing {
                headers: Some(headers),
                ..RawTracing::default()
            },
            &[("TOKEN", "t0ps3cret")],
        )
        .expect("valid");
        assert_eq!(c.collector.headers[0].1, "Bearer t0ps3cret");
        assert!(!format!("{c:?}").contains("t0ps3cret"));
    }
}
