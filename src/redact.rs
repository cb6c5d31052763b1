//! Masking what a watched table holds before it leaves the agent: the
//! `[[server.redact]]` patterns and the built-ins of `[server]
//! redact_builtins`, applied to `last_error`, `business_key` and `summary`
//! on the pages, the JSON API, the commands' output and span attributes.
//!
//! One [`Redactor`] is built from the config and handed to each of those
//! places; each applies it to the raw text, before its own escaping (HTML,
//! control characters), so a mask can never split an escape.

use std::borrow::Cow;

use regex::Regex;
use serde::Deserialize;

use crate::validation::Validator;

/// What a custom pattern's match becomes when its `replace` is not given.
pub const DEFAULT_REPLACE: &str = "[redacted]";
/// What an e-mail address becomes (`redact_builtins = ["email"]`).
pub const EMAIL_MASK: &str = "[email]";
/// What a card-like number becomes (`redact_builtins = ["card"]`).
pub const CARD_MASK: &str = "[card]";

/// The built-ins `redact_builtins` takes.
const BUILTINS: [&str; 2] = ["email", "card"];

/// One `[[server.redact]]` entry as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawRule {
    /// A regular expression (Rust `regex` syntax: linear time, no
    /// look-around or back-references); every match is replaced.
    pub pattern: Option<String>,
    /// What a match becomes (default `[redacted]`); `$1` or `${name}` put a
    /// group of the match back, `$$` is a `$`.
    pub replace: Option<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    pattern: Regex,
    replace: String,
}

/// The masks of one config: the custom patterns in file order, then the
/// e-mail and card built-ins when switched on. The default masks nothing.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    rules: Vec<Rule>,
    email: Option<Regex>,
    card: Option<Regex>,
}

/// Reads `[[server.redact]]` and `redact_builtins`, each problem named by
/// its key (`server.redact[1].pattern: …`).
pub fn validate(v: &mut Validator<'_>, rules: &[RawRule], builtins: &[String]) -> Redactor {
    let mut out = Redactor::default();
    for (i, r) in rules.iter().enumerate() {
        let key = format!("server.redact[{i}]");
        let Some(pattern) = r.pattern.as_deref() else {
            v.problem(
                &format!("{key}.pattern"),
                "missing: the regular expression to mask".into(),
            );
            continue;
        };
        // `regex`'s own bound on a compiled pattern (10 MiB) keeps a mistaken
        // `{1000000}` from taking the agent's memory.
        match Regex::new(pattern) {
            Ok(re) if re.is_match("") => v.problem(
                &format!("{key}.pattern"),
                format!(
                    "{pattern:?} matches the empty text: it would mask between every character"
                ),
            ),
            Ok(re) => out.rules.push(Rule {
                pattern: re,
                replace: r
                    .replace
                    .clone()
                    .unwrap_or_else(|| DEFAULT_REPLACE.to_string()),
            }),
            Err(regex::Error::CompiledTooBig(limit)) => v.problem(
                &format!("{key}.pattern"),
                format!(
                    "compiles to more than {} MiB: use a narrower class (`[A-Za-z0-9]` \
                     rather than `\\w`) or fewer repetitions",
                    limit >> 20
                ),
            ),
            Err(e) => v.problem(
                &format!("{key}.pattern"),
                format!("not a regular expression: {}", one_line(&e.to_string())),
            ),
        }
    }
    for (i, b) in builtins.iter().enumerate() {
        match b.as_str() {
            "email" => out.email = Some(email()),
            "card" => out.card = Some(card()),
            other => v.problem(
                &format!("server.redact_builtins[{i}]"),
                format!(
                    "unknown built-in {other:?}: expected one of {}",
                    BUILTINS.join(", ")
                ),
            ),
        }
    }
    out
}

/// `regex`'s error shows the pattern over several lines with a caret; the
/// config's problems are one line each.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.iter().rev().find(|l| l.starts_with("error:")) {
        Some(last) => last.trim_start_matches("error:").trim().to_string(),
        None => lines.join(" "),
    }
}

fn email() -> Regex {
    Regex::new(r"[\w.%+-]+@[\w-]+(?:\.[\w-]+)+").expect("the e-mail pattern compiles")
}

/// Runs of digits with single spaces or dashes between them; which part
/// is a card is decided by [`cards`].
fn card() -> Regex {
    Regex::new(r"\b[0-9]+(?:[ -][0-9]+)*\b").expect("the card pattern compiles")
}

impl Redactor {
    /// Whether anything is masked at all.
    pub fn is_on(&self) -> bool {
        !self.rules.is_empty() || self.email.is_some() || self.card.is_some()
    }

    /// `text` with every mask applied; unchanged (and not copied) when
    /// nothing matches.
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for r in &self.rules {
            if let Cow::Owned(s) = r.pattern.replace_all(&out, r.replace.as_str()) {
                out = Cow::Owned(s);
            }
        }
        if let Some(re) = &self.email
            && let Cow::Owned(s) = re.replace_all(&out, EMAIL_MASK)
        {
            out = Cow::Owned(s);
        }
        if let Some(re) = &self.card
            && let Some(s) = cards(re, &out)
        {
            out = Cow::Owned(s);
        }
        out
    }

    /// [`Redactor::text`] of an owned value.
    pub fn owned(&self, text: Option<String>) -> Option<String> {
        text.map(|t| match self.text(&t) {
            Cow::Borrowed(_) => t,
            Cow::Owned(s) => s,
        })
    }

    /// [`Redactor::text`] of a prefix read from a table: when `text` is
    /// longer than `max` characters it was (or will be) cut, so a secret can
    /// straddle the cut where no pattern sees it whole. With masks on, such a
    /// text keeps its first `max` characters up to the last whitespace, is
    /// masked, and ends in `…`; with none, it is returned as it is.
    pub fn prefix<'t>(&self, text: &'t str, max: usize) -> Cow<'t, str> {
        if !self.is_on() {
            return Cow::Borrowed(text);
        }
        let Some((end, _)) = text.char_indices().nth(max) else {
            return self.text(text);
        };
        let kept = text[..end].trim_end_matches(|c: char| !c.is_whitespace());
        Cow::Owned(format!("{}…", self.text(kept)))
    }
}

/// `text` with every card-like number masked; `None` when there is none.
/// A candidate is a run of digit groups (single spaces or dashes between
/// them): within it, the longest stretch of whole groups holding 13 to 19
/// digits that passes the Luhn check is a card. So a 20-digit id is never
/// masked, nor a 16-digit one that fails the check.
fn cards(re: &Regex, text: &str) -> Option<String> {
    let mut out = String::new();
    let mut last = 0;
    for m in re.find_iter(text) {
        // The pattern puts exactly one separator between two groups.
        let mut groups: Vec<(usize, usize)> = Vec::new();
        let mut at = m.start();
        for g in m.as_str().split([' ', '-']) {
            groups.push((at, at + g.len()));
            at += g.len() + 1;
        }
        let mut i = 0;
        while i < groups.len() {
            match longest_card(text, &groups[i..]) {
                Some(n) => {
                    out.push_str(&text[last..groups[i].0]);
                    out.push_str(CARD_MASK);
                    last = groups[i + n - 1].1;
                    i += n;
                }
                None => i += 1,
            }
        }
    }
    (last > 0).then(|| {
        out.push_str(&text[last..]);
        out
    })
}

/// How many of the leading `groups` (byte ranges of digit runs in `text`)
/// make the longest card-like number starting at the first.
fn longest_card(text: &str, groups: &[(usize, usize)]) -> Option<usize> {
    let mut digits = String::new();
    let mut found = None;
    for (n, &(start, end)) in groups.iter().enumerate() {
        digits.push_str(&text[start..end]);
        if digits.len() > 19 {
            break;
        }
        if digits.len() >= 13 && luhn(&digits) {
            found = Some(n + 1);
        }
    }
    found
}

/// The Luhn check of a string of ASCII digits.
fn luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            match i % 2 {
                0 => d,
                _ if d * 2 > 9 => d * 2 - 9,
                _ => d * 2,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Environment, Problem};

    fn built(rules: &[(&str, Option<&str>)], builtins: &[&str]) -> (Redactor, Vec<Problem>) {
        let env = |_: &str| None;
        let mut v = Validator::new("", Environment::Process, &env);
        let rules: Vec<RawRule> = rules
            .iter()
            .map(|(p, r)| RawRule {
                pattern: Some(p.to_string()),
                replace: r.map(str::to_string),
            })
            .collect();
        let builtins: Vec<String> = builtins.iter().map(|b| b.to_string()).collect();
        let r = validate(&mut v, &rules, &builtins);
        (r, v.into_problems())
    }

    #[test]
    fn nothing_is_masked_by_default() {
        let r = Redactor::default();
        assert!(!r.is_on());
        let text = "mail ann@example.com card 4111 1111 1111 1111";
        assert!(matches!(r.text(text), Cow::Borrowed(t) if t == text));
        assert_eq!(r.prefix(text, 5), text);
    }

    #[test]
    fn cards_pass_the_luhn_check_and_ids_do_not() {
        let (r, problems) = built(&[], &["card"]);
        assert!(problems.is_empty(), "{problems:?}");
        for (text, masked) in [
            ("4111111111111111", "[card]"),
            ("paid with 4111 1111 1111 1111.", "paid with [card]."),
            ("card=4111-1111-1111-1111;", "card=[card];"),
            // Amex, 15 digits in 4-6-5 groups.
            ("378282246310005", "[card]"),
            ("3782 822463 10005", "[card]"),
            // A 16-digit id that fails the check, and a 20-digit one.
            ("order 1234567812345678", "order 1234567812345678"),
            ("id 41111111111111110000", "id 41111111111111110000"),
            // Digits inside a word are part of an id, not a card.
            ("evt4111111111111111", "evt4111111111111111"),
            // A card followed by another number keeps the number.
            ("4111 1111 1111 1111 43", "[card] 43"),
            ("2026-12-04 05:06:08", "2026-12-04 05:06:08"),
        ] {
            assert_eq!(r.text(text), masked, "{text}");
        }
    }

    #[test]
    fn emails_and_custom_patterns_are_masked_in_order() {
        let (r, problems) = built(
            &[
                (r"tok_[A-Za-z0-9]{8,}", None),
                (r"(user=)\S+", Some("${1}***")),
            ],
            &["email"],
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            r.text("tok_abcdefgh12 for ann.lee+x@mail.example.co.uk user=bob ok"),
            "[redacted] for [email] user=*** ok"
        );
        assert_eq!(r.text("no secret here"), "no secret here");
    }

    #[test]
    fn a_cut_text_loses_its_last_word_before_the_mask() {
        let (r, _) = built(&[], &["email"]);
        // Cut at 20 characters: "ann@exam" alone would not be an address.
        assert_eq!(
            r.prefix("failed for ann@example.com today", 18),
            "failed for …"
        );
        assert_eq!(r.prefix("to ann@example.com", 40), "to [email]");
    }

    #[test]
    fn bad_patterns_and_builtins_are_named_by_key() {
        let (_, problems) = built(
            &[
                ("ok", None),
                ("(unclosed", None),
                ("x*", None),
                (r"\w{50,}", None),
                (r"\w{2000}", None),
            ],
            &["card", "phone"],
        );
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "server.redact[1].pattern",
                "server.redact[2].pattern",
                "server.redact[4].pattern",
                "server.redact_builtins[1]"
            ]
        );
        assert!(
            problems[2]
                .message
                .starts_with("compiles to more than 10 MiB"),
            "{}",
            problems[2].message
        );
        assert_eq!(
            problems[0].message,
            "not a regular expression: unclosed group"
        );
        assert!(
            problems[1].message.contains("matches the empty text"),
            "{}",
            problems[1].message
        );
        assert!(
            problems[3].message.contains("\"phone\""),
            "{}",
            problems[3].message
        );
    }
}
