//! The agent's own poll cycles as spans (`[tracing] agent_spans = true`):
//! the `tracing` spans of the `inboxwatch` crate go through
//! `tracing-opentelemetry` to the same OTLP endpoint, under
//! `service.name = inboxwatch`.
//!
//! The subscriber is set up before the config is read, so it carries an
//! [`AgentSpans`] layer that forwards to the OpenTelemetry layer once
//! [`enable`] has installed it, and only for the crate's own spans: spans of
//! the libraries below (drivers, HTTP) never reach the trace backend.

use std::any::TypeId;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::collector::{Collector, span_exporter};

type Installer = Box<dyn Fn(opentelemetry_sdk::trace::Tracer) + Send + Sync>;
type Inner<S> = Arc<OnceLock<Box<dyn Layer<S> + Send + Sync>>>;

static INSTALL: OnceLock<Installer> = OnceLock::new();

/// A layer that stays inert until [`enable`] runs.
pub struct AgentSpans<S> {
    inner: Inner<S>,
}

impl<S> AgentSpans<S>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static,
{
    /// The layer of the process's subscriber (the first one made is the one enabled).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let inner: Inner<S> = Arc::new(OnceLock::new());
        let slot = inner.clone();
        let _ = INSTALL.set(Box::new(move |tracer| {
            let layer = tracing_opentelemetry::layer::<S>()
                .with_tracer(tracer)
                .with_tracked_inactivity(false);
            let _ = slot.set(Box::new(layer));
        }));
        AgentSpans { inner }
    }
}

fn ours(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with("inboxwatch")
}

impl<S> AgentSpans<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn active(&self, meta: Option<&Metadata<'_>>) -> Option<&(dyn Layer<S> + Send + Sync)> {
        let inner = self.inner.get()?;
        meta.filter(|m| ours(m)).map(|_| inner.as_ref())
    }
}

impl<S> Layer<S> for AgentSpans<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(l) = self.active(Some(attrs.metadata())) {
            l.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(l) = self.active(ctx.metadata(id)) {
            l.on_record(id, values, ctx);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let in_ours = ctx.event_span(event).is_some_and(|s| ours(s.metadata()));
        if in_ours && let Some(l) = self.active(Some(event.metadata())) {
            l.on_event(event, ctx);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(l) = self.active(ctx.metadata(id)) {
            l.on_enter(id, ctx);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(l) = self.active(ctx.metadata(id)) {
            l.on_exit(id, ctx);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(l) = self.active(ctx.metadata(&id)) {
            l.on_close(id, ctx);
        }
    }

    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: forwarded to the inner layer, which upholds the contract.
        self.inner.get().and_then(|l| unsafe { l.downcast_raw(id) })
    }
}

/// Starts exporting the agent's spans; keep the provider until shutdown.
pub fn enable(c: &Collector) -> anyhow::Result<SdkTracerProvider> {
    let exporter =
        span_exporter(c).context("building the OTLP exporter of the agent's own spans")?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder_empty()
                .with_service_name("inboxwatch")
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build();
    if let Some(install) = INSTALL.get() {
        install(provider.tracer("inboxwatch"));
    }
    Ok(provider)
}
