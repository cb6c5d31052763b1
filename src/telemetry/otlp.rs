//! OTLP metrics push beside `/metrics`: a `metrics` recorder that forwards
//! every counter increment, gauge value and histogram observation to
//! OpenTelemetry instruments, pushed by a periodic reader on tokio.
//!
//! Names follow the OpenTelemetry form of the catalogue's names — dots, no
//! `_total`, the unit apart (`inbox_processing_duration_seconds` →
//! `inbox.processing.duration`, unit `s`) — so that a Prometheus fed through
//! OTLP (or a Collector's Prometheus exporter) names them exactly as
//! `/metrics` does, and the dashboards and alert rules work on either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;

use super::catalogue::{self, Kind};
use super::collector::Collector;

/// The OpenTelemetry name and unit of a catalogue metric.
pub fn otel_name(name: &str) -> (String, &'static str) {
    let def = catalogue::find(name);
    let mut base = name;
    if def.is_some_and(|d| d.kind == Kind::Counter) {
        base = base.strip_suffix("_total").unwrap_or(base);
    }
    let mut unit = "";
    if def.is_some_and(|d| d.unit == Some(Unit::Seconds))
        && let Some(b) = base.strip_suffix("_seconds")
    {
        base = b;
        unit = "s";
    }
    (base.replace('_', "."), unit)
}

/// A running metrics push: keep it until shutdown, then [`MetricsPush::shutdown`].
pub struct MetricsPush {
    provider: SdkMeterProvider,
}

impl MetricsPush {
    /// Builds the exporter and the periodic reader (must run inside tokio).
    pub fn start(
        c: &Collector,
        endpoint: &str,
        every: Duration,
    ) -> anyhow::Result<(MetricsPush, OtlpRecorder)> {
        let exporter = super::collector::metric_exporter(c, endpoint)?;
        let reader = PeriodicReader::builder(exporter, opentelemetry_sdk::runtime::Tokio)
            .with_interval(every)
            .with_timeout(c.timeout)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(
                Resource::builder_empty()
                    .with_service_name("inboxwatch")
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .build(),
            )
            .build();
        let meter = provider.meter("inboxwatch");
        observe_snapshots(&meter);
        Ok((
            MetricsPush { provider },
            OtlpRecorder {
                meter,
                instruments: Mutex::default(),
            },
        ))
    }

    /// Pushes once more and stops the reader.
    pub fn shutdown(self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}

/// The series sources publish as snapshots (Kafka) are read at each push by
/// observable instruments: a gauge per gauge family, a cumulative counter per
/// counter family.
fn observe_snapshots(meter: &Meter) {
    for def in catalogue::CATALOGUE {
        if !super::snapshot::is_snapshot_metric(def.name) {
            continue;
        }
        let (name, unit) = otel_name(def.name);
        let family = def.name;
        let attrs = |labels: Vec<(String, String)>| -> Vec<KeyValue> {
            labels
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v))
                .collect()
        };
        match def.kind {
            Kind::Counter => {
                meter
                    .f64_observable_counter(name)
                    .with_unit(unit)
                    .with_description(def.help)
                    .with_callback(move |o| {
                        super::snapshot::for_each(family, |l, v| o.observe(v, &attrs(l)))
                    })
                    .build();
            }
            _ => {
                meter
                    .f64_observable_gauge(name)
                    .with_unit(unit)
                    .with_description(def.help)
                    .with_callback(move |o| {
                        super::snapshot::for_each(family, |l, v| o.observe(v, &attrs(l)))
                    })
                    .build();
            }
        }
    }
}

#[derive(Clone)]
enum Instrument {
    Counter(opentelemetry::metrics::Counter<u64>),
    Gauge(opentelemetry::metrics::Gauge<f64>),
    Histogram(opentelemetry::metrics::Histogram<f64>),
}

/// The recorder half: one OpenTelemetry instrument per metric name.
pub struct OtlpRecorder {
    meter: Meter,
    instruments: Mutex<HashMap<String, Instrument>>,
}

impl OtlpRecorder {
    fn instrument(&self, name: &str, kind: Kind) -> Instrument {
        let mut map = self
            .instruments
            .lock()
            .expect("the instrument map is never poisoned");
        if let Some(i) = map.get(name) {
            return i.clone();
        }
        let (otel, unit) = otel_name(name);
        let help = catalogue::find(name).map_or("", |d| d.help);
        let i = match kind {
            Kind::Counter => Instrument::Counter(
                self.meter
                    .u64_counter(otel)
                    .with_unit(unit)
                    .with_description(help)
                    .build(),
            ),
            Kind::Gauge => Instrument::Gauge(
                self.meter
                    .f64_gauge(otel)
                    .with_unit(unit)
                    .with_description(help)
                    .build(),
            ),
            Kind::Histogram => {
                let buckets = catalogue::find(name)
                    .and_then(|d| d.buckets)
                    .unwrap_or(catalogue::LATENCY_BUCKETS);
                Instrument::Histogram(
                    self.meter
                        .f64_histogram(otel)
                        .with_unit(unit)
                        .with_description(help)
                        .with_boundaries(buckets.to_vec())
                        .build(),
                )
            }
        };
        map.insert(name.to_string(), i.clone());
        i
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|l| KeyValue::new(l.key().to_string(), l.value().to_string()))
        .collect()
}

struct OtelCounter {
    inst: opentelemetry::metrics::Counter<u64>,
    attrs: Vec<KeyValue>,
    last: AtomicU64,
}

impl CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.last.fetch_add(value, Ordering::Relaxed);
        self.inst.add(value, &self.attrs);
    }
    fn absolute(&self, value: u64) {
        let prev = self.last.fetch_max(value, Ordering::Relaxed);
        if value > prev {
            self.inst.add(value - prev, &self.attrs);
        }
    }
}

struct OtelGauge {
    inst: opentelemetry::metrics::Gauge<f64>,
    attrs: Vec<KeyValue>,
    bits: AtomicU64,
}

impl OtelGauge {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let mut cur = self.bits.load(Ordering::Relaxed);
        loop {
            let next = f(f64::from_bits(cur));
            match self.bits.compare_exchange_weak(
                cur,
                next.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.inst.record(next, &self.attrs);
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

impl GaugeFn for OtelGauge {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

struct OtelHistogram {
    inst: opentelemetry::metrics::Histogram<f64>,
    attrs: Vec<KeyValue>,
}

impl HistogramFn for OtelHistogram {
    fn record(&self, value: f64) {
        self.inst.record(value, &self.attrs);
    }
}

/// Handles by (name, labels): the `metrics` macros register on every call,
/// and a counter's `absolute` needs the value it had.
type Handles<T> = Mutex<HashMap<Key, Arc<T>>>;

/// The recorder installed beside the Prometheus one.
pub struct Bridge {
    otlp: OtlpRecorder,
    counters: Handles<OtelCounter>,
    gauges: Handles<OtelGauge>,
}

impl Bridge {
    /// Wraps the OTLP recorder.
    pub fn new(otlp: OtlpRecorder) -> Bridge {
        Bridge {
            otlp,
            counters: Mutex::default(),
            gauges: Mutex::default(),
        }
    }
}

impl Recorder for Bridge {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut map = self
            .counters
            .lock()
            .expect("the counter map is never poisoned");
        let h = map
            .entry(key.clone())
            .or_insert_with(|| {
                let Instrument::Counter(inst) = self.otlp.instrument(key.name(), Kind::Counter)
                else {
                    unreachable!("a counter name registers a counter")
                };
                Arc::new(OtelCounter {
                    inst,
                    attrs: attributes(key),
                    last: AtomicU64::new(0),
                })
            })
            .clone();
        Counter::from_arc(h)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut map = self.gauges.lock().expect("the gauge map is never poisoned");
        let h = map
            .entry(key.clone())
            .or_insert_with(|| {
                let Instrument::Gauge(inst) = self.otlp.instrument(key.name(), Kind::Gauge) else {
                    unreachable!("a gauge name registers a gauge")
                };
                Arc::new(OtelGauge {
                    inst,
                    attrs: attributes(key),
                    bits: AtomicU64::new(0f64.to_bits()),
                })
            })
            .clone();
        Gauge::from_arc(h)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let Instrument::Histogram(inst) = self.otlp.instrument(key.name(), Kind::Histogram) else {
            unreachable!("a histogram name registers a histogram")
        };
        Histogram::from_arc(Arc::new(OtelHistogram {
            inst,
            attrs: attributes(key),
        }))
    }
}

/// Builds the push when the collector has a metrics endpoint
/// (`[tracing] export_metrics`), pushing every `interval`.
pub fn start(c: &Collector, interval: Duration) -> anyhow::Result<Option<(MetricsPush, Bridge)>> {
    let Some(endpoint) = &c.metrics_endpoint else {
        return Ok(None);
    };
    let (push, rec) =
        MetricsPush::start(c, endpoint, interval).context("building the OTLP metrics exporter")?;
    Ok(Some((push, Bridge::new(rec))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otel_names_map_back_to_the_prometheus_names() {
        assert_eq!(
            otel_name("inbox_messages_received_total"),
            ("inbox.messages.received".to_string(), "")
        );
        assert_eq!(
            otel_name("inbox_processing_duration_seconds"),
            ("inbox.processing.duration".to_string(), "s")
        );
        assert_eq!(
            otel_name("inboxwatch_source_up"),
            ("inboxwatch.source.up".to_string(), "")
        );
    }
}
