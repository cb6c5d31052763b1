//! The values `/metrics` renders, readable in memory: a recorder layer,
//! installed in front of the Prometheus recorder (and the OTLP bridge), that
//! forwards every update and keeps, by series, each counter's and gauge's
//! value and the bucket counts of each histogram the catalogue gives buckets.
//! The status page reads them through a [`Reading`] of one source (which
//! also reads its snapshot), instead of parsing the text `/metrics` renders.
//!
//! Sources call `metrics::counter!` and friends on every poll: the same
//! series gets the same handle, so the layer holds one entry per series, as
//! the Prometheus recorder does, and like it never forgets one (the
//! recorder has no idle timeout; were one set, a handle kept here would go
//! on updating a series the recorder had dropped, so this layer would have
//! to forget it too). A card reads only its source's series: they are kept
//! by source as well.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use metrics::atomics::AtomicU64;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

use super::catalogue;
use super::snapshot;

/// The values of every series recorded through [`Values::layer`]; cheap to
/// clone (one shared store).
#[derive(Debug, Clone, Default)]
pub struct Values {
    store: Arc<Store>,
}

#[derive(Debug, Default)]
struct Store {
    counters: RwLock<Series<KeptCounter>>,
    gauges: RwLock<Series<KeptGauge>>,
    histograms: RwLock<Series<KeptHistogram>>,
}

/// The kept handles of one type: by series, to hand the same one out again,
/// and by source (the `source` label; "" for the agent's own series), so
/// that a card reads its source's series without visiting the others'.
#[derive(Debug)]
struct Series<T> {
    by_key: HashMap<Key, Arc<T>>,
    by_source: HashMap<String, Vec<(Key, Arc<T>)>>,
}

impl<T> Default for Series<T> {
    fn default() -> Series<T> {
        Series {
            by_key: HashMap::new(),
            by_source: HashMap::new(),
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the map itself stays valid.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// The entry of `key`, made by `make` the first time. `make` (the inner
/// recorder's registration) runs outside the lock; two first registrations
/// of one series at once keep the first (the inner recorder hands both the
/// same series).
fn kept<T>(lock: &RwLock<Series<T>>, key: &Key, make: impl FnOnce() -> T) -> Arc<T> {
    if let Some(h) = read(lock).by_key.get(key) {
        return h.clone();
    }
    let made = Arc::new(make());
    let mut series = write(lock);
    if let Some(h) = series.by_key.get(key) {
        return h.clone();
    }
    series.by_key.insert(key.clone(), made.clone());
    let source = key
        .labels()
        .find(|l| l.key() == "source")
        .map_or_else(String::new, |l| l.value().to_string());
    series
        .by_source
        .entry(source)
        .or_default()
        .push((key.clone(), made.clone()));
    made
}

impl Values {
    /// `inner` with this store in front of it: the recorder to install.
    pub fn layer<R: Recorder>(&self, inner: R) -> Layer<R> {
        Layer {
            inner,
            values: self.clone(),
        }
    }

    /// What `source` recorded (its `source` label) and published (its
    /// snapshot).
    pub fn reading<'a>(&'a self, source: &'a str) -> Reading<'a> {
        Reading {
            values: Some(self),
            source,
        }
    }
}

/// A recorder that keeps the values of what it forwards to `R`.
pub struct Layer<R> {
    inner: R,
    values: Values,
}

impl<R: Recorder> Recorder for Layer<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        Counter::from_arc(kept(&self.values.store.counters, key, || KeptCounter {
            inner: self.inner.register_counter(key, metadata),
            value: AtomicU64::new(0),
        }))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(kept(&self.values.store.gauges, key, || KeptGauge {
            inner: self.inner.register_gauge(key, metadata),
            value: AtomicU64::new(0.0_f64.to_bits()),
        }))
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let Some(bounds) = catalogue::find(key.name()).and_then(|m| m.buckets) else {
            return self.inner.register_histogram(key, metadata);
        };
        Histogram::from_arc(kept(&self.values.store.histograms, key, || KeptHistogram {
            inner: self.inner.register_histogram(key, metadata),
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
        }))
    }
}

/// A counter handed on to the inner recorder, and its total.
#[derive(Debug)]
struct KeptCounter {
    inner: Counter,
    value: AtomicU64,
}

impl CounterFn for KeptCounter {
    fn increment(&self, value: u64) {
        self.inner.increment(value);
        CounterFn::increment(&self.value, value);
    }

    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
        CounterFn::absolute(&self.value, value);
    }
}

/// A gauge handed on to the inner recorder, and its value (as `f64` bits).
#[derive(Debug)]
struct KeptGauge {
    inner: Gauge,
    value: AtomicU64,
}

impl GaugeFn for KeptGauge {
    fn increment(&self, value: f64) {
        self.inner.increment(value);
        GaugeFn::increment(&self.value, value);
    }

    fn decrement(&self, value: f64) {
        self.inner.decrement(value);
        GaugeFn::decrement(&self.value, value);
    }

    fn set(&self, value: f64) {
        self.inner.set(value);
        GaugeFn::set(&self.value, value);
    }
}

/// A histogram handed on to the inner recorder, and how many observations
/// fell in each of its catalogue buckets (not cumulative; the last: above
/// every bound, or NaN).
#[derive(Debug)]
struct KeptHistogram {
    inner: Histogram,
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
}

impl KeptHistogram {
    fn bucket(&self, value: f64) -> &AtomicU64 {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        &self.counts[i]
    }
}

impl HistogramFn for KeptHistogram {
    fn record(&self, value: f64) {
        self.inner.record(value);
        CounterFn::increment(self.bucket(value), 1);
    }

    fn record_many(&self, value: f64, count: usize) {
        self.inner.record_many(value, count);
        CounterFn::increment(self.bucket(value), count as u64);
    }
}

/// Whether `key` is a series of `name` with every label of `labels`.
fn matches(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels
            .iter()
            .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

/// What one source recorded and published, as its status card reads it.
/// Every series read is the source's (`source` label); a reading of a
/// source this agent does not export ([`Reading::nothing`]) finds none.
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    values: Option<&'a Values>,
    source: &'a str,
}

impl<'a> Reading<'a> {
    /// A reading that finds nothing: what `/metrics` shows of a source
    /// another agent owns, or one out of this agent's reach.
    pub fn nothing(source: &'a str) -> Reading<'a> {
        Reading {
            values: None,
            source,
        }
    }

    /// The source's name.
    pub fn source(&self) -> &'a str {
        self.source
    }

    /// Calls `f` with each counter and gauge series of `name` with `labels`
    /// (and the source's), and its value.
    fn each(&self, name: &str, labels: &[(&str, &str)], mut f: impl FnMut(&Key, f64)) {
        let Some(values) = self.values else {
            return;
        };
        if let Some(series) = read(&values.store.counters).by_source.get(self.source) {
            for (key, c) in series {
                if matches(key, name, labels) {
                    f(key, c.value.load(Ordering::Acquire) as f64);
                }
            }
        }
        if let Some(series) = read(&values.store.gauges).by_source.get(self.source) {
            for (key, g) in series {
                if matches(key, name, labels) {
                    f(key, f64::from_bits(g.value.load(Ordering::Acquire)));
                }
            }
        }
    }

    /// The sum of the series of `name` with `labels`; `None` when there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut sum = None;
        self.each(name, labels, |_, v| *sum.get_or_insert(0.0) += v);
        sum
    }

    /// The largest of the series of `name` with `labels`, NaN left out;
    /// `None` when there is none.
    pub fn max(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut max: Option<f64> = None;
        self.each(name, labels, |_, v| {
            if !v.is_nan() {
                max = Some(max.map_or(v, |m| m.max(v)));
            }
        });
        max
    }

    /// The series of `name` with `labels` summed by the value of their
    /// label `by` (series without it left out).
    pub fn sum_by(&self, name: &str, by: &str, labels: &[(&str, &str)]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        self.each(name, labels, |key, v| {
            if let Some(l) = key.labels().find(|l| l.key() == by) {
                *out.entry(l.value().to_string()).or_default() += v;
            }
        });
        out
    }

    /// The observations of histogram `name` with `labels`, summed over its
    /// series, by bucket: (upper bound, count in that bucket alone), the
    /// last bound infinite; empty when there is no series.
    pub fn buckets(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, u64)> {
        let Some(values) = self.values else {
            return Vec::new();
        };
        let mut out: Vec<(f64, u64)> = Vec::new();
        let histograms = read(&values.store.histograms);
        for (key, h) in histograms.by_source.get(self.source).into_iter().flatten() {
            if !matches(key, name, labels) {
                continue;
            }
            if out.is_empty() {
                out = h
                    .bounds
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .map(|b| (b, 0))
                    .collect();
            }
            for (slot, count) in out.iter_mut().zip(h.counts.iter()) {
                slot.1 += count.load(Ordering::Acquire);
            }
        }
        out
    }

    /// What the source last published beside its snapshot
    /// ([`snapshot::Builder::keep`]), if it is a `T`.
    pub fn kept<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.values?;
        snapshot::kept::<T>(self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::catalogue::{self as metric, catalogue_recorder};

    /// Guards the layer: what it keeps of each series is what the
    /// Prometheus recorder behind it renders, and a series registered again
    /// (every poll) is the same series.
    #[test]
    fn the_kept_values_are_what_the_recorder_behind_renders() {
        let prometheus = catalogue_recorder();
        let rendered = prometheus.handle();
        let values = Values::default();
        let layer = values.layer(prometheus);
        metrics::with_local_recorder(&layer, || {
            for _ in 0..3 {
                metrics::counter!(metric::INBOX_DELIVERIES, "source" => "s", "event_type" => "a")
                    .increment(2);
            }
            metrics::counter!(metric::INBOX_DELIVERIES, "source" => "s", "event_type" => "b")
                .increment(1);
            metrics::counter!(metric::INBOX_DELIVERIES, "source" => "other", "event_type" => "a")
                .increment(7);
            let g = metrics::gauge!(metric::INBOX_BACKLOG, "source" => "s", "event_type" => "a", "status" => "pending");
            g.set(5.0);
            g.decrement(1.5);
            metrics::gauge!(metric::INBOX_BACKLOG, "source" => "s", "event_type" => "b", "status" => "failed")
                .set(2.0);
            metrics::gauge!(metric::INBOX_DURATION_QUANTILE, "source" => "s", "event_type" => "a", "quantile" => "0.95")
                .set(f64::NAN);
            metrics::gauge!(metric::INBOX_DURATION_QUANTILE, "source" => "s", "event_type" => "b", "quantile" => "0.95")
                .set(0.25);
            for attempts in [1.0, 1.0, 2.0, 7.0, 30.0] {
                metrics::histogram!(metric::INBOX_ATTEMPTS, "source" => "s", "event_type" => "a")
                    .record(attempts);
            }
            metrics::histogram!(metric::INBOX_ATTEMPTS, "source" => "s", "event_type" => "b")
                .record(3.0);
        });
        let s = values.reading("s");
        assert_eq!(s.sum(metric::INBOX_DELIVERIES, &[]), Some(7.0));
        assert_eq!(
            s.sum(metric::INBOX_DELIVERIES, &[("event_type", "a")]),
            Some(6.0)
        );
        assert_eq!(s.sum(metric::INBOX_STUCK, &[]), None);
        assert_eq!(
            s.sum_by(metric::INBOX_BACKLOG, "status", &[]),
            BTreeMap::from([("failed".to_string(), 2.0), ("pending".to_string(), 3.5)])
        );
        assert_eq!(
            s.max(metric::INBOX_DURATION_QUANTILE, &[("quantile", "0.95")]),
            Some(0.25)
        );
        let buckets = s.buckets(metric::INBOX_ATTEMPTS, &[]);
        let non_empty: Vec<(f64, u64)> = buckets.iter().copied().filter(|b| b.1 > 0).collect();
        assert_eq!(
            non_empty,
            vec![(1.0, 2), (2.0, 1), (3.0, 1), (8.0, 1), (f64::INFINITY, 1)]
        );
        assert_eq!(buckets.len(), metric::ATTEMPT_BUCKETS.len() + 1);
        // The same numbers in the text the recorder behind renders.
        let text = rendered.render();
        for line in [
            "inbox_deliveries_total{source=\"s\",event_type=\"a\"} 6",
            "inbox_backlog_messages{source=\"s\",event_type=\"a\",status=\"pending\"} 3.5",
            "inbox_delivery_attempts_bucket{source=\"s\",event_type=\"a\",le=\"8\"} 4",
            "inbox_delivery_attempts_bucket{source=\"s\",event_type=\"a\",le=\"+Inf\"} 5",
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        assert_eq!(
            Reading::nothing("s").sum(metric::INBOX_DELIVERIES, &[]),
            None
        );
        assert_eq!(read(&values.store.counters).by_key.len(), 3);
        // Each series is kept once by source too: a series registered again
        // is not listed again.
        let by_source: usize = read(&values.store.counters)
            .by_source
            .values()
            .map(Vec::len)
            .sum();
        assert_eq!(by_source, 3);
    }
}
