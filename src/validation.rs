//! The tools every part of the configuration is checked with: problems with
//! their full key paths, `${VAR}` expansion, durations and bounded numbers,
//! SQL identifiers, and reading a TOML table into a typed value while keeping
//! the line of whatever is wrong in it.
//!
//! This is the bottom layer: it imports nothing of the product, so every
//! section's and every source kind's settings can use it.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// One problem in a configuration file, with the key it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Full key path, e.g. `sources[0].poll_interval`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Every problem found in a configuration file.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    /// The file, when the config came from one.
    pub path: Option<String>,
    /// One entry per problem, in file order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        write!(f, "{}", lines.join("\n"))
    }
}

/// Where `${VAR}` gets its value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Environment {
    /// The process environment.
    #[default]
    Process,
    /// Every `${VAR}` is set, to [`PLACEHOLDER`], and nothing else is read from
    /// the environment: `check-config --no-env`, for pipelines without the secrets.
    Placeholders,
}

/// The value of every `${VAR}` under `--no-env`: a valid user, password, host,
/// port and database name alike.
pub const PLACEHOLDER: &str = "1";

impl Environment {
    /// The value of variable `name`.
    pub fn lookup(self, name: &str) -> Option<String> {
        match self {
            Environment::Process => std::env::var(name).ok(),
            // The only variables read other than through `${VAR}` are the
            // OTEL_EXPORTER_OTLP_* fallbacks of [tracing]: those stay unset.
            Environment::Placeholders => (!name.starts_with("OTEL_")).then(|| PLACEHOLDER.into()),
        }
    }
}

/// Collects the problems of one file while its sections are checked; every
/// check reports and goes on, so one run names every problem.
pub struct Validator<'e> {
    problems: Vec<Problem>,
    environment: Environment,
    env: &'e dyn Fn(&str) -> Option<String>,
    /// The file's text, for line numbers.
    text: &'e str,
}

impl<'e> Validator<'e> {
    /// A validator resolving `${VAR}` with `env`; `text` is the file, for line numbers.
    pub fn new(
        text: &'e str,
        environment: Environment,
        env: &'e dyn Fn(&str) -> Option<String>,
    ) -> Validator<'e> {
        Validator {
            problems: Vec::new(),
            environment,
            env,
            text,
        }
    }

    /// Reports a problem at `key`.
    pub fn problem(&mut self, key: &str, message: String) {
        self.problems.push(Problem {
            key: key.to_string(),
            message,
        });
    }

    /// How many problems were reported so far: a check compares it before
    /// and after to know whether its part was valid.
    pub fn count(&self) -> usize {
        self.problems.len()
    }

    /// Every problem, in the order reported.
    pub fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    /// Where `${VAR}` values come from.
    pub fn environment(&self) -> Environment {
        self.environment
    }

    /// The value of environment variable `name`.
    pub fn var(&self, name: &str) -> Option<String> {
        (self.env)(name)
    }

    /// The resolver of `${VAR}`, for parsers that expand it themselves.
    pub fn env(&self) -> &'e dyn Fn(&str) -> Option<String> {
        self.env
    }

    /// `text` with `${VAR}` expanded; an unset variable is a problem at `key`.
    pub fn expand(&mut self, key: &str, text: &str) -> Option<String> {
        match expand_env(text, self.env) {
            Ok(t) => Some(t),
            Err(var) => {
                self.problem(key, format!("environment variable {var} is not set"));
                None
            }
        }
    }

    /// A duration (`5s`, `1m30s`), or `default` when absent or invalid.
    pub fn duration(&mut self, key: &str, value: Option<&str>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) => d,
                Err(e) => {
                    self.problem(key, format!("invalid duration \"{text}\": {e}"));
                    default
                }
            },
        }
    }

    /// A whole number from 1 to `max`, or `default` when absent or out of range.
    pub fn positive(&mut self, key: &str, value: Option<i64>, default: usize, max: usize) -> usize {
        match value {
            None => default,
            Some(n) if n >= 1 && (n as u64) <= max as u64 => n as usize,
            Some(n) => {
                self.problem(key, format!("must be between 1 and {max}, got {n}"));
                default
            }
        }
    }

    /// The 1-based line of byte offset `at` in the file.
    fn line(&self, at: usize) -> usize {
        self.text[..at.min(self.text.len())].matches('\n').count() + 1
    }

    /// Reads `value` (found at `key`) as a `T`. A key `T` does not have is
    /// not reported here but returned, each with its full path and line, for
    /// the caller to say whose key it is ([`Validator::unknown_key`]); a value
    /// of the wrong type is a problem, with its line. `None` when it cannot be read.
    pub fn read<T: DeserializeOwned>(
        &mut self,
        key: &str,
        value: Spanned<DeValue<'_>>,
    ) -> (Option<T>, Vec<Unknown>) {
        let spans = KeySpans::of(&value);
        let mut ignored = Vec::new();
        let mut track = serde_path_to_error::Track::new();
        let result = {
            let de = toml::de::ValueDeserializer::from(value);
            let de = serde_path_to_error::Deserializer::new(de, &mut track);
            serde_ignored::deserialize(de, |path| ignored.push(segments(&path)))
        };
        let mut unknown: Vec<Unknown> = ignored
            .into_iter()
            .map(|path| Unknown {
                key: join(key, &path),
                line: spans.find(&path).map(|at| self.line(at)),
                path,
            })
            .collect();
        unknown.sort_by_key(|u| u.line);
        match result {
            Ok(v) => (Some(v), unknown),
            Err(e) => {
                let path = track.path().to_string();
                let at = if path == "." || path.is_empty() {
                    key.to_string()
                } else if path.starts_with('[') {
                    format!("{key}{path}")
                } else {
                    format!("{key}.{path}")
                };
                let mut message = e.message().to_string();
                if let Some(span) = e.span() {
                    message = format!("{message} (line {})", self.line(span.start));
                }
                self.problem(&at, message);
                (None, unknown)
            }
        }
    }

    /// Reports a key the section does not know, with the keys it takes
    /// there (`expected`); `owner` says where it belongs instead, when it is
    /// another kind's key.
    pub fn unknown_key(&mut self, unknown: &Unknown, expected: &[&str], owner: Option<&str>) {
        let mut message = match owner {
            Some(owner) => format!("unknown key: it is a key of {owner}"),
            None if expected.is_empty() => "unknown key".to_string(),
            None => format!(
                "unknown key, expected one of {}",
                expected
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        if let Some(line) = unknown.line {
            message = format!("{message} (line {line})");
        }
        self.problem(&unknown.key, message);
    }

    /// Reports a TOML syntax error: it stops the reading of the whole file.
    pub fn syntax(&mut self, e: &toml::de::Error) {
        let mut message = e.message().to_string();
        if let Some(span) = e.span() {
            message = format!("{message} (line {})", self.line(span.start));
        }
        self.problem("config", message);
    }
}

/// A key a section was given but does not have.
#[derive(Debug, Clone)]
pub struct Unknown {
    /// Its full path, e.g. `sources[1].columns.status`.
    pub key: String,
    /// The path inside the section read, e.g. `["columns", "status"]`.
    pub path: Vec<String>,
    /// Its line in the file.
    pub line: Option<usize>,
}

/// The keys a `T` takes at `path` (a table inside it when `path` is not
/// empty): whether `T` has a key another section was given.
pub fn knows<T: DeserializeOwned>(path: &[String]) -> bool {
    // Build the smallest table holding the key, read it as a T, and see
    // whether the key was ignored. Any value will do: a type error at the key
    // means the key is known.
    let mut text = String::new();
    if path.len() > 1 {
        text.push_str(&format!("[{}]\n", path[..path.len() - 1].join(".")));
    }
    let Some(last) = path.last() else {
        return false;
    };
    text.push_str(&format!("{last} = 0\n"));
    let Ok(de) = toml::Deserializer::parse(&text) else {
        return false;
    };
    let mut ignored = false;
    let _ = serde_ignored::deserialize(de, |_| ignored = true) as Result<T, _>;
    !ignored
}

impl Unknown {
    /// The path of the table that holds the key (empty: the section itself).
    pub fn parent(&self) -> &[String] {
        self.path.split_last().map_or(&[], |(_, parent)| parent)
    }
}

/// The keys the table at `path` inside a `T` takes (`path` empty: `T`'s
/// own), as serde declares them; empty where `T` has no struct there.
pub fn keys_at<T: DeserializeOwned>(path: &[String]) -> Vec<&'static str> {
    let mut found = None;
    let _ = T::deserialize(Probe {
        path,
        found: &mut found,
    });
    found.map(<[&str]>::to_vec).unwrap_or_default()
}

/// An entry read as several typed parts from the one table: the settings
/// every source has beside a kind's own, say. Each part reads the keys it
/// declares; a key is unknown when no part takes it.
pub trait Parts: Sized {
    /// Reads every part from `value` (found at `key`); the keys no part
    /// takes are returned as [`Validator::read`] returns them.
    fn read(
        v: &mut Validator<'_>,
        key: &str,
        value: Spanned<DeValue<'_>>,
    ) -> (Option<Self>, Vec<Unknown>);

    /// Whether a part takes the key at `path` ([`knows`]).
    fn knows(path: &[String]) -> bool;

    /// The keys the parts take in the table at `path`, part by part, each
    /// once ([`keys_at`]).
    fn keys_at(path: &[String]) -> Vec<&'static str>;
}

macro_rules! parts {
    ($($part:ident $value:ident),+) => {
        impl<$($part: DeserializeOwned),+> Parts for ($($part,)+) {
            fn read(
                v: &mut Validator<'_>,
                key: &str,
                value: Spanned<DeValue<'_>>,
            ) -> (Option<Self>, Vec<Unknown>) {
                let mut unknown = Vec::new();
                $(
                    let ($value, u) = v.read::<$part>(key, value.clone());
                    unknown.push(u);
                )+
                let read = match ($($value,)+) {
                    ($(Some($value),)+) => Some(($($value,)+)),
                    _ => None,
                };
                (read, unknown_to_all(&unknown))
            }

            fn knows(path: &[String]) -> bool {
                $(knows::<$part>(path))||+
            }

            fn keys_at(path: &[String]) -> Vec<&'static str> {
                let mut keys: Vec<&'static str> = Vec::new();
                $(
                    for k in keys_at::<$part>(path) {
                        if !keys.contains(&k) {
                            keys.push(k);
                        }
                    }
                )+
                keys
            }
        }
    };
}

parts!(A a, B b);
parts!(A a, B b, C c);

/// The keys no part takes, from what each part ignored: a path is unknown to
/// a part when the part ignored it or a table holding it; the most precise
/// path is kept, once, in the order of the file.
fn unknown_to_all(parts: &[Vec<Unknown>]) -> Vec<Unknown> {
    let ignored_by =
        |side: &[Unknown], path: &[String]| side.iter().any(|u| path.starts_with(&u.path));
    let mut out: Vec<Unknown> = Vec::new();
    for (i, mine) in parts.iter().enumerate() {
        for u in mine {
            let everywhere = parts
                .iter()
                .enumerate()
                .all(|(j, other)| j == i || ignored_by(other, &u.path));
            if everywhere && !out.iter().any(|o| o.path == u.path) {
                out.push(u.clone());
            }
        }
    }
    // A table reported whole by one part and key by key by another: keep the keys.
    let keys: Vec<Vec<String>> = out.iter().map(|u| u.path.clone()).collect();
    out.retain(|u| {
        !keys
            .iter()
            .any(|k| k.len() > u.path.len() && k.starts_with(&u.path))
    });
    out.sort_by_key(|u| u.line);
    out
}

/// A deserializer that walks `path` into a type's structs and records the
/// fields of the struct at its end.
struct Probe<'p, 'f> {
    path: &'p [String],
    found: &'f mut Option<&'static [&'static str]>,
}

impl<'de> serde::Deserializer<'de> for Probe<'_, '_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("not a struct"))
    }

    fn deserialize_option<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.path.split_first() {
            None => {
                *self.found = Some(fields);
                Err(serde::de::Error::custom("probed"))
            }
            Some((key, rest)) => visitor.visit_map(ProbeEntry {
                key: Some(key.as_str()),
                value: Some(Probe {
                    path: rest,
                    found: self.found,
                }),
            }),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The one entry of a probed table: the next key of the path.
struct ProbeEntry<'k, 'p, 'f> {
    key: Option<&'k str>,
    value: Option<Probe<'p, 'f>>,
}

impl<'de> serde::de::MapAccess<'de> for ProbeEntry<'_, '_, '_> {
    type Error = serde::de::value::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.key.take() {
            Some(k) => seed
                .deserialize(serde::de::value::StrDeserializer::<Self::Error>::new(k))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value.take() {
            Some(probe) => seed.deserialize(probe),
            None => Err(serde::de::Error::custom("no value")),
        }
    }
}

/// The keys of a path, without serde's `?` steps.
fn segments(path: &serde_ignored::Path<'_>) -> Vec<String> {
    use serde_ignored::Path;
    let mut out = match path {
        Path::Root => return Vec::new(),
        Path::Seq { parent, .. }
        | Path::Map { parent, .. }
        | Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segments(parent),
    };
    match path {
        Path::Seq { index, .. } => out.push(format!("[{index}]")),
        Path::Map { key, .. } => out.push(key.clone()),
        _ => {}
    }
    out
}

fn join(key: &str, path: &[String]) -> String {
    let mut out = key.to_string();
    for p in path {
        if !p.starts_with('[') && !out.is_empty() {
            out.push('.');
        }
        out.push_str(p);
    }
    out
}

/// Where each key of a table starts in the file, by path.
struct KeySpans(Vec<(Vec<String>, usize)>);

impl KeySpans {
    fn of(value: &Spanned<DeValue<'_>>) -> KeySpans {
        fn walk(
            table: &DeTable<'_>,
            prefix: &mut Vec<String>,
            out: &mut Vec<(Vec<String>, usize)>,
        ) {
            for (k, v) in table {
                prefix.push(k.get_ref().to_string());
                out.push((prefix.clone(), k.span().start));
                if let DeValue::Table(t) = v.get_ref() {
                    walk(t, prefix, out);
                }
                prefix.pop();
            }
        }
        let mut out = Vec::new();
        if let DeValue::Table(t) = value.get_ref() {
            walk(t, &mut Vec::new(), &mut out);
        }
        KeySpans(out)
    }

    fn find(&self, path: &[String]) -> Option<usize> {
        self.0.iter().find(|(p, _)| p == path).map(|(_, at)| *at)
    }
}

/// A parsed file whose top-level keys are taken one by one; what is left is unknown.
pub struct Document<'i> {
    root: DeTable<'i>,
    span: std::ops::Range<usize>,
}

impl<'i> Document<'i> {
    /// Parses TOML text; a syntax error is reported to `v`.
    pub fn parse(text: &'i str, v: &mut Validator<'_>) -> Option<Document<'i>> {
        match DeTable::parse(text) {
            Ok(root) => {
                let span = root.span();
                Some(Document {
                    root: root.into_inner(),
                    span,
                })
            }
            Err(e) => {
                v.syntax(&e);
                None
            }
        }
    }

    /// Takes the value of a top-level key.
    pub fn take(&mut self, key: &str) -> Option<Spanned<DeValue<'i>>> {
        let found = self.root.keys().find(|k| k.get_ref() == key)?.clone();
        self.root.remove(&found)
    }

    /// The top-level keys nobody took, with their lines.
    pub fn rest(self, v: &Validator<'_>) -> Vec<Unknown> {
        self.root
            .keys()
            .map(|k| Unknown {
                key: k.get_ref().to_string(),
                path: vec![k.get_ref().to_string()],
                line: Some(v.line(k.span().start)),
            })
            .collect()
    }

    /// The whole document as one value (for reading it at once).
    pub fn into_value(self) -> Spanned<DeValue<'i>> {
        Spanned::new(self.span, DeValue::Table(self.root))
    }
}

/// Replaces `${VAR}` with the variable's value; returns the name of the first unset one.
pub fn expand_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let var = &after[..end];
        match env(var) {
            Some(value) => out.push_str(&value),
            None => return Err(var.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A plain SQL identifier: it is interpolated (quoted) into queries.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && s.len() <= 63
}

/// An `owner`: a short word, as a label value Alertmanager routes on.
pub fn is_owner(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The message of an `owner` that [`is_owner`] refuses.
pub fn owner_problem(owner: &str) -> String {
    format!(
        "\"{owner}\" is not an owner: a short word of letters, digits, _, - and . (at most 63, starting with a letter or digit), e.g. \"team-payments\""
    )
}

/// `table` or `schema.table`, each part an identifier.
pub fn is_table_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 2 && parts.iter().all(|p| is_identifier(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Inner {
        a: Option<i64>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Outer {
        name: Option<String>,
        #[serde(default)]
        inner: Option<Inner>,
    }

    fn read(text: &str) -> (Option<Outer>, Vec<Unknown>, Vec<Problem>) {
        let env = |_: &str| None;
        let mut v = Validator::new(text, Environment::Process, &env);
        let doc = Document::parse(text, &mut v).expect("parses");
        let (value, unknown) = v.read::<Outer>("s", doc.into_value());
        (value, unknown, v.into_problems())
    }

    #[test]
    fn every_unknown_key_is_returned_with_its_path_and_line() {
        let (value, unknown, problems) = read("name = \"x\"\nnope = 1\n[inner]\na = 2\nb = 3\n");
        let value = value.expect("readable");
        assert_eq!(value.name.as_deref(), Some("x"));
        assert_eq!(value.inner.expect("inner").a, Some(2));
        assert!(problems.is_empty(), "{problems:?}");
        let found: Vec<(String, Option<usize>)> =
            unknown.into_iter().map(|u| (u.key, u.line)).collect();
        assert_eq!(
            found,
            vec![
                ("s.nope".to_string(), Some(2)),
                ("s.inner.b".to_string(), Some(5))
            ]
        );
    }

    #[test]
    fn a_wrong_type_is_a_problem_at_its_key_with_its_line() {
        let (value, _, problems) = read("name = \"x\"\n[inner]\na = \"two\"\n");
        assert!(value.is_none());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "s.inner.a");
        assert!(problems[0].message.ends_with("(line 3)"), "{problems:?}");
    }

    #[test]
    fn keys_at_lists_what_a_table_takes() {
        assert_eq!(keys_at::<Outer>(&[]), vec!["name", "inner"]);
        assert_eq!(keys_at::<Outer>(&["inner".into()]), vec!["a"]);
        assert!(keys_at::<Outer>(&["name".into()]).is_empty());
    }

    #[test]
    fn knows_tells_whose_key_it_is() {
        assert!(knows::<Outer>(&["name".into()]));
        assert!(knows::<Outer>(&["inner".into(), "a".into()]));
        assert!(!knows::<Outer>(&["inner".into(), "b".into()]));
        assert!(!knows::<Outer>(&["b".into()]));
    }

    #[derive(Debug, serde::Deserialize)]
    struct Other {
        other: Option<i64>,
        #[serde(default)]
        inner: Option<OtherInner>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct OtherInner {
        c: Option<i64>,
    }

    /// An entry read in parts: a key is unknown only when no part takes it,
    /// by its most precise path, and the keys listed are every part's.
    #[test]
    fn parts_share_one_table() {
        let text = "name = \"x\"\nother = 1\nnope = 2\n[inner]\na = 3\nc = 4\nb = 5\n";
        let env = |_: &str| None;
        let mut v = Validator::new(text, Environment::Process, &env);
        let doc = Document::parse(text, &mut v).expect("parses");
        let (read, unknown) = <(Outer, Other)>::read(&mut v, "s", doc.into_value());
        assert!(v.into_problems().is_empty());
        let (outer, other) = read.expect("readable");
        assert_eq!((outer.name.as_deref(), other.other), (Some("x"), Some(1)));
        assert_eq!(outer.inner.and_then(|i| i.a), Some(3));
        assert_eq!(other.inner.and_then(|i| i.c), Some(4));
        let found: Vec<&str> = unknown.iter().map(|u| u.key.as_str()).collect();
        assert_eq!(found, ["s.nope", "s.inner.b"]);
        assert_eq!(<(Outer, Other)>::keys_at(&[]), ["name", "inner", "other"]);
        assert_eq!(<(Outer, Other)>::keys_at(&["inner".into()]), ["a", "c"]);
        assert!(<(Outer, Other)>::knows(&["inner".into(), "c".into()]));
        assert!(!<(Outer, Other)>::knows(&["inner".into(), "b".into()]));
    }

    #[test]
    fn identifiers_are_checked_before_they_reach_sql() {
        assert!(is_table_name("public.inbox"));
        assert!(!is_table_name("inbox; drop table x"));
        assert!(!is_identifier("a\"b"));
        assert!(!is_identifier(""));
    }
}
