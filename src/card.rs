//! A source's status card as plain data: what the status page and
//! `/api/v1/status` show of one source below the lines every source has
//! (name, kind, owner, state). Each kind builds its own card from the values
//! it recorded (`sources/*/card.rs`); `http` lays cards out and formats the
//! numbers, and names no kind and no metric.

use std::time::Duration;

/// One source's card.
#[derive(Debug, Clone, Default)]
pub struct Card {
    /// What `/api/v1/status` gives as the source's `numbers`: the kind's own
    /// numbers, serialized.
    pub numbers: serde_json::Value,
    /// Why the source is degraded, in a sentence, when the kind judges it so
    /// although its polls succeed.
    pub degraded: Option<String>,
    /// Tables shown before the rows (a Kafka cluster's groups).
    pub tables: Vec<Table>,
    /// Named numbers, one row each, with their sparklines.
    pub rows: Vec<Row>,
    /// What the history keeps of the source at each sample, by key: the
    /// values of its sparklines (`/api/v1/status` `history`).
    pub trends: Vec<(&'static str, Trend)>,
}

/// One row of named numbers.
#[derive(Debug, Clone)]
pub struct Row {
    /// Names the row's value cell (`data-field`) for scripts and tests.
    pub field: &'static str,
    pub title: Vec<Part>,
    pub value: Vec<Part>,
    /// The trend drawn beside the value: a key of [`Card::trends`].
    pub spark: Option<&'static str>,
}

/// A piece of a title or a value; the page escapes texts and formats numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// A number named by `key` (`data-value`): what tests and scripts read.
    Value {
        key: String,
        value: f64,
    },
    /// A number without a name (an objective, a threshold).
    Number(f64),
    /// A span of time, as people say it (`7 min`).
    Span(Duration),
    /// A side remark, in grey.
    Muted(Vec<Part>),
    /// Parts judged against a limit: red when `over`; `field` names them.
    Judged {
        over: bool,
        field: Option<&'static str>,
        parts: Vec<Part>,
    },
    /// A link to one of the agent's own pages: its path and query, not yet
    /// encoded.
    Link {
        path: &'static str,
        query: Vec<(&'static str, String)>,
        parts: Vec<Part>,
    },
    /// Nothing known: a dash.
    Missing,
}

/// A table of named rows (a cluster's groups).
#[derive(Debug, Clone)]
pub struct Table {
    /// What a row is (`group`): the first column's title, and the rows'
    /// attribute (`data-group`) holding their key.
    pub rows_are: &'static str,
    /// The other columns, as (`data-field`, title).
    pub columns: Vec<(&'static str, &'static str)>,
    pub rows: Vec<TableRow>,
    /// Said in place of the rows when there are none.
    pub empty: &'static str,
}

/// One row of a [`Table`]: its key (the first column) and a cell per column.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub key: String,
    pub cells: Vec<Vec<Part>>,
}

/// One value of a sparkline at one moment; NaN where it is absent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trend {
    /// A level (a gauge): drawn as it was at each sample.
    Level(f64),
    /// A running total (a counter): drawn as its growth between samples.
    Total(f64),
    /// One running total's growth over another's between samples
    /// (duplicate deliveries over deliveries).
    Share { part: f64, whole: f64 },
}

impl Trend {
    /// The same kind of trend with no value: a sample of a source that had none.
    pub fn absent(self) -> Trend {
        match self {
            Trend::Level(_) => Trend::Level(f64::NAN),
            Trend::Total(_) => Trend::Total(f64::NAN),
            Trend::Share { .. } => Trend::Share {
                part: f64::NAN,
                whole: f64::NAN,
            },
        }
    }
}

/// What a card may ask of its source's history (kept by `http`).
pub trait Past {
    /// How much the running total `key` (a [`Trend::Total`] of the card)
    /// grew within `window`: `now` minus its value at the latest sample at
    /// least that old, or minus 0 (its value when the agent started) when
    /// the history is younger. To the sample, and never below 0.
    fn growth(&self, key: &str, now: f64, window: Duration) -> f64;

    /// `longest`, or the agent's age when it is younger.
    fn window(&self, longest: Duration) -> Duration;
}

/// The history of a source that has none, of an agent older than any
/// window: every total grew by all of it (for the kinds' card tests).
#[cfg(test)]
pub struct NoPast;

#[cfg(test)]
impl Past for NoPast {
    fn growth(&self, _key: &str, now: f64, _window: Duration) -> f64 {
        now
    }

    fn window(&self, longest: Duration) -> Duration {
        longest
    }
}

/// A text part.
pub fn text(t: impl Into<String>) -> Part {
    Part::Text(t.into())
}

/// A named number, or a dash when there is none.
pub fn value(key: impl Into<String>, v: Option<f64>) -> Part {
    match v {
        Some(value) => Part::Value {
            key: key.into(),
            value,
        },
        None => Part::Missing,
    }
}

/// A named number in `unit`, red when above its objective, the objective
/// beside it in grey: `12 s (objective 30 s)`; a dash when there is none.
pub fn against(key: &str, v: Option<f64>, objective: Option<f64>, unit: &str) -> Vec<Part> {
    let Some(v) = v else {
        return vec![Part::Missing];
    };
    let shown = vec![value(key, Some(v)), text(unit)];
    match objective {
        None => shown,
        Some(o) => vec![
            Part::Judged {
                over: v > o,
                field: None,
                parts: shown,
            },
            text(" "),
            Part::Muted(vec![
                text("(objective "),
                Part::Number(o),
                text(format!("{unit})")),
            ]),
        ],
    }
}

/// `items` joined by `, `; a dash when there are none.
pub fn list(items: Vec<Vec<Part>>) -> Vec<Part> {
    if items.is_empty() {
        return vec![Part::Missing];
    }
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(text(", "));
        }
        out.extend(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_against_its_objective_is_judged_and_without_one_is_plain() {
        assert_eq!(against("k", None, Some(1.0), " s"), vec![Part::Missing]);
        assert_eq!(
            against("k", Some(2.0), None, " s"),
            vec![value("k", Some(2.0)), text(" s")]
        );
        let judged = against("k", Some(2.0), Some(1.0), " s");
        assert!(matches!(judged[0], Part::Judged { over: true, .. }));
        assert_eq!(
            judged[2],
            Part::Muted(vec![text("(objective "), Part::Number(1.0), text(" s)")])
        );
    }

    #[test]
    fn lists_are_joined_and_an_empty_one_is_a_dash() {
        assert_eq!(list(Vec::new()), vec![Part::Missing]);
        assert_eq!(
            list(vec![vec![text("a")], vec![text("b")]]),
            vec![text("a"), text(", "), text("b")]
        );
    }
}
