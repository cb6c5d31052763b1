//! Bounded label values: `event_type` keeps the first N distinct values it sees
//! and folds the rest into `other`, so a table with free-form types cannot blow
//! up the number of series.

use std::collections::HashMap;

/// The label value of rows whose event type is NULL.
pub const UNKNOWN: &str = "unknown";
/// The label value every type past the limit folds into.
pub const OTHER: &str = "other";
/// Longest label value kept; longer values are cut at a character boundary.
const MAX_LEN: usize = 100;

/// Maps raw values to a bounded set of label values.
#[derive(Debug)]
pub struct LabelCap {
    limit: usize,
    known: HashMap<String, usize>,
    values: Vec<String>,
}

impl LabelCap {
    /// A cap that admits `limit` distinct values besides `other` and `unknown`.
    pub fn new(limit: usize) -> Self {
        let mut cap = LabelCap {
            limit,
            known: HashMap::new(),
            values: Vec::new(),
        };
        cap.intern(OTHER);
        cap.intern(UNKNOWN);
        cap
    }

    fn intern(&mut self, value: &str) -> usize {
        let id = self.values.len();
        self.values.push(value.to_string());
        self.known.insert(value.to_string(), id);
        id
    }

    /// The label id of a raw value, admitting it while there is room.
    pub fn resolve(&mut self, raw: Option<&str>) -> usize {
        let Some(raw) = raw else {
            return self.known[UNKNOWN];
        };
        let value = truncate(raw);
        if let Some(id) = self.known.get(value) {
            return *id;
        }
        if self.values.len() - 2 < self.limit {
            self.intern(value)
        } else {
            self.known[OTHER]
        }
    }

    /// The label value of an id returned by [`LabelCap::resolve`].
    pub fn value(&self, id: usize) -> &str {
        &self.values[id]
    }
}

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_LEN {
        return s;
    }
    let mut end = MAX_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_limit_fold_into_other() {
        let mut cap = LabelCap::new(2);
        let a = cap.resolve(Some("a"));
        let b = cap.resolve(Some("b"));
        let c = cap.resolve(Some("c"));
        assert_eq!(cap.value(a), "a");
        assert_eq!(cap.value(b), "b");
        assert_eq!(cap.value(c), OTHER);
        assert_eq!(cap.resolve(Some("a")), a);
        let unknown = cap.resolve(None);
        assert_eq!(cap.value(unknown), UNKNOWN);
        let other = cap.resolve(Some("other"));
        assert_eq!(cap.value(other), OTHER);
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let mut cap = LabelCap::new(5);
        let long = "é".repeat(200);
        let id = cap.resolve(Some(&long));
        assert!(cap.value(id).len() <= MAX_LEN);
        assert!(long.starts_with(cap.value(id)));
    }
}
