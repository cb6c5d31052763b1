//! The Prometheus text exposition format: a scrape parsed into samples, looked up
//! by name and a subset of labels.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

/// One sample line.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// `name{a="b",...}`
    pub fn series(&self) -> String {
        series_name(
            &self.name,
            self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }
}

/// `name{a="b",...}` for messages.
pub fn series_name<'a>(name: &str, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let l: Vec<String> = labels
        .into_iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if l.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", l.join(","))
    }
}

/// Whether a sample's label `key` equals `want`. `le` and `quantile` compare as numbers,
/// so `1` matches `1.0` and `0.5` matches `0.50`.
pub fn label_matches(key: &str, have: &str, want: &str) -> bool {
    if have == want {
        return true;
    }
    if (key == "le" || key == "quantile")
        && let (Some(a), Some(b)) = (parse_value(have), parse_value(want))
    {
        return a == b;
    }
    false
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    pub text: String,
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        s => f64::from_str(s).ok(),
    }
}

impl Metrics {
    /// Parses the Prometheus text exposition format (comments skipped).
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut samples = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples
                .push(Self::parse_line(line).map_err(|e| format!("line {}: {e}: {raw:?}", n + 1))?);
        }
        Ok(Metrics {
            samples,
            text: text.to_string(),
        })
    }

    fn parse_line(line: &str) -> Result<Sample, String> {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or("no value")?;
        let name = line[..name_end].to_string();
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let close;
            loop {
                while let Some((_, c)) = chars.peek() {
                    if *c == ',' || c.is_whitespace() {
                        chars.next();
                    } else {
                        break;
                    }
                }
                let (i, c) = chars.next().ok_or("unterminated labels")?;
                if c == '}' {
                    close = i;
                    break;
                }
                let mut key = String::from(c);
                loop {
                    let (_, c) = chars.next().ok_or("unterminated label name")?;
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return Err(format!("label {key} value is not quoted"));
                }
                let mut val = String::new();
                loop {
                    let (_, c) = chars.next().ok_or("unterminated label value")?;
                    match c {
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => val.push('\n'),
                            Some(c) => val.push(c),
                            None => return Err("dangling escape".into()),
                        },
                        '"' => break,
                        c => val.push(c),
                    }
                }
                labels.insert(key.trim().to_string(), val);
            }
            rest = &r[close + 1..];
        }
        let value_txt = rest.split_whitespace().next().ok_or("no value")?;
        let value = parse_value(value_txt).ok_or_else(|| format!("bad value {value_txt:?}"))?;
        Ok(Sample {
            name,
            labels,
            value,
        })
    }

    /// Every sample named `name` whose labels include all of `labels`.
    pub fn series<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels.iter().all(|(k, v)| {
                    s.labels
                        .get(*k)
                        .is_some_and(|have| label_matches(k, have, v))
                })
        })
    }

    /// The first sample named `name` whose labels include all of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series(name, labels).next().map(|s| s.value)
    }

    /// The sum over every sample named `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name, labels).map(|s| s.value).sum()
    }

    /// Distinct sample names.
    pub fn names(&self) -> BTreeSet<&str> {
        self.samples.iter().map(|s| s.name.as_str()).collect()
    }
}
