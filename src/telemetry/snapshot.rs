//! Series that a source rebuilds whole every cycle (the Kafka source), kept
//! apart from the metrics recorder so that a series of a group or topic that
//! has gone simply is not in the next snapshot, instead of freezing at its
//! last value. `/metrics` renders them after the recorder's families.
//!
//! Beside its series a source may keep a value of its own type, made from
//! the same samples in the same cycle ([`Builder::keep`]): what its status
//! card reads ([`crate::telemetry::values::Reading::kept`]), without parsing
//! the text back.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use super::catalogue::{self, CATALOGUE};

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// Labels borrowed from the caller: what [`Builder::push_labels`] takes, so
/// that a source writing 300,000 series a cycle allocates none of them.
pub type Labels<'a> = [(&'static str, &'a str)];

/// One source's series of one cycle, already in the text format, one block
/// per family: about the size of the `/metrics` text it becomes.
#[derive(Default)]
pub struct Builder {
    /// In the order first pushed; a handful, found by the address of their
    /// `&'static` name first (the catalogue's constants), then by its text.
    families: Vec<(&'static str, String)>,
    count: usize,
    kept: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("families", &self.families.len())
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Adds one sample.
    pub fn push(&mut self, s: Sample) {
        let labels: Vec<(&'static str, &str)> =
            s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.push_labels(s.name, &labels, s.value);
    }

    /// Adds one sample of family `name`.
    pub fn push_labels(&mut self, name: &'static str, labels: &Labels<'_>, value: f64) {
        let out = self.family_mut(name);
        out.push_str(name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                escape_into(out, v);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        push_value(out, value);
        out.push('\n');
        self.count += 1;
    }

    fn family_mut(&mut self, name: &'static str) -> &mut String {
        let at = self
            .families
            .iter()
            .position(|(n, _)| std::ptr::eq(*n, name))
            .or_else(|| self.families.iter().position(|(n, _)| *n == name));
        let at = match at {
            Some(at) => at,
            None => {
                self.families.push((name, String::new()));
                self.families.len() - 1
            }
        };
        &mut self.families[at].1
    }

    fn family(&self, name: &str) -> Option<&String> {
        self.families
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| text)
    }

    /// Samples added.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Keeps `value` with the samples, published and cleared with them.
    pub fn keep<T: Any + Send + Sync>(&mut self, value: T) {
        self.kept = Some(Arc::new(value));
    }
}

static SNAPSHOTS: Mutex<BTreeMap<String, Arc<Builder>>> = Mutex::new(BTreeMap::new());

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<String, Arc<Builder>>> {
    SNAPSHOTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the samples of `source`.
pub fn publish(source: &str, samples: Builder) {
    lock().insert(source.to_string(), Arc::new(samples));
}

/// Removes the samples of `source` (it is down or another agent owns it).
pub fn clear(source: &str) {
    lock().remove(source);
}

/// How many samples `source` last published.
pub fn count(source: &str) -> Option<usize> {
    lock().get(source).map(|b| b.len())
}

/// What `source` last kept beside its samples ([`Builder::keep`]), if it is a `T`.
pub fn kept<T: Any + Send + Sync>(source: &str) -> Option<Arc<T>> {
    let kept = lock().get(source)?.kept.clone()?;
    kept.downcast::<T>().ok()
}

/// Appends every snapshot except the `hidden` sources' in the Prometheus text
/// format, one `# HELP`/`# TYPE` per family, families in catalogue order.
pub fn render(out: &mut String, hidden: &[String]) {
    let snaps: Vec<Arc<Builder>> = lock()
        .iter()
        .filter(|(k, _)| !hidden.contains(k))
        .map(|(_, v)| v.clone())
        .collect();
    if snaps.is_empty() {
        return;
    }
    for def in CATALOGUE {
        let mut header = false;
        for block in snaps.iter().filter_map(|s| s.family(def.name)) {
            if !header {
                let _ = writeln!(out, "# HELP {} {}", def.name, def.help);
                let _ = writeln!(out, "# TYPE {} {}", def.name, def.kind.as_str());
                header = true;
            }
            out.push_str(block);
        }
    }
}

/// Calls `f` with the labels and value of every sample of family `name` in
/// every published snapshot (for the OTLP metrics push).
pub fn for_each(name: &str, mut f: impl FnMut(Vec<(String, String)>, f64)) {
    let snaps: Vec<Arc<Builder>> = lock().values().cloned().collect();
    for block in snaps.iter().filter_map(|s| s.family(name)) {
        for line in block.lines() {
            if let Some((labels, value)) = parse_line(line) {
                f(labels, value);
            }
        }
    }
}

/// `name{a="b",c="d"} 1.5` → ([(a, b), (c, d)], 1.5).
fn parse_line(line: &str) -> Option<(Vec<(String, String)>, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let mut labels = Vec::new();
    if let Some(open) = series.find('{') {
        let mut rest = series[open + 1..].strip_suffix('}')?;
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"")?;
            let mut val = String::new();
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => val.push('\n'),
                        Some((_, other)) => val.push(other),
                        None => return None,
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => val.push(c),
                }
            }
            let end = end?;
            labels.push((key.to_string(), val));
            rest = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
    }
    Some((labels, value))
}

/// Appends a value as `{}` prints an `f64` (`3`, `4.5`, `NaN`, `inf`), whole
/// numbers without `fmt`: most values are counts and offsets.
fn push_value(out: &mut String, value: f64) {
    // Below 2^53 every whole number is exact, and `{}` prints it as an integer.
    if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        if value == 0.0 && value.is_sign_negative() {
            out.push_str("-0");
            return;
        }
        out.push_str(itoa::Buffer::new().format(value as i64));
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Appends a label value with `\\`, `"` and newlines escaped, as the text
/// format wants; most values need none and are copied whole.
fn escape_into(out: &mut String, v: &str) {
    if !v.contains(['\\', '"', '\n']) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Whether a catalogue metric lives in snapshots rather than the recorder
/// (the catalogue says which families: [`catalogue::SNAPSHOT_PREFIXES`]).
pub fn is_snapshot_metric(name: &str) -> bool {
    catalogue::SNAPSHOT_PREFIXES
        .iter()
        .any(|p| name.starts_with(p))
        && catalogue::find(name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_once_with_escaped_labels_and_hidden_sources_vanish() {
        let s = |group: &str, v: f64| Sample {
            name: catalogue::KAFKA_LAG_MESSAGES,
            labels: vec![("cluster", "c".into()), ("group", group.into())],
            value: v,
        };
        let mut a = Builder::default();
        a.push(s("g\"1", 3.0));
        publish("snap-a", a);
        let mut b = Builder::default();
        b.push(s("g2", 4.5));
        b.keep(String::from("kept with g2"));
        publish("snap-b", b);
        assert_eq!(count("snap-b"), Some(1));
        assert_eq!(kept::<u32>("snap-b"), None);
        let mut out = String::new();
        render(&mut out, &[]);
        assert_eq!(
            out.matches("# TYPE kafka_consumer_group_lag_messages gauge")
                .count(),
            1
        );
        assert!(
            out.contains("kafka_consumer_group_lag_messages{cluster=\"c\",group=\"g\\\"1\"} 3\n")
        );
        assert!(out.contains("group=\"g2\"} 4.5\n"));
        let mut out = String::new();
        render(&mut out, &["snap-b".to_string()]);
        assert!(!out.contains("g2"));
        let mut seen = Vec::new();
        for_each(catalogue::KAFKA_LAG_MESSAGES, |l, v| seen.push((l, v)));
        seen.sort_by(|a, b| a.1.total_cmp(&b.1));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0[1], ("group".to_string(), "g\"1".to_string()));
        assert_eq!(seen[1].1, 4.5);
        assert_eq!(
            kept::<String>("snap-b").as_deref().map(String::as_str),
            Some("kept with g2")
        );
        clear("snap-a");
        clear("snap-b");
        assert_eq!(kept::<String>("snap-b"), None);
    }

    #[test]
    fn values_print_as_fmt_prints_them() {
        for v in [
            0.0,
            -0.0,
            1.0,
            -3.0,
            4.5,
            1e15,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            1e300,
            -1e-7,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            i64::MAX as f64,
        ] {
            let mut out = String::new();
            push_value(&mut out, v);
            assert_eq!(out, format!("{v}"), "{v:?}");
        }
    }
}
