//! The `kind = "kafka"` source's settings, validated. The settings every
//! source has (name, owner, service, poll interval, timeout) are read and
//! checked by [`crate::sources::common`]; a Kafka source embeds them.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;

use serde::Deserialize;

use super::shards::{MAX_SHARDS, Shards};
use crate::dsn::{Dialect, Dsn};
use crate::sources::common::{self, Common, Defaults, RawCommon};
use crate::sources::common::{RawTls, tls_config};
use crate::sources::lag_status::status_window;
use crate::validation::{
    Environment, Validator, expand_env, is_owner, is_table_name, owner_problem,
};

/// Default pattern of dead-letter topic names.
pub const DEFAULT_DEAD_LETTER_TOPICS: &str = r".*(\.DLQ|-dlq|\.dead-letter)$";
/// Default pattern of retry topic names; `tier` names the retry delay.
pub const DEFAULT_RETRY_TOPICS: &str = r".*\.retry\.(?P<tier>[0-9]+[smh])$";

/// A validated Kafka source. It embeds the settings every source has:
/// `spec.name` (the `cluster` label of its series), `spec.poll_interval`,
/// `spec.timeout` (the longest time one cycle may take) and the others are
/// [`Common`]'s.
#[derive(Debug, Clone)]
pub struct KafkaSpec {
    /// Name, owner, service, poll interval, timeout.
    pub common: Common,
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    pub groups: Filter,
    pub topics: Filter,
    /// Drop the `partition` label (sums and maxima per topic).
    pub per_topic: bool,
    pub dead_letter_topics: Regex,
    pub retry_topics: Regex,
    /// The window a group's status is judged over.
    pub status_window: Duration,
    /// Concurrent fetches of the records at committed offsets.
    pub read_concurrency: usize,
    pub client_id: String,
    pub security: KafkaSecurity,
    /// `[[sources.owners]]`: group name patterns (whole names) and their
    /// owner, first match wins; the groups none matches are the source's `owner`.
    pub owners: Vec<(Regex, String)>,
    /// `[sources.dead_letter_actions]`: what `dead-letters replay --topic`
    /// produces with and audits to; never used by `run`.
    pub actions: Option<Box<KafkaActions>>,
    /// `shards`: the consumer groups split over the agents present.
    pub shards: Shards,
}

/// A validated `[sources.dead_letter_actions]` of a Kafka source.
#[derive(Debug, Clone)]
pub struct KafkaActions {
    /// The write credentials (TLS, SASL) the replay connects with. Private
    /// to the Kafka unit: only `replay` opens a connection with them, and
    /// the agent's poll never does.
    pub(in crate::sources::kafka) security: KafkaSecurity,
    /// `audit_dsn`: where each record sent back is recorded; `None`: the
    /// replay is refused.
    pub(in crate::sources::kafka) audit_dsn: Option<Dsn>,
    /// The audit table, possibly `schema.table`.
    pub audit_table: String,
    /// The `[sources.dead_letter_actions]` key (`sources[2].dead_letter_actions`), for errors.
    pub key: String,
}

impl KafkaActions {
    /// The audit DSN's dialect, when one is configured.
    pub fn audit_dialect(&self) -> Option<Dialect> {
        self.audit_dsn.as_ref().map(Dsn::dialect)
    }
}

impl Deref for KafkaSpec {
    type Target = Common;

    /// The embedded settings every source has, read as the spec's own.
    fn deref(&self) -> &Common {
        &self.common
    }
}

impl KafkaSpec {
    /// The owner of consumer group `group`: the first `owners` entry whose
    /// pattern matches its whole name, else the source's owner, else "".
    pub fn owner_of(&self, group: &str) -> &str {
        owner_of(
            &self.owners,
            self.owner.as_deref().unwrap_or_default(),
            group,
        )
    }
}

/// The owner of `group`: the first of `owners` whose pattern matches it, else `default`.
pub fn owner_of<'a>(owners: &'a [(Regex, String)], default: &'a str, group: &str) -> &'a str {
    owners
        .iter()
        .find(|(r, _)| r.is_match(group))
        .map_or(default, |(_, o)| o.as_str())
}

/// Include / exclude regexes, anchored on whole names.
#[derive(Debug, Clone)]
pub struct Filter {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl Filter {
    pub fn matches(&self, name: &str) -> bool {
        self.include.iter().any(|r| r.is_match(name))
            && !self.exclude.iter().any(|r| r.is_match(name))
    }

    /// The names the include patterns spell out plainly (no regex operator
    /// but `.`, which matches itself too, and `\` escapes), that the filter
    /// keeps: the groups watched on brokers that cannot list groups.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .include
            .iter()
            .filter_map(|r| plain_name(r.as_str()))
            .filter(|n| self.matches(n))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every name.
    pub fn all() -> Filter {
        Filter {
            include: vec![Regex::new("^.*$").expect("valid")],
            exclude: Vec::new(),
        }
    }
}

/// TLS and SASL settings.
#[derive(Clone, Default)]
pub struct KafkaSecurity {
    pub tls: Option<TlsSettings>,
    pub sasl: Option<SaslSettings>,
}

impl fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

#[derive(Clone)]
pub struct TlsSettings {
    pub client_config: Arc<rustls::ClientConfig>,
}

#[derive(Debug, Clone)]
pub struct SaslSettings {
    pub mechanism: SaslMechanism,
    pub credentials: Credentials,
}

/// What a mechanism authenticates with.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// PLAIN and SCRAM.
    Password { username: String, password: Secret },
    /// OAUTHBEARER.
    Token(TokenSettings),
}

/// Where OAUTHBEARER's token comes from, and the KIP-342 extensions sent
/// with it.
#[derive(Debug, Clone)]
pub struct TokenSettings {
    pub source: TokenSource,
    /// `[sources.sasl.extensions]`, by name.
    pub extensions: Vec<(String, String)>,
    /// The `[sources.sasl]` key of the source (`sources[2].sasl`), for errors.
    pub key: String,
}

impl TokenSettings {
    /// The full key of the token's source (`sources[2].sasl.token_file`).
    pub fn source_key(&self) -> String {
        match self.source {
            TokenSource::File(_) => format!("{}.token_file", self.key),
            TokenSource::Command { .. } => format!("{}.token_command", self.key),
        }
    }
}

/// `token_file` or `token_command`.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// Read at every authentication, so a rotated token is used from the next.
    File(std::path::PathBuf),
    /// Run (no shell) with a timeout; its standard output is the token.
    Command {
        argv: Vec<String>,
        timeout: Duration,
    },
}

/// A secret: never printed.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl SaslMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// The mechanism sends its secret as it is (a password, a bearer
    /// token): readable on the wire without TLS.
    pub fn sends_secret_in_clear(self) -> bool {
        matches!(self, SaslMechanism::Plain | SaslMechanism::OAuthBearer)
    }
}

/// A `kind = "kafka"` entry's own keys as written, besides those every
/// source has ([`RawCommon`]; for Kafka, `timeout` bounds connecting to a
/// broker and one request).
#[derive(Debug, Default, Deserialize)]
pub struct RawKafka {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Option<Vec<String>>,
    /// Consumer groups to watch (default all).
    pub groups: Option<RawFilter>,
    /// Topics to watch (default all except internal ones).
    pub topics: Option<RawFilter>,
    /// `partition` (default) or `topic`.
    pub granularity: Option<String>,
    /// Regex of dead-letter topic names.
    pub dead_letter_topics: Option<String>,
    /// Regex of retry topic names, with a named group `tier`.
    pub retry_topics: Option<String>,
    /// The sliding window a group's status is judged over (default `5m`).
    pub status_window: Option<String>,
    /// Concurrent fetches of records at committed offsets (default 8).
    pub read_concurrency: Option<i64>,
    /// The client id the agent's requests carry (default `inboxwatch`).
    pub client_id: Option<String>,
    /// TLS to the brokers.
    pub tls: Option<RawTls>,
    /// SASL authentication.
    pub sasl: Option<RawSasl>,
    /// Owners of consumer groups by name pattern, first match wins.
    pub owners: Option<Vec<RawOwner>>,
    /// What `inboxwatch dead-letters replay --topic` produces with and
    /// audits to.
    pub dead_letter_actions: Option<RawKafkaActions>,
    /// The consumer groups split into this many shards over the agents
    /// (`"auto"`: one per agent present).
    pub shards: Option<RawShards>,
}

/// `shards` as written: a number or a word.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawShards {
    Count(i64),
    Word(String),
}

/// `[sources.dead_letter_actions]` of a Kafka source: the write credentials
/// of `dead-letters replay --topic` (never used by `run`) and the database
/// its audit rows go to.
#[derive(Debug, Default, Deserialize)]
pub struct RawKafkaActions {
    /// TLS of the write connection (a client certificate: `cert_file`,
    /// `key_file`); same keys as the source's `[sources.tls]`.
    pub tls: Option<RawTls>,
    /// SASL of the write connection (a user allowed to produce); same keys
    /// as the source's `[sources.sasl]`.
    pub sasl: Option<RawSasl>,
    /// PostgreSQL, MariaDB/MySQL or SQLite connection string of the audit
    /// table; without it (and `audit_dsn_file`) a replay is refused.
    pub audit_dsn: Option<String>,
    /// A file whose content is that DSN; instead of `audit_dsn`.
    pub audit_dsn_file: Option<String>,
    /// Where each record sent back is recorded (default `inboxwatch_dead_letter_actions`).
    pub audit_table: Option<String>,
}

/// One `[[sources.owners]]` entry of a Kafka source.
#[derive(Debug, Default, Deserialize)]
pub struct RawOwner {
    /// Regex matched against whole group names.
    pub groups: Option<String>,
    /// The owner of the groups it matches.
    pub owner: Option<String>,
}

/// `{ include = [...], exclude = [...] }`: regexes matched against whole names.
#[derive(Debug, Default, Deserialize)]
pub struct RawFilter {
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
}

/// `[sources.sasl]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawSasl {
    /// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` or `OAUTHBEARER`.
    pub mechanism: Option<String>,
    /// PLAIN and SCRAM: the user.
    pub username: Option<String>,
    /// PLAIN and SCRAM; `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
    /// OAUTHBEARER: a file whose content is the token, read at every
    /// authentication.
    pub token_file: Option<String>,
    /// OAUTHBEARER: a command (program and arguments, no shell) whose
    /// standard output is the token; instead of `token_file`.
    pub token_command: Option<Vec<String>>,
    /// How long `token_command` may run (default `10s`).
    pub token_command_timeout: Option<String>,
    /// OAUTHBEARER: SASL extensions (KIP-342) sent with the token, name =
    /// value; `${VAR}` in a value is replaced by the environment variable VAR.
    pub extensions: Option<std::collections::BTreeMap<String, String>>,
}

/// The settings every source has, as a Kafka source reads them: the cluster
/// read every 10 s, within a timeout of the poll interval, at least 5 s;
/// no objectives.
const COMMON: Defaults = Defaults {
    kind: "kafka",
    poll_interval: Duration::from_secs(10),
    timeout_floor: Duration::from_secs(5),
    objectives: &[],
};

/// Validates a `kind = "kafka"` entry.
pub(crate) fn validate(
    v: &mut Validator<'_>,
    key: &str,
    name: String,
    (common, s): (RawCommon, RawKafka),
) -> Option<KafkaSpec> {
    let brokers = brokers(v, key, s.brokers.as_deref());
    let groups = filter(v, &format!("{key}.groups"), s.groups.as_ref(), &[]);
    let topics = filter(v, &format!("{key}.topics"), s.topics.as_ref(), &["__.*"]);
    let per_topic = per_topic(v, key, s.granularity.as_deref());
    let dead_letter_topics = regex(
        v,
        &format!("{key}.dead_letter_topics"),
        s.dead_letter_topics
            .as_deref()
            .unwrap_or(DEFAULT_DEAD_LETTER_TOPICS),
    );
    let retry_topics = retry_topics(v, key, s.retry_topics.as_deref());
    let common = common::check(common, key, name, &COMMON, v);
    let status_window = status_window(v, key, s.status_window.as_deref(), common.poll_interval);
    let read_concurrency = v.positive(
        &format!("{key}.read_concurrency"),
        s.read_concurrency,
        8,
        256,
    );
    let client_id = s.client_id.clone().unwrap_or_else(|| "inboxwatch".into());
    let security = security(v, key, &s);
    let owners = owners(v, key, s.owners.as_deref().unwrap_or_default());
    let shards = shards(v, key, s.shards.as_ref());
    let before = v.count();
    let actions = s
        .dead_letter_actions
        .as_ref()
        .map(|a| actions(v, &format!("{key}.dead_letter_actions"), a));
    if v.count() > before {
        return None;
    }
    let (Some(dead_letter_topics), Some(retry_topics), Some(groups), Some(topics), Some(security)) =
        (dead_letter_topics, retry_topics, groups, topics, security)
    else {
        return None;
    };
    Some(KafkaSpec {
        common,
        brokers,
        groups,
        topics,
        per_topic,
        dead_letter_topics,
        retry_topics,
        status_window,
        read_concurrency,
        client_id,
        security,
        owners,
        actions: actions.flatten().map(Box::new),
        shards,
    })
}

/// `shards`: 1 (the default), 2 to [`MAX_SHARDS`], or `"auto"`.
fn shards(v: &mut Validator<'_>, key: &str, raw: Option<&RawShards>) -> Shards {
    match raw {
        None | Some(RawShards::Count(1)) => Shards::One,
        Some(RawShards::Count(n)) if (2..=i64::from(MAX_SHARDS)).contains(n) => {
            Shards::Fixed(*n as u32)
        }
        Some(RawShards::Word(w)) if w == "auto" => Shards::Auto,
        Some(other) => {
            let got = match other {
                RawShards::Count(n) => n.to_string(),
                RawShards::Word(w) => format!("\"{w}\""),
            };
            v.problem(
                &format!("{key}.shards"),
                format!("must be a number of shards from 1 to {MAX_SHARDS}, or \"auto\" (one per agent present), got {got}"),
            );
            Shards::One
        }
    }
}

/// Checks `[sources.dead_letter_actions]` at key `at`.
fn actions(v: &mut Validator<'_>, at: &str, raw: &RawKafkaActions) -> Option<KafkaActions> {
    let before = v.count();
    let security = security_of(v, at, raw.tls.as_ref(), raw.sasl.as_ref());
    let audit_dsn = match (&raw.audit_dsn, &raw.audit_dsn_file) {
        (None, None) => None,
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{at}.audit_dsn_file"),
                "give either audit_dsn or audit_dsn_file, not both".into(),
            );
            None
        }
        (Some(text), None) => audit_dsn(v, &format!("{at}.audit_dsn"), text),
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(text) => audit_dsn(v, &format!("{at}.audit_dsn_file"), text.trim()),
            Err(e) => {
                v.problem(
                    &format!("{at}.audit_dsn_file"),
                    format!("cannot read \"{path}\": {e}"),
                );
                None
            }
        },
    };
    let audit_table = match raw.audit_table.as_deref() {
        None => crate::sources::kind::DEFAULT_AUDIT_TABLE.to_string(),
        Some(t) if is_table_name(t) => t.to_string(),
        Some(t) => {
            v.problem(
                &format!("{at}.audit_table"),
                format!(
                    "\"{t}\" is not a table name (letters, digits, _ and $, optionally schema.table)"
                ),
            );
            String::new()
        }
    };
    if v.count() > before {
        return None;
    }
    Some(KafkaActions {
        security: security?,
        audit_dsn,
        audit_table,
        key: at.to_string(),
    })
}

/// The audit DSN written at `at`.
fn audit_dsn(v: &mut Validator<'_>, at: &str, text: &str) -> Option<Dsn> {
    if v.environment() == Environment::Placeholders && text.trim_start().starts_with("${") {
        // The scheme, and so everything, comes from a variable.
        return Some(Dsn::refused());
    }
    match Dsn::expand(text, v.env()) {
        Ok(d) => Some(d),
        Err(e) => {
            v.problem(at, e.to_string());
            None
        }
    }
}

/// `brokers`: required, at least one, each `host:port`.
fn brokers(v: &mut Validator<'_>, key: &str, written: Option<&[String]>) -> Vec<String> {
    let Some(brokers) = written else {
        v.problem(
            &format!("{key}.brokers"),
            "required (host:port, ...)".into(),
        );
        return Vec::new();
    };
    if brokers.is_empty() {
        v.problem(
            &format!("{key}.brokers"),
            "needs at least one broker".into(),
        );
    }
    for (i, addr) in brokers.iter().enumerate() {
        let ok = addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !ok {
            v.problem(
                &format!("{key}.brokers[{i}]"),
                format!("\"{addr}\" is not host:port"),
            );
        }
    }
    brokers.to_vec()
}

/// `granularity`: whether the `partition` label is dropped (`"topic"`).
fn per_topic(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> bool {
    match written {
        None | Some("partition") => false,
        Some("topic") => true,
        Some(other) => {
            v.problem(
                &format!("{key}.granularity"),
                format!("unknown granularity \"{other}\" (expected partition or topic)"),
            );
            false
        }
    }
}

/// `retry_topics`: a pattern with a named group `tier`.
fn retry_topics(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Option<Regex> {
    let at = format!("{key}.retry_topics");
    let pattern = regex(v, &at, written.unwrap_or(DEFAULT_RETRY_TOPICS));
    if let Some(r) = &pattern
        && !r.capture_names().any(|n| n == Some("tier"))
    {
        v.problem(
            &at,
            "needs a named group (?P<tier>...) that extracts the retry tier".into(),
        );
    }
    pattern
}

/// `[[sources.owners]]`: each a pattern of group names and its owner.
fn owners(v: &mut Validator<'_>, key: &str, written: &[RawOwner]) -> Vec<(Regex, String)> {
    let mut owners = Vec::new();
    for (i, o) in written.iter().enumerate() {
        let at = format!("{key}.owners[{i}]");
        let pattern = match o.groups.as_deref() {
            Some(g) => regex(v, &format!("{at}.groups"), g),
            None => {
                v.problem(
                    &format!("{at}.groups"),
                    "required (a regex of group names)".into(),
                );
                None
            }
        };
        let team = match o.owner.as_deref() {
            Some(t) if is_owner(t) => Some(t.to_string()),
            Some(t) => {
                v.problem(&format!("{at}.owner"), owner_problem(t));
                None
            }
            None => {
                v.problem(&format!("{at}.owner"), "required".into());
                None
            }
        };
        if let (Some(p), Some(t)) = (pattern, team) {
            owners.push((p, t));
        }
    }
    owners
}

/// The name a compiled pattern `^(?:…)$` spells out, if it is a plain
/// name: no operator but `.` (and `\`-escaped characters).
fn plain_name(anchored: &str) -> Option<String> {
    let text = anchored.strip_prefix("^(?:")?.strip_suffix(")$")?;
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let e = chars.next()?;
                if e.is_ascii_alphanumeric() {
                    // \d, \w, \b, …: classes and assertions.
                    return None;
                }
                out.push(e);
            }
            '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => return None,
            c => out.push(c),
        }
    }
    (!out.is_empty()).then_some(out)
}

fn regex(v: &mut Validator<'_>, key: &str, text: &str) -> Option<Regex> {
    match Regex::new(&format!("^(?:{text})$")) {
        Ok(r) => Some(r),
        Err(e) => {
            let first = e
                .to_string()
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string();
            v.problem(
                key,
                format!("invalid regular expression \"{text}\": {first}"),
            );
            None
        }
    }
}

fn filter(
    v: &mut Validator<'_>,
    key: &str,
    raw: Option<&RawFilter>,
    default_exclude: &[&str],
) -> Option<Filter> {
    let include: Vec<String> = raw
        .and_then(|r| r.include.clone())
        .unwrap_or_else(|| vec![".*".into()]);
    let exclude: Vec<String> = raw
        .and_then(|r| r.exclude.clone())
        .unwrap_or_else(|| default_exclude.iter().map(|s| s.to_string()).collect());
    let mut ok = true;
    let mut compile = |list: &[String], which: &str| -> Vec<Regex> {
        list.iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let r = regex(v, &format!("{key}.{which}[{i}]"), t);
                ok &= r.is_some();
                r
            })
            .collect()
    };
    let include = compile(&include, "include");
    let exclude = compile(&exclude, "exclude");
    ok.then_some(Filter { include, exclude })
}

fn security(v: &mut Validator<'_>, key: &str, s: &RawKafka) -> Option<KafkaSecurity> {
    security_of(v, key, s.tls.as_ref(), s.sasl.as_ref())
}

/// `tls` and `sasl` under `key`: the source's, or its dead-letter actions'.
fn security_of(
    v: &mut Validator<'_>,
    key: &str,
    tls: Option<&RawTls>,
    sasl_raw: Option<&RawSasl>,
) -> Option<KafkaSecurity> {
    let mut out = KafkaSecurity::default();
    let mut ok = true;
    if let Some(t) = tls {
        match tls_config(t) {
            Ok(c) => {
                out.tls = Some(TlsSettings {
                    client_config: Arc::new(c),
                })
            }
            Err((k, message)) => {
                v.problem(&format!("{key}.tls.{k}"), message);
                ok = false;
            }
        }
    }
    if let Some(sa) = sasl_raw {
        match sasl(v, &format!("{key}.sasl"), sa) {
            Some(settings) => out.sasl = Some(settings),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Validates `[sources.sasl]` at key `sk`.
fn sasl(v: &mut Validator<'_>, sk: &str, sa: &RawSasl) -> Option<SaslSettings> {
    const EXPECTED: &str = "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER";
    let mechanism = match sa.mechanism.as_deref() {
        Some("PLAIN") => SaslMechanism::Plain,
        Some("SCRAM-SHA-256") => SaslMechanism::ScramSha256,
        Some("SCRAM-SHA-512") => SaslMechanism::ScramSha512,
        Some("OAUTHBEARER") => SaslMechanism::OAuthBearer,
        Some(other) => {
            v.problem(
                &format!("{sk}.mechanism"),
                format!("unknown SASL mechanism \"{other}\" (expected {EXPECTED})"),
            );
            return None;
        }
        None => {
            v.problem(&format!("{sk}.mechanism"), format!("required ({EXPECTED})"));
            return None;
        }
    };
    let credentials = if mechanism == SaslMechanism::OAuthBearer {
        for (name, given) in [
            ("username", sa.username.is_some()),
            ("password", sa.password.is_some()),
            ("password_file", sa.password_file.is_some()),
        ] {
            if given {
                v.problem(
                    &format!("{sk}.{name}"),
                    "not used with OAUTHBEARER (the token names the principal)".into(),
                );
            }
        }
        Credentials::Token(token_settings(v, sk, sa)?)
    } else {
        for (name, given) in [
            ("token_file", sa.token_file.is_some()),
            ("token_command", sa.token_command.is_some()),
            ("token_command_timeout", sa.token_command_timeout.is_some()),
            ("extensions", sa.extensions.is_some()),
        ] {
            if given {
                v.problem(
                    &format!("{sk}.{name}"),
                    "only with mechanism = \"OAUTHBEARER\"".into(),
                );
            }
        }
        password_credentials(v, sk, sa)?
    };
    Some(SaslSettings {
        mechanism,
        credentials,
    })
}

/// `username` with `password` or `password_file` (PLAIN, SCRAM).
fn password_credentials(v: &mut Validator<'_>, sk: &str, sa: &RawSasl) -> Option<Credentials> {
    let env = v.env();
    let username = match sa.username.as_deref() {
        Some(u) if !u.is_empty() => match expand_env(u, env) {
            Ok(u) => Some(u),
            Err(var) => {
                v.problem(
                    &format!("{sk}.username"),
                    format!("environment variable {var} is not set"),
                );
                None
            }
        },
        _ => {
            v.problem(&format!("{sk}.username"), "required".into());
            None
        }
    };
    let password = match (&sa.password, &sa.password_file) {
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{sk}.password_file"),
                "give either password or password_file, not both".into(),
            );
            None
        }
        (Some(p), None) => match expand_env(p, env) {
            Ok(p) => Some(p),
            Err(var) => {
                v.problem(
                    &format!("{sk}.password"),
                    format!("environment variable {var} is not set"),
                );
                None
            }
        },
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(p) => Some(p.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) => {
                v.problem(
                    &format!("{sk}.password_file"),
                    format!("cannot read \"{path}\": {e}"),
                );
                None
            }
        },
        (None, None) => {
            v.problem(
                &format!("{sk}.password"),
                "required (or password_file)".into(),
            );
            None
        }
    };
    Some(Credentials::Password {
        username: username?,
        password: Secret(password?),
    })
}

/// `token_file` or `token_command`, and `extensions` (OAUTHBEARER). The
/// token itself is read when a connection authenticates, not here.
fn token_settings(v: &mut Validator<'_>, sk: &str, sa: &RawSasl) -> Option<TokenSettings> {
    let timeout_key = format!("{sk}.token_command_timeout");
    let timeout = v.duration(
        &timeout_key,
        sa.token_command_timeout.as_deref(),
        Duration::from_secs(10),
    );
    if timeout.is_zero() || timeout > Duration::from_secs(300) {
        v.problem(&timeout_key, "must be between 1ms and 5m".into());
    }
    let source = match (&sa.token_file, &sa.token_command) {
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{sk}.token_command"),
                "give either token_file or token_command, not both".into(),
            );
            None
        }
        (Some(path), None) if path.is_empty() => {
            v.problem(&format!("{sk}.token_file"), "must not be empty".into());
            None
        }
        (Some(path), None) => Some(TokenSource::File(path.into())),
        (None, Some(argv)) if argv.first().is_none_or(|p| p.is_empty()) => {
            v.problem(
                &format!("{sk}.token_command"),
                "needs a program: [\"/path/to/program\", \"argument\", ...]".into(),
            );
            None
        }
        (None, Some(argv)) => Some(TokenSource::Command {
            argv: argv.clone(),
            timeout,
        }),
        (None, None) => {
            v.problem(
                &format!("{sk}.token_file"),
                "required with OAUTHBEARER (or token_command)".into(),
            );
            None
        }
    };
    if sa.token_command_timeout.is_some() && sa.token_command.is_none() {
        v.problem(&timeout_key, "only with token_command".into());
    }
    let env = v.env();
    let mut extensions = Vec::new();
    let mut ok = true;
    for (name, value) in sa.extensions.iter().flatten() {
        let at = format!("{sk}.extensions.{name}");
        // RFC 7628 §3.1: key = 1*(ALPHA); "auth" is the token's own key.
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphabetic()) {
            v.problem(&at, "an extension name is letters only (RFC 7628)".into());
            ok = false;
            continue;
        }
        if name == "auth" {
            v.problem(&at, "\"auth\" is reserved for the token".into());
            ok = false;
            continue;
        }
        match expand_env(value, env) {
            // RFC 7628 §3.1: value = *(VCHAR / SP / HTAB / CR / LF).
            Ok(value)
                if !value.is_empty()
                    && value
                        .bytes()
                        .all(|b| (0x21..=0x7e).contains(&b) || b" \t\r\n".contains(&b)) =>
            {
                extensions.push((name.clone(), value));
            }
            Ok(_) => {
                v.problem(
                    &at,
                    "an extension value is printable ASCII, spaces, tabs and line breaks, not empty (RFC 7628)".into(),
                );
                ok = false;
            }
            Err(var) => {
                v.problem(&at, format!("environment variable {var} is not set"));
                ok = false;
            }
        }
    }
    Some(TokenSettings {
        source: source?,
        extensions: ok.then_some(extensions)?,
        key: sk.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(include: &[&str], exclude: &[&str]) -> Filter {
        let compile = |l: &[&str]| -> Vec<Regex> {
            l.iter()
                .map(|t| Regex::new(&format!("^(?:{t})$")).unwrap())
                .collect()
        };
        Filter {
            include: compile(include),
            exclude: compile(exclude),
        }
    }

    /// Guards the groups watched on brokers without ListGroups: only the
    /// include entries that spell out one name, and not the excluded ones.
    #[test]
    fn plain_include_entries_are_names_and_patterns_are_not() {
        let f = filter(
            &[
                "billing",
                "orders.consumer",
                r"audit\.v2",
                "pay-.*",
                "a|b",
                r"\d+",
                "legacy",
                "billing",
            ],
            &["legacy"],
        );
        assert_eq!(f.names(), ["audit.v2", "billing", "orders.consumer"]);
        assert!(Filter::all().names().is_empty());
    }
}
