//! Error classes: what kind of failure a row's `last_error` shows, so that
//! failed attempts and dead letters can be counted by a bounded `error_class`
//! label, and retries spent on errors that no retry can fix (invalid input,
//! no permission, a business-rule conflict) can be seen.
//!
//! A source's classes are its `[[sources.error_classes]]`, in order, then
//! (unless `default_error_classes = false`) the built-in [`DEFAULTS`]; the
//! first pattern that matches the start of the text wins. Patterns are
//! case-insensitive. A text no pattern matches is `other`; a row without
//! one (NULL or empty, or no `last_error` column) is `unknown`. Both count
//! as retryable: only a class known to be permanent marks a retry as wasted.

use regex::{RegexSet, RegexSetBuilder};
use serde::Deserialize;

use crate::validation::Validator;

/// The class of a text no pattern matches.
pub const OTHER: &str = "other";
/// The class of a row without an error text.
pub const UNKNOWN: &str = "unknown";
/// At most this many classes per source (the label stays bounded).
pub const MAX_CLASSES: usize = 32;

/// The built-in classes: name, pattern, retryable.
pub const DEFAULTS: &[(&str, &str, bool)] = &[
    (
        "timeout",
        r"timeout|timed?[ _-]?out|deadline[ _-]exceeded|etimedout",
        true,
    ),
    (
        "connection",
        r"connection[ _-]?(reset|refused|closed|aborted)|econnreset|econnrefused|broken[ _-]pipe",
        true,
    ),
    (
        "throttled",
        r"\b429\b|rate[ _-]?limit|too[ _-]many[ _-]requests|throttl",
        true,
    ),
    (
        "server_error",
        r"\b50[0-4]\b|internal[ _-]server[ _-]error|service[ _-]unavailable|bad[ _-]gateway|gateway[ _-]timeout",
        true,
    ),
    (
        "invalid",
        r"validation|invalid|bad[ _-]request|\b400\b|\b422\b|schema|pars(e|ing)|deserializ|malformed",
        false,
    ),
    (
        "permission",
        r"\b40[13]\b|forbidden|unauthori[sz]ed|permission[ _-]denied|access[ _-]denied|not[ _-]authori[sz]ed",
        false,
    ),
    (
        "conflict",
        r"unique|duplicate[ _-]key|version[ _-]conflict|business[ _-]rule|conflict|\b409\b",
        false,
    ),
];

/// One `[[sources.error_classes]]` entry.
#[derive(Debug, Default, Deserialize)]
pub struct RawErrorClass {
    /// The `error_class` label value: a word of lower-case letters, digits and `_`.
    pub class: Option<String>,
    /// A regular expression (Rust `regex` syntax, case-insensitive) searched in the error text.
    pub pattern: Option<String>,
    /// Whether a retry can fix this error (default false).
    pub retryable: Option<bool>,
}

/// One class: its label value and whether a retry may fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorClass {
    pub name: String,
    pub retryable: bool,
}

/// A source's error classes, in the order they are tried.
#[derive(Debug, Clone)]
pub struct ErrorClasses {
    /// The patterns' classes, then `other`, then `unknown`.
    classes: Vec<ErrorClass>,
    patterns: RegexSet,
}

impl Default for ErrorClasses {
    /// The built-in classes alone.
    fn default() -> Self {
        let entries = DEFAULTS
            .iter()
            .map(|(c, p, r)| (c.to_string(), p.to_string(), *r))
            .collect::<Vec<_>>();
        ErrorClasses::build(&entries).expect("the built-in patterns compile")
    }
}

impl ErrorClasses {
    fn build(entries: &[(String, String, bool)]) -> Result<Self, regex::Error> {
        let patterns = RegexSetBuilder::new(entries.iter().map(|(_, p, _)| p))
            .case_insensitive(true)
            .size_limit(1 << 20)
            .build()?;
        let mut classes: Vec<ErrorClass> = entries
            .iter()
            .map(|(name, _, retryable)| ErrorClass {
                name: name.clone(),
                retryable: *retryable,
            })
            .collect();
        for name in [OTHER, UNKNOWN] {
            classes.push(ErrorClass {
                name: name.to_string(),
                retryable: true,
            });
        }
        Ok(ErrorClasses { classes, patterns })
    }

    /// The class of an error text, and whether it is retryable: the first
    /// matching class, `other` when none matches, `unknown` without a text.
    pub fn classify(&self, error: Option<&str>) -> (&str, bool) {
        let c = &self.classes[usize::from(self.index(error))];
        (&c.name, c.retryable)
    }

    /// [`ErrorClasses::classify`] as an index into [`ErrorClasses::get`]
    /// (what the inbox remembers per event: one byte).
    pub fn index(&self, error: Option<&str>) -> u8 {
        let n = self.patterns.len();
        let i = match error.filter(|e| !e.trim().is_empty()) {
            None => n + 1,
            Some(text) => self.patterns.matches(text).iter().next().unwrap_or(n),
        };
        u8::try_from(i).expect("at most MAX_CLASSES classes")
    }

    /// The class at `index`.
    pub fn get(&self, index: u8) -> &ErrorClass {
        &self.classes[usize::from(index)]
    }

    /// The index of `unknown`: a row without an error text.
    pub fn unknown(&self) -> u8 {
        (self.classes.len() - 1) as u8
    }

    /// Every class, in order, ending with `other` and `unknown`.
    pub fn all(&self) -> &[ErrorClass] {
        &self.classes
    }
}

/// Whether `name` can be an `error_class` label value.
fn is_class_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && name.len() <= 40
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Checks `[[sources.error_classes]]` and `default_error_classes`, naming
/// the key of every problem.
pub(crate) fn validate(
    v: &mut Validator<'_>,
    key: &str,
    raw: &[RawErrorClass],
    defaults: Option<bool>,
) -> ErrorClasses {
    let mut entries: Vec<(String, String, bool)> = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let at = format!("{key}.error_classes[{i}]");
        let class = match r.class.as_deref() {
            Some(c) if c == OTHER || c == UNKNOWN => {
                v.problem(
                    &format!("{at}.class"),
                    format!("\"{c}\" is reserved: it is the class of errors no pattern matches (other) or of rows without an error (unknown)"),
                );
                None
            }
            Some(c) if is_class_name(c) => Some(c.to_string()),
            Some(c) => {
                v.problem(
                    &format!("{at}.class"),
                    format!(
                        "\"{c}\" is not a class name: a lower-case letter, then lower-case letters, digits and _ (at most 40)"
                    ),
                );
                None
            }
            None => {
                v.problem(&format!("{at}.class"), "required".into());
                None
            }
        };
        let pattern = match r.pattern.as_deref() {
            Some("") => {
                v.problem(
                    &format!("{at}.pattern"),
                    "must not be empty (it would match every error)".into(),
                );
                None
            }
            Some(p) => match RegexSetBuilder::new([p]).case_insensitive(true).build() {
                Ok(_) => Some(p.to_string()),
                Err(e) => {
                    let first = e.to_string();
                    let first = first.lines().last().unwrap_or_default().trim().to_string();
                    v.problem(
                        &format!("{at}.pattern"),
                        format!("\"{p}\" is not a regular expression: {first}"),
                    );
                    None
                }
            },
            None => {
                v.problem(&format!("{at}.pattern"), "required".into());
                None
            }
        };
        if let (Some(class), Some(pattern)) = (class, pattern) {
            entries.push((class, pattern, r.retryable.unwrap_or(false)));
        }
    }
    if defaults.unwrap_or(true) {
        entries.extend(
            DEFAULTS
                .iter()
                .map(|(c, p, r)| (c.to_string(), p.to_string(), *r)),
        );
    }
    // A class named twice must say the same about retrying.
    for (i, (class, _, retryable)) in entries.iter().enumerate() {
        if let Some((_, _, earlier)) = entries[..i].iter().find(|(c, _, _)| c == class)
            && earlier != retryable
            && i < raw.len()
        {
            v.problem(
                &format!("{key}.error_classes[{i}].retryable"),
                format!(
                    "class \"{class}\" is also given with retryable = {earlier}: a class is retryable or not"
                ),
            );
        }
    }
    let distinct: std::collections::HashSet<&str> =
        entries.iter().map(|(c, _, _)| c.as_str()).collect();
    if distinct.len() + 2 > MAX_CLASSES {
        v.problem(
            &format!("{key}.error_classes"),
            format!(
                "{} classes with the built-in ones, other and unknown: at most {MAX_CLASSES}",
                distinct.len() + 2
            ),
        );
    }
    if entries.len() + 2 > MAX_CLASSES {
        entries.truncate(MAX_CLASSES - 2);
    }
    ErrorClasses::build(&entries).unwrap_or_else(|e| {
        v.problem(&format!("{key}.error_classes"), e.to_string());
        ErrorClasses::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_class_common_error_texts() {
        let classes = ErrorClasses::default();
        let table: &[(Option<&str>, &str, bool)] = &[
            (Some("TimeoutError: no answer after 30s"), "timeout", true),
            (Some("context deadline exceeded"), "timeout", true),
            (Some("upstream request timed out"), "timeout", true),
            (
                Some("Connection reset by peer (os error 104)"),
                "connection",
                true,
            ),
            (
                Some("connect ECONNREFUSED 10.0.0.7:5432"),
                "connection",
                true,
            ),
            (Some("write: broken pipe"), "connection", true),
            (Some("HTTP 429 from billing"), "throttled", true),
            (Some("Rate limit exceeded"), "throttled", true),
            (Some("Too Many Requests"), "throttled", true),
            (Some("request throttled by the gateway"), "throttled", true),
            (Some("HTTP 503 from inventory"), "server_error", true),
            (Some("502 Bad Gateway"), "server_error", true),
            (Some("Internal Server Error"), "server_error", true),
            (
                Some("ValidationError: amount must be positive"),
                "invalid",
                false,
            ),
            (Some("400 Bad Request"), "invalid", false),
            (Some("JSON parse error at line 1"), "invalid", false),
            (Some("failed to deserialize OrderPlaced"), "invalid", false),
            (Some("schema mismatch: unknown field"), "invalid", false),
            (Some("HTTP 403 Forbidden"), "permission", false),
            (Some("401 Unauthorized"), "permission", false),
            (
                Some("ERROR: permission denied for table ledger"),
                "permission",
                false,
            ),
            (Some("AccessDenied: access denied"), "permission", false),
            (
                Some("duplicate key value violates unique constraint \"orders_pkey\""),
                "conflict",
                false,
            ),
            (Some("optimistic lock: version conflict"), "conflict", false),
            (
                Some("business rule violated: order already shipped"),
                "conflict",
                false,
            ),
            (Some("HTTP 409 Conflict"), "conflict", false),
            (Some("NullPointerException at Handler.java:42"), OTHER, true),
            (Some("order 4295 failed"), OTHER, true),
            (Some("   "), UNKNOWN, true),
            (Some(""), UNKNOWN, true),
            (None, UNKNOWN, true),
        ];
        for (text, class, retryable) in table {
            assert_eq!(
                classes.classify(*text),
                (*class, *retryable),
                "{text:?} should be {class}"
            );
        }
    }

    #[test]
    fn the_first_match_wins_in_the_configured_order() {
        // "504 gateway timeout" matches timeout first, as the defaults are ordered.
        assert_eq!(
            ErrorClasses::default().classify(Some("504 Gateway Timeout")),
            ("timeout", true)
        );
    }

    fn check(
        toml_entries: &[(&str, &str, Option<bool>)],
        defaults: Option<bool>,
    ) -> (ErrorClasses, Vec<String>) {
        let raw: Vec<RawErrorClass> = toml_entries
            .iter()
            .map(|(c, p, r)| RawErrorClass {
                class: Some(c.to_string()),
                pattern: Some(p.to_string()),
                retryable: *r,
            })
            .collect();
        let env = |_: &str| None;
        let mut v = Validator::new("", crate::validation::Environment::Process, &env);
        let classes = validate(&mut v, "sources[0]", &raw, defaults);
        let problems = v
            .into_problems()
            .into_iter()
            .map(|p| p.to_string())
            .collect();
        (classes, problems)
    }

    #[test]
    fn a_config_can_extend_the_defaults_before_them() {
        let (classes, problems) = check(
            &[
                ("fraud", r"fraud[ _]check", Some(false)),
                ("timeout", "ledger busy", Some(true)),
            ],
            None,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            classes.classify(Some("Fraud check refused card")),
            ("fraud", false)
        );
        assert_eq!(
            classes.classify(Some("ledger busy, try later")),
            ("timeout", true)
        );
        // The defaults still apply after the user's entries.
        assert_eq!(classes.classify(Some("HTTP 403")), ("permission", false));
    }

    #[test]
    fn a_config_can_replace_the_defaults() {
        let (classes, problems) = check(
            &[
                ("transient", r"timeout|unavailable|reset", Some(true)),
                ("poison", r"deserializ|invalid", None),
            ],
            Some(false),
        );
        assert!(problems.is_empty(), "{problems:?}");
        let table: &[(Option<&str>, &str, bool)] = &[
            (Some("TimeoutError"), "transient", true),
            (Some("503 Service Unavailable"), "transient", true),
            (Some("connection reset"), "transient", true),
            (Some("cannot deserialize body"), "poison", false),
            (Some("Invalid amount"), "poison", false),
            // No default class is left: these are other.
            (Some("HTTP 403 Forbidden"), OTHER, true),
            (Some("duplicate key"), OTHER, true),
            (None, UNKNOWN, true),
        ];
        for (text, class, retryable) in table {
            assert_eq!(classes.classify(*text), (*class, *retryable), "{text:?}");
        }
        let names: Vec<&str> = classes.all().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["transient", "poison", OTHER, UNKNOWN]);
    }

    #[test]
    fn bad_entries_are_named_by_their_key() {
        let (_, problems) = check(
            &[
                ("ok", "(unclosed", None),
                ("Bad Class", "x", None),
                ("other", "y", None),
                ("fine", "", None),
            ],
            None,
        );
        let text = problems.join("\n");
        assert!(
            text.contains("sources[0].error_classes[0].pattern"),
            "{text}"
        );
        assert!(text.contains("not a regular expression"), "{text}");
        assert!(text.contains("sources[0].error_classes[1].class"), "{text}");
        assert!(text.contains("sources[0].error_classes[2].class"), "{text}");
        assert!(text.contains("reserved"), "{text}");
        assert!(
            text.contains("sources[0].error_classes[3].pattern"),
            "{text}"
        );
        assert_eq!(problems.len(), 4, "{text}");
    }
}
