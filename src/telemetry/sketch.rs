//! Relative-error quantiles for durations: a DDSketch and a sliding-window wrapper.
//!
//! A [`DdSketch`] maps each value `v` to the bin `ceil(ln v / ln gamma)` with
//! `gamma = (1 + a) / (1 - a)` and answers with the bin's representative
//! `2 * gamma^i / (gamma + 1)`, which is within relative error `a` of every value in
//! the bin. Bins live in a ring buffer of at most [`MAX_BINS`] counters; when the values
//! span more bins than that, the lowest bins are folded into one, so only the lowest
//! quantiles lose accuracy and memory stays bounded whatever the input.
//!
//! [`WindowedSketch`] keeps one sketch per time slice and merges them on read, so
//! expiring old values is clearing a slice, never subtracting.

use std::time::{Duration, Instant};

/// Most bins a sketch keeps (16 KiB of counters); past it the lowest bins are folded.
const MAX_BINS: usize = 2048;
/// Ring size on first use; it doubles as the indexed range widens, up to `MAX_BINS`.
const INITIAL_BINS: usize = 64;
/// Smallest value with a bin of its own; values in `[0, MIN_INDEXABLE)` count as zero.
const MIN_INDEXABLE: f64 = 1e-9;
/// Finest supported relative accuracy; finer ones make `gamma` indistinguishable from 1.
const MIN_RELATIVE_ACCURACY: f64 = 1e-12;

/// DDSketch over non-negative f64 values (durations in seconds). Relative accuracy alpha (e.g. 0.005).
///
/// Quantiles are within relative error alpha of the exact value at the same rank, except
/// when the values span more than 2048 bins (a factor of about `e^(4096 * alpha)`, i.e.
/// 1e-9..1e9 at alpha = 0.005): then the lowest bins are folded into one and only the
/// quantiles that land in that folded bin are over-estimated.
#[derive(Debug, Clone)]
pub struct DdSketch {
    relative_accuracy: f64,
    ln_gamma: f64,
    /// Ring buffer of counters: bin `i` lives at `i mod bins.len()`. The length is zero
    /// or a power of two no larger than `MAX_BINS`; every slot outside `range` is zero.
    bins: Vec<u64>,
    /// Lowest and highest bin index in use, `None` while no value has a bin.
    range: Option<(i64, i64)>,
    /// Set once bins were folded: the lowest bin then also holds every value below it.
    collapsed: bool,
    zero_count: u64,
    count: u64,
    min: f64,
    max: f64,
}

impl DdSketch {
    /// An empty sketch whose quantiles are within `relative_accuracy` (e.g. 0.005 for
    /// 0.5 %) of the exact ones.
    ///
    /// # Panics
    ///
    /// If `relative_accuracy` is not within `[1e-12, 1)`: it is a programming constant,
    /// and outside that range the bin mapping is meaningless.
    pub fn new(relative_accuracy: f64) -> Self {
        assert!(
            (MIN_RELATIVE_ACCURACY..1.0).contains(&relative_accuracy),
            "DdSketch relative accuracy must be within [1e-12, 1), got {relative_accuracy}"
        );
        // ln((1 + a) / (1 - a)), computed without cancellation for tiny a.
        let ln_gamma = relative_accuracy.ln_1p() - (-relative_accuracy).ln_1p();
        Self {
            relative_accuracy,
            ln_gamma,
            bins: Vec::new(),
            range: None,
            collapsed: false,
            zero_count: 0,
            count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Records one value. Negative, NaN and infinite values are ignored; 0 and values
    /// below 1e-9 are counted in a zero bin and reported as 0.
    pub fn add(&mut self, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        let value = value.abs(); // -0.0 becomes 0.0
        self.count += 1;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        if value < MIN_INDEXABLE {
            self.zero_count += 1;
        } else {
            self.add_to_bin(self.index(value), 1);
        }
    }

    /// Adds every value recorded in `other`, as if they had been added to `self`.
    /// Both sketches must have the same relative accuracy.
    pub fn merge(&mut self, other: &DdSketch) {
        debug_assert_eq!(
            self.relative_accuracy.to_bits(),
            other.relative_accuracy.to_bits(),
            "merged sketches must share their relative accuracy"
        );
        if other.count == 0 {
            return;
        }
        self.count += other.count;
        self.zero_count += other.zero_count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        if let Some((lo, hi)) = other.range {
            for index in lo..=hi {
                let n = other.bins[other.slot(index)];
                if n > 0 {
                    self.add_to_bin(index, n);
                }
            }
        }
    }

    /// Number of values recorded (ignored values excluded).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Forgets every value but keeps the allocated bins for reuse.
    pub fn clear(&mut self) {
        if let Some((lo, hi)) = self.range {
            for index in lo..=hi {
                let slot = self.slot(index);
                self.bins[slot] = 0;
            }
        }
        self.range = None;
        self.collapsed = false;
        self.zero_count = 0;
        self.count = 0;
        self.min = f64::INFINITY;
        self.max = f64::NEG_INFINITY;
    }

    /// Value at zero-based rank floor(q * (count - 1)) with relative error <= alpha. None when empty. q in [0,1].
    ///
    /// A `q` outside `[0, 1]` is clamped into it, and a NaN `q` acts as 0. Answers are
    /// also clamped to the smallest and largest value recorded.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let last = self.count - 1;
        // A NaN q survives the clamp and the float-to-int cast saturates it to rank 0.
        let rank = ((q.clamp(0.0, 1.0) * last as f64).floor() as u64).min(last);
        let answer = if rank < self.zero_count {
            0.0
        } else {
            self.bin_value_at_rank(rank)
        };
        Some(answer.max(self.min).min(self.max))
    }

    /// Representative value of the bin holding the value of `rank` (which is past the zero bin).
    fn bin_value_at_rank(&self, rank: u64) -> f64 {
        let mut seen = self.zero_count;
        if let Some((lo, hi)) = self.range {
            for index in lo..=hi {
                seen += self.bins[self.slot(index)];
                if seen > rank {
                    return self.value(index);
                }
            }
        }
        self.max // unreachable while the counts are consistent
    }

    fn index(&self, value: f64) -> i64 {
        (value.ln() / self.ln_gamma).ceil() as i64
    }

    /// `2 * gamma^i / (gamma + 1)`, which simplifies to `gamma^i * (1 - alpha)`.
    fn value(&self, index: i64) -> f64 {
        (index as f64 * self.ln_gamma).exp() * (1.0 - self.relative_accuracy)
    }

    fn slot(&self, index: i64) -> usize {
        // The length is a power of two, so masking is `rem_euclid`, negatives included.
        (index & (self.bins.len() as i64 - 1)) as usize
    }

    fn add_to_bin(&mut self, index: i64, n: u64) {
        let max = MAX_BINS as i64;
        let target = match self.range {
            None => {
                self.reserve_span(1);
                self.range = Some((index, index));
                index
            }
            Some((lo, hi)) if index < lo => {
                if self.collapsed {
                    lo
                } else if hi - index < max {
                    self.reserve_span((hi - index + 1) as usize);
                    self.range = Some((index, hi));
                    index
                } else {
                    let new_lo = hi - max + 1;
                    self.reserve_span(MAX_BINS);
                    self.range = Some((new_lo, hi));
                    self.collapsed = true;
                    new_lo
                }
            }
            Some((lo, hi)) if index > hi => {
                if index - lo < max {
                    self.reserve_span((index - lo + 1) as usize);
                    self.range = Some((lo, index));
                } else {
                    self.fold_below(index - max + 1);
                    self.range = Some((index - max + 1, index));
                }
                index
            }
            Some(_) => index,
        };
        let slot = self.slot(target);
        self.bins[slot] += n;
    }

    /// Folds every bin below `new_lo` into `new_lo`. Each bin is folded at most once and
    /// the lowest index only rises, so the cost is amortised over the values added.
    fn fold_below(&mut self, new_lo: i64) {
        self.reserve_span(MAX_BINS);
        if let Some((lo, hi)) = self.range {
            let mut folded = 0;
            for index in lo..new_lo.min(hi + 1) {
                let slot = self.slot(index);
                folded += self.bins[slot];
                self.bins[slot] = 0;
            }
            let slot = self.slot(new_lo);
            self.bins[slot] += folded;
        }
        self.collapsed = true;
    }

    /// Grows the ring so that `span` consecutive bins fit; only allocates while the
    /// indexed range widens, never in the steady state.
    fn reserve_span(&mut self, span: usize) {
        if span <= self.bins.len() {
            return;
        }
        let len = span
            .next_power_of_two()
            .max(INITIAL_BINS)
            .max(self.bins.len() * 2)
            .min(MAX_BINS);
        let mut grown = vec![0; len];
        if let Some((lo, hi)) = self.range {
            for index in lo..=hi {
                grown[(index & (len as i64 - 1)) as usize] = self.bins[self.slot(index)];
            }
        }
        self.bins = grown;
    }
}

/// Sliding window of `slices` sub-sketches covering `window`; quantiles are over values added in the last `window` (granularity window/slices).
///
/// A value added at `t` counts until `t + window` at the latest and never less than
/// `window - window/slices`: slices are aligned on the first instant the sketch sees.
#[derive(Debug, Clone)]
pub struct WindowedSketch {
    slices: Vec<DdSketch>,
    slice_nanos: u128,
    origin: Option<Instant>,
    /// Slice number (since `origin`) of the newest slice.
    current: u64,
    /// Scratch sketch for merging the slices on read, kept to reuse its bins.
    merged: DdSketch,
}

impl WindowedSketch {
    /// An empty window of length `window` cut into `slices` slices (0 is taken as 1),
    /// each a [`DdSketch`] with `relative_accuracy`.
    ///
    /// # Panics
    ///
    /// If `relative_accuracy` is not within `[1e-12, 1)`, as [`DdSketch::new`].
    pub fn new(window: Duration, slices: u32, relative_accuracy: f64) -> Self {
        let slices = slices.max(1);
        Self {
            slices: vec![DdSketch::new(relative_accuracy); slices as usize],
            slice_nanos: (window.as_nanos() / u128::from(slices)).max(1),
            origin: None,
            current: 0,
            merged: DdSketch::new(relative_accuracy),
        }
    }

    /// Records `value` as observed at `now`. Values are ignored as in [`DdSketch::add`],
    /// and so are those whose `now` is already outside the window.
    pub fn add(&mut self, now: Instant, value: f64) {
        let slice = self.advance(now);
        let n = self.slices.len() as u64;
        if self.current - slice < n {
            self.slices[(slice % n) as usize].add(value);
        }
    }

    /// Quantiles for each q over the current window; None when the window holds no values.
    pub fn quantiles(&mut self, now: Instant, qs: &[f64]) -> Option<Vec<f64>> {
        self.advance(now);
        self.merged.clear();
        for slice in &self.slices {
            self.merged.merge(slice);
        }
        qs.iter().map(|&q| self.merged.quantile(q)).collect()
    }

    /// Number of values in the window at `now`.
    pub fn count(&mut self, now: Instant) -> u64 {
        self.advance(now);
        self.slices.iter().map(DdSketch::count).sum()
    }

    /// Moves the window to `now`, clearing the slices that left it, and returns the slice
    /// number of `now`. Instants older than the newest slice do not move it back.
    fn advance(&mut self, now: Instant) -> u64 {
        let origin = *self.origin.get_or_insert(now);
        let elapsed = now.saturating_duration_since(origin).as_nanos() / self.slice_nanos;
        let slice = u64::try_from(elapsed).unwrap_or(u64::MAX);
        if slice > self.current {
            let n = self.slices.len() as u64;
            // At most one pass over the ring, however long the gap.
            let stale = (slice - self.current).min(n);
            for expired in slice - stale + 1..=slice {
                self.slices[(expired % n) as usize].clear();
            }
            self.current = slice;
        }
        slice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALPHA: f64 = 0.005;
    const QS: [f64; 7] = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
    /// Slack for float rounding: a value on a bin boundary is exactly alpha away from
    /// the representative, and `ln`/`exp` may tip that by an ulp or two.
    const ROUNDING: f64 = 1e-12;

    /// SplitMix64: small, deterministic, and good enough to drive the distributions.
    struct SplitMix64(u64);

    impl SplitMix64 {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in `[0, 1)`.
        fn unit(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Standard normal (Box-Muller).
        fn normal(&mut self) -> f64 {
            let u1 = 1.0 - self.unit(); // (0, 1], so ln is finite
            let u2 = self.unit();
            (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
    }

    fn uniform(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..n)
            .map(|_| 0.001 + rng.unit() * (60.0 - 0.001))
            .collect()
    }

    fn exponential(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..n)
            .map(|_| (-(1.0 - rng.unit()).ln() * 0.5).clamp(0.001, 60.0))
            .collect()
    }

    fn lognormal(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..n)
            .map(|_| (0.2f64.ln() + 1.5 * rng.normal()).exp().clamp(0.001, 60.0))
            .collect()
    }

    /// Log-uniform over 1e-9..1e9: about 4150 bins at alpha = 0.005, twice the cap.
    fn wide(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        let (lo, hi) = (1e-9f64.ln(), 1e9f64.ln());
        (0..n)
            .map(|_| (lo + rng.unit() * (hi - lo)).exp())
            .collect()
    }

    fn sketch_of(alpha: f64, values: &[f64]) -> DdSketch {
        let mut sketch = DdSketch::new(alpha);
        for &v in values {
            sketch.add(v);
        }
        sketch
    }

    fn sorted(values: &[f64]) -> Vec<f64> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted
    }

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    fn relative_error(got: f64, exact: f64) -> f64 {
        (got - exact).abs() / exact
    }

    fn assert_accurate(label: &str, alpha: f64, sketch: &DdSketch, values: &[f64]) {
        let sorted = sorted(values);
        assert_eq!(sketch.count(), values.len() as u64, "{label}: count");
        for q in QS {
            let exact = exact(&sorted, q);
            let got = sketch.quantile(q).expect("sketch is not empty");
            let err = relative_error(got, exact);
            assert!(
                err <= alpha + ROUNDING,
                "{label} alpha={alpha} q={q}: exact {exact}, sketch {got}, error {err}"
            );
        }
    }

    fn span(sketch: &DdSketch) -> usize {
        sketch.range.map_or(0, |(lo, hi)| (hi - lo + 1) as usize)
    }

    #[test]
    fn quantiles_are_within_relative_accuracy_of_exact_ranks() {
        let cases: [(&str, Vec<f64>); 4] = [
            ("uniform", uniform(100_000, 1)),
            ("exponential", exponential(50_000, 2)),
            ("lognormal", lognormal(100_000, 3)),
            ("constant", vec![0.25; 10_000]),
        ];
        for alpha in [0.005, 0.01, 0.02] {
            for (label, values) in &cases {
                assert_accurate(label, alpha, &sketch_of(alpha, values), values);
            }
        }
    }

    #[test]
    fn bin_boundaries_are_within_relative_accuracy() {
        // Exact powers of gamma sit on bin edges, where the error is alpha itself.
        let gamma: f64 = (1.0 + ALPHA) / (1.0 - ALPHA);
        let values: Vec<f64> = (-1200..800).map(|i| gamma.powi(i)).collect();
        assert_accurate(
            "powers of gamma",
            ALPHA,
            &sketch_of(ALPHA, &values),
            &values,
        );
    }

    #[test]
    fn merging_two_halves_equals_the_sketch_of_the_whole() {
        for (label, values) in [
            ("lognormal", lognormal(60_000, 4)),
            ("wide", wide(60_000, 5)),
        ] {
            let whole = sketch_of(ALPHA, &values);
            let (first, second) = values.split_at(values.len() / 3);
            let mut merged = sketch_of(ALPHA, first);
            merged.merge(&sketch_of(ALPHA, second));
            assert_eq!(merged.count(), whole.count(), "{label}: count");
            for i in 0..=1000 {
                let q = f64::from(i) / 1000.0;
                assert_eq!(merged.quantile(q), whole.quantile(q), "{label}: q={q}");
            }
            let mut into_empty = DdSketch::new(ALPHA);
            into_empty.merge(&whole);
            for q in QS {
                assert_eq!(into_empty.quantile(q), whole.quantile(q), "{label}: q={q}");
            }
        }
    }

    #[test]
    fn empty_sketch_has_no_quantiles() {
        let mut sketch = DdSketch::new(ALPHA);
        assert_eq!(sketch.count(), 0);
        assert_eq!(sketch.quantile(0.5), None);
        sketch.merge(&DdSketch::new(ALPHA));
        assert_eq!(sketch.quantile(0.0), None);
        sketch.add(1.0);
        sketch.clear();
        assert_eq!(sketch.count(), 0);
        assert_eq!(sketch.quantile(1.0), None);
    }

    #[test]
    fn nan_negative_and_infinite_values_are_ignored() {
        let values = uniform(10_000, 6);
        let mut sketch = DdSketch::new(ALPHA);
        for bad in [f64::NAN, -1.0, -1e-12, f64::NEG_INFINITY, f64::INFINITY] {
            sketch.add(bad);
        }
        assert_eq!(sketch.count(), 0);
        assert_eq!(sketch.quantile(0.5), None);
        for &v in &values {
            sketch.add(v);
            sketch.add(-v);
            sketch.add(f64::NAN);
        }
        assert_accurate("uniform with junk", ALPHA, &sketch, &values);
    }

    #[test]
    fn zero_and_tiny_values_go_to_the_zero_bin() {
        let mut sketch = DdSketch::new(ALPHA);
        for v in [0.0, -0.0, 1e-12, 5e-10] {
            sketch.add(v);
        }
        sketch.add(2.0);
        assert_eq!(sketch.count(), 5);
        assert_eq!(sketch.zero_count, 4);
        assert_eq!(sketch.quantile(0.0), Some(0.0));
        assert_eq!(sketch.quantile(0.75), Some(0.0));
        let max = sketch.quantile(1.0).expect("not empty");
        assert!(relative_error(max, 2.0) <= ALPHA, "max {max}");
        assert_eq!(span(&sketch), 1);
    }

    #[test]
    fn out_of_range_q_is_clamped() {
        let sketch = sketch_of(ALPHA, &uniform(1_000, 7));
        assert_eq!(sketch.quantile(-1.0), sketch.quantile(0.0));
        assert_eq!(sketch.quantile(f64::NAN), sketch.quantile(0.0));
        assert_eq!(sketch.quantile(2.0), sketch.quantile(1.0));
    }

    #[test]
    fn bin_cap_folds_only_the_lowest_bins() {
        let values = wide(100_000, 8);
        let sketch = sketch_of(ALPHA, &values);
        assert!(
            sketch.collapsed,
            "1e-9..1e9 must exceed the cap at alpha {ALPHA}"
        );
        assert_eq!(sketch.bins.len(), MAX_BINS);
        assert_eq!(span(&sketch), MAX_BINS);
        assert_eq!(sketch.count(), values.len() as u64);

        // Values above the folded bin keep full accuracy; those in it are over-estimated.
        let (lo, _) = sketch.range.expect("not empty");
        let folded_edge = (lo as f64 * sketch.ln_gamma).exp();
        let sorted = sorted(&values);
        let mut precise = 0;
        for i in 0..=1000 {
            let q = f64::from(i) / 1000.0;
            let exact = exact(&sorted, q);
            let got = sketch.quantile(q).expect("not empty");
            if exact > folded_edge {
                precise += 1;
                assert!(
                    relative_error(got, exact) <= ALPHA + ROUNDING,
                    "q={q}: {exact} vs {got}"
                );
            } else {
                assert!(got >= exact * (1.0 - ALPHA), "q={q}: {exact} vs {got}");
                assert!(got <= folded_edge, "q={q}: {got} above the folded bin");
            }
        }
        assert!(
            precise > 400,
            "only {precise} of 1001 quantiles above the folded bin"
        );
        for q in [0.9, 0.95, 0.99, 0.999] {
            let err = relative_error(sketch.quantile(q).expect("not empty"), exact(&sorted, q));
            assert!(err <= ALPHA + ROUNDING, "q={q}: error {err}");
        }
    }

    #[test]
    fn memory_is_bounded_for_adversarial_input() {
        let mut sketch = DdSketch::new(ALPHA);
        let mut n = 0;
        let mut check = |sketch: &mut DdSketch, v: f64| {
            sketch.add(v);
            n += 1;
            assert!(sketch.bins.len() <= MAX_BINS && span(sketch) <= MAX_BINS);
            assert_eq!(sketch.count(), n);
        };
        // Descending, ascending across every finite magnitude, then alternating extremes.
        for e in (-9..=308).rev() {
            check(&mut sketch, 10f64.powi(e));
        }
        let mut v: f64 = 1e-9;
        while v.is_finite() {
            check(&mut sketch, v);
            v *= 1.0 + ALPHA;
        }
        for i in 0..10_000 {
            check(&mut sketch, if i % 2 == 0 { 1e-9 } else { f64::MAX });
        }
        assert_eq!(sketch.quantile(1.0), Some(f64::MAX));
        let p99 = sketch.quantile(0.99).expect("not empty");
        assert!(
            relative_error(p99, f64::MAX) <= ALPHA + ROUNDING,
            "p99 {p99}"
        );
    }

    #[test]
    fn steady_state_adds_do_not_reallocate() {
        let mut sketch = sketch_of(ALPHA, &lognormal(10_000, 9));
        let (ptr, len) = (sketch.bins.as_ptr(), sketch.bins.len());
        for v in lognormal(100_000, 10) {
            sketch.add(v);
        }
        sketch.clear();
        for v in lognormal(10_000, 11) {
            sketch.add(v);
        }
        assert_eq!((sketch.bins.as_ptr(), sketch.bins.len()), (ptr, len));
    }

    #[test]
    fn cleared_sketch_is_reusable() {
        let mut sketch = sketch_of(ALPHA, &wide(10_000, 12));
        sketch.clear();
        assert!(sketch.bins.iter().all(|&c| c == 0));
        let values = exponential(20_000, 13);
        for &v in &values {
            sketch.add(v);
        }
        assert!(!sketch.collapsed);
        assert_accurate("exponential after clear", ALPHA, &sketch, &values);
    }

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn empty_window_has_no_quantiles() {
        let start = Instant::now();
        let mut window = WindowedSketch::new(Duration::from_secs(60), 6, ALPHA);
        assert_eq!(window.count(start), 0);
        assert_eq!(window.quantiles(start, &[0.5]), None);
        window.add(start, f64::NAN);
        assert_eq!(window.quantiles(start, &[0.5]), None);
    }

    #[test]
    fn values_older_than_the_window_no_longer_count() {
        let start = Instant::now();
        let mut window = WindowedSketch::new(Duration::from_secs(60), 6, ALPHA);
        window.add(start, 1.0);
        window.add(start + Duration::from_secs(30), 3.0);
        assert_eq!(window.count(start + Duration::from_secs(50)), 2);
        assert_eq!(
            window.quantiles(start + Duration::from_secs(59), &[0.0]),
            Some(vec![1.0])
        );
        // At t = 60 s the value of t = 0 has aged a full window; the one of 30 s has not.
        assert_eq!(window.count(start + Duration::from_secs(60)), 1);
        assert_eq!(
            window.quantiles(start + Duration::from_secs(60), &[0.0]),
            Some(vec![3.0])
        );
        assert_eq!(window.count(start + Duration::from_secs(90)), 0);
        assert_eq!(
            window.quantiles(start + Duration::from_secs(90), &[0.5]),
            None
        );
    }

    #[test]
    fn window_counts_each_value_exactly_once() {
        let start = Instant::now();
        let mut window = WindowedSketch::new(Duration::from_secs(10), 10, ALPHA);
        for k in 0..1_000u64 {
            let now = start + Duration::from_secs(k);
            window.add(now, k as f64 + 1.0);
            assert_eq!(window.count(now), (k + 1).min(10), "t={k}s");
        }
    }

    #[test]
    fn windowed_quantiles_match_the_values_in_the_window() {
        let start = Instant::now();
        let (window_ms, slice_ms) = (60_000u64, 5_000u64);
        let mut window = WindowedSketch::new(Duration::from_millis(window_ms), 12, ALPHA);
        let mut rng = SplitMix64(14);
        let mut added: Vec<(u64, f64)> = Vec::new();
        let mut t = 0u64;
        while t < 600_000 {
            let v = (0.2f64.ln() + 1.5 * rng.normal()).exp().clamp(0.001, 60.0);
            window.add(at(start, t), v);
            added.push((t, v));
            t += 1 + rng.next_u64() % 40;
            if !added.len().is_multiple_of(997) {
                continue;
            }
            // Ground truth: the values of the 12 newest 5-second slices.
            let oldest_slice = (t / slice_ms).saturating_sub(11);
            let expected: Vec<f64> = added
                .iter()
                .filter(|&&(at, _)| at / slice_ms >= oldest_slice)
                .map(|&(_, v)| v)
                .collect();
            // That is the documented contract: nothing a full window old, everything
            // younger than one slice less than the window.
            let age = |at: u64| t - at;
            assert!(
                added
                    .iter()
                    .filter(|&&(a, _)| age(a) >= window_ms)
                    .all(|&(a, _)| a / slice_ms < oldest_slice)
            );
            assert!(
                added
                    .iter()
                    .filter(|&&(a, _)| age(a) < window_ms - slice_ms)
                    .all(|&(a, _)| a / slice_ms >= oldest_slice)
            );

            assert_eq!(window.count(at(start, t)), expected.len() as u64, "t={t}ms");
            let got = window
                .quantiles(at(start, t), &QS)
                .expect("window not empty");
            let sorted = sorted(&expected);
            for (&q, &got) in QS.iter().zip(&got) {
                let exact = exact(&sorted, q);
                let err = relative_error(got, exact);
                assert!(
                    err <= ALPHA + ROUNDING,
                    "t={t}ms q={q}: exact {exact}, got {got}"
                );
            }
        }
    }

    #[test]
    fn long_gaps_rotate_in_one_pass() {
        let start = Instant::now();
        let mut window = WindowedSketch::new(Duration::from_millis(1), 1_000, ALPHA);
        window.add(start, 1.0);
        // 1e9 s is 1e15 slices of 1 µs: a per-slice loop would never finish.
        let later = start + Duration::from_secs(1_000_000_000);
        assert_eq!(window.count(later), 0);
        window.add(later, 2.0);
        assert_eq!(window.quantiles(later, &[0.5]), Some(vec![2.0]));
    }

    #[test]
    fn late_adds_land_in_their_slice_or_are_dropped() {
        let start = Instant::now();
        let mut window = WindowedSketch::new(Duration::from_secs(60), 6, ALPHA);
        window.add(start, 1.0);
        let now = start + Duration::from_secs(100);
        assert_eq!(window.count(now), 0);
        window.add(start + Duration::from_secs(95), 2.0); // late, but inside the window
        window.add(start + Duration::from_secs(40), 3.0); // exactly a full window old
        window.add(start + Duration::from_secs(10), 3.0); // long gone
        if let Some(before) = start.checked_sub(Duration::from_secs(10)) {
            window.add(before, 4.0); // before the origin: slice 0, gone
        }
        assert_eq!(window.count(now), 1);
        assert_eq!(window.quantiles(now, &[0.0, 1.0]), Some(vec![2.0, 2.0]));
        // An older `now` does not move the window back.
        assert_eq!(window.count(start), 1);
    }

    #[test]
    fn degenerate_windows_do_not_panic() {
        let start = Instant::now();
        let mut zero_slices = WindowedSketch::new(Duration::from_secs(60), 0, ALPHA);
        zero_slices.add(start, 1.0);
        assert_eq!(zero_slices.count(start + Duration::from_secs(59)), 1);
        assert_eq!(zero_slices.count(start + Duration::from_secs(60)), 0);
        let mut zero_window = WindowedSketch::new(Duration::ZERO, 4, ALPHA);
        zero_window.add(start, 1.0);
        assert_eq!(zero_window.count(start), 1);
        assert_eq!(zero_window.count(start + Duration::from_millis(1)), 0);
    }
}
