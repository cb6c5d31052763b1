//! Command line: `run`, `demo`, `check-config`, `schema`, `doctor`, `metrics`,
//! `trace`, `dead-letters` (and `dead-letters replay | ignore`); and what
//! `check-config` prints of a config that passed.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::dsn::Dialect;
use crate::sources::kind::{Action, ActionRequest};

/// Watches message consumers from the outside: inbox and outbox tables,
/// exported as Prometheus metrics.
#[derive(Debug, Parser)]
#[command(name = "inboxwatch", version, about)]
pub struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. `info` or `inboxwatch=debug`; the
    /// default keeps the NATS client's own connection chatter out.
    #[arg(
        long,
        global = true,
        env = "INBOXWATCH_LOG",
        default_value = "info,async_nats=warn"
    )]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent on a config file.
    Run {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Listen address, overriding `server.listen`.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// The exporter-toolkit web config file (TLS, basic auth, headers),
        /// overriding `server.web_config_file`.
        #[arg(long = "web.config.file", value_name = "FILE")]
        web_config_file: Option<PathBuf>,
    },
    /// Run the embedded demo: an SQLite inbox fed by a simulated consumer, watched live.
    Demo {
        /// Listen address of /metrics.
        #[arg(long, default_value = "127.0.0.1:9469")]
        listen: SocketAddr,
        /// New events per second of the simulated consumer.
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        /// Inject one fault from 30 s after the start (docs/drills.md); `list`
        /// prints the drills.
        #[arg(long, value_name = "NAME")]
        drill: Option<String>,
        /// Run on this PostgreSQL or MariaDB (postgres://… or mysql://…) instead of
        /// a temporary SQLite file, in a table of its own (inboxwatch_demo_inbox),
        /// created at the start and dropped at the exit.
        #[arg(long, value_name = "URL")]
        dsn: Option<String>,
    },
    /// Check a config file: exit 0, or 2 with one line per problem.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
        /// Treat every `${VAR}` as set (to a placeholder) and read nothing from the
        /// environment: for CI pipelines that check a config without its secrets.
        #[arg(long)]
        no_env: bool,
    },
    /// Print the recommended DDL and indexes for a dialect, or the indexes a config's tables need.
    Schema {
        /// postgres, mysql or sqlite.
        #[arg(long, required_unless_present = "config", conflicts_with = "config")]
        dialect: Option<Dialect>,
        /// Instead: the indexes each table source of this config needs, for
        /// its column map, status rules and cursor mode.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Name of the inbox table.
        #[arg(long, default_value = "inbox")]
        table: String,
        /// Also print an outbox table of this name.
        #[arg(long)]
        outbox_table: Option<String>,
        /// Also print the dead-letter audit table of this name (the
        /// `dead_letter_actions.audit_table`, by default `inboxwatch_dead_letter_actions`).
        #[arg(long)]
        audit_table: Option<String>,
    },
    /// Connect to every table source, check columns and indexes, and EXPLAIN the agent's queries.
    Doctor {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the metric reference (every metric the agent exports) as Markdown.
    Metrics,
    /// List the presets (real libraries' table shapes, `preset = "NAME"`), or
    /// print one preset's settings and what it measures.
    Presets {
        /// One preset: what it measures, what it cannot, and its settings.
        name: Option<String>,
    },
    /// Look up one event: its timeline, its trace id and its producer's trace id (read-only).
    Trace {
        /// The event id (idempotency key).
        event_id: String,
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Only this source (default: every inbox and outbox source).
        #[arg(long)]
        source: Option<String>,
    },
    /// List recently dead-lettered events, newest first, tab-separated
    /// (read-only); or `replay` / `ignore` some of them (audited).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    DeadLetters {
        /// replay or ignore dead-lettered events instead of listing them.
        #[command(subcommand)]
        action: Option<DeadLetterCommand>,
        /// The TOML config file.
        #[arg(long, short, required = true)]
        config: Option<PathBuf>,
        /// Only this source (default: every inbox, outbox and Kafka source).
        #[arg(long)]
        source: Option<String>,
        /// How far back, e.g. `1h` or `2d` (table sources; Kafka sources
        /// show the latest records of their dead-letter topics, whatever
        /// their age).
        #[arg(long, default_value = "1h", value_parser = crate::text::parse_since)]
        since: std::time::Duration,
        /// At most this many events (or dead-letter records) per source.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Kafka sources: at most this many of the latest records of each
        /// dead-letter topic partition.
        #[arg(long, default_value_t = 5)]
        per_partition: usize,
    },
}

/// `inboxwatch dead-letters replay | ignore`.
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// Put dead-lettered events back to the replay status for the consumer to
    /// process again, each in one transaction with an audit row. Without
    /// `--yes`, only prints what it would do.
    Replay(Box<ActionArgs>),
    /// Record dead-lettered events as deliberately not processed (an audit
    /// row; and the `ignored_status`, if configured). Without `--yes`, only
    /// prints what it would do.
    Ignore(Box<ActionArgs>),
    /// Print the dead letters, and the events failing now, gathered into
    /// failure groups (source, event type, error class and the error text
    /// with its variable parts taken out), tab-separated, the latest last
    /// seen first (read-only).
    Groups {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Only this source (default: every source with dead letters to list).
        #[arg(long)]
        source: Option<String>,
        /// How far back, e.g. `1h` or `2d`.
        #[arg(long, default_value = "1d", value_parser = crate::text::parse_since)]
        since: std::time::Duration,
        /// At most this many dead letters per source are grouped; a source
        /// that has more says so on a line of its own.
        #[arg(long, default_value_t = 10_000)]
        limit: usize,
    },
    /// Print the replay / ignore history of events from the audit table,
    /// tab-separated, oldest first (read-only: the source's own DSN).
    History {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// The inbox source.
        #[arg(long)]
        source: String,
        /// The event ids.
        #[arg(required = true)]
        event_ids: Vec<String>,
    },
}

/// A bulk run's events per second without `--rate`: slow enough for a
/// consumer sized for its normal traffic to absorb a re-drive of hundreds.
pub const DEFAULT_RATE: u32 = 20;

/// The arguments of `dead-letters replay` and `ignore`.
#[derive(Debug, clap::Args)]
pub struct ActionArgs {
    /// The TOML config file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// The inbox source, or with `--topic` the Kafka source (it needs
    /// `[sources.dead_letter_actions]`).
    #[arg(long)]
    pub source: String,
    /// Who does this (recorded in the audit table).
    #[arg(long)]
    pub operator: String,
    /// Why (recorded in the audit table).
    #[arg(long)]
    pub reason: String,
    /// Apply: without it, nothing is written.
    #[arg(long)]
    pub yes: bool,
    /// Bulk: the events of this failure group (the `group` column of
    /// `dead-letters groups`).
    #[arg(long)]
    pub group: Option<String>,
    /// Bulk: the dead letters of this error class.
    #[arg(long)]
    pub error_class: Option<String>,
    /// Bulk: the dead letters of this event type.
    #[arg(long)]
    pub event_type: Option<String>,
    /// Bulk: dead-lettered within this long, e.g. `6h` or `2d` (default
    /// `7d` when a group or filter is given; with `--topic`: the record's
    /// timestamp, no default).
    #[arg(long, value_parser = crate::text::parse_since)]
    pub since: Option<std::time::Duration>,
    /// Bulk: dead-lettered at least this long ago, e.g. `10m` (with
    /// `--topic`: the record's timestamp).
    #[arg(long, value_parser = crate::text::parse_since)]
    pub until: Option<std::time::Duration>,
    /// Bulk: at most this many events per second, e.g. `100/s` (default
    /// `20/s`; a resumed run keeps its own unless given).
    #[arg(long, value_parser = crate::sources::kind::parse_rate)]
    pub rate: Option<u32>,
    /// Resume the bulk run of this id (printed when it began, and in the
    /// runs table) after an interruption: the events of its snapshot it has
    /// not done yet, none twice.
    #[arg(
        long,
        value_name = "RUN_ID",
        conflicts_with_all = ["group", "error_class", "event_type", "since", "until", "event_ids", "topic"]
    )]
    pub resume: Option<String>,
    /// Kafka: send records of this dead-letter topic back (replay only),
    /// picked by `--partition` with `--from-offset` / `--to-offset`,
    /// `--header`, `--since` / `--until` (on the record's timestamp).
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
    /// Kafka: only this partition of `--topic`.
    #[arg(long, requires = "topic")]
    pub partition: Option<i32>,
    /// Kafka: the first offset (inclusive), with `--partition`.
    #[arg(long, requires = "partition")]
    pub from_offset: Option<i64>,
    /// Kafka: the last offset (inclusive), with `--partition`.
    #[arg(long, requires = "partition")]
    pub to_offset: Option<i64>,
    /// Kafka: only records with this header, `key=value` (repeatable: all
    /// of them).
    #[arg(long = "header", value_name = "KEY=VALUE", requires = "topic", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Kafka: produce every record to this topic instead of its original
    /// topic (the `kafka_dlt-original-topic` / `__connect.errors.topic`
    /// header).
    #[arg(long = "to", value_name = "TOPIC", requires = "topic")]
    pub to_topic: Option<String>,
    /// The event ids (idempotency keys); or a group or filter instead.
    pub event_ids: Vec<String>,
}

/// `--header key=value`.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{text:?}: expected KEY=VALUE")),
    }
}

impl ActionArgs {
    /// The request these arguments make for `action`.
    pub fn request(self, action: Action) -> ActionRequest {
        ActionRequest {
            action,
            operator: self.operator,
            reason: self.reason,
            event_ids: self.event_ids,
            apply: self.yes,
            run_id: None,
        }
    }

    /// The records of a dead-letter topic, when `--topic` is given; at most
    /// `max` per run.
    pub fn topic_selection(&self, max: usize) -> Option<crate::sources::kind::TopicSelection> {
        let topic = self.topic.clone()?;
        Some(crate::sources::kind::TopicSelection {
            topic,
            partition: self.partition,
            from_offset: self.from_offset,
            to_offset: self.to_offset,
            headers: self.headers.clone(),
            since: self.since,
            until: self.until,
            to: self.to_topic.clone(),
            max,
        })
    }

    /// The bulk selection, when a group or a filter is given.
    pub fn selection(&self) -> Option<crate::sources::kind::Selection> {
        let bulk = self.group.is_some()
            || self.error_class.is_some()
            || self.event_type.is_some()
            || self.since.is_some()
            || self.until.is_some();
        bulk.then(|| crate::sources::kind::Selection {
            group: self.group.clone(),
            error_class: self.error_class.clone(),
            event_type: self.event_type.clone(),
            since: self.since,
            until: self.until,
            rate: self.rate.unwrap_or(DEFAULT_RATE),
        })
    }
}

/// `check-config` of a config that passed: the number of sources, then the
/// effective settings of each source written with a preset (name and DSN
/// left out).
pub fn config_report(config: &Config) -> String {
    let mut out = format!("config OK: {} sources\n", config.sources.len());
    for used in &config.presets {
        out.push_str(&format!(
            "\n# source \"{}\": {}\n# effective settings (name and DSN left out):\n{}",
            used.source,
            used.headline(),
            used.effective
        ));
    }
    out
}
