//! The TOML configuration: `[server]`, `[tracing]`, and one `[[sources]]`
//! entry per watched source, each read and checked by its kind
//! (`src/sources/<kind>/config.rs`), into what the agent runs on ([`Config`]).
//!
//! Reading and checking report every problem at once, each line naming its
//! full key (`sources[1].columns.updated_at: …`) and, where TOML has one, its
//! line; a key a section does not take is named, and where it is another
//! kind's key, the message says whose.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml::de::DeValue;

pub use crate::validation::{
    ConfigError, Environment, PLACEHOLDER, Problem, is_identifier, is_table_name,
};
use crate::validation::{Document, Validator, keys_at};
pub mod presets;
pub mod web;

use crate::redact::Redactor;
use crate::sources::SourceSpec;
use crate::sources::common;
use crate::tracing_link::config::{RawTracing, TracingConfig};

/// Where `run` listens when neither the config nor a flag says otherwise.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9469";

/// How long shutdown may take when the config does not say.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
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
    /// HTTP connections one client address may hold open at once; its next
    /// ones are closed at once (default 32).
    pub max_http_connections_per_client: Option<i64>,
    /// Serve the pages (`/`, `/dead-letters`, `/events/{id}`) and the JSON
    /// API (`/api/v1/…`) beside `/metrics` (default: on a loopback listener,
    /// or behind TLS and basic auth; off on a listener other hosts reach).
    pub pages: Option<bool>,
    /// The exporter-toolkit web config file (TLS, basic auth, headers),
    /// re-read when it changes (docs/configuration.md).
    pub web_config_file: Option<String>,
    /// A trace viewer's URL with `{trace_id}` in it: the pages link each
    /// trace id there (e.g. a Grafana Explore or Jaeger URL).
    pub trace_url: Option<String>,
    /// `[[server.redact]]`: patterns masked in `last_error`, `business_key`
    /// and `summary` wherever they leave the agent (none by default).
    pub redact: Option<Vec<crate::redact::RawRule>>,
    /// The built-in masks switched on: `"email"`, `"card"` (none by default).
    pub redact_builtins: Option<Vec<String>>,
}

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
    pub http: HttpLimits,
    /// The sources, in file order.
    pub sources: Vec<SourceSpec>,
    /// Span export, when `[tracing]` is configured.
    pub tracing: Option<TracingConfig>,
    /// `[server] pages` as written; unset, the listener decides
    /// ([`crate::http::pages_served`]).
    pub pages: Option<bool>,
    /// `[server] web_config_file` (or `--web.config.file`), checked.
    pub web_config_file: Option<PathBuf>,
    /// `[server] trace_url`, checked to hold `{trace_id}`.
    pub trace_url: Option<String>,
    /// `[[server.redact]]` and `redact_builtins`: the one redactor every
    /// output of table text applies.
    pub redact: Arc<Redactor>,
    /// The file it was read from (the pages print commands that name it).
    pub path: Option<String>,
    /// The sources written on a preset, with their effective settings.
    pub presets: Vec<presets::PresetUse>,
}

/// What one client may hold on the listener (`[server]` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time to send a request's headers, counted from the moment the server
    /// waits for them: a new connection, or a kept-alive one after its last
    /// response. So it is also how long an idle keep-alive connection is kept.
    pub header_read_timeout: Duration,
    /// A connection that moves no byte either way for this long is closed: a
    /// client that stops reading its response or sending its body.
    pub idle_timeout: Duration,
    /// Connections served at once (`max_http_connections`); the next ones wait in the listen backlog
    /// until one closes.
    pub max_connections: usize,
    /// Connections one client address may hold at once
    /// (`max_http_connections_per_client`); its next ones are closed.
    pub max_connections_per_client: usize,
}

impl Default for HttpLimits {
    /// Prometheus sends a request's headers in one packet, so 10 s is generous
    /// on any network and cuts a held connection short; with scrape intervals
    /// of 15 s and more it costs one TCP handshake per scrape. 60 s of silence
    /// outlasts any `scrape_timeout`. 256 connections are a hundred times what
    /// a pod sees (one or two Prometheus replicas and the kubelet's probes) and,
    /// at the listener's read buffer each, fit the DaemonSet's memory limit many times.
    fn default() -> HttpLimits {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_connections_per_client: 32,
        }
    }
}

impl Config {
    /// Serves with this web config file (`run --web.config.file`) instead of
    /// `[server] web_config_file`, once it is checked.
    pub fn use_web_config_file(&mut self, path: PathBuf) -> Result<(), ConfigError> {
        web::load(&path).map_err(|problems| ConfigError {
            path: Some(path.display().to_string()),
            problems,
        })?;
        self.web_config_file = Some(path);
        Ok(())
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
    parse_str_in(&text, environment)
        .map(|mut c| {
            c.path = Some(path.display().to_string());
            c
        })
        .map_err(|mut e| {
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
    parse_with(text, environment, &|name| environment.lookup(name))
}

/// Parses and validates config text, resolving `${VAR}` with `env`.
pub fn parse_with(
    text: &str,
    environment: Environment,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut v = Validator::new(text, environment, env);
    let config = read(text, &mut v);
    let problems = v.into_problems();
    match config {
        Some(config) if problems.is_empty() => Ok(config),
        _ => Err(ConfigError {
            path: None,
            problems,
        }),
    }
}

/// Reads every section; `None` when the file cannot be read at all.
fn read(text: &str, v: &mut Validator<'_>) -> Option<Config> {
    let mut doc = Document::parse(text, v)?;
    let server = doc.take("server");
    let sources = doc.take("sources");
    let tracing = doc.take("tracing");
    for unknown in doc.rest(v) {
        v.unknown_key(&unknown, &["server", "sources", "tracing"], None);
    }
    let server: RawServer = section(v, "server", server).unwrap_or_default();

    let listen = match server.listen.as_deref().unwrap_or(DEFAULT_LISTEN).parse() {
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
        server.shutdown_grace.as_deref(),
        DEFAULT_SHUTDOWN_GRACE,
    );
    if shutdown_grace < Duration::from_secs(1) {
        v.problem("server.shutdown_grace", "must be at least 1s".into());
    }
    let max_connections_per_database = v.positive(
        "server.max_connections_per_database",
        server.max_connections_per_database,
        4,
        1_000,
    ) as u32;
    let http = http_limits(v, &server);
    if let Some(file) = &server.web_config_file
        && let Err(problems) = web::load(Path::new(file))
    {
        for p in problems {
            v.problem(&p.key, p.message);
        }
    }
    let trace_url = server.trace_url.clone().filter(|u| {
        let ok =
            u.contains("{trace_id}") && (u.starts_with("http://") || u.starts_with("https://"));
        if !ok {
            v.problem(
                "server.trace_url",
                format!("{u:?} must be an http:// or https:// URL with {{trace_id}} in it"),
            );
        }
        ok
    });
    let redact = crate::redact::validate(
        v,
        server.redact.as_deref().unwrap_or_default(),
        server.redact_builtins.as_deref().unwrap_or_default(),
    );
    let (sources, presets) = read_sources(v, sources);
    let tracing: Option<RawTracing> = tracing.and_then(|t| section(v, "tracing", Some(t)));
    let tracing = crate::tracing_link::config::validate(tracing.as_ref(), v);
    Some(Config {
        listen,
        shutdown_grace,
        max_connections_per_database,
        http,
        sources,
        tracing,
        pages: server.pages,
        web_config_file: server.web_config_file.as_ref().map(PathBuf::from),
        trace_url,
        redact: Arc::new(redact),
        path: None,
        presets,
    })
}

/// Reads a top-level table; its unknown keys are problems.
fn section<T: serde::de::DeserializeOwned + Default>(
    v: &mut Validator<'_>,
    key: &str,
    value: Option<Spanned<DeValue<'_>>>,
) -> Option<T> {
    let value = value?;
    let (read, unknown) = v.read::<T>(key, value);
    for u in &unknown {
        let expected = keys_at::<T>(u.parent());
        v.unknown_key(u, &expected, None);
    }
    read
}

/// Every `[[sources]]` entry, each read by its kind.
fn read_sources(
    v: &mut Validator<'_>,
    value: Option<Spanned<DeValue<'_>>>,
) -> (Vec<SourceSpec>, Vec<presets::PresetUse>) {
    let entries = match value.map(|s| (s.span(), s.into_inner())) {
        Some((_, DeValue::Array(entries))) if !entries.is_empty() => entries,
        Some((_, DeValue::Array(_))) | None => {
            v.problem(
                "sources",
                "at least one [[sources]] entry is required".into(),
            );
            return (Vec::new(), Vec::new());
        }
        Some((_, other)) => {
            v.problem(
                "sources",
                format!(
                    "invalid type: {}, expected a sequence of [[sources]] tables",
                    other.type_str()
                ),
            );
            return (Vec::new(), Vec::new());
        }
    };
    let mut names = HashSet::new();
    let mut used = Vec::new();
    let mut sources = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let key = format!("sources[{i}]");
        let span = entry.span();
        let DeValue::Table(mut table) = entry.into_inner() else {
            v.problem(&key, "must be a table ([[sources]])".into());
            continue;
        };
        let preset_span = table
            .keys()
            .find(|k| k.get_ref() == "preset")
            .map(|k| k.span());
        let mut take_string = |field: &str, v: &mut Validator<'_>| -> Option<String> {
            let found = table.keys().find(|k| k.get_ref() == field)?.clone();
            let value = table.remove(&found)?;
            match value.get_ref() {
                DeValue::String(s) => Some(s.to_string()),
                other => {
                    v.problem(
                        &format!("{key}.{field}"),
                        format!("invalid type: {}, expected a string", other.type_str()),
                    );
                    None
                }
            }
        };
        let name = take_string("name", v);
        let preset = take_string("preset", v);
        let mut kind = take_string("kind", v);
        let mut preset_use = None;
        if let (Some(preset), Some(span)) = (preset, preset_span) {
            let Some(applied) = presets::apply(v, &key, &preset, kind.as_deref(), &mut table, span)
            else {
                continue;
            };
            kind = Some(applied.kind.to_string());
            preset_use = Some(applied);
        }
        if let Some(name) = &name
            && !names.insert(name.clone())
        {
            v.problem(
                &format!("{key}.name"),
                format!("duplicate source name \"{name}\" (names must be unique)"),
            );
        }
        let name = common::check_name(v, &key, name.as_deref());
        let kinds = match SourceSpec::KINDS {
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
            [] => String::new(),
        };
        let Some(kind) = kind else {
            v.problem(&format!("{key}.kind"), format!("required ({kinds})"));
            continue;
        };
        let entry = Spanned::new(span, DeValue::Table(table));
        let source_name = name.clone();
        match SourceSpec::check(&kind, &key, name, entry, v) {
            Some(Some(spec)) => {
                if let Some(applied) = preset_use {
                    used.push(applied.used_by(source_name));
                }
                sources.push(spec)
            }
            Some(None) => {}
            None => v.problem(
                &format!("{key}.kind"),
                format!("unknown kind \"{kind}\" (expected {kinds})"),
            ),
        }
    }
    (sources, used)
}

fn http_limits(v: &mut Validator<'_>, server: &RawServer) -> HttpLimits {
    let default = HttpLimits::default();
    let mut timeout = |key: &str, value: Option<&str>, default: Duration| {
        let d = v.duration(key, value, default);
        if d.is_zero() {
            v.problem(key, "must be more than 0s".into());
        }
        d
    };
    HttpLimits {
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
        max_connections: v.positive(
            "server.max_http_connections",
            server.max_http_connections,
            default.max_connections,
            65_536,
        ),
        max_connections_per_client: v.positive(
            "server.max_http_connections_per_client",
            server.max_http_connections_per_client,
            default.max_connections_per_client,
            65_536,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::table::Status;

    fn env(name: &str) -> Option<String> {
        (name == "PW").then(|| "s3cret".to_string())
    }

    fn check(text: &str) -> Result<Config, ConfigError> {
        parse_with(text, Environment::Process, &env)
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
        // Optional meanings not written are not used: no change cursor.
        assert_eq!(s.columns.updated_at, None);
        assert_eq!(s.columns.started_at, None);
        assert_eq!(s.columns.status.as_deref(), Some("status"));
        assert_eq!(s.table.cursor, crate::sources::table::config::Cursor::None);
        assert_eq!(s.statuses.classify("dead"), Some(Status::Dead));
        assert_eq!(s.table.dsn.expose(), "postgres://u:s3cret@db/orders");
        assert_eq!(s.table.dsn.to_string(), "postgres://u:***@db/orders");
        assert_eq!(cfg.listen.to_string(), "0.0.0.0:9469");
        assert_eq!(cfg.shutdown_grace, Duration::from_secs(20));
        assert_eq!(cfg.http, HttpLimits::default());
    }

    /// Guards `full_read_timeout`: 5 m by default, never below `timeout`, and
    /// refused by key when written below it.
    #[test]
    fn full_read_timeout_defaults_to_5m_and_is_at_least_the_timeout() {
        let table = |text: &str| {
            let SourceSpec::Inbox(s) = &check(text).expect("valid").sources[0] else {
                panic!("expected an inbox source")
            };
            (s.table.timeout, s.table.full_read_timeout)
        };
        let secs = Duration::from_secs;
        assert_eq!(table(MINIMAL), (secs(5), secs(300)));
        assert_eq!(
            table(&format!("{MINIMAL}timeout = \"10m\"\n")),
            (secs(600), secs(600))
        );
        assert_eq!(
            table(&format!("{MINIMAL}full_read_timeout = \"30s\"\n")),
            (secs(5), secs(30))
        );
        let err = check(&format!(
            "{MINIMAL}timeout = \"1m\"\nfull_read_timeout = \"30s\"\n"
        ))
        .expect_err("invalid");
        let problems: Vec<(&str, &str)> = err
            .problems
            .iter()
            .map(|p| (p.key.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            problems,
            vec![(
                "sources[0].full_read_timeout",
                "must be at least the timeout (1m)"
            )]
        );
    }

    /// Guards `attempts_count`: a column of failed attempts (.NET CAP's `Retries`) is
    /// read as attempts started by adding the attempt under way or the one that
    /// succeeded; a bad word, or the key without an attempts column, is named.
    #[test]
    fn attempts_count_is_read_and_checked_by_key() {
        use crate::sources::table::config::AttemptsCount;
        let SourceSpec::Inbox(s) = &check(MINIMAL).expect("valid").sources[0] else {
            panic!("expected an inbox source")
        };
        assert_eq!(s.attempts_count, AttemptsCount::Started);
        let text = format!(
            "{MINIMAL}attempts_count = \"failed\"\n[sources.columns]\nattempts = \"Retries\"\n"
        );
        let SourceSpec::Inbox(s) = &check(&text).expect("valid").sources[0] else {
            panic!("expected an inbox source")
        };
        assert_eq!(s.attempts_count, AttemptsCount::Failed);
        let failed = AttemptsCount::Failed;
        assert_eq!(failed.started(0, Some(Status::Pending)), 0);
        assert_eq!(failed.started(2, Some(Status::Failed)), 2);
        assert_eq!(failed.started(2, Some(Status::Processing)), 3);
        assert_eq!(failed.started(2, Some(Status::Succeeded)), 3);
        assert_eq!(failed.started(50, Some(Status::Dead)), 50);
        assert_eq!(failed.started(1, None), 1);
        assert_eq!(
            AttemptsCount::Started.started(2, Some(Status::Succeeded)),
            2
        );

        let err = check(&format!("{MINIMAL}attempts_count = \"retries\"\n")).expect_err("invalid");
        let problems: Vec<(&str, &str)> = err
            .problems
            .iter()
            .map(|p| (p.key.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            problems,
            vec![
                (
                    "sources[0].attempts_count",
                    "\"retries\" is not one of \"started\", \"failed\""
                ),
                (
                    "sources[0].attempts_count",
                    "applies only with columns.attempts"
                ),
            ]
        );
    }

    #[test]
    fn a_preset_fills_what_the_entry_does_not_write_and_the_entry_wins() {
        let cfg = check(
            r#"
[[sources]]
name = "jobs"
preset = "graphile-worker"
dsn = "postgres://u:${PW}@db/app"
table = "app_worker.jobs"
owner = "team-a"

[sources.columns]
last_error = ""
received_at = "run_at"
"#,
        )
        .expect("valid");
        let SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("the preset makes an inbox source")
        };
        // The entry's own keys win, one column at a time.
        assert_eq!(s.table.table, "app_worker.jobs");
        assert_eq!(s.columns.received_at, "run_at");
        assert_eq!(s.columns.last_error, None);
        // The preset's other keys are there.
        assert_eq!(s.columns.event_id, "id");
        assert_eq!(s.columns.event_type.as_deref(), Some("task_identifier"));
        assert_eq!(s.columns.attempts.as_deref(), Some("attempts"));
        assert_eq!(s.rules.len(), 4);
        assert_eq!(
            s.table.finished_rows,
            crate::sources::table::config::FinishedRows::Deleted
        );
        assert_eq!(s.deleted_as, Status::Succeeded);
        assert_eq!(s.table.cursor, crate::sources::table::config::Cursor::None);
        assert_eq!(s.table.owner.as_deref(), Some("team-a"));
        let used = &cfg.presets[0];
        assert_eq!(
            (used.source.as_str(), used.preset),
            ("jobs", "graphile-worker")
        );
        assert_eq!(
            used.overridden,
            ["columns.last_error", "columns.received_at", "table"]
        );
        assert!(used.effective.contains("table = \"app_worker.jobs\""));
        assert!(used.effective.contains("finished_rows = \"deleted\""));
        assert!(!used.effective.contains("s3cret") && !used.effective.contains("dsn"));
    }

    #[test]
    fn a_preset_is_checked_like_the_entry_and_named_in_problems() {
        let head = "[[sources]]\nname = \"j\"\ndsn = \"postgres://u@db/app\"\n";
        let problems = |extra: &str| -> Vec<String> {
            match check(&format!("{head}{extra}")) {
                Ok(_) => Vec::new(),
                Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
            }
        };
        assert_eq!(
            problems("preset = \"graphile\"\n"),
            [format!(
                "sources[0].preset: unknown preset \"graphile\" (expected one of {}; \
                 `inboxwatch presets` lists them)",
                presets::names().join(", ")
            )]
        );
        assert_eq!(
            problems("preset = \"graphile-worker\"\nkind = \"outbox\"\n"),
            [
                "sources[0].kind: \"outbox\" does not fit preset \"graphile-worker\", which \
              makes inbox sources (leave `kind` out)"
            ]
        );
        // The entry's kind may repeat the preset's.
        assert_eq!(
            problems("preset = \"graphile-worker\"\nkind = \"inbox\"\n"),
            Vec::<String>::new()
        );
        // A bad override is the entry's problem, at its key.
        assert_eq!(
            problems("preset = \"graphile-worker\"\ncursor = \"sometimes\"\n"),
            [
                "sources[0].cursor: \"sometimes\" is not a cursor mode: \"updated_at\", \"none\" or \"events\""
            ]
        );
        assert_eq!(
            problems("preset = \"graphile-worker\"\n[sources.columns]\nevent_idd = \"id\"\n"),
            [
                "sources[0].columns.event_idd: unknown key, expected one of `event_id`, \
              `event_type`, `status`, `received_at`, `started_at`, `finished_at`, `attempts`, \
              `deliveries`, `last_error`, `traceparent`, `updated_at`, `business_key`, \
              `summary`, `ordering_key`, `version` (line 6)"
            ]
        );
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
status = ""

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
                "sources[0].columns.status",
                "sources[1].name",
                "sources[1].dsn",
            ]
        );
        assert!(err.problems[4].message.contains("NOPE"));
    }

    #[test]
    fn owners_and_error_classes_are_read_and_checked_by_key() {
        let text = format!(
            "{MINIMAL}owner = \"team-payments\"\ndefault_error_classes = false\n\
             [[sources.error_classes]]\nclass = \"poison\"\npattern = \"deserializ\"\n\n\
             [[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"b:9092\"]\nowner = \"team-core\"\n\
             [[sources.owners]]\ngroups = \"billing-.*\"\nowner = \"team-payments\"\n"
        );
        let cfg = check(&text).expect("valid");
        assert_eq!(cfg.sources[0].owner(), "team-payments");
        assert_eq!(cfg.sources[0].service(), "orders");
        let SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("expected an inbox source")
        };
        assert_eq!(
            s.error_classes.classify(Some("cannot deserialize")),
            ("poison", false)
        );
        assert_eq!(s.error_classes.classify(Some("HTTP 403")), ("other", true));
        let SourceSpec::Kafka(k) = &cfg.sources[1] else {
            panic!("expected a kafka source")
        };
        assert_eq!(cfg.sources[1].owner(), "team-core");
        assert_eq!(k.owner_of("billing-eu"), "team-payments");
        assert_eq!(k.owner_of("eu-billing-eu"), "team-core");
        // Without an owner: "" (the info series' owner="").
        assert_eq!(check(MINIMAL).expect("valid").sources[0].owner(), "");

        let bad = format!(
            "{MINIMAL}owner = \"team payments\"\n[[sources.error_classes]]\nclass = \"x\"\npattern = \"(\"\n\n\
             [[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"b:9092\"]\nowner = \"\"\n\
             [[sources.owners]]\ngroups = \"[\"\n"
        );
        let err = check(&bad).expect_err("invalid");
        let keys: Vec<&str> = err.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "sources[0].owner",
                "sources[0].error_classes[0].pattern",
                "sources[1].owner",
                "sources[1].owners[0].groups",
                "sources[1].owners[0].owner",
            ],
            "{err}"
        );
    }

    /// Guards the one rule per common setting (issue 30): before, a table
    /// source took a `poll_interval` of 1 ms and a Kafka source a `timeout`
    /// of 0; `service_name` was a table key only, and taken blank.
    #[test]
    fn common_settings_follow_one_rule_whatever_the_kind() {
        let kafka = "[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"b:9092\"]\n";
        let problems = |text: &str| -> Vec<String> {
            match check(text) {
                Ok(_) => Vec::new(),
                Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
            }
        };
        for (extra, said) in [
            (
                "poll_interval = \"99ms\"\n",
                "poll_interval: must be at least 100ms",
            ),
            ("timeout = \"0s\"\n", "timeout: must be at least 100ms"),
            ("service_name = \" \"\n", "service_name: must not be empty"),
        ] {
            for entry in [MINIMAL, kafka] {
                assert_eq!(
                    problems(&format!("{entry}{extra}")),
                    [format!("sources[0].{said}")],
                    "{entry}{extra}"
                );
            }
        }
        let cfg = check(&format!(
            "{MINIMAL}poll_interval = \"100ms\"\ntimeout = \"100ms\"\n\
             {kafka}poll_interval = \"100ms\"\ntimeout = \"100ms\"\nservice_name = \"billing\"\n"
        ))
        .expect("100ms is the shortest, for every kind");
        let SourceSpec::Kafka(k) = &cfg.sources[1] else {
            panic!("a kafka source")
        };
        assert_eq!(
            (k.poll_interval, k.timeout),
            (Duration::from_millis(100), Duration::from_millis(100))
        );
        assert_eq!(cfg.sources[1].service(), "billing");
        assert_eq!(
            problems(&format!("{kafka}[sources.objectives]\np95 = \"1s\"\n")),
            ["sources[0].objectives: kafka sources export no objectives: nothing would read them"]
        );
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

    #[test]
    fn pages_and_trace_url() {
        let source =
            "[[sources]]\nname = \"a\"\nkind = \"inbox\"\ntable = \"t\"\ndsn = \"sqlite://x.db\"\n";
        let cfg = parse_str(source).expect("valid");
        assert_eq!(cfg.pages, None, "unset, the listener decides");
        assert_eq!(cfg.trace_url, None);
        let cfg = parse_str(&format!(
            "[server]\npages = false\ntrace_url = \"https://jaeger.example/trace/{{trace_id}}\"\n{source}"
        ))
        .expect("valid");
        assert_eq!(cfg.pages, Some(false));
        assert_eq!(
            cfg.trace_url.as_deref(),
            Some("https://jaeger.example/trace/{trace_id}")
        );
        for bad in ["https://jaeger.example/trace/", "ftp://x/{trace_id}"] {
            let err = parse_str(&format!("[server]\ntrace_url = \"{bad}\"\n{source}"))
                .expect_err("invalid");
            assert_eq!(
                err.problems
                    .iter()
                    .map(|p| (p.key.as_str(), p.message.as_str()))
                    .collect::<Vec<_>>(),
                vec![(
                    "server.trace_url",
                    format!("{bad:?} must be an http:// or https:// URL with {{trace_id}} in it")
                        .as_str()
                )]
            );
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
        let cfg = parse_with(text, Environment::Process, &env).expect("valid");
        let shown = format!(
            "{cfg:?} {}",
            cfg.sources
                .iter()
                .filter_map(|s| match s {
                    SourceSpec::Inbox(s) => Some(s.table.dsn.to_string()),
                    SourceSpec::Outbox(s) => Some(s.table.dsn.to_string()),
                    _ => None,
                })
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
            let err = parse_with(&text, Environment::Process, &env).expect_err(misread);
            assert!(!format!("{err} {err:?}").contains("Lk9qA"), "{err:?}");
        }
    }

    /// Guards the documented example: it must stay valid as keys change.
    #[test]
    fn the_documented_example_is_valid() {
        let text = include_str!("../config/inboxwatch.toml");
        // Every ${VAR} set; the OTEL_EXPORTER_OTLP_* fallbacks left unset.
        let env = |name: &str| (!name.starts_with("OTEL_")).then(|| "example".to_string());
        let cfg =
            parse_with(text, Environment::Process, &env).expect("config/inboxwatch.toml is valid");
        assert_eq!(cfg.sources.len(), 6);
        use crate::sources::table::config::{Cursor, FinishedRows};
        let SourceSpec::Inbox(orders) = &cfg.sources[0] else {
            panic!("orders-inbox is an inbox")
        };
        assert_eq!(orders.table.cursor, Cursor::UpdatedAt);
        let SourceSpec::Inbox(billing) = &cfg.sources[1] else {
            panic!("billing-inbox is an inbox")
        };
        assert_eq!(billing.columns.deliveries, None);
        assert_eq!(billing.table.cursor, Cursor::None);
        assert_eq!(billing.statuses.classify("buried"), Some(Status::Dead));
        let SourceSpec::Inbox(payments) = &cfg.sources[2] else {
            panic!("payments-inbox is an inbox")
        };
        assert_eq!(payments.columns.status, None);
        assert_eq!(payments.rules.len(), 5);
        let SourceSpec::Inbox(mailer) = &cfg.sources[3] else {
            panic!("mailer-jobs is an inbox")
        };
        assert_eq!(mailer.table.finished_rows, FinishedRows::Deleted);
        assert_eq!(mailer.deleted_as, Status::Succeeded);
        let SourceSpec::Kafka(k) = &cfg.sources[5] else {
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
        assert_eq!(
            tracing.collector.traces_endpoint,
            "http://otel-collector:4317"
        );
        let SourceSpec::Inbox(orders) = &cfg.sources[0] else {
            panic!("the first source is an inbox")
        };
        assert_eq!(orders.table.trace.messaging_system, "kafka");
    }

    /// `attempts_offset` turns a retry count into attempts made, once a row
    /// has started (pg-boss's `retry_count` is 0 through the first attempt);
    /// it needs both columns, a small non-negative value and an inbox.
    #[test]
    fn attempts_offset_reads_a_retry_count_as_attempts() {
        use crate::dsn::Dialect;
        use crate::sources::table::sql::Sql;
        let inbox = |extra: &str, columns: &str| {
            format!(
                "[[sources]]\nname = \"jobs\"\nkind = \"inbox\"\ndsn = \"sqlite://x\"\n\
                 table = \"job\"\n{extra}\n[sources.columns]\n{columns}\n"
            )
        };
        let both = "attempts = \"retry_count\"\nstarted_at = \"started_on\"";
        let pg = Sql {
            dialect: Dialect::Postgres,
        };
        let cfg = check(&inbox("attempts_offset = 1", both)).expect("valid");
        let SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("an inbox source")
        };
        assert_eq!(s.attempts_offset, 1);
        assert_eq!(
            s.attempts_select(&pg),
            "CAST(CASE WHEN \"started_on\" IS NULL THEN \"retry_count\" \
             ELSE \"retry_count\" + 1 END AS BIGINT)"
        );
        let cfg = check(&inbox("", both)).expect("valid");
        let SourceSpec::Inbox(s) = &cfg.sources[0] else {
            panic!("an inbox source")
        };
        assert_eq!(s.attempts_offset, 0);
        assert_eq!(s.attempts_select(&pg), "CAST(\"retry_count\" AS BIGINT)");

        for (extra, columns, says) in [
            ("attempts_offset = -1", both, "not between 0 and 10"),
            ("attempts_offset = 11", both, "not between 0 and 10"),
            (
                "attempts_offset = 1",
                "attempts = \"retry_count\"",
                "needs columns.attempts and columns.started_at",
            ),
            (
                "attempts_offset = 1",
                "started_at = \"started_on\"",
                "needs columns.attempts and columns.started_at",
            ),
        ] {
            let err = check(&inbox(extra, columns)).expect_err(extra);
            let p = err
                .problems
                .iter()
                .find(|p| p.key == "sources[0].attempts_offset")
                .unwrap_or_else(|| panic!("{extra} / {columns}: {:?}", err.problems));
            assert!(p.message.contains(says), "{extra}: {}", p.message);
        }
        let err = check(
            "[[sources]]\nname = \"o\"\nkind = \"outbox\"\ndsn = \"sqlite://x\"\n\
             table = \"outbox\"\nattempts_offset = 1\n",
        )
        .expect_err("an outbox has no attempts");
        assert!(
            err.problems
                .iter()
                .any(|p| p.key == "sources[0].attempts_offset"),
            "{:?}",
            err.problems
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

    /// An inbox entry with `extra` settings and `columns` mapped.
    fn ordering_inbox(extra: &str, columns: &str) -> String {
        format!(
            "[[sources]]\nname = \"orders\"\nkind = \"inbox\"\ndsn = \"sqlite://x\"\n\
             table = \"inbox\"\n{extra}\n[sources.columns]\n{columns}\n"
        )
    }

    /// Both ordering columns mapped.
    const ORDERING_COLUMNS: &str =
        "ordering_key = \"aggregate_id\"\nversion = \"aggregate_version\"";

    /// `ordering_key` and `version` come as a pair; `ordering_keys_limit`
    /// only with them and within its bounds; `parked` has no default word,
    /// takes words like the other meanings and is a meaning rules may name.
    #[test]
    fn ordering_columns_and_parked_statuses_are_checked_by_key() {
        let inbox = ordering_inbox;
        let both = ORDERING_COLUMNS;
        let spec = |text: &str| {
            let cfg = check(text).unwrap_or_else(|e| panic!("{text}: {:?}", e.problems));
            let SourceSpec::Inbox(s) = cfg.sources.into_iter().next().expect("a source") else {
                panic!("an inbox source")
            };
            s
        };
        let s = spec(&inbox("", both));
        assert!(s.ordered());
        assert_eq!(s.ordering_keys_limit, 100_000);
        assert!(!s.parks());
        assert_eq!(s.statuses.classify("parked"), None, "no default word");
        let s = spec(&inbox("", ""));
        assert!(!s.ordered());
        let s = spec(&inbox(
            "ordering_keys_limit = 50\n[sources.statuses]\nparked = [\"parked\", \"quarantined\"]",
            both,
        ));
        assert_eq!(s.ordering_keys_limit, 50);
        assert!(s.parks());
        assert_eq!(s.statuses.classify("quarantined"), Some(Status::Parked));
        // What doctor says of each series; none of them for a source without.
        let lines: Vec<String> = crate::sources::table::capabilities::inbox(&s)
            .iter()
            .map(|c| c.line())
            .filter(|l| l.contains("order") || l.contains("parked") || l.contains("gap"))
            .collect();
        assert_eq!(
            lines,
            [
                "inbox_out_of_order_arrivals_total: exact",
                "inbox_out_of_order_completions_total: bounded — no finished_at column: \
                 successes are ordered by when the agent saw them",
                "inbox_version_gaps: exact",
                "inbox_oldest_version_gap_age_seconds: exact",
                "inboxwatch_ordering_keys_evicted_total: exact",
                "inbox_parked_messages: exact",
                "inbox_oldest_parked_age_seconds: exact",
                "inbox_parked_keys: exact",
            ]
        );
        // The parked rows' aggregate: by the status words, or by the rules' meaning.
        {
            use crate::dsn::Dialect;
            use crate::sources::table::TableKind;
            use crate::sources::table::sql::Sql;
            let pg = Sql {
                dialect: Dialect::Postgres,
            };
            let query = crate::sources::table::inbox::Inbox::new(s.clone())
                .parked_query(&pg)
                .expect("a source with parked words has the aggregate");
            assert!(
                query.starts_with(
                    "SELECT CAST(COUNT(*) AS BIGINT), CAST(COUNT(DISTINCT \"aggregate_id\") AS BIGINT), "
                ),
                "{query}"
            );
            assert!(
                query.ends_with(" FROM \"inbox\" WHERE \"status\" IN ('parked', 'quarantined')"),
                "{query}"
            );
            let ruled = spec(&inbox(
                "[[sources.status_rules]]\nmeaning = \"parked\"\nwhen = \"parked_at IS NOT NULL\"",
                "",
            ));
            let query = crate::sources::table::inbox::Inbox::new(ruled)
                .parked_query(&pg)
                .expect("a source with a parked rule has the aggregate");
            assert!(
                query.contains("WHEN \"parked_at\" IS NOT NULL THEN 'parked'"),
                "{query}"
            );
            assert!(
                query.contains("CAST(0 AS BIGINT)"),
                "no keys without the columns: {query}"
            );
            let none = crate::sources::table::inbox::Inbox::new(spec(&inbox("", both)));
            assert_eq!(
                none.parked_query(&pg),
                None,
                "no parked status, no aggregate"
            );
        }
        let plain = spec(&inbox("", ""));
        assert!(
            crate::sources::table::capabilities::inbox(&plain)
                .iter()
                .all(|c| !c.metric.contains("order") && !c.metric.contains("parked")),
            "no ordering series without the columns"
        );
        let s = spec(&inbox(
            "[[sources.status_rules]]\nmeaning = \"parked\"\nwhen = \"parked_at IS NOT NULL\"",
            "",
        ));
        assert!(s.parks() && !s.ordered());
    }

    /// The ordering and parked settings that are wrong, each refused by its key.
    #[test]
    fn wrong_ordering_and_parked_settings_are_refused_by_key() {
        let inbox = ordering_inbox;
        let both = ORDERING_COLUMNS;
        for (extra, columns, key, says) in [
            (
                "",
                "version = \"aggregate_version\"",
                "sources[0].columns.version",
                "needs columns.ordering_key",
            ),
            (
                "",
                "ordering_key = \"aggregate_id\"",
                "sources[0].columns.ordering_key",
                "needs columns.version",
            ),
            (
                "",
                "ordering_key = \"aggregate_id\"\nversion = \"aggregate_id\"",
                "sources[0].columns.version",
                "also mapped to ordering_key",
            ),
            (
                "ordering_keys_limit = 10",
                "",
                "sources[0].ordering_keys_limit",
                "applies only with columns.ordering_key and columns.version",
            ),
            (
                "ordering_keys_limit = 0",
                both,
                "sources[0].ordering_keys_limit",
                "must be between 1 and",
            ),
            (
                "[sources.statuses]\nparked = [\"dead\"]",
                "",
                "sources[0].statuses.parked",
                "\"dead\" is already mapped to dead",
            ),
            (
                "[[sources.status_rules]]\nmeaning = \"parkd\"\nwhen = \"parked_at IS NOT NULL\"",
                "",
                "sources[0].status_rules[0].meaning",
                "one of pending, processing, succeeded, failed, dead, parked",
            ),
        ] {
            let err = check(&inbox(extra, columns)).expect_err(extra);
            let p = err
                .problems
                .iter()
                .find(|p| p.key == key)
                .unwrap_or_else(|| panic!("{extra} / {columns}: {:?}", err.problems));
            assert!(p.message.contains(says), "{extra}: {}", p.message);
        }
    }
}
