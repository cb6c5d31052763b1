//! Turning rows into linked spans: a consumer's processing of an event
//! becomes a CONSUMER span linked to the producer's context from the row's
//! `traceparent`; an outbox row becomes the PRODUCER span `publish …` under
//! that context.
//!
//! Ids are derived, never random, so that every agent that reads a row (again)
//! emits the same span:
//! * trace id = the first 16 bytes of SHA-256(event id) — the trace of an event
//!   can be found from its id alone (`printf %s "$ID" | sha256sum | cut -c1-32`);
//! * span id = the first 8 bytes of SHA-256(kind, service, event id, attempt),
//!   so two consumer services of one event never share a span id.
//!
//! Sources hand spans to a bounded queue ([`SpanSink`]) and never wait for it:
//! a full queue drops the span and counts it.

pub mod config;
pub mod export;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::redact::Redactor;
use crate::telemetry::catalogue as metric;
use crate::text::at;

/// Characters of `last_error` carried in a span's status message.
pub const ERROR_TEXT_LEN: usize = 256;

/// A W3C trace context: `00-{trace id}-{parent id}-{flags}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value; `None` if it is not one.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let text = text.trim();
        let mut parts = text.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        // Version 00 has exactly four fields; later versions may append more.
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        u8::from_str_radix(version, 16).ok()?;
        let trace_id: [u8; 16] = hex(trace)?.try_into().ok()?;
        let span_id: [u8; 8] = hex(span)?.try_into().ok()?;
        let flags: [u8; 1] = hex(flags)?.try_into().ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }

    /// The trace id in lowercase hex.
    pub fn trace_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    fn context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::NONE,
        )
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2)
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Lowercase hex of bytes.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The trace id of an event: the first 16 bytes of SHA-256 of its id.
pub fn trace_id(event_id: &str) -> [u8; 16] {
    let d = Sha256::digest(event_id.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    if out == [0; 16] {
        out[15] = 1;
    }
    out
}

/// The span id of one attempt (`publish` spans use attempt 0) of `event_id`
/// as seen by `service`.
pub fn span_id(kind: &str, service: &str, event_id: &str, attempt: u32) -> [u8; 8] {
    let mut h = Sha256::new();
    for part in [kind.as_bytes(), service.as_bytes(), event_id.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    if out == [0; 8] {
        out[7] = 1;
    }
    out
}

/// Whether a successful, fast event is kept at `ratio`, decided from its
/// trace id alone so that every agent decides the same (the low 8 bytes, as
/// OpenTelemetry's `TraceIdRatioBased` sampler does).
pub fn sampled(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let low = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes"));
    // Compare on 63 bits, as the SDK sampler does, so that ratio 1 keeps all.
    (low >> 1) < (ratio * (1u64 << 63) as f64) as u64
}

/// The bounded class of an error text: its leading exception-like word
/// (`TimeoutError: …` → `TimeoutError`), else `_OTHER` as the semantic
/// conventions ask for values they cannot name.
pub fn error_class(text: &str) -> String {
    let head: &str = text
        .trim_start()
        .split(|c: char| c == ':' || c.is_whitespace() || c == '(')
        .next()
        .unwrap_or("");
    let ok = !head.is_empty()
        && head.len() <= 64
        && head.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.$".contains(c));
    if ok {
        head.to_string()
    } else {
        "_OTHER".to_string()
    }
}

/// `text` cut to at most `n` characters, with an ellipsis when cut.
pub fn truncate(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        None => text.to_string(),
        Some((i, _)) => format!("{}…", &text[..i]),
    }
}

/// What is known of one consumer attempt, for its span.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub event_id: &'a str,
    pub event_type: Option<&'a str>,
    /// `inbox.outcome`: `succeeded`, `dead_lettered` or `failed`.
    pub outcome: &'static str,
    pub attempt: u32,
    pub attempts: Option<i64>,
    pub deliveries: Option<i64>,
    pub received: i64,
    pub started: Option<i64>,
    pub end: i64,
    pub last_error: Option<&'a str>,
    pub traceparent: Option<TraceParent>,
}

/// How one source's spans describe its consumer.
#[derive(Debug, Clone)]
pub struct SourceIdentity {
    /// The `source` label of the span counters.
    pub source: String,
    /// `service.name` of the resource.
    pub service: String,
    pub messaging_system: String,
    pub consumer_group: String,
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("inboxwatch")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The CONSUMER span `process {event_type}` of one attempt.
pub fn consumer_span(id: &SourceIdentity, a: &Attempt<'_>) -> SpanData {
    let trace = trace_id(a.event_id);
    let span = span_id("process", &id.service, a.event_id, a.attempt);
    let event_type = a.event_type.unwrap_or("unknown");
    let mut attributes = vec![
        KeyValue::new("messaging.system", id.messaging_system.clone()),
        KeyValue::new("messaging.operation.name", "process"),
        KeyValue::new("messaging.operation.type", "process"),
        KeyValue::new("messaging.destination.name", event_type.to_string()),
        KeyValue::new("messaging.consumer.group.name", id.consumer_group.clone()),
        KeyValue::new("messaging.message.id", a.event_id.to_string()),
        KeyValue::new("inbox.attempt", i64::from(a.attempt)),
        KeyValue::new("inbox.outcome", a.outcome),
        KeyValue::new("inboxwatch.source", id.source.clone()),
    ];
    if let Some(n) = a.attempts {
        attributes.push(KeyValue::new("inbox.attempts", n));
    }
    if let Some(n) = a.deliveries {
        attributes.push(KeyValue::new("inbox.deliveries", n));
        attributes.push(KeyValue::new("messaging.message.delivery_count", n));
    }
    let failed = a.outcome != "succeeded";
    if failed {
        let class = a.last_error.map_or("_OTHER".to_string(), error_class);
        attributes.push(KeyValue::new("error.type", class));
    }
    let start = a.started.unwrap_or(a.received).min(a.end);
    let mut events = Vec::new();
    if let Some(started) = a.started {
        events.push(Event::new(
            "inbox.wait",
            at(started),
            vec![
                KeyValue::new("inbox.received_at_unix_ms", a.received / 1000),
                KeyValue::new("inbox.wait_ms", (started - a.received) / 1000),
            ],
            0,
        ));
    }
    let links = a
        .traceparent
        .map(|tp| vec![Link::with_context(tp.context())])
        .unwrap_or_default();
    let status = if failed {
        Status::error(truncate(a.last_error.unwrap_or(a.outcome), ERROR_TEXT_LEN))
    } else {
        Status::Unset
    };
    let mut span_events = SpanEvents::default();
    span_events.events = events;
    let mut span_links = SpanLinks::default();
    span_links.links = links;
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(span),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Consumer,
        name: Cow::Owned(format!("process {event_type}")),
        start_time: at(start),
        end_time: at(a.end),
        attributes,
        dropped_attributes_count: 0,
        events: span_events,
        links: span_links,
        status,
        instrumentation_scope: scope(),
    }
}

/// What is known of one published outbox row, for its span.
#[derive(Debug, Clone)]
pub struct Publish<'a> {
    pub event_id: &'a str,
    pub event_type: Option<&'a str>,
    pub created: i64,
    pub published: i64,
    pub traceparent: Option<TraceParent>,
}

/// The PRODUCER span `publish {event_type}`: a child of the stored context,
/// or, without one, the root of the event's own trace.
pub fn producer_span(id: &SourceIdentity, p: &Publish<'_>) -> SpanData {
    let event_type = p.event_type.unwrap_or("unknown");
    let (trace, parent) = match p.traceparent {
        Some(tp) => (tp.trace_id, SpanId::from_bytes(tp.span_id)),
        None => (trace_id(p.event_id), SpanId::INVALID),
    };
    let span = span_id("publish", &id.service, p.event_id, 0);
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(span),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: parent,
        parent_span_is_remote: p.traceparent.is_some(),
        span_kind: SpanKind::Producer,
        name: Cow::Owned(format!("publish {event_type}")),
        start_time: at(p.created),
        end_time: at(p.published.max(p.created)),
        attributes: vec![
            KeyValue::new("messaging.system", id.messaging_system.clone()),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", event_type.to_string()),
            KeyValue::new("messaging.message.id", p.event_id.to_string()),
            KeyValue::new("inboxwatch.source", id.source.clone()),
        ],
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope(),
    }
}

/// Masks the parts of a span that come from the row's `last_error`.
fn redact(redact: &Redactor, span: &mut SpanData) {
    if let Status::Error { description } = &mut span.status {
        *description = Cow::Owned(redact.prefix(description, ERROR_TEXT_LEN).into_owned());
    }
    for kv in span
        .attributes
        .iter_mut()
        .filter(|kv| kv.key.as_str() == "error.type")
    {
        let class = kv.value.as_str();
        if let Cow::Owned(masked) = redact.text(&class) {
            kv.value = masked.into();
        }
    }
}

/// Wires sources to one exporter: the export task and a sink per source.
pub struct Linker {
    exporter: export::Exporter,
    sample_ratio: f64,
    redact: Arc<Redactor>,
}

impl Linker {
    /// A linker exporting with `config`, its spans' error texts masked by `redact`.
    pub fn new(config: config::TracingConfig, redact: Arc<Redactor>) -> Linker {
        Linker {
            sample_ratio: config.sample_ratio,
            exporter: export::Exporter::new(config),
            redact,
        }
    }

    /// The sink of one source, under its own resource: `service_name`
    /// (default: the source's name), `[sources.trace]`, and the P95
    /// objective beyond which an event counts as slow (always kept).
    pub fn sink(
        &mut self,
        source: &str,
        service_name: Option<&str>,
        trace: &config::SourceTrace,
        slow_after: Option<std::time::Duration>,
    ) -> anyhow::Result<SpanSink> {
        let service = service_name.unwrap_or(source).to_string();
        let identity = SourceIdentity {
            source: source.to_string(),
            consumer_group: trace
                .consumer_group
                .clone()
                .unwrap_or_else(|| service.clone()),
            messaging_system: trace.messaging_system.clone(),
            service,
        };
        let (resource, tx) = self.exporter.add_source(&identity, &trace.resource)?;
        Ok(SpanSink::new(
            tx,
            resource,
            identity,
            self.sample_ratio,
            slow_after,
            self.redact.clone(),
        ))
    }

    /// The export task; it drains and flushes once more when `stop` fires.
    pub fn run(self, stop: tokio_util::sync::CancellationToken) -> impl Future<Output = ()> {
        self.exporter.run(stop)
    }
}

/// One span on its way to the exporter, with the index of its source's resource.
pub type Queued = (usize, SpanData);

/// A source's handle on the export queue, with its sampling settings.
#[derive(Debug, Clone)]
pub struct SpanSink {
    tx: mpsc::Sender<Queued>,
    resource: usize,
    /// Who the spans describe.
    pub identity: SourceIdentity,
    /// Share of successful, fast events kept.
    pub sample_ratio: f64,
    /// Processing slower than this is always kept (the source's P95 objective).
    pub slow_after: Option<Duration>,
    redact: Arc<Redactor>,
    dropped: u64,
    created: bool,
}

impl SpanSink {
    /// A sink sending to `tx` for the resource with index `resource`.
    pub fn new(
        tx: mpsc::Sender<Queued>,
        resource: usize,
        identity: SourceIdentity,
        sample_ratio: f64,
        slow_after: Option<Duration>,
        redact: Arc<Redactor>,
    ) -> SpanSink {
        SpanSink {
            tx,
            resource,
            identity,
            sample_ratio,
            slow_after,
            redact,
            dropped: 0,
            created: false,
        }
    }

    /// Whether an event's spans are kept: always when it failed, was
    /// dead-lettered or was slow; otherwise by its trace id.
    pub fn keep(&self, event_id: &str, failed: bool, processing_micros: Option<i64>) -> bool {
        let slow = match (self.slow_after, processing_micros) {
            (Some(limit), Some(p)) => p > i64::try_from(limit.as_micros()).unwrap_or(i64::MAX),
            _ => false,
        };
        failed || slow || sampled(&trace_id(event_id), self.sample_ratio)
    }

    /// Queues a span without waiting, its error text masked (the status
    /// message, from `last_error`, and `error.type`, its class); a full
    /// queue drops it.
    pub fn send(&mut self, mut span: SpanData) {
        if self.redact.is_on() {
            redact(&self.redact, &mut span);
        }
        if self.tx.try_send((self.resource, span)).is_err() {
            self.dropped += 1;
        }
    }

    /// Records the spans dropped since the last call, once per poll.
    pub fn flush(&mut self) {
        let c = metrics::counter!(metric::SPANS_DROPPED, "source" => self.identity.source.clone());
        if !self.created {
            self.created = true;
            metrics::counter!(metric::SPANS_EXPORTED, "source" => self.identity.source.clone())
                .increment(0);
        }
        c.increment(std::mem::take(&mut self.dropped));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parsing_follows_w3c() {
        let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid");
        assert_eq!(tp.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.flags, 1);
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some(),
            "a later version may carry more fields"
        );
    }

    #[test]
    fn ids_are_derived_and_the_trace_id_is_a_sha256_prefix() {
        // printf %s evt-1 | sha256sum
        assert_eq!(
            to_hex(&trace_id("evt-1")),
            "7b409f932d2c88e97f0c17676c8420d3"
        );
        // The documented recipe (docs/traces.md), computed outside Rust:
        // python3 -c 'import hashlib,struct; h=hashlib.sha256()
        //   [h.update(struct.pack(">Q",len(p))+p) for p in (b"process",b"svc",b"evt-1")]
        //   h.update(struct.pack(">I",1)); print(h.hexdigest()[:16])'
        assert_eq!(
            to_hex(&span_id("process", "svc", "evt-1", 1)),
            "df28d61ba51a43b5"
        );
        assert_ne!(
            span_id("process", "svc", "evt-1", 1),
            span_id("process", "svc", "evt-1", 2)
        );
        assert_ne!(
            span_id("process", "a", "evt-1", 1),
            span_id("process", "b", "evt-1", 1)
        );
    }

    #[test]
    fn sampling_keeps_the_configured_share() {
        let kept = (0..20_000)
            .filter(|i| sampled(&trace_id(&format!("e{i}")), 0.25))
            .count();
        assert!((4_700..=5_300).contains(&kept), "{kept}");
        assert!(sampled(&trace_id("x"), 1.0));
        assert!(!sampled(&trace_id("x"), 0.0));
    }

    /// Guards the span boundary of `[[server.redact]]`: the status message
    /// and `error.type` leave masked, the rest of the span as it was.
    #[test]
    fn sent_spans_carry_masked_error_texts() {
        let env = |_: &str| None;
        let mut v =
            crate::validation::Validator::new("", crate::validation::Environment::Process, &env);
        let rules = [crate::redact::RawRule {
            pattern: Some(r"Acme\w*".into()),
            replace: Some("[acme]".into()),
        }];
        let redact = crate::redact::validate(&mut v, &rules, &["email".to_string()]);
        assert!(v.into_problems().is_empty());
        let identity = SourceIdentity {
            source: "s".into(),
            service: "svc".into(),
            messaging_system: "kafka".into(),
            consumer_group: "g".into(),
        };
        let (tx, mut rx) = mpsc::channel(1);
        let mut sink = SpanSink::new(tx, 0, identity.clone(), 1.0, None, Arc::new(redact));
        let attempt = Attempt {
            event_id: "evt-1",
            event_type: Some("order.paid"),
            outcome: "failed",
            attempt: 1,
            attempts: Some(1),
            deliveries: Some(1),
            received: 0,
            started: Some(1_000),
            end: 2_000,
            last_error: Some("AcmeError: no answer for ann@example.com"),
            traceparent: None,
        };
        let span = consumer_span(&identity, &attempt);
        sink.send(span.clone());
        let (_, sent) = rx.try_recv().expect("the span was queued");
        assert_eq!(
            sent.status,
            Status::error("[acme]: no answer for [email]".to_string())
        );
        let class = |s: &SpanData| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "error.type")
                .map(|kv| kv.value.as_str().into_owned())
        };
        assert_eq!(class(&span).as_deref(), Some("AcmeError"));
        assert_eq!(class(&sent).as_deref(), Some("[acme]"));
        assert_eq!(sent.attributes.len(), span.attributes.len());
        assert_eq!(sent.name, span.name);
    }

    #[test]
    fn error_classes_are_bounded() {
        assert_eq!(
            error_class("TimeoutError: upstream did not answer"),
            "TimeoutError"
        );
        assert_eq!(error_class("HttpError: 503"), "HttpError");
        assert_eq!(
            error_class("  java.io.IOException (x)"),
            "java.io.IOException"
        );
        assert_eq!(error_class("503 from upstream"), "_OTHER");
        assert_eq!(error_class(""), "_OTHER");
        assert_eq!(error_class(&"A".repeat(100)), "_OTHER");
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("hi", 2), "hi");
    }
}
