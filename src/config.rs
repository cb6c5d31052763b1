//! The TOML configuration: what the file may say ([`RawConfig`]) and what the
//! agent runs on once every key has been checked ([`Config`]).
//!
//! Parsing and validation are two steps so that one run reports every problem,
//! each line naming its full key (`sources[1].columns.updated_at: …`).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use crate::dsn::{Dsn, DsnError, redact};

/// Where `run` listens when neither the config nor a flag says otherwise.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9469";

/// How long shutdown may take when the config does not say.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

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

// ---------------------------------------------------------------------------
// What the file may say.

/// The file as written. Every table denies unknown keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The HTTP listener.
    #[serde(default)]
    pub server: RawServer,
    /// The watched sources.
    #[serde(default)]
    pub sources: Vec<RawSource>,
    /// OTLP export of linked spans; absent: no spans.
    pub tracing: Option<crate::tracing_link::config::RawTracing>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Address of the `/metrics`, `/healthz`, `/readyz` listener (default `0.0.0.0:9469`).
    pub listen: Option<String>,
    /// How long shutdown may take, from SIGTERM to exit (default `20s`).
    pub shutdown_grace: Option<String>,
    /// Poll sessions per database (and statement timeout), shared by every
    /// source on it (default 4); the locks add one session per database.
    pub max_connections_per_database: Option<i64>,
    /// Time a client has to send a request's headers, from connecting or from
    /// its previous response; also how long an idle keep-alive connection is kept (default `10s`).
    pub header_read_timeout: Option<String>,
    /// A connection that moves no byte either way for this long is closed (default `60s`).
    pub idle_timeout: Option<String>,
    /// HTTP connections served at once; more wait until one closes (default 256).
    pub max_http_connections: Option<i64>,
}

/// One `[[sources]]` entry; which keys apply depends on `kind`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// Unique name; becomes the `source` label.
    pub name: Option<String>,
    /// `inbox` or `outbox`.
    pub kind: Option<String>,
    /// Connection string; the scheme picks the dialect (`postgres://`, `mysql://`, `sqlite://`).
    /// `${VAR}` is replaced by the environment variable VAR, percent-encoded
    /// where it lands in the user, password or a query value.
    pub dsn: Option<String>,
    /// A file whose content is the DSN (a mounted secret); instead of `dsn`.
    pub dsn_file: Option<String>,
    /// The watched table, optionally schema-qualified (`schema.table`).
    pub table: Option<String>,
    /// How often the source is polled (default `5s`).
    pub poll_interval: Option<String>,
    /// How late a transaction may commit and still be counted (default `30s`).
    pub overlap: Option<String>,
    /// Rows in processing for longer than this are stuck (default `10m`).
    pub stuck_after: Option<String>,
    /// Statement timeout of one poll (default: the poll interval, at least 1s).
    pub timeout: Option<String>,
    /// Sliding window of the quantile gauges (default `5m`).
    pub quantile_window: Option<String>,
    /// How long the state of a finished event is remembered to count late duplicates (default `15m`).
    pub state_retention: Option<String>,
    /// How often the gauges kept from the tailed rows are checked against an
    /// aggregate over the unfinished rows, which catches deleted rows (default `1m`).
    pub reconcile_every: Option<String>,
    /// Distinct `event_type` label values kept; the rest fold into `other` (default 50).
    pub event_type_limit: Option<i64>,
    /// Upper bound on events whose state is remembered, and on the backlog
    /// kept for the gauges (default 400000: both maps then stay within 2^19
    /// buckets, 45 MiB, and one inbox source fits the DaemonSet's 128Mi;
    /// docs/performance.md, "Memory").
    pub max_tracked_events: Option<i64>,
    /// Rows fetched per query page (default 5000).
    pub batch_size: Option<i64>,
    /// Largest growth of `attempts` or `deliveries` in one change that is
    /// believed (default 1000); a larger one is rejected as `implausible_count`.
    pub max_count_jump: Option<i64>,
    /// `service.name` of the spans emitted for this consumer.
    pub service_name: Option<String>,
    /// Column names by meaning.
    #[serde(default)]
    pub columns: RawColumns,
    /// Status words by meaning (inbox only).
    pub statuses: Option<RawStatuses>,
    /// Objectives exported as gauges for the alert rules.
    #[serde(default)]
    pub objectives: RawObjectives,
    /// Kafka: bootstrap brokers, `host:port`.
    pub brokers: Option<Vec<String>>,
    /// Kafka: consumer groups to watch (default all).
    pub groups: Option<RawFilter>,
    /// Kafka: topics to watch (default all except internal ones).
    pub topics: Option<RawFilter>,
    /// Kafka: `partition` (default) or `topic`.
    pub granularity: Option<String>,
    /// Kafka: regex of dead-letter topic names.
    pub dead_letter_topics: Option<String>,
    /// Kafka: regex of retry topic names, with a named group `tier`.
    pub retry_topics: Option<String>,
    /// Kafka: the sliding window a group's status is judged over (default `5m`).
    pub status_window: Option<String>,
    /// Kafka: concurrent fetches of records at committed offsets (default 8).
    pub read_concurrency: Option<i64>,
    /// Kafka: the client id the agent's requests carry (default `inboxwatch`).
    pub client_id: Option<String>,
    /// Kafka: TLS to the brokers.
    pub tls: Option<RawTls>,
    /// Kafka: SASL authentication.
    pub sasl: Option<RawSasl>,
    /// How this consumer's spans describe it (with `[tracing]`).
    pub trace: Option<crate::tracing_link::config::RawSourceTrace>,
}

/// `{ include = [...], exclude = [...] }`: regexes matched against whole names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFilter {
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
}

/// `[sources.tls]`: present means the brokers are reached over TLS.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM file of the CA(s) that sign the brokers' certificates (default: the Mozilla roots).
    pub ca_file: Option<String>,
    /// PEM client certificate (mutual TLS), with `key_file`.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
}

/// `[sources.sasl]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: Option<String>,
    pub username: Option<String>,
    /// `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
}

/// `[sources.columns]`: meaning = column name. An empty string means "not present".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawColumns {
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub status: Option<String>,
    pub received_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub attempts: Option<String>,
    pub deliveries: Option<String>,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: Option<String>,
    pub created_at: Option<String>,
    pub published_at: Option<String>,
}

impl RawColumns {
    /// What the file sets for a meaning.
    fn get(&self, meaning: &str) -> Option<&str> {
        let value = match meaning {
            "event_id" => &self.event_id,
            "event_type" => &self.event_type,
            "status" => &self.status,
            "received_at" => &self.received_at,
            "started_at" => &self.started_at,
            "finished_at" => &self.finished_at,
            "attempts" => &self.attempts,
            "deliveries" => &self.deliveries,
            "last_error" => &self.last_error,
            "traceparent" => &self.traceparent,
            "updated_at" => &self.updated_at,
            "created_at" => &self.created_at,
            "published_at" => &self.published_at,
            _ => &None,
        };
        value.as_deref()
    }
}

/// `[sources.statuses]`: meaning = the words the table uses for it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStatuses {
    pub pending: Option<Vec<String>>,
    pub processing: Option<Vec<String>>,
    pub succeeded: Option<Vec<String>>,
    pub failed: Option<Vec<String>>,
    pub dead: Option<Vec<String>>,
}

/// `[sources.objectives]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawObjectives {
    /// Objective for the age of the oldest unprocessed message.
    pub oldest_age: Option<String>,
    /// Objective for the 95th percentile of processing time.
    pub p95: Option<String>,
}

// ---------------------------------------------------------------------------
// What the agent runs on.

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The HTTP listener.
    pub listen: SocketAddr,
    /// How long shutdown may take: stop polling, release locks, finish scrapes.
    pub shutdown_grace: Duration,
    /// `[server] max_connections_per_database`.
    pub max_connections_per_database: u32,
    /// What one client may hold on the listener.
    pub http: crate::http::Limits,
    /// The sources, in file order.
    pub sources: Vec<SourceSpec>,
    /// Span export, when `[tracing]` is configured.
    pub tracing: Option<crate::tracing_link::config::TracingConfig>,
}

/// One validated source.
#[derive(Debug, Clone)]
pub enum SourceSpec {
    /// An inbox / processing-record table.
    Inbox(InboxSpec),
    /// An outbox table.
    Outbox(OutboxSpec),
    /// A Kafka cluster's consumer groups and topics.
    Kafka(crate::sources::kafka::config::KafkaSpec),
}

impl SourceSpec {
    /// The settings every table source has; `None` for Kafka.
    pub fn table(&self) -> Option<&TableSpec> {
        match self {
            SourceSpec::Inbox(s) => Some(&s.table),
            SourceSpec::Outbox(s) => Some(&s.table),
            SourceSpec::Kafka(_) => None,
        }
    }

    /// The configured name (the `source` label).
    pub fn name(&self) -> &str {
        match self {
            SourceSpec::Inbox(s) => &s.table.name,
            SourceSpec::Outbox(s) => &s.table.name,
            SourceSpec::Kafka(s) => &s.name,
        }
    }
}

/// Database dialect, chosen by the DSN's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// The dialect a DSN's scheme names.
    pub fn from_dsn(dsn: &str) -> Option<Dialect> {
        let scheme = dsn.split_once(':')?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    /// The name used on the command line (`--dialect`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "mysql" | "mariadb" => Ok(Dialect::MySql),
            "sqlite" => Ok(Dialect::Sqlite),
            other => Err(format!(
                "unknown dialect \"{other}\" (expected postgres, mysql or sqlite)"
            )),
        }
    }
}

/// Settings shared by inbox and outbox sources.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub name: String,
    pub dsn: Dsn,
    /// Table name, possibly `schema.table`; checked to be a plain identifier.
    pub table: String,
    pub poll_interval: Duration,
    pub overlap: Duration,
    pub timeout: Duration,
    pub quantile_window: Duration,
    pub state_retention: Duration,
    pub reconcile_every: Duration,
    pub event_type_limit: usize,
    pub max_tracked_events: usize,
    pub batch_size: usize,
    pub max_count_jump: u64,
    pub service_name: Option<String>,
    /// `[sources.trace]`: how the consumer's spans describe it.
    pub trace: crate::tracing_link::config::SourceTrace,
    pub objectives: Objectives,
    /// `sources[i]`, for messages that point back at the file.
    pub key: String,
}

/// Per-source objectives, exported as `inboxwatch_objective_*` gauges.
#[derive(Debug, Clone, Default)]
pub struct Objectives {
    pub oldest_age: Option<Duration>,
    pub p95: Option<Duration>,
}

/// A validated inbox source.
#[derive(Debug, Clone)]
pub struct InboxSpec {
    pub table: TableSpec,
    pub stuck_after: Duration,
    pub columns: InboxColumns,
    pub statuses: StatusMap,
}

/// A validated outbox source.
#[derive(Debug, Clone)]
pub struct OutboxSpec {
    pub table: TableSpec,
    pub columns: OutboxColumns,
}

/// Column names of an inbox table; `None` for optional columns the table lacks.
#[derive(Debug, Clone)]
pub struct InboxColumns {
    pub event_id: String,
    pub event_type: Option<String>,
    pub status: String,
    pub received_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub attempts: Option<String>,
    pub deliveries: Option<String>,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub updated_at: String,
}

impl InboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("event_id", self.event_id.as_str()),
            ("status", self.status.as_str()),
            ("received_at", self.received_at.as_str()),
            ("updated_at", self.updated_at.as_str()),
        ];
        let optional = [
            ("event_type", &self.event_type),
            ("started_at", &self.started_at),
            ("finished_at", &self.finished_at),
            ("attempts", &self.attempts),
            ("deliveries", &self.deliveries),
            ("last_error", &self.last_error),
            ("traceparent", &self.traceparent),
        ];
        out.extend(
            optional
                .into_iter()
                .filter_map(|(m, c)| c.as_deref().map(|c| (m, c))),
        );
        out
    }
}

/// Column names of an outbox table.
#[derive(Debug, Clone)]
pub struct OutboxColumns {
    pub event_id: String,
    pub event_type: Option<String>,
    pub created_at: String,
    pub published_at: String,
    pub traceparent: Option<String>,
    pub updated_at: String,
}

impl OutboxColumns {
    /// Every mapped column with the meaning it has, for schema checks.
    pub fn mapped(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![
            ("event_id", self.event_id.as_str()),
            ("created_at", self.created_at.as_str()),
            ("published_at", self.published_at.as_str()),
            ("updated_at", self.updated_at.as_str()),
        ];
        if let Some(c) = &self.event_type {
            out.push(("event_type", c));
        }
        if let Some(c) = &self.traceparent {
            out.push(("traceparent", c));
        }
        out
    }
}

/// What a status word means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Pending,
    Processing,
    Succeeded,
    Failed,
    Dead,
}

impl Status {
    /// The meanings in the order of the config keys.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Processing,
        Status::Succeeded,
        Status::Failed,
        Status::Dead,
    ];

    /// The config key / label value of this meaning.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }

    /// Succeeded or dead-lettered: the event is done.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Dead)
    }
}

/// The status words of one table, in the order of their meanings (pending,
/// processing, succeeded, failed, dead) and, within one, as configured — so
/// generated SQL lists them in the same order as the recommended indexes.
#[derive(Debug, Clone)]
pub struct StatusMap {
    words: Vec<(String, Status)>,
}

impl StatusMap {
    /// What a word means, if the table's map knows it.
    pub fn classify(&self, word: &str) -> Option<Status> {
        self.words.iter().find(|(w, _)| w == word).map(|(_, s)| *s)
    }

    /// The words that mean `status`.
    pub fn words_for(&self, status: Status) -> Vec<&str> {
        self.words
            .iter()
            .filter(|(_, s)| *s == status)
            .map(|(w, _)| w.as_str())
            .collect()
    }

    /// The words of every unfinished meaning: pending, then processing, then failed.
    pub fn unfinished_words(&self) -> Vec<&str> {
        [Status::Pending, Status::Processing, Status::Failed]
            .into_iter()
            .flat_map(|s| self.words_for(s))
            .collect()
    }
}

impl Default for StatusMap {
    fn default() -> Self {
        StatusMap {
            words: Status::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), *s))
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// Loading and validation.

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
    fn lookup(self, name: &str) -> Option<String> {
        match self {
            Environment::Process => std::env::var(name).ok(),
            // The only variables read other than through `${VAR}` are the
            // OTEL_EXPORTER_OTLP_* fallbacks of [tracing]: those stay unset.
            Environment::Placeholders => (!name.starts_with("OTEL_")).then(|| PLACEHOLDER.into()),
        }
    }
}

/// Reads, parses and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_in(path, Environment::Process)
}

/// [`load`], with `${VAR}` taken from `environment`.
pub fn load_in(path: &Path, environment: Environment) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: Some(path.display().to_string()),
        problems: vec![Problem {
            key: path.display().to_string(),
            message: format!("cannot read the config file: {e}"),
        }],
    })?;
    parse_str_in(&text, environment).map_err(|mut e| {
        e.path = Some(path.display().to_string());
        e
    })
}

/// Parses and validates config text, reading `${VAR}` from the process environment.
pub fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse_str_in(text, Environment::Process)
}

/// [`parse_str`], with `${VAR}` taken from `environment`.
pub fn parse_str_in(text: &str, environment: Environment) -> Result<Config, ConfigError> {
    let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, &e, None))?;
    let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        toml_error(text, e.inner(), Some(path))
    })?;
    validate_in(&raw, &|name| environment.lookup(name), environment)
}

fn toml_error(text: &str, e: &toml::de::Error, path: Option<String>) -> ConfigError {
    let mut message = e.message().to_string();
    if let Some(span) = e.span() {
        let line = text[..span.start.min(text.len())].lines().count().max(1);
        message = format!("{message} (line {line})");
    }
    let mut key = path
        .filter(|p| p != ".")
        .unwrap_or_else(|| "config".to_string());
    // serde reports an unknown field at its parent; name the field itself.
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|m| m.split('`').next())
    {
        if key == "config" {
            key = field.to_string();
        } else if !key.ends_with(field) {
            key = format!("{key}.{field}");
        }
    }
    ConfigError {
        path: None,
        problems: vec![Problem { key, message }],
    }
}

/// Collects every problem of a parsed file; `env` resolves `${VAR}`.
pub fn validate(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    validate_in(raw, env, Environment::Process)
}

fn validate_in(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    environment: Environment,
) -> Result<Config, ConfigError> {
    let mut v = Validator {
        environment,
        ..Validator::default()
    };
    let listen = match raw
        .server
        .listen
        .as_deref()
        .unwrap_or(DEFAULT_LISTEN)
        .parse()
    {
        Ok(a) => a,
        Err(e) => {
            v.problem("server.listen", format!("not a socket address: {e}"));
            DEFAULT_LISTEN
                .parse()
                .expect("the default listen address parses")
        }
    };
    let shutdown_grace = v.duration(
        "server.shutdown_grace",
        raw.server.shutdown_grace.as_deref(),
        DEFAULT_SHUTDOWN_GRACE,
    );
    if shutdown_grace < Duration::from_secs(1) {
        v.problem("server.shutdown_grace", "must be at least 1s".into());
    }
    let max_connections_per_database = v.positive(
        "server.max_connections_per_database",
        raw.server.max_connections_per_database,
        4,
        1_000,
    ) as u32;
    let http = v.http_limits(&raw.server);
    if raw.sources.is_empty() {
        v.problem(
            "sources",
            "at least one [[sources]] entry is required".into(),
        );
    }
    let mut names = HashSet::new();
    let mut sources = Vec::new();
    for (i, s) in raw.sources.iter().enumerate() {
        let key = format!("sources[{i}]");
        if let Some(name) = &s.name
            && !names.insert(name.clone())
        {
            v.problem(
                &format!("{key}.name"),
                format!("duplicate source name \"{name}\" (names must be unique)"),
            );
        }
        if let Some(spec) = v.source(&key, s, env) {
            sources.push(spec);
        }
    }
    let tracing = crate::tracing_link::config::validate(raw.tracing.as_ref(), env, &mut v.problems);
    if v.problems.is_empty() {
        Ok(Config {
            listen,
            shutdown_grace,
            max_connections_per_database,
            http,
            sources,
            tracing,
        })
    } else {
        Err(ConfigError {
            path: None,
            problems: v.problems,
        })
    }
}

#[derive(Default)]
pub(crate) struct Validator {
    problems: Vec<Problem>,
    environment: Environment,
}

impl Validator {
    pub(crate) fn problem(&mut self, key: &str, message: String) {
        self.problems.push(Problem {
            key: key.to_string(),
            message,
        });
    }

    pub(crate) fn duration(
        &mut self,
        key: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Duration {
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

    fn http_limits(&mut self, server: &RawServer) -> crate::http::Limits {
        let default = crate::http::Limits::default();
        let mut timeout = |key: &str, value: Option<&str>, default: Duration| {
            let d = self.duration(key, value, default);
            if d.is_zero() {
                self.problem(key, "must be more than 0s".into());
            }
            d
        };
        crate::http::Limits {
            header_read_timeout: timeout(
                "server.header_read_timeout",
                server.header_read_timeout.as_deref(),
                default.header_read_timeout,
            ),
            idle_timeout: timeout(
                "server.idle_timeout",
                server.idle_timeout.as_deref(),
                default.idle_timeout,
            ),
            max_connections: self.positive(
                "server.max_http_connections",
                server.max_http_connections,
                default.max_connections,
                65_536,
            ),
        }
    }

    pub(crate) fn positive(
        &mut self,
        key: &str,
        value: Option<i64>,
        default: usize,
        max: usize,
    ) -> usize {
        match value {
            None => default,
            Some(n) if n >= 1 && (n as u64) <= max as u64 => n as usize,
            Some(n) => {
                self.problem(key, format!("must be between 1 and {max}, got {n}"));
                default
            }
        }
    }

    fn source(
        &mut self,
        key: &str,
        s: &RawSource,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<SourceSpec> {
        let before = self.problems.len();
        let name = match s.name.as_deref() {
            // It ends up in log lines, label values and /readyz lines.
            Some(n) if n.chars().any(char::is_control) => {
                self.problem(
                    &format!("{key}.name"),
                    "must not contain control characters (newline, tab, …)".into(),
                );
                String::new()
            }
            Some(n) if !n.trim().is_empty() => n.to_string(),
            Some(_) => {
                self.problem(&format!("{key}.name"), "must not be empty".into());
                String::new()
            }
            None => {
                self.problem(&format!("{key}.name"), "required".into());
                String::new()
            }
        };
        let kind = match s.kind.as_deref() {
            Some(k @ ("inbox" | "outbox")) => k,
            Some("kafka") => {
                let spec = crate::sources::kafka::config::validate(self, key, name, s, env);
                return if self.problems.len() > before {
                    None
                } else {
                    spec.map(SourceSpec::Kafka)
                };
            }
            Some(other) => {
                self.problem(
                    &format!("{key}.kind"),
                    format!("unknown kind \"{other}\" (expected inbox, outbox or kafka)"),
                );
                return None;
            }
            None => {
                self.problem(
                    &format!("{key}.kind"),
                    "required (inbox, outbox or kafka)".into(),
                );
                return None;
            }
        };
        crate::sources::kafka::config::reject_kafka_keys(self, key, s);
        let dsn = self.dsn(key, s, env);
        let table = match s.table.as_deref() {
            Some(t) if is_table_name(t) => t.to_string(),
            Some(t) => {
                self.problem(
                    &format!("{key}.table"),
                    format!("\"{t}\" is not a table name (letters, digits, _ and $, optionally schema.table)"),
                );
                String::new()
            }
            None => {
                self.problem(&format!("{key}.table"), "required".into());
                String::new()
            }
        };
        let poll_interval = self.duration(
            &format!("{key}.poll_interval"),
            s.poll_interval.as_deref(),
            Duration::from_secs(5),
        );
        if poll_interval.is_zero() {
            self.problem(
                &format!("{key}.poll_interval"),
                "must be greater than zero".into(),
            );
        }
        let overlap = self.duration(
            &format!("{key}.overlap"),
            s.overlap.as_deref(),
            Duration::from_secs(30),
        );
        let timeout = self.duration(
            &format!("{key}.timeout"),
            s.timeout.as_deref(),
            poll_interval.max(Duration::from_secs(1)),
        );
        if timeout.is_zero() {
            self.problem(
                &format!("{key}.timeout"),
                "must be greater than zero".into(),
            );
        }
        let quantile_window = self.duration(
            &format!("{key}.quantile_window"),
            s.quantile_window.as_deref(),
            Duration::from_secs(300),
        );
        if quantile_window < Duration::from_secs(1) {
            self.problem(
                &format!("{key}.quantile_window"),
                "must be at least 1s".into(),
            );
        }
        let state_retention = self.duration(
            &format!("{key}.state_retention"),
            s.state_retention.as_deref(),
            Duration::from_secs(900),
        );
        if state_retention < overlap {
            self.problem(
                &format!("{key}.state_retention"),
                "must be at least the overlap window".into(),
            );
        }
        let reconcile_every = self.duration(
            &format!("{key}.reconcile_every"),
            s.reconcile_every.as_deref(),
            Duration::from_secs(60),
        );
        if reconcile_every.is_zero() {
            self.problem(
                &format!("{key}.reconcile_every"),
                "must be greater than zero".into(),
            );
        }
        let event_type_limit = self.positive(
            &format!("{key}.event_type_limit"),
            s.event_type_limit,
            50,
            10_000,
        );
        let max_tracked_events = self.positive(
            &format!("{key}.max_tracked_events"),
            s.max_tracked_events,
            400_000,
            100_000_000,
        );
        let batch_size =
            self.positive(&format!("{key}.batch_size"), s.batch_size, 5_000, 1_000_000);
        let max_count_jump = self.positive(
            &format!("{key}.max_count_jump"),
            s.max_count_jump,
            1_000,
            1_000_000_000,
        ) as u64;
        let objectives =
            Objectives {
                oldest_age: s.objectives.oldest_age.as_deref().map(|t| {
                    self.duration(
                        &format!("{key}.objectives.oldest_age"),
                        Some(t),
                        Duration::ZERO,
                    )
                }),
                p95: s.objectives.p95.as_deref().map(|t| {
                    self.duration(&format!("{key}.objectives.p95"), Some(t), Duration::ZERO)
                }),
            };
        let common = TableSpec {
            name,
            dsn: dsn.unwrap_or_else(Dsn::refused),
            table,
            poll_interval,
            overlap,
            timeout,
            quantile_window,
            state_retention,
            reconcile_every,
            event_type_limit,
            max_tracked_events,
            batch_size,
            max_count_jump,
            service_name: s.service_name.clone(),
            trace: crate::tracing_link::config::validate_source(
                key,
                s.trace.as_ref(),
                &mut self.problems,
            ),
            objectives,
            key: key.to_string(),
        };
        let spec = if kind == "inbox" {
            let stuck_after = self.duration(
                &format!("{key}.stuck_after"),
                s.stuck_after.as_deref(),
                Duration::from_secs(600),
            );
            let columns = self.inbox_columns(key, &s.columns);
            let statuses = self.statuses(key, s.statuses.as_ref());
            columns.map(|columns| {
                SourceSpec::Inbox(InboxSpec {
                    table: common,
                    stuck_after,
                    columns,
                    statuses,
                })
            })
        } else {
            if s.stuck_after.is_some() {
                self.problem(
                    &format!("{key}.stuck_after"),
                    "applies to inbox sources only".into(),
                );
            }
            if s.statuses.is_some() {
                self.problem(
                    &format!("{key}.statuses"),
                    "applies to inbox sources only".into(),
                );
            }
            self.outbox_columns(key, &s.columns).map(|columns| {
                SourceSpec::Outbox(OutboxSpec {
                    table: common,
                    columns,
                })
            })
        };
        if self.problems.len() > before {
            return None;
        }
        spec
    }

    fn dsn(
        &mut self,
        key: &str,
        s: &RawSource,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<Dsn> {
        let (dsn_key, text) = match (&s.dsn, &s.dsn_file) {
            (Some(_), Some(_)) => {
                self.problem(
                    &format!("{key}.dsn_file"),
                    "give either dsn or dsn_file, not both".into(),
                );
                return None;
            }
            (Some(d), None) => (format!("{key}.dsn"), d.clone()),
            (None, Some(path)) => {
                let dsn_key = format!("{key}.dsn_file");
                match std::fs::read_to_string(path) {
                    Ok(t) => (dsn_key, t.trim().to_string()),
                    Err(e) => {
                        self.problem(&dsn_key, format!("cannot read \"{path}\": {e}"));
                        return None;
                    }
                }
            }
            (None, None) => {
                self.problem(&format!("{key}.dsn"), "required (or dsn_file)".into());
                return None;
            }
        };
        if self.environment == Environment::Placeholders && text.trim_start().starts_with("${") {
            // The scheme, and so everything, comes from a variable: nothing to check without it.
            return Some(Dsn::refused());
        }
        match Dsn::expand(&text, env) {
            Ok(d) => Some(d),
            Err(e) => {
                self.problem(&dsn_key, e.to_string());
                None
            }
        }
    }

    fn column(
        &mut self,
        key: &str,
        meaning: &str,
        value: &Option<String>,
        required: bool,
    ) -> Option<String> {
        let full = format!("{key}.columns.{meaning}");
        match value.as_deref() {
            None if required => Some(meaning.to_string()),
            None => Some(meaning.to_string()),
            Some("") if required => {
                self.problem(
                    &full,
                    "required: this column cannot be left unmapped".into(),
                );
                None
            }
            Some("") => None,
            Some(c) if is_identifier(c) => Some(c.to_string()),
            Some(c) => {
                self.problem(
                    &full,
                    format!("\"{c}\" is not a column name (letters, digits, _ and $)"),
                );
                None
            }
        }
    }

    fn inbox_columns(&mut self, key: &str, c: &RawColumns) -> Option<InboxColumns> {
        let before = self.problems.len();
        for (meaning, value) in [
            ("created_at", &c.created_at),
            ("published_at", &c.published_at),
        ] {
            if value.is_some() {
                self.problem(
                    &format!("{key}.columns.{meaning}"),
                    "is an outbox column; inbox tables do not have it".into(),
                );
            }
        }
        let cols = InboxColumns {
            event_id: self
                .column(key, "event_id", &c.event_id, true)
                .unwrap_or_default(),
            event_type: self.column(key, "event_type", &c.event_type, false),
            status: self
                .column(key, "status", &c.status, true)
                .unwrap_or_default(),
            received_at: self
                .column(key, "received_at", &c.received_at, true)
                .unwrap_or_default(),
            started_at: self.column(key, "started_at", &c.started_at, false),
            finished_at: self.column(key, "finished_at", &c.finished_at, false),
            attempts: self.column(key, "attempts", &c.attempts, false),
            deliveries: self.column(key, "deliveries", &c.deliveries, false),
            last_error: self.column(key, "last_error", &c.last_error, false),
            traceparent: self.column(key, "traceparent", &c.traceparent, false),
            updated_at: self
                .column(key, "updated_at", &c.updated_at, true)
                .unwrap_or_default(),
        };
        self.distinct_columns(key, &cols.mapped(), c);
        (self.problems.len() == before).then_some(cols)
    }

    /// One meaning per column: a column mapped twice (`status` and `event_id`
    /// to `id`) is named at the key the file sets, the later one when both are set.
    fn distinct_columns(&mut self, key: &str, mapped: &[(&'static str, &str)], raw: &RawColumns) {
        let written = |meaning: &str| raw.get(meaning).is_some_and(|c| !c.is_empty());
        for (i, (meaning, column)) in mapped.iter().enumerate() {
            if let Some((earlier, _)) = mapped[..i].iter().find(|(_, c)| c == column) {
                let named = if written(meaning) || !written(earlier) {
                    meaning
                } else {
                    earlier
                };
                let other = if named == meaning { earlier } else { meaning };
                self.problem(
                    &format!("{key}.columns.{named}"),
                    format!(
                        "column \"{column}\" is also mapped to {other}; a column can have one meaning only"
                    ),
                );
            }
        }
    }

    fn outbox_columns(&mut self, key: &str, c: &RawColumns) -> Option<OutboxColumns> {
        let before = self.problems.len();
        let inbox_only = [
            ("status", &c.status),
            ("received_at", &c.received_at),
            ("started_at", &c.started_at),
            ("finished_at", &c.finished_at),
            ("attempts", &c.attempts),
            ("deliveries", &c.deliveries),
            ("last_error", &c.last_error),
        ];
        for (meaning, value) in inbox_only {
            if value.is_some() {
                self.problem(
                    &format!("{key}.columns.{meaning}"),
                    "is an inbox column; outbox tables do not have it".into(),
                );
            }
        }
        let cols = OutboxColumns {
            event_id: self
                .column(key, "event_id", &c.event_id, true)
                .unwrap_or_default(),
            event_type: self.column(key, "event_type", &c.event_type, false),
            created_at: self
                .column(key, "created_at", &c.created_at, true)
                .unwrap_or_default(),
            published_at: self
                .column(key, "published_at", &c.published_at, true)
                .unwrap_or_default(),
            traceparent: self.column(key, "traceparent", &c.traceparent, false),
            updated_at: self
                .column(key, "updated_at", &c.updated_at, true)
                .unwrap_or_default(),
        };
        self.distinct_columns(key, &cols.mapped(), c);
        (self.problems.len() == before).then_some(cols)
    }

    fn statuses(&mut self, key: &str, raw: Option<&RawStatuses>) -> StatusMap {
        let Some(raw) = raw else {
            return StatusMap::default();
        };
        let lists = [
            (Status::Pending, &raw.pending),
            (Status::Processing, &raw.processing),
            (Status::Succeeded, &raw.succeeded),
            (Status::Failed, &raw.failed),
            (Status::Dead, &raw.dead),
        ];
        let mut words: Vec<(String, Status)> = Vec::new();
        for (status, list) in lists {
            let full = format!("{key}.statuses.{}", status.as_str());
            let list = match list {
                Some(l) => l.clone(),
                None => vec![status.as_str().to_string()],
            };
            if list.is_empty() && matches!(status, Status::Pending | Status::Succeeded) {
                self.problem(&full, "needs at least one status word".into());
            }
            for word in list {
                if word.is_empty() {
                    self.problem(&full, "status words must not be empty".into());
                    continue;
                }
                if let Some((_, prev)) = words.iter().find(|(w, _)| *w == word) {
                    self.problem(
                        &full,
                        format!(
                            "\"{word}\" is already mapped to {}; a word can have one meaning only",
                            prev.as_str()
                        ),
                    );
                } else {
                    words.push((word, status));
                }
            }
        }
        StatusMap { words }
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

/// `table` or `schema.table`, each part an identifier.
pub fn is_table_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 2 && parts.iter().all(|p| is_identifier(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PW").then(|| "s3cret".to_string())
    }

    fn check(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).expect("test config parses");
        validate(&raw, &env)
    }

    const MINIMAL: &str = r#"
[[sources]]
name = "orders"
kind = "inbox"
dsn = "postgres://u:${PW}@db/orders"
table = "inbox"
"#;

    #[test]
    fn minimal_inbox_gets_the_documented_defaults() {
        let cfg = check(MINIMAL).expect("valid");
        let SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("expected an inbox source")
        };
        assert_eq!(s.table.poll_interval, Duration::from_secs(5));
        assert_eq!(s.table.overlap, Duration::from_secs(30));
        assert_eq!(s.stuck_after, Duration::from_secs(600));
        assert_eq!(s.table.event_type_limit, 50);
        assert_eq!(s.columns.updated_at, "updated_at");
        assert_eq!(s.statuses.classify("dead"), Some(Status::Dead));
        assert_eq!(s.table.dsn.expose(), "postgres://u:s3cret@db/orders");
        assert_eq!(s.table.dsn.to_string(), "postgres://u:***@db/orders");
        assert_eq!(cfg.listen.to_string(), "0.0.0.0:9469");
        assert_eq!(cfg.shutdown_grace, Duration::from_secs(20));
        assert_eq!(cfg.http, crate::http::Limits::default());
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = r#"
[[sources]]
name = "a"
kind = "inbox"
dsn = "oracle://x/y"
table = "inbox"
poll_interval = "5 parsecs"
[sources.columns]
updated_at = ""

[[sources]]
name = "a"
kind = "outbox"
dsn = "postgres://${NOPE}@db/x"
table = "outbox"
"#;
        let err = check(text).expect_err("invalid");
        let keys: Vec<&str> = err.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "sources[0].dsn",
                "sources[0].poll_interval",
                "sources[0].columns.updated_at",
                "sources[1].name",
                "sources[1].dsn",
            ]
        );
        assert!(err.problems[4].message.contains("NOPE"));
    }

    #[test]
    fn a_status_word_has_one_meaning() {
        let text =
            format!("{MINIMAL}[sources.statuses]\nsucceeded = [\"done\"]\ndead = [\"done\"]\n");
        let err = check(&text).expect_err("invalid");
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].key, "sources[0].statuses.dead");
    }

    #[test]
    fn unknown_keys_name_their_full_path() {
        let text = format!("{MINIMAL}poll_intervall = \"5s\"\n");
        let err = parse_str(&text).expect_err("invalid");
        assert_eq!(err.problems[0].key, "sources[0].poll_intervall");
        let err = parse_str("[server]\nlisten = \"x\"\nport = 1\n").expect_err("invalid");
        assert_eq!(err.problems[0].key, "server.port");
        let err = parse_str("sources = 3\n").expect_err("invalid");
        assert_eq!(err.problems[0].key, "sources");
    }

    /// Guards the listener limits (issue 16): each bad value is named by its key.
    #[test]
    fn http_limits_name_their_keys() {
        let text = "[server]\nheader_read_timeout = \"0s\"\nidle_timeout = \"soon\"\nmax_http_connections = 0\n";
        let err = parse_str(text).expect_err("invalid");
        let keys: Vec<&str> = err.problems.iter().map(|p| p.key.as_str()).collect();
        for key in [
            "server.header_read_timeout",
            "server.idle_timeout",
            "server.max_http_connections",
        ] {
            assert!(keys.contains(&key), "{key} not reported: {keys:?}");
        }
    }

    /// Guards what panic and `expect` messages are made of: a config's `Debug`
    /// and `Display` forms carry no piece of a password, whatever it holds
    /// (before issue 16, `postgres:u:pw@h` was accepted and printed raw).
    #[test]
    fn a_config_formats_no_password() {
        let hostile = "Lk9qA/Zt8wB@Wm7eC:Vp6rD%2FJn5tE#Hb4yF?Cd3uG+Ef2iH Qs1oJ";
        let env = |name: &str| (name == "PW").then(|| hostile.to_string());
        let text = "[[sources]]\nname = \"a\"\nkind = \"inbox\"\ntable = \"t\"\n\
                    dsn = \"postgres://u:${PW}@db/x\"\n\
                    [[sources]]\nname = \"b\"\nkind = \"outbox\"\ntable = \"t\"\n\
                    dsn = \"mysql://u@db/x?ssl-mode=required\"\n";
        let raw: RawConfig = toml::from_str(text).expect("test config parses");
        let cfg = validate(&raw, &env).expect("valid");
        let shown = format!(
            "{cfg:?} {}",
            cfg.sources
                .iter()
                .filter_map(|s| s.table().map(|t| t.dsn.to_string()))
                .collect::<Vec<_>>()
                .join(" ")
        );
        assert!(shown.contains("u:***@db"), "{shown}");
        for piece in hostile.split(['/', '@', ':', '%', '#', '?', '+', ' ']) {
            assert!(
                piece.len() < 5 || !shown.contains(piece),
                "{piece}: {shown}"
            );
        }
        for misread in ["postgres:u:Lk9qA@db/x", "postgres://u:1/Lk9qA@db/x"] {
            let text = format!(
                "[[sources]]\nname = \"a\"\nkind = \"inbox\"\ntable = \"t\"\ndsn = \"{misread}\"\n"
            );
            let raw: RawConfig = toml::from_str(&text).expect("test config parses");
            let err = validate(&raw, &env).expect_err(misread);
            assert!(!format!("{err} {err:?}").contains("Lk9qA"), "{err:?}");
        }
    }

    /// Guards the documented example: it must stay valid as keys change.
    #[test]
    fn the_documented_example_is_valid() {
        let text = include_str!("../config/inboxwatch.toml");
        let raw: RawConfig = toml::from_str(text).expect("config/inboxwatch.toml parses");
        // Every ${VAR} set; the OTEL_EXPORTER_OTLP_* fallbacks left unset.
        let env = |name: &str| (!name.starts_with("OTEL_")).then(|| "example".to_string());
        let cfg = validate(&raw, &env).expect("config/inboxwatch.toml is valid");
        assert_eq!(cfg.sources.len(), 4);
        let SourceSpec::Inbox(billing) = &cfg.sources[1] else {
            panic!("billing-inbox is an inbox")
        };
        assert_eq!(billing.columns.deliveries, None);
        assert_eq!(billing.statuses.classify("parked"), Some(Status::Dead));
        let SourceSpec::Kafka(k) = &cfg.sources[3] else {
            panic!("main-kafka is a kafka source")
        };
        assert_eq!(k.brokers.len(), 2);
        assert!(!k.per_topic);
        assert_eq!(k.status_window, Duration::from_secs(300));
        let tier = k.retry_topics.captures("orders.retry.10s").unwrap();
        assert_eq!(&tier["tier"], "10s");
        assert!(k.dead_letter_topics.is_match("orders.DLQ"));
        assert!(!k.dead_letter_topics.is_match("orders.DLQ.archive"));
        assert!(!k.topics.matches("__consumer_offsets"));
        let tracing = cfg.tracing.expect("the example configures [tracing]");
        assert_eq!(tracing.traces_endpoint, "http://otel-collector:4317");
        assert_eq!(
            cfg.sources[0]
                .table()
                .expect("a table source")
                .trace
                .messaging_system,
            "kafka"
        );
    }

    /// Kafka sources: defaults, and keys of the other kinds refused by name.
    #[test]
    fn kafka_sources_get_defaults_and_refuse_table_keys() {
        let cfg =
            check("[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"b:9092\"]\n").unwrap();
        let SourceSpec::Kafka(k) = &cfg.sources[0] else {
            panic!("a kafka source")
        };
        assert_eq!(k.poll_interval, Duration::from_secs(10));
        assert_eq!(k.read_concurrency, 8);
        assert!(k.groups.matches("anything"));
        assert!(k.topics.matches("orders") && !k.topics.matches("__transaction_state"));
        assert!(k.security.tls.is_none() && k.security.sasl.is_none());
        let err = check(
            "[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"b\"]\ntable = \"t\"\n\
             [[sources]]\nname = \"i\"\nkind = \"inbox\"\ndsn = \"sqlite://x\"\ntable = \"t\"\ngranularity = \"topic\"\n",
        )
        .unwrap_err();
        let keys: Vec<&str> = err.problems.iter().map(|p| p.key.as_str()).collect();
        assert!(keys.contains(&"sources[0].brokers[0]"), "{keys:?}");
        assert!(keys.contains(&"sources[0].table"), "{keys:?}");
        assert!(keys.contains(&"sources[1].granularity"), "{keys:?}");
    }

    #[test]
    fn identifiers_are_checked_before_they_reach_sql() {
        assert!(is_table_name("public.inbox"));
        assert!(!is_table_name("inbox; drop table x"));
        assert!(!is_identifier("a\"b"));
        assert!(!is_identifier(""));
    }
}
