//! Comparing a scrape with expected values, series by series, and printing the diff.

use super::{Metrics, label_matches, series_name};

/// How close the exported value has to be.
#[derive(Clone, Copy, Debug)]
pub enum Tol {
    Exact,
    /// |actual - expected| <= r * |expected| (+ 1e-9 for values near zero).
    Rel(f64),
    Abs(f64),
}

impl Tol {
    fn ok(self, expected: f64, actual: f64) -> bool {
        match self {
            Tol::Exact => (expected - actual).abs() < 1e-9,
            Tol::Rel(r) => (expected - actual).abs() <= r * expected.abs() + 1e-9,
            Tol::Abs(a) => (expected - actual).abs() <= a,
        }
    }
}

/// One expected series value. The labels are matched as a subset of the series'
/// labels, and all matching series are summed (absent counts as 0).
#[derive(Clone, Debug)]
pub struct Expect {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub tol: Tol,
}

/// A set of expectations plus "closed" metric names: for those, any series of the
/// given scope (e.g. `source="x"`) that no expectation covers must be absent or 0.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    pub items: Vec<Expect>,
    pub closed: Vec<(String, Vec<(String, String)>)>,
}

impl Expectations {
    pub fn push(&mut self, name: &str, labels: &[(&str, &str)], value: f64, tol: Tol) {
        self.items.push(Expect {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
            tol,
        });
    }

    /// Like [`Expectations::push`], replacing what was expected of the same
    /// name and labels before (a shared helper's default for a column a test
    /// does have).
    pub fn set(&mut self, name: &str, labels: &[(&str, &str)], value: f64, tol: Tol) {
        self.items.retain(|e| {
            e.name != name
                || e.labels.len() != labels.len()
                || !e
                    .labels
                    .iter()
                    .zip(labels)
                    .all(|((k, v), (k2, v2))| k == k2 && v == v2)
        });
        self.push(name, labels, value, tol);
    }

    /// No series of `name` within `scope` may be non-zero unless expected.
    pub fn close(&mut self, name: &str, scope: &[(&str, &str)]) {
        self.closed.push((
            name.to_string(),
            scope
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
    }

    pub fn extend(&mut self, other: Expectations) {
        self.items.extend(other.items);
        self.closed.extend(other.closed);
    }

    /// One line per mismatch; empty when the scrape matches.
    pub fn diff(&self, m: &Metrics) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.items {
            let labels: Vec<(&str, &str)> = e
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut found = false;
            let mut actual = 0.0;
            for s in m.series(&e.name, &labels) {
                found = true;
                actual += s.value;
            }
            if !e.tol.ok(e.value, actual) || (!found && e.value != 0.0) {
                out.push(format!(
                    "{}: expected {} ({:?}), got {}",
                    series_name(&e.name, labels.iter().copied()),
                    e.value,
                    e.tol,
                    if found {
                        actual.to_string()
                    } else {
                        "no series".to_string()
                    }
                ));
            }
        }
        for (name, scope) in &self.closed {
            let scope: Vec<(&str, &str)> = scope
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            for s in m.series(name, &scope) {
                let covered = self.items.iter().any(|e| {
                    &e.name == name
                        && e.labels.iter().all(|(k, v)| {
                            s.labels
                                .get(k)
                                .is_some_and(|have| label_matches(k, have, v))
                        })
                });
                if !covered && s.value != 0.0 {
                    out.push(format!(
                        "{}: unexpected series, value {}",
                        s.series(),
                        s.value
                    ));
                }
            }
        }
        out
    }
}

/// The nearest-rank quantile the contract defines: sorted[floor(q * (n - 1))].
pub fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "quantile of an empty set");
    sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
}

/// Formats a diff for a panic message, capped so a total mismatch stays readable.
pub fn render_diff(lines: &[String]) -> String {
    const MAX: usize = 200;
    let mut s = lines
        .iter()
        .take(MAX)
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    if lines.len() > MAX {
        s.push_str(&format!("\n  ... and {} more", lines.len() - MAX));
    }
    s
}
