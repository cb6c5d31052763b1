//! The `inboxwatch` binary's command-line contract, tested through the binary:
//! `check-config` accepts the documented example and rejects broken configs with
//! exit code 2 and one line per problem naming its key; DSN passwords never reach
//! any output; `schema` prints DDL that runs (twice) on PostgreSQL, MariaDB and
//! SQLite; `--help` lists every subcommand.

use crate::common;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::schema_ddl;
use common::{Agent, Cmd, Db, Outcome, Tables, V, unique_name, wait_until};

/// A DSN for configs that are only checked (nothing connects to it).
const EXAMPLE_DSN: &str = "postgres://postgres@127.0.0.1:5432/test";
/// A variable no environment sets; removed from every child's environment anyway.
const UNSET_VAR: &str = "INBOXWATCH_CLI_TEST_UNSET_VARIABLE";
const SECRET: &str = "s3cr3t-pw";
const SECRET_DSN: &str = "postgres://u:s3cr3t-pw@127.0.0.1:1/db";

// ---------------------------------------------------------------------------
// Running the binary

/// `inboxwatch <args>` without [`UNSET_VAR`], within 30 s.
fn cli(args: &[&str]) -> Cmd {
    Cmd::new(args)
        .env_remove(UNSET_VAR)
        .timeout(Duration::from_secs(30))
}

fn run_cli(args: &[&str]) -> Outcome {
    cli(args).output()
}

fn write_config(toml: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .prefix("inboxwatch-cli-")
        .suffix(".toml")
        .tempfile()
        .expect("a temporary config file can be created");
    std::fs::write(file.path(), toml).expect("the temporary config file can be written");
    file
}

fn check_config(toml: &str) -> Outcome {
    let file = write_config(toml);
    let path = file.path().to_str().expect("temp paths are UTF-8");
    run_cli(&["check-config", path])
}

// ---------------------------------------------------------------------------
// Building configs

/// TOML string literal.
fn q(value: &str) -> String {
    format!("\"{value}\"")
}

/// One `[[sources]]` entry: top-level keys (in order) plus sub-tables.
#[derive(Clone)]
struct SourceToml {
    keys: Vec<(String, String)>,
    tables: String,
}

impl SourceToml {
    /// A complete, valid inbox source named `name`.
    fn inbox(name: &str) -> Self {
        let keys = [
            ("name", q(name)),
            ("kind", q("inbox")),
            ("dsn", q(EXAMPLE_DSN)),
            ("table", q("inbox_cli")),
            ("poll_interval", q("5s")),
            ("overlap", q("30s")),
            ("stuck_after", q("10m")),
            ("event_type_limit", "50".to_owned()),
        ];
        Self {
            keys: keys.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            tables: String::new(),
        }
    }

    /// Replaces `key`'s value (raw TOML), or appends the key.
    fn set(mut self, key: &str, value: &str) -> Self {
        match self.keys.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_owned(),
            None => self.keys.push((key.to_owned(), value.to_owned())),
        }
        self
    }

    fn remove(mut self, key: &str) -> Self {
        self.keys.retain(|(k, _)| k != key);
        self
    }

    /// Appends a sub-table such as `[sources.columns]` with its body.
    fn table(mut self, header: &str, body: &str) -> Self {
        self.tables.push_str(&format!("\n[{header}]\n{body}\n"));
        self
    }

    fn render(&self) -> String {
        let mut out = String::from("\n[[sources]]\n");
        for (key, value) in &self.keys {
            out.push_str(&format!("{key} = {value}\n"));
        }
        out.push_str(&self.tables);
        out
    }
}

/// A config file: optional top-level keys, `[server]`, then the sources.
fn config_with(top_level: &str, server: &str, sources: &[SourceToml]) -> String {
    let mut out = String::from(top_level);
    out.push_str(&format!("\n[server]\n{server}\n"));
    for source in sources {
        out.push_str(&source.render());
    }
    out
}

fn config(sources: &[SourceToml]) -> String {
    config_with("", "listen = \"127.0.0.1:0\"", sources)
}

// ---------------------------------------------------------------------------
// Asserting on check-config's problems

fn problem_lines(out: &Outcome) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect()
}

/// Whether `line` starts with the key `key` (followed by `:`), or with a key under it
/// (followed by `.`) when `allow_subkey`.
fn starts_with_key(line: &str, key: &str, allow_subkey: bool) -> bool {
    match line.strip_prefix(key) {
        Some(rest) => rest.starts_with(':') || (allow_subkey && rest.starts_with('.')),
        None => false,
    }
}

/// Exit 2, nothing on stdout, and exactly `expected.len()` problem lines on stderr,
/// each expected `(key, value)` on its own line that starts with the key.
fn assert_problems(out: &Outcome, expected: &[(&str, Option<&str>)], allow_subkey: bool) {
    assert_eq!(out.code, Some(2), "exit code\n{}", out.describe());
    assert_eq!(out.stdout, "", "stdout must be empty\n{}", out.describe());
    let lines = problem_lines(out);
    assert_eq!(
        lines.len(),
        expected.len(),
        "one stderr line per problem\n{}",
        out.describe()
    );
    for (key, value) in expected {
        let found = lines.iter().any(|line| {
            starts_with_key(line, key, allow_subkey) && value.is_none_or(|v| line.contains(v))
        });
        assert!(
            found,
            "no stderr line starts with `{key}:`{}\n{}",
            value
                .map(|v| format!(" and contains `{v}`"))
                .unwrap_or_default(),
            out.describe()
        );
    }
}

fn assert_problem(out: &Outcome, key: &str, value: Option<&str>) {
    assert_problems(out, &[(key, value)], false);
}

/// Exit 0 and exactly `config OK: N sources` on stdout (`1 source` also accepted).
fn assert_config_ok(out: &Outcome, sources: usize) {
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let expected = format!("config OK: {sources} sources");
    let stdout = out.stdout.trim_end();
    let accepted = stdout == expected || (sources == 1 && stdout == "config OK: 1 source");
    assert!(accepted, "expected stdout `{expected}`\n{}", out.describe());
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} contains the DSN password `{SECRET}`:\n{text}"
    );
}

// ---------------------------------------------------------------------------
// check-config: valid configs

/// Names of the `${VAR}` references in `text`.
fn env_references(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        rest = &rest[start + 2..];
        if let Some(end) = rest.find('}') {
            let name = &rest[..end];
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn check_config_accepts_the_documented_example() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/inboxwatch.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let sources = text
        .lines()
        .filter(|line| line.trim() == "[[sources]]")
        .count();

    let out = Cmd::new(["check-config"])
        .arg(&path)
        .envs(
            env_references(&text)
                .into_iter()
                .map(|name| (name, "dummy-value")),
        )
        .timeout(Duration::from_secs(30))
        .output();
    assert_config_ok(&out, sources);
}

/// Guards the rejection cases below: the config they start from is valid, so each
/// rejection is caused by its one change.
#[test]
fn check_config_accepts_the_base_config_of_the_rejection_cases() {
    let out = check_config(&config(&[
        SourceToml::inbox("orders"),
        SourceToml::inbox("payments"),
    ]));
    assert_config_ok(&out, 2);
}

#[test]
fn check_config_accepts_fully_specified_source() {
    let source = SourceToml::inbox("orders")
        .set("timeout", &q("2s"))
        .set("quantile_window", &q("5m"))
        .table(
            "sources.columns",
            "event_id = \"id\"\nevent_type = \"\"\nstatus = \"state\"\nreceived_at = \"created\"\n\
             started_at = \"\"\nfinished_at = \"done_at\"\nattempts = \"tries\"\ndeliveries = \"\"\n\
             last_error = \"\"\ntraceparent = \"\"\nupdated_at = \"changed\"",
        )
        .table(
            "sources.statuses",
            "pending = [\"new\", \"queued\"]\nprocessing = [\"running\"]\nsucceeded = [\"done\", \"success\"]\n\
             failed = [\"retry\"]\ndead = [\"dlq\"]",
        )
        .table("sources.objectives", "oldest_age = \"5m\"\np95 = \"2s\"");
    let out = check_config(&config(&[source]));
    assert_config_ok(&out, 1);
}

// ---------------------------------------------------------------------------
// check-config: one problem each

#[test]
fn check_config_rejects_unknown_top_level_key() {
    let toml = config_with(
        "metrics_port = 9000\n",
        "listen = \"127.0.0.1:0\"",
        &[SourceToml::inbox("orders")],
    );
    assert_problem(&check_config(&toml), "metrics_port", None);
}

#[test]
fn check_config_rejects_unknown_server_key() {
    let toml = config_with(
        "",
        "listen = \"127.0.0.1:0\"\nport = 9469",
        &[SourceToml::inbox("orders")],
    );
    assert_problem(&check_config(&toml), "server.port", None);
}

#[test]
fn check_config_rejects_unknown_source_key() {
    let source = SourceToml::inbox("orders")
        .remove("poll_interval")
        .set("poll_intervall", &q("5s"));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].poll_intervall",
        None,
    );
}

#[test]
fn check_config_rejects_unknown_key_in_second_source() {
    let second = SourceToml::inbox("payments").set("stuck_afer", &q("10m"));
    assert_problem(
        &check_config(&config(&[SourceToml::inbox("orders"), second])),
        "sources[1].stuck_afer",
        None,
    );
}

#[test]
fn check_config_rejects_unknown_column_key() {
    let source = SourceToml::inbox("orders").table(
        "sources.columns",
        "event_id = \"event_id\"\nrecieved_at = \"received_at\"",
    );
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].columns.recieved_at",
        None,
    );
}

#[test]
fn check_config_rejects_wrong_value_type() {
    let source = SourceToml::inbox("orders").set("event_type_limit", &q("fifty"));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].event_type_limit",
        Some("fifty"),
    );
}

#[test]
fn check_config_rejects_missing_dsn() {
    let source = SourceToml::inbox("orders").remove("dsn");
    assert_problem(&check_config(&config(&[source])), "sources[0].dsn", None);
}

#[test]
fn check_config_rejects_bad_duration() {
    let source = SourceToml::inbox("orders").set("poll_interval", &q("5 parsecs"));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].poll_interval",
        Some("5 parsecs"),
    );
}

#[test]
fn check_config_rejects_unknown_dialect() {
    let source = SourceToml::inbox("orders").set("dsn", &q("oracle://x/y"));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].dsn",
        Some("oracle"),
    );
}

#[test]
fn check_config_rejects_duplicate_source_names() {
    let toml = config(&[SourceToml::inbox("orders"), SourceToml::inbox("orders")]);
    assert_problem(&check_config(&toml), "sources[1].name", Some("orders"));
}

#[test]
fn check_config_rejects_required_column_mapped_to_empty_string() {
    let source = SourceToml::inbox("orders").table("sources.columns", "status = \"\"");
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].columns.status",
        None,
    );
}

#[test]
fn check_config_rejects_unknown_kind() {
    let source = SourceToml::inbox("orders").set("kind", &q("queue"));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].kind",
        Some("queue"),
    );
}

#[test]
fn check_config_rejects_status_word_with_two_meanings() {
    let source = SourceToml::inbox("orders").table(
        "sources.statuses",
        "pending = [\"pending\"]\nprocessing = [\"processing\"]\nsucceeded = [\"done\"]\n\
         failed = [\"failed\"]\ndead = [\"done\"]",
    );
    // The line may name the table or the meaning: `sources[0].statuses[.dead]: ...`.
    assert_problems(
        &check_config(&config(&[source])),
        &[("sources[0].statuses", Some("done"))],
        true,
    );
}

#[test]
fn check_config_rejects_zero_event_type_limit() {
    let source = SourceToml::inbox("orders").set("event_type_limit", "0");
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].event_type_limit",
        None,
    );
}

#[test]
fn check_config_names_the_unset_variable_in_a_dsn() {
    let dsn = format!("postgres://u:${{{UNSET_VAR}}}@127.0.0.1:5432/db");
    let source = SourceToml::inbox("orders").set("dsn", &q(&dsn));
    assert_problem(
        &check_config(&config(&[source])),
        "sources[0].dsn",
        Some(UNSET_VAR),
    );
}

#[test]
fn check_config_prints_one_line_per_problem() {
    let first = SourceToml::inbox("orders").table("sources.columns", "status = \"\"");
    let second = SourceToml::inbox("orders");
    assert_problems(
        &check_config(&config(&[first, second])),
        &[
            ("sources[0].columns.status", None),
            ("sources[1].name", Some("orders")),
        ],
        false,
    );
}

/// `cursor`, `finished_rows`, `deleted_as` and `[[sources.status_rules]]`
/// mistakes: exit 2, each at its key, with what was wrong.
#[test]
fn check_config_names_cursor_and_status_rule_mistakes() {
    let rules = |body: &str| {
        SourceToml::inbox("orders")
            .table("sources.columns", "status = \"\"")
            .table("[sources.status_rules]", body)
    };
    let cases: Vec<(SourceToml, &str, Option<&str>)> = vec![
        (
            SourceToml::inbox("orders").set("cursor", &q("updated")),
            "sources[0].cursor",
            Some("updated"),
        ),
        // No updated_at column written: there is no cursor to tail.
        (
            SourceToml::inbox("orders").set("cursor", &q("updated_at")),
            "sources[0].cursor",
            Some("columns.updated_at"),
        ),
        (
            SourceToml::inbox("orders").set("finished_rows", &q("dropped")),
            "sources[0].finished_rows",
            Some("dropped"),
        ),
        (
            SourceToml::inbox("orders").set("deleted_as", &q("dead")),
            "sources[0].deleted_as",
            Some("finished_rows"),
        ),
        (
            SourceToml::inbox("orders")
                .set("finished_rows", &q("deleted"))
                .set("deleted_as", &q("gone")),
            "sources[0].deleted_as",
            Some("gone"),
        ),
        (
            rules("meaning = \"done\"\nwhen = \"true\""),
            "sources[0].status_rules[0].meaning",
            Some("done"),
        ),
        (
            rules("meaning = \"dead\"\nwhen = \"abandoned_at IS NOT NULL OR x > 1\""),
            "sources[0].status_rules[0].when",
            Some("OR is not supported"),
        ),
        (
            rules("meaning = \"dead\"\nwhen = \"x = 1; DELETE FROM inbox\""),
            "sources[0].status_rules[0].when",
            Some("unexpected \";\""),
        ),
        (
            rules("meaning = \"dead\""),
            "sources[0].status_rules[0].when",
            Some("required"),
        ),
    ];
    for (source, key, says) in cases {
        assert_problem(&check_config(&config(&[source])), key, says);
    }
    // Rules stand in for the status column, and the second entry's problem
    // carries its own index.
    let ok = rules("meaning = \"succeeded\"\nwhen = \"processed_at IS NOT NULL\"");
    assert_config_ok(&check_config(&config(&[ok])), 1);
    let second = SourceToml::inbox("orders")
        .table("sources.columns", "status = \"\"")
        .table(
            "[sources.status_rules]",
            "meaning = \"succeeded\"\nwhen = \"true\"",
        )
        .table(
            "[sources.status_rules]",
            "meaning = \"dead\"\nwhen = \"tries >\"",
        );
    assert_problem(
        &check_config(&config(&[second])),
        "sources[0].status_rules[1].when",
        Some("expected a column, an integer"),
    );
}

// ---------------------------------------------------------------------------
// Secrets

#[test]
fn check_config_never_prints_a_dsn_password() {
    let valid = SourceToml::inbox("orders").set("dsn", &q(SECRET_DSN));
    let out = check_config(&config(&[valid]));
    assert_config_ok(&out, 1);
    assert_no_secret("stderr", &out.stderr);

    // Problems in the DSN itself, where printing it would be the easy message.
    let wrong_scheme = SourceToml::inbox("orders").set("dsn", &q("oracle://u:s3cr3t-pw@x/y"));
    let out = check_config(&config(&[wrong_scheme]));
    assert_problem(&out, "sources[0].dsn", Some("oracle"));
    assert_no_secret("stderr", &out.stderr);

    let unset_host = format!("postgres://u:{SECRET}@${{{UNSET_VAR}}}:5432/db");
    let unset = SourceToml::inbox("orders").set("dsn", &q(&unset_host));
    let out = check_config(&config(&[unset]));
    assert_problem(&out, "sources[0].dsn", Some(UNSET_VAR));
    assert_no_secret("stderr", &out.stderr);

    // A problem elsewhere in a source whose DSN carries a password.
    let other = SourceToml::inbox("orders")
        .set("dsn", &q(SECRET_DSN))
        .set("poll_interval", &q("5 parsecs"));
    let out = check_config(&config(&[other]));
    assert_problem(&out, "sources[0].poll_interval", Some("5 parsecs"));
    assert_no_secret("stderr", &out.stderr);
}

/// Every character a generated secret may hold, each piece distinctive.
const HOSTILE: &str = "Lk9qA/Zt8wB@Wm7eC:Vp6rD%2FJn5tE#Hb4yF?Cd3uG+Ef2iH Qs1oJ";

fn assert_no_hostile_piece(what: &str, text: &str) {
    for piece in HOSTILE.split(['/', '@', ':', '%', '#', '?', '+', ' ']) {
        assert!(
            piece.len() < 5 || !text.contains(piece),
            "{what} carries `{piece}`, a piece of the password:\n{text}"
        );
    }
}

/// Guards issue 16: a password with `/` from `${VAR}` was substituted unencoded
/// and check-config said OK about a URL that sqlx misreads; now the variable's
/// value is encoded into the userinfo, so any password is valid.
#[test]
fn check_config_accepts_any_password_through_a_variable() {
    const VAR: &str = "INBOXWATCH_CLI_TEST_HOSTILE_PASSWORD";
    let sources = [
        SourceToml::inbox("orders").set(
            "dsn",
            &q(&format!(
                "postgres://u:${{{VAR}}}@127.0.0.1:5432/db?sslmode=prefer"
            )),
        ),
        SourceToml::inbox("billing").set(
            "dsn",
            &q(&format!(
                "mysql://u:${{{VAR}}}@127.0.0.1:3306/db?ssl-mode=DISABLED"
            )),
        ),
    ];
    let file = write_config(&config(&sources));
    let path = file.path().to_str().expect("temp paths are UTF-8");
    let out = cli(&["check-config", path]).env(VAR, HOSTILE).output();
    assert_config_ok(&out, 2);
    assert_no_hostile_piece("check-config", &format!("{}{}", out.stdout, out.stderr));
}

/// Guards issue 16: a DSN that sqlx would read other than as written (a literal
/// password with `/ ? #`, or `postgres:user:pw@host` without `//`) was accepted, and
/// printed in clear because the redaction fell back to the raw text. Now each is
/// one problem naming `sources[0].dsn`, and no line carries any piece of it.
#[test]
fn check_config_refuses_a_dsn_sqlx_would_misread_without_printing_it() {
    for (dsn, says) in [
        ("postgres:u:Lk9qA@127.0.0.1:5432/db", "//"),
        (
            "postgres://u:Lk9qA/Zt8wB@127.0.0.1:5432/db",
            "<unparsable DSN>",
        ),
        // Issue 35: the parser's "invalid port number" (host `u`, port
        // `Lk9qA`) carries the hint the `#` case gives.
        (
            "postgres://u:Lk9qA/Zt8wB@127.0.0.1:5432/db",
            "percent-encoded",
        ),
        ("postgres://u:1/Lk9qA@127.0.0.1:5432/db", "percent-encoded"),
        ("postgres://u:1?Lk9qA@127.0.0.1:5432/db", "percent-encoded"),
        ("mysql://u:1#Lk9qA@127.0.0.1:3306/db", "percent-encoded"),
    ] {
        let source = SourceToml::inbox("orders").set("dsn", &q(dsn));
        let out = check_config(&config(&[source]));
        assert_problem(&out, "sources[0].dsn", Some(says));
        assert_no_hostile_piece(dsn, &out.stderr);
    }
    // The same through dsn_file, the key named as written.
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let file = dir.path().join("orders.dsn");
    std::fs::write(&file, "postgres://u:Lk9qA/Zt8wB@127.0.0.1:5432/db\n")
        .expect("write the DSN file");
    let source = SourceToml::inbox("orders")
        .remove("dsn")
        .set("dsn_file", &q(file.to_str().expect("temp paths are UTF-8")));
    let out = check_config(&config(&[source]));
    assert_problem(&out, "sources[0].dsn_file", Some("<unparsable DSN>"));
    assert_no_hostile_piece("dsn_file", &out.stderr);
}

/// Guards issue 16's "check-config parses each DSN": host, port range and the
/// query parameters sqlx 0.9 reads, with their values, each one problem naming
/// the key and never the password.
#[test]
fn check_config_checks_host_port_and_parameters_of_each_dsn() {
    for (dsn, says) in [
        ("postgres://u:s3cr3t-pw@127.0.0.1:70000/db", "invalid port"),
        ("postgres://u:s3cr3t-pw@127.0.0.1:0/db", "port 0"),
        ("mysql://u:s3cr3t-pw@/db", "empty host"),
        ("postgres:///db", "no host"),
        ("postgres://u:s3cr3t-pw@db/x?sslmode=on", "verify-full"),
        (
            "postgres://u:s3cr3t-pw@db/x?sslmod=require",
            "unknown parameter \"sslmod\"",
        ),
        (
            "mysql://u:s3cr3t-pw@db/x?ssl-mode=require",
            "verify_identity",
        ),
        (
            "mysql://u@db/x?password=s3cr3t-pw",
            "unknown parameter \"password\"",
        ),
        ("sqlite:///tmp/inbox.db?mode=readonly", "rwc"),
        (
            "sqlite:///tmp/inbox.db?journal=wal",
            "unknown parameter \"journal\"",
        ),
    ] {
        let source = SourceToml::inbox("orders").set("dsn", &q(dsn));
        let out = check_config(&config(&[source]));
        assert_problem(&out, "sources[0].dsn", Some(says));
        assert_no_secret(dsn, &out.stderr);
    }
    for dsn in [
        "postgres://u:s3cr3t-pw@db:5432/x?sslmode=verify-full&application_name=iw",
        "mysql://u:s3cr3t-pw@db:3306/x?ssl-mode=REQUIRED&charset=utf8mb4",
        "sqlite:///tmp/inbox.db?mode=ro",
    ] {
        let source = SourceToml::inbox("orders").set("dsn", &q(dsn));
        assert_config_ok(&check_config(&config(&[source])), 1);
    }
}

/// Guards issue 16: one column with two meanings (`status` and `event_id` both
/// `id`) was accepted; it is a problem at the key that set it.
#[test]
fn check_config_refuses_a_column_mapped_twice() {
    for (columns, key, other) in [
        ("event_id = \"id\"\nstatus = \"id\"", "status", "event_id"),
        // The default name of a required meaning counts too.
        (
            "finished_at = \"received_at\"",
            "finished_at",
            "received_at",
        ),
    ] {
        let inbox = SourceToml::inbox("orders").table("sources.columns", columns);
        assert_problem(
            &check_config(&config(&[inbox])),
            &format!("sources[0].columns.{key}"),
            Some(other),
        );
    }
    let outbox = SourceToml::inbox("outbox")
        .set("kind", &q("outbox"))
        .remove("stuck_after")
        .table("sources.columns", "published_at = \"created_at\"");
    assert_problem(
        &check_config(&config(&[outbox])),
        "sources[0].columns.published_at",
        Some("created_at"),
    );
}

/// Guards issue 16: a source name with a newline broke log lines and the
/// `/readyz` line format; control characters in names are refused by key.
#[test]
fn check_config_refuses_control_characters_in_source_names() {
    for name in [
        "orders\\nfake_line 1",
        "tab\\there",
        "bell\\u0007",
        "del\\u007f",
    ] {
        let source = SourceToml::inbox("x").set("name", &format!("\"{name}\""));
        assert_problem(
            &check_config(&config(&[source])),
            "sources[0].name",
            Some("control characters"),
        );
    }
    let kafka = "\n[[sources]]\nname = \"k\\r\"\nkind = \"kafka\"\nbrokers = [\"b:9092\"]\n";
    let out = check_config(&format!("[server]\nlisten = \"127.0.0.1:0\"\n{kafka}"));
    assert_problem(&out, "sources[0].name", Some("control characters"));
}

/// Guards issue 16: the shipped example failed check-config unless every
/// secret was in the environment; `--no-env` treats every `${VAR}` as set,
/// also a whole DSN from a variable, and reads no OTEL_* fallback either.
#[test]
fn check_config_no_env_checks_a_config_without_its_secrets() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/inboxwatch.toml");
    let example = example.to_str().expect("the checkout's path is UTF-8");
    let text = std::fs::read_to_string(example).expect("read the example");
    let sources = text.lines().filter(|l| l.trim() == "[[sources]]").count();
    let vars = env_references(&text);
    let run = |args: &[&str]| {
        let mut cmd = Cmd::new(args)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "not a URL")
            .timeout(Duration::from_secs(30));
        for var in &vars {
            cmd = cmd.env_remove(var);
        }
        cmd.output()
    };
    let without = run(&["check-config", example]);
    assert_eq!(without.code, Some(2), "{}", without.describe());
    assert!(
        without.stderr.contains("ORDERS_DB_PASSWORD"),
        "{}",
        without.describe()
    );
    assert_config_ok(&run(&["check-config", "--no-env", example]), sources);

    let whole = SourceToml::inbox("orders").set("dsn", &q(&format!("${{{UNSET_VAR}}}")));
    let port = SourceToml::inbox("billing").set(
        "dsn",
        &q(&format!(
            "postgres://u:${{{UNSET_VAR}}}@${{{UNSET_VAR}}}:${{{UNSET_VAR}}}/db"
        )),
    );
    let file = write_config(&config(&[whole, port]));
    let path = file.path().to_str().expect("temp paths are UTF-8");
    assert_config_ok(&run_cli(&["check-config", "--no-env", path]), 2);
    // Still checked: everything the variables do not bring.
    let bad = SourceToml::inbox("orders").set(
        "dsn",
        &q(&format!("postgres://u:${{{UNSET_VAR}}}@db/x?sslmode=maybe")),
    );
    let out = check_config_no_env(&config(&[bad]));
    assert_problem(&out, "sources[0].dsn", Some("sslmode"));
}

fn check_config_no_env(toml: &str) -> Outcome {
    let file = write_config(toml);
    let path = file.path().to_str().expect("temp paths are UTF-8");
    run_cli(&["check-config", "--no-env", path])
}

/// Guards issue 16: a listen address in use was "failed to listen on …"; it is
/// one line saying the address is in use and naming `server.listen` / `--listen`,
/// and the agent exits non-zero at once.
#[test]
fn run_reports_a_listen_address_in_use_naming_server_listen() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("an ephemeral port can be bound");
    let addr = taken
        .local_addr()
        .expect("a bound listener has an address")
        .to_string();
    let source = SourceToml::inbox("orders").set("dsn", &q("sqlite:///nonexistent/inbox.db"));
    let file = write_config(&config_with(
        "",
        &format!("listen = {}", q(&addr)),
        &[source],
    ));
    let path = file.path().to_str().expect("temp paths are UTF-8");
    for args in [
        vec!["run", "--config", path],
        vec!["run", "--config", path, "--listen", &addr],
    ] {
        let out = run_cli(&args);
        assert!(matches!(out.code, Some(c) if c != 0), "{}", out.describe());
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| !l.contains(" INFO ") && !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 1, "one error line\n{}", out.describe());
        assert!(
            lines[0].contains("server.listen")
                && lines[0].contains("--listen")
                && lines[0].contains(&addr)
                && lines[0].contains("already in use"),
            "{}",
            out.describe()
        );
    }
}

/// The password reaches the agent three ways: in the DSN, through `${VAR}`, and in a
/// `dsn_file` (as a `password=` query parameter); none of them may reach any output.
#[tokio::test]
async fn run_never_logs_a_dsn_password_when_the_database_is_unreachable() {
    const PASSWORD_VAR: &str = "INBOXWATCH_CLI_TEST_PASSWORD";
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let dsn_file = dir.path().join("billing.dsn");
    std::fs::write(
        &dsn_file,
        format!("postgres://u@127.0.0.1:1/db?password={SECRET}\n"),
    )
    .expect("the DSN file can be written");
    let names = ["orders", "payments", "billing"];
    let sources = [
        SourceToml::inbox(names[0]).set("dsn", &q(SECRET_DSN)),
        SourceToml::inbox(names[1]).set(
            "dsn",
            &q(&format!("mysql://u:${{{PASSWORD_VAR}}}@127.0.0.1:1/db")),
        ),
        SourceToml::inbox(names[2]).remove("dsn").set(
            "dsn_file",
            &q(dsn_file.to_str().expect("temp paths are UTF-8")),
        ),
    ]
    .map(|source| {
        source
            .set("poll_interval", &q("300ms"))
            .set("timeout", &q("1s"))
    });
    let file = write_config(&config_with(
        "",
        &format!("listen = {}", q(&addr)),
        &sources,
    ));

    let started = Instant::now();
    let agent = Agent::run_file(file.path())
        .port(port)
        .env("INBOXWATCH_LOG", "debug")
        .env(PASSWORD_VAR, SECRET)
        .env_remove(UNSET_VAR)
        .start();

    // Wait until the agent has tried every database, marked each source down and
    // logged a warning naming it.
    let down_lines = names.map(|name| format!("inboxwatch_source_up{{source=\"{name}\"}} 0"));
    let agent_ref = &agent;
    let metrics = wait_until(Duration::from_secs(20), || {
        let down_lines = &down_lines;
        async move {
            if let Some(status) = agent_ref.exited() {
                panic!("the agent exited early with {status}");
            }
            let metrics = match agent_ref.get("/metrics").await {
                Ok((200, body)) => body,
                Ok((code, body)) => return Err(format!("/metrics answered {code}: {body}")),
                Err(e) => return Err(e),
            };
            let all_down = down_lines
                .iter()
                .all(|down| metrics.lines().any(|line| line.trim() == down));
            let log = agent_ref.stderr();
            let all_logged = names.iter().all(|name| {
                log.lines()
                    .any(|line| line.contains("WARN") && line.contains(name))
            });
            if all_down && all_logged {
                Ok(metrics)
            } else {
                Err(format!(
                    "/metrics shows {down_lines:?} and stderr has a WARN line per source\n\
                     --- /metrics ---\n{metrics}\n--- stderr ---\n{log}"
                ))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("within 20 s: {e}"));

    // Give it a few reconnect attempts (with their log lines), then stop it gracefully.
    let exposure = Duration::from_secs(2);
    if let Some(remaining) = exposure.checked_sub(started.elapsed()) {
        tokio::time::sleep(remaining).await;
    }
    agent.terminate(Duration::from_secs(10));
    agent.kill();

    assert_no_secret("run's stderr", &agent.stderr());
    assert_no_secret("run's stdout", &agent.stdout());
    assert_no_secret("/metrics", &metrics);
}

// ---------------------------------------------------------------------------
// schema

/// Fresh table names, dropped with `db` (at its cleanup, or on drop when the test fails).
fn schema_tables(db: &Db, tag: &str) -> Tables {
    let tables = Tables {
        inbox: unique_name("inbox_cli", tag),
        outbox: unique_name("outbox_cli", tag),
    };
    db.register_table(&tables.inbox);
    db.register_table(&tables.outbox);
    tables
}

/// What `inboxwatch schema` prints for both tables (it names both), run twice.
async fn run_schema_twice(db: &Db, tables: &Tables) -> String {
    let ddl = schema_ddl(db.dialect.cli_name(), &tables.inbox, Some(&tables.outbox));
    assert!(
        ddl.contains(&tables.inbox) && ddl.contains(&tables.outbox),
        "the DDL names both tables\n{ddl}"
    );
    for run in 1..=2 {
        db.pool
            .raw(&ddl)
            .await
            .unwrap_or_else(|e| panic!("DDL run {run} failed: {e}\n{ddl}"));
    }
    ddl
}

/// The rows of a query whose columns are all text; NULL as `NULL`.
async fn strings(db: &Db, template: &str, args: &[V]) -> Vec<Vec<String>> {
    db.query(template, args)
        .await
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|c| c.unwrap_or_else(|| "NULL".into()))
                .collect()
        })
        .collect()
}

/// The first column of each row.
async fn first_column(db: &Db, template: &str, args: &[V]) -> Vec<String> {
    strings(db, template, args)
        .await
        .into_iter()
        .map(|mut row| row.swap_remove(0))
        .collect()
}

/// After the dialect's own checks: a row with only the required columns gets the
/// defaults, and a third run of the DDL leaves the tables and their rows alone.
/// `now` is the dialect's expression for the current time.
async fn check_defaults_and_rerun(db: &Db, tables: &Tables, ddl: &str, now: &str) {
    let insert = format!(
        "INSERT INTO {} (event_id, status, received_at, updated_at) VALUES ('e1', 'pending', {now}, {now}); \
         INSERT INTO {} (event_id, created_at, updated_at) VALUES ('e1', {now}, {now})",
        tables.inbox, tables.outbox
    );
    db.pool
        .raw(&insert)
        .await
        .expect("a row with only the required columns can be inserted");
    let defaults = strings(
        db,
        &format!(
            "SELECT CAST(attempts AS {{text}}), CAST(deliveries AS {{text}}) FROM {}",
            tables.inbox
        ),
        &[],
    )
    .await;
    assert_eq!(defaults, [["0", "1"]], "defaults of (attempts, deliveries)");
    let count = async |table: &str, filter: &str| {
        first_column(
            db,
            &format!("SELECT CAST(COUNT(*) AS {{text}}) FROM {table} {filter}"),
            &[],
        )
        .await
    };
    assert_eq!(
        count(&tables.outbox, "WHERE published_at IS NULL").await,
        ["1"],
        "published_at is NULL until sent"
    );

    db.pool
        .raw(ddl)
        .await
        .expect("DDL run 3 succeeds on tables with rows");
    assert_eq!(
        count(&tables.inbox, "").await,
        ["1"],
        "re-running the DDL keeps existing rows"
    );
}

/// Inbox columns and whether each is NOT NULL (contract DDL).
const INBOX_COLUMNS: &[(&str, bool)] = &[
    ("attempts", true),
    ("deliveries", true),
    ("event_id", true),
    ("event_type", false),
    ("finished_at", false),
    ("last_error", false),
    ("received_at", true),
    ("started_at", false),
    ("status", true),
    ("traceparent", false),
    ("updated_at", true),
];

/// Outbox columns and whether each is NOT NULL (contract DDL).
const OUTBOX_COLUMNS: &[(&str, bool)] = &[
    ("created_at", true),
    ("event_id", true),
    ("event_type", false),
    ("published_at", false),
    ("traceparent", false),
    ("updated_at", true),
];

fn expected_columns(columns: &[(&str, bool)]) -> Vec<(String, bool)> {
    columns
        .iter()
        .map(|(name, not_null)| ((*name).to_owned(), *not_null))
        .collect()
}

fn is_time_column(name: &str) -> bool {
    name.ends_with("_at")
}

#[tokio::test]
async fn schema_postgres_runs_twice_on_postgresql() {
    let db = Db::postgres().await;
    let tables = schema_tables(&db, "pg");
    let ddl = run_schema_twice(&db, &tables).await;

    for (table, columns) in [
        (&tables.inbox, INBOX_COLUMNS),
        (&tables.outbox, OUTBOX_COLUMNS),
    ] {
        let rows = strings(
            &db,
            "SELECT column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name::text = ? \
             ORDER BY column_name",
            &[V::text(table)],
        )
        .await;
        let actual: Vec<(String, bool)> =
            rows.iter().map(|r| (r[0].clone(), r[2] == "NO")).collect();
        assert_eq!(actual, expected_columns(columns), "columns of {table}");
        for r in &rows {
            let (name, data_type) = (&r[0], &r[1]);
            let expected = if is_time_column(name) {
                "timestamp with time zone"
            } else if name == "attempts" || name == "deliveries" {
                "integer"
            } else {
                "text"
            };
            assert_eq!(data_type, expected, "type of {table}.{name}");
        }

        let primary_key = first_column(
            &db,
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = to_regclass(?) AND i.indisprimary",
            &[V::text(table)],
        )
        .await;
        assert_eq!(primary_key, ["event_id"], "primary key of {table}");
    }

    let index_defs = async |table: &str| {
        first_column(
            &db,
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i \
             WHERE i.indrelid = to_regclass(?) AND NOT i.indisprimary ORDER BY 1",
            &[V::text(table)],
        )
        .await
    };
    let inbox_indexes = index_defs(&tables.inbox).await;
    assert_eq!(inbox_indexes.len(), 2, "inbox indexes: {inbox_indexes:#?}");
    assert!(
        inbox_indexes.iter().any(|d| d.ends_with("(updated_at)")),
        "inbox has an index on (updated_at): {inbox_indexes:#?}"
    );
    assert!(
        inbox_indexes
            .iter()
            .any(|d| d.contains("(received_at) WHERE")
                && d.contains("'pending'")
                && d.contains("'processing'")
                && d.contains("'failed'")
                && !d.contains("'succeeded'")
                && !d.contains("'dead'")),
        "inbox has a partial index on (received_at) over pending/processing/failed: {inbox_indexes:#?}"
    );
    let outbox_indexes = index_defs(&tables.outbox).await;
    assert_eq!(
        outbox_indexes.len(),
        2,
        "outbox indexes: {outbox_indexes:#?}"
    );
    assert!(
        outbox_indexes.iter().any(|d| d.ends_with("(updated_at)")),
        "outbox has an index on (updated_at): {outbox_indexes:#?}"
    );
    assert!(
        outbox_indexes
            .iter()
            .any(|d| d.contains("(created_at) WHERE (published_at IS NULL)")),
        "outbox has a partial index on (created_at) WHERE published_at IS NULL: {outbox_indexes:#?}"
    );

    check_defaults_and_rerun(&db, &tables, &ddl, "now()").await;
    db.cleanup().await;
}

#[tokio::test]
async fn schema_mysql_runs_twice_on_mariadb() {
    let db = Db::mysql().await;
    let tables = schema_tables(&db, "my");
    let ddl = run_schema_twice(&db, &tables).await;

    for (table, columns, expected_indexes) in [
        (
            &tables.inbox,
            INBOX_COLUMNS,
            ["status,received_at", "updated_at"],
        ),
        (
            &tables.outbox,
            OUTBOX_COLUMNS,
            ["published_at,created_at", "updated_at"],
        ),
    ] {
        let rows = strings(
            &db,
            "SELECT CAST(column_name AS CHAR), CAST(column_type AS CHAR), CAST(is_nullable AS CHAR) \
             FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ? ORDER BY column_name",
            &[V::text(table)],
        )
        .await;
        let actual: Vec<(String, bool)> =
            rows.iter().map(|r| (r[0].clone(), r[2] == "NO")).collect();
        assert_eq!(actual, expected_columns(columns), "columns of {table}");
        for r in &rows {
            let (name, column_type) = (&r[0], &r[1]);
            let ok = match name.as_str() {
                n if is_time_column(n) => column_type == "datetime(6)",
                "event_id" => column_type == "varchar(191)",
                "status" => column_type == "varchar(32)",
                "last_error" => column_type == "mediumtext",
                "attempts" | "deliveries" => column_type.starts_with("int"),
                _ => column_type.starts_with("varchar"),
            };
            assert!(ok, "type of {table}.{name}: {column_type}");
        }

        let primary_key = first_column(
            &db,
            "SELECT CAST(column_name AS CHAR) FROM information_schema.key_column_usage \
             WHERE table_schema = DATABASE() AND table_name = ? AND constraint_name = 'PRIMARY'",
            &[V::text(table)],
        )
        .await;
        assert_eq!(primary_key, ["event_id"], "primary key of {table}");

        let indexes = first_column(
            &db,
            "SELECT CAST(GROUP_CONCAT(column_name ORDER BY seq_in_index) AS CHAR) \
             FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = ? AND index_name <> 'PRIMARY' \
             GROUP BY index_name ORDER BY 1",
            &[V::text(table)],
        )
        .await;
        assert_eq!(indexes, expected_indexes, "indexes of {table}");
    }

    check_defaults_and_rerun(&db, &tables, &ddl, "UTC_TIMESTAMP(6)").await;
    db.cleanup().await;
}

#[tokio::test]
async fn schema_sqlite_runs_twice_on_sqlite() {
    let db = Db::sqlite().await;
    let tables = schema_tables(&db, "lite");
    let ddl = run_schema_twice(&db, &tables).await;

    for (table, columns, recency_column) in [
        (&tables.inbox, INBOX_COLUMNS, "received_at"),
        (&tables.outbox, OUTBOX_COLUMNS, "created_at"),
    ] {
        let rows = strings(
            &db,
            "SELECT name, type, CAST(\"notnull\" AS TEXT), CAST(pk AS TEXT) \
             FROM pragma_table_info(?) ORDER BY name",
            &[V::text(table)],
        )
        .await;
        // SQLite lets a non-INTEGER primary key hold NULL unless it says NOT NULL;
        // the primary key is checked on its own below.
        let actual: Vec<(String, bool)> = rows
            .iter()
            .map(|r| (r[0].clone(), r[2] == "1" || r[3] != "0"))
            .collect();
        assert_eq!(actual, expected_columns(columns), "columns of {table}");
        for r in &rows {
            let (name, column_type) = (&r[0], &r[1]);
            let expected = if name == "attempts" || name == "deliveries" {
                "INTEGER"
            } else {
                "TEXT"
            };
            assert_eq!(
                column_type.to_ascii_uppercase(),
                expected,
                "type of {table}.{name}"
            );
        }
        let primary_key: Vec<&str> = rows
            .iter()
            .filter(|r| r[3] != "0")
            .map(|r| r[0].as_str())
            .collect();
        assert_eq!(primary_key, ["event_id"], "primary key of {table}");

        let indexes = first_column(
            &db,
            "SELECT (SELECT group_concat(name) FROM pragma_index_info(il.name)) \
             FROM pragma_index_list(?) AS il WHERE il.origin = 'c' ORDER BY 1",
            &[V::text(table)],
        )
        .await;
        assert_eq!(indexes.len(), 2, "indexes of {table}: {indexes:?}");
        assert!(
            indexes.iter().any(|cols| cols == "updated_at"),
            "{table} has an index on (updated_at): {indexes:?}"
        );
        assert!(
            indexes
                .iter()
                .any(|cols| cols.split(',').next_back() == Some(recency_column)),
            "{table} has an index ending in {recency_column}: {indexes:?}"
        );
    }

    let now = "strftime('%Y-%m-%d %H:%M:%f','now')";
    check_defaults_and_rerun(&db, &tables, &ddl, now).await;
    db.cleanup().await;
}

#[test]
fn schema_rejects_an_unknown_dialect() {
    let out = run_cli(&["schema", "--dialect", "oracle"]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert_eq!(out.stdout, "", "no DDL on stdout\n{}", out.describe());
    assert!(
        out.stderr
            .lines()
            .any(|line| line.contains("--dialect") && line.contains("oracle")),
        "stderr names the flag and the value\n{}",
        out.describe()
    );
}

// ---------------------------------------------------------------------------
// help

#[test]
fn help_lists_every_subcommand() {
    let out = run_cli(&["--help"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for subcommand in ["run", "demo", "check-config", "schema", "doctor"] {
        assert!(
            out.stdout
                .lines()
                .any(|line| line.split_whitespace().next() == Some(subcommand)),
            "`--help` lists `{subcommand}` as a subcommand\n{}",
            out.describe()
        );
    }
}

/// Guards `schema --config`: for a table with no status column (status from
/// rules) and no change cursor — pg-transactional-outbox's shape — it prints
/// the indexes the agent's queries need: one per watermark (`created_at`,
/// `processed_at`) and the partial index over the unfinished rows that the
/// rules' finished conditions make. Run on PostgreSQL, that DDL makes every
/// query `doctor` EXPLAINs use an index (before it, each would scan the
/// table), and the source counts the table's rows as unfinished exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_config_prints_the_indexes_that_rules_and_watermarks_need() {
    let db = Db::postgres().await;
    let t = unique_name("pto", "schema");
    db.register_table(&t);
    db.exec(
        &format!(
            "CREATE TABLE {t} (id uuid PRIMARY KEY, message_type text, \
             locked_until timestamptz NOT NULL DEFAULT to_timestamp(0), \
             created_at timestamptz NOT NULL, processed_at timestamptz, abandoned_at timestamptz, \
             started_attempts smallint NOT NULL DEFAULT 0, finished_attempts smallint NOT NULL DEFAULT 0)"
        ),
        &[],
    )
    .await;
    // 50,000 rows over a month, 1 % unfinished: enough for the planner to
    // prefer an index once there is one.
    db.exec(
        &format!(
            "INSERT INTO {t} (id, message_type, created_at, processed_at, finished_attempts) \
             SELECT md5(g::text)::uuid, 'order.created', now() - (50000 - g) * interval '50 seconds', \
             CASE WHEN g % 100 = 0 THEN NULL ELSE now() - (50000 - g) * interval '50 seconds' + interval '1 second' END, \
             CASE WHEN g % 100 = 0 THEN 0 ELSE 1 END FROM generate_series(1, 50000) g"
        ),
        &[],
    )
    .await;
    db.exec(&format!("ANALYZE {t}"), &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("pto.toml");
    std::fs::write(
        &config,
        format!(
            "[[sources]]\nname = \"pto\"\nkind = \"inbox\"\ndsn = \"{}\"\ntable = \"{t}\"\n\n\
             [sources.columns]\nevent_id = \"id\"\nevent_type = \"message_type\"\nreceived_at = \"created_at\"\n\
             finished_at = \"processed_at\"\nattempts = \"finished_attempts\"\n\n\
             [[sources.status_rules]]\nmeaning = \"dead\"\nwhen = \"abandoned_at IS NOT NULL\"\n\
             [[sources.status_rules]]\nmeaning = \"succeeded\"\nwhen = \"processed_at IS NOT NULL\"\n\
             [[sources.status_rules]]\nmeaning = \"failed\"\nwhen = \"finished_attempts > 0\"\n\
             [[sources.status_rules]]\nmeaning = \"processing\"\nwhen = \"locked_until > now() AND started_attempts > finished_attempts\"\n\
             [[sources.status_rules]]\nmeaning = \"pending\"\nwhen = \"true\"\n",
            db.dsn
        ),
    )
    .expect("write config");

    let doctor = || Cmd::new(["doctor", "--config"]).arg(&config).output();
    let before = doctor();
    let warnings = |o: &Outcome| -> Vec<String> {
        o.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("warning:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        warnings(&before).len(),
        3,
        "without indexes the two tails and the unfinished rows scan the table:\n{}",
        before.describe()
    );

    let out = Cmd::new(["schema", "--config"]).arg(&config).output();
    assert!(out.success(), "{}", out.describe());
    let ddl: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect();
    assert_eq!(
        ddl,
        vec![
            format!("CREATE INDEX IF NOT EXISTS {t}_created_at ON \"{t}\" (\"created_at\");"),
            format!("CREATE INDEX IF NOT EXISTS {t}_processed_at ON \"{t}\" (\"processed_at\");"),
            format!(
                "CREATE INDEX IF NOT EXISTS {t}_unfinished ON \"{t}\" (\"created_at\") \
                 WHERE \"abandoned_at\" IS NULL AND \"processed_at\" IS NULL;"
            ),
        ],
        "{}",
        out.describe()
    );
    for stmt in &ddl {
        db.exec(stmt, &[]).await;
    }
    db.exec(&format!("ANALYZE {t}"), &[]).await;

    let after = doctor();
    assert_eq!(
        warnings(&after),
        Vec::<String>::new(),
        "{}",
        after.describe()
    );
    for what in [
        "tail on created_at",
        "tail on processed_at",
        "unfinished rows",
    ] {
        let line = format!("  ok:      the {what} query uses an index");
        assert!(
            after.stdout.lines().any(|l| l == line),
            "missing {line:?}:\n{}",
            after.describe()
        );
    }
    assert!(
        after.stdout.contains(
            "and every unfinished row, O(backlog) (status_rules: a row's meaning can \
                       change with the clock or any column): 500 unfinished rows now, read on \
                       every poll"
        ),
        "the doctor counts the unfinished rows the rules select, and says why each poll \
         reads them:\n{}",
        after.describe()
    );
    assert_eq!(after.code, Some(0), "{}", after.describe());
}

// ---------------------------------------------------------------------------
// Presets

/// `inboxwatch presets` lists exactly the files under `presets/` (a file nobody
/// registered, or a listed preset without a file, fails); `presets NAME` prints
/// settings that are a valid `[[sources]]` entry once a name and a DSN are added, and
/// `check-config` on an entry with only `preset`, `name` and `dsn` shows exactly those
/// settings as its effective settings, with no DSN or password in them.
#[test]
fn presets_list_every_file_and_print_settings_check_config_accepts_back() {
    let files: BTreeSet<String> = std::fs::read_dir(common::repo_path("presets"))
        .expect("the presets directory")
        .map(|e| e.expect("a directory entry").file_name())
        .filter_map(|n| n.to_str()?.strip_suffix(".toml").map(str::to_string))
        .collect();
    let list = run_cli(&["presets"]);
    assert_eq!(list.code, Some(0), "{}", list.describe());
    let listed: BTreeSet<String> = list
        .stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(
        listed, files,
        "`inboxwatch presets` vs the files under presets/"
    );
    for name in &files {
        let shown = run_cli(&["presets", name]);
        assert_eq!(shown.code, Some(0), "{}", shown.describe());
        let settings: String = shown
            .stdout
            .lines()
            .skip_while(|l| l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            settings.starts_with("[[sources]]\n"),
            "presets {name}: no settings block\n{}",
            shown.stdout
        );
        let written = settings.replacen(
            "[[sources]]\n",
            &format!("[[sources]]\nname = \"a\"\ndsn = {}\n", q(SECRET_DSN)),
            1,
        );
        assert_config_ok_with(&check_config(&written), 1);
        let out = check_config(&format!(
            "[[sources]]\nname = \"a\"\npreset = {}\ndsn = {}\n",
            q(name),
            q(SECRET_DSN)
        ));
        assert_eq!(out.code, Some(0), "{}", out.describe());
        assert_no_secret("check-config on a preset", &out.stdout);
        let effective: String = out
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("[[sources]]"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            effective, settings,
            "check-config's effective settings of preset {name} vs `presets {name}`"
        );
        assert!(
            out.stdout
                .contains(&format!("# source \"a\": preset {name} (")),
            "{}",
            out.stdout
        );
    }
    let unknown = run_cli(&["presets", "no-such-library"]);
    assert_eq!(unknown.code, Some(2), "{}", unknown.describe());
    assert!(
        unknown
            .stderr
            .starts_with("unknown preset \"no-such-library\" (expected one of "),
        "{}",
        unknown.describe()
    );
}

/// One paragraph of `presets NAME`'s comment header (`# Measures: …` up to
/// the next `#` line), as one line without the head.
fn preset_paragraph(out: &str, head: &str) -> String {
    let lines: Vec<&str> = out
        .lines()
        .map(|l| l.strip_prefix('#').unwrap_or(l).trim())
        .collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(head))
        .unwrap_or_else(|| panic!("no `# {head}` paragraph in:\n{out}"));
    lines[start..]
        .iter()
        .take_while(|l| !l.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
        .strip_prefix(head)
        .expect("the head")
        .trim()
        .to_string()
}

/// Issue 35: `presets graphile-worker` said it measured stuck jobs, then
/// that `inbox_stuck_messages` is always 0. Each preset's printed claims now
/// agree with what its file maps: a claim that needs a column (or the
/// events log) is under "Measures" exactly when the preset maps it, and
/// under "Cannot" otherwise, worked out here from the file itself.
#[test]
fn presets_claim_only_what_their_columns_give() {
    let dir = common::repo_path("presets");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("the presets directory") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .expect("a preset file name")
            .to_string();
        let file: toml::Table = toml::from_str(&std::fs::read_to_string(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let source = file["source"].as_table().expect("[source]");
        let text = |k: &str| source.get(k).and_then(|v| v.as_str()).unwrap_or("");
        let columns = source.get("columns").and_then(|c| c.as_table());
        let mapped = |k: &str| {
            columns
                .and_then(|c| c.get(k))
                .and_then(|v| v.as_str())
                .is_some_and(|c| !c.is_empty())
        };
        let events = text("cursor") == "events";
        let deleted = text("finished_rows") == "deleted" && !events;
        let deleted_ends = deleted
            && source
                .get("deleted_durations")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
        let ends = mapped("finished_at") || events || deleted_ends;
        let starts = mapped("started_at") || events;
        let mut expected = vec![
            ("by event type", mapped("event_type")),
            ("trace links", mapped("traceparent")),
        ];
        if text("kind") == "inbox" {
            expected.extend([
                ("stuck rows", starts),
                ("processing time", starts && ends),
                ("end-to-end latency", ends),
                ("deliveries and duplicate deliveries", mapped("deliveries")),
                ("error classes", mapped("last_error")),
            ]);
        }
        let out = run_cli(&["presets", &name]);
        assert_eq!(out.code, Some(0), "{}", out.describe());
        let measures = preset_paragraph(&out.stdout, "Measures:");
        let cannot = preset_paragraph(&out.stdout, "Cannot:");
        for (claim, measured) in expected {
            assert_eq!(
                (measures.contains(claim), cannot.contains(claim)),
                (measured, !measured),
                "preset {name}: \"{claim}\" should be under {}\nMeasures: {measures}\nCannot: {cannot}",
                if measured { "Measures" } else { "Cannot" }
            );
        }
        checked += 1;
    }
    assert!(checked >= 14, "{checked} presets checked");
    let graphile = run_cli(&["presets", "graphile-worker"]).stdout;
    assert!(
        !preset_paragraph(&graphile, "Measures:").contains("stuck")
            && !preset_paragraph(&graphile, "Notes:").contains("stuck"),
        "graphile-worker claims stuck jobs:\n{graphile}"
    );
    assert!(
        preset_paragraph(&graphile, "Cannot:")
            .contains("stuck rows (always 0: no started_at column)"),
        "{graphile}"
    );
}

/// `config OK: N sources` first, whatever follows (the effective settings of presets).
fn assert_config_ok_with(out: &Outcome, sources: usize) {
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        out.stdout.lines().next(),
        Some(format!("config OK: {sources} sources").as_str()),
        "{}",
        out.describe()
    );
}
