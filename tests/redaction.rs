//! Issue 35: `[server] redact_builtins` and `[[server.redact]]` mask what a
//! watched table's `last_error`, `business_key` and `summary` hold, wherever
//! the agent shows them: the pages, the JSON API, the commands' output and
//! the exported spans. Against SQLite, PostgreSQL and MariaDB, through the
//! binary: two agents on one table, one masking and one not, and the texts
//! each must show worked out by the test from the secrets it generated.

use crate::common;

use std::time::Duration;

use common::otlp::{Got, Receiver};
use common::workload::{InboxEvent, Status};
use common::{Agent, Cmd, Db, READY_TIMEOUT, V, split_statements, toml_str, wait_until};

/// What the masking agent's pattern replaces a token with: markup, so that
/// a mask applied after the HTML escaping (not before) shows.
const TOKEN_MASK: &str = "<token>";

/// The secrets of one run, and an id that must stay.
struct Secrets {
    email: String,
    /// Three Luhn-valid card numbers: grouped by spaces, by dashes, plain.
    card_spaced: String,
    card_dashed: String,
    card_plain: String,
    token: String,
    /// A 16-digit id that fails the Luhn check: not a card, never masked.
    id16: String,
}

fn digits(n: usize) -> String {
    (0..n)
        .map(|_| char::from(b'0' + fastrand::u8(0..10)))
        .collect()
}

/// The Luhn check digit of `payload`, worked out here, not by the agent.
fn check_digit(payload: &str) -> u32 {
    let sum: u32 = payload
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            if i % 2 == 0 {
                let twice = d * 2;
                twice / 10 + twice % 10
            } else {
                d
            }
        })
        .sum();
    (10 - sum % 10) % 10
}

fn card() -> String {
    let payload = format!("4{}", digits(14));
    format!("{payload}{}", check_digit(&payload))
}

fn grouped(card: &str, sep: &str) -> String {
    card.as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).expect("digits"))
        .collect::<Vec<_>>()
        .join(sep)
}

impl Secrets {
    fn new() -> Secrets {
        let payload = format!("7{}", digits(14));
        let wrong = (check_digit(&payload) + 1) % 10;
        Secrets {
            email: format!("ann.lee+{}@mail.example.com", fastrand::u32(..)),
            card_spaced: grouped(&card(), " "),
            card_dashed: grouped(&card(), "-"),
            card_plain: card(),
            token: format!("tok_{}", fastrand::u64(..)),
            id16: format!("{payload}{wrong}"),
        }
    }

    fn all(&self) -> [&str; 5] {
        [
            &self.email,
            &self.card_spaced,
            &self.card_dashed,
            &self.card_plain,
            &self.token,
        ]
    }

    /// What starts every secret: none of it may show with masks on, not
    /// even the start of an address a length limit cut.
    fn starts(&self) -> [&str; 2] {
        ["ann.lee+", "tok_"]
    }

    /// `raw` as the masking agent must show it.
    fn masked(&self, raw: &str) -> String {
        raw.replace(&self.token, TOKEN_MASK)
            .replace(&self.email, "[email]")
            .replace(&self.card_spaced, "[card]")
            .replace(&self.card_dashed, "[card]")
            .replace(&self.card_plain, "[card]")
    }
}

/// One row of the test: its event, business key and summary.
struct Row {
    event: InboxEvent,
    business_key: Option<String>,
    summary: Option<String>,
}

/// An event received at `now` whose last attempt ended 300 ms later.
fn event(id: &str, status: Status, attempts: i32, error: String, now: i64) -> InboxEvent {
    InboxEvent {
        id: id.to_string(),
        event_type: Some("order.paid".into()),
        status,
        received_ms: now,
        started_ms: Some(now + 100),
        finished_ms: (status == Status::Dead).then_some(now + 300),
        attempts,
        deliveries: 1,
        last_error: Some(error),
        traceparent: None,
        updated_ms: now + 300,
    }
}

/// The rows of one run; their ids need no percent-encoding in a path.
fn rows(s: &Secrets, tag: &str, now: i64) -> Vec<Row> {
    let ev = |id: &str, status: Status, attempts: i32, error: String| {
        event(&format!("{tag}-{id}"), status, attempts, error, now)
    };
    vec![
        Row {
            event: ev(
                "d1",
                Status::Dead,
                3,
                format!(
                    "PaymentError: card {} declined for {}",
                    s.card_spaced, s.email
                ),
            ),
            business_key: Some(format!("customer {}", s.email)),
            summary: Some(format!("ref {} for order {}", s.token, s.id16)),
        },
        Row {
            event: ev(
                "d2",
                Status::Dead,
                2,
                format!("LookupError: order {} unknown; token {}", s.id16, s.token),
            ),
            business_key: Some(format!("order-{}", s.id16)),
            summary: Some(format!("paid with {}", s.card_dashed)),
        },
        Row {
            event: ev(
                "f1",
                Status::Failed,
                1,
                format!(
                    "TimeoutError: mailer did not answer for {}, card {}",
                    s.email, s.card_plain
                ),
            ),
            business_key: None,
            summary: None,
        },
    ]
}

/// A dead letter whose address straddles the 200 characters the pages and
/// the commands show of `last_error`: the start of it must not show either.
fn straddling(s: &Secrets, tag: &str, now: i64) -> InboxEvent {
    let error = format!("QuotaError: {}{}", "x ".repeat(89), s.email);
    assert_eq!(
        error.find(&s.email),
        Some(190),
        "the address starts before the cut"
    );
    event(&format!("{tag}-d3"), Status::Dead, 1, error, now)
}

fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn run(args: &[&str]) -> String {
    let out = Cmd::new(args).output();
    assert_eq!(out.code, Some(0), "{args:?}: {}", out.describe());
    out.stdout
}

/// One of the two agents: its source name, config file, and spans.
struct Side {
    on: bool,
    source: String,
    config: String,
    agent: Agent,
    receiver: Receiver,
}

impl Side {
    /// `raw` as this side must show it.
    fn shown(&self, s: &Secrets, raw: &str) -> String {
        if self.on {
            s.masked(raw)
        } else {
            raw.to_string()
        }
    }
}

/// The agent's spans of `ids`, once each has one.
async fn spans_of(receiver: &Receiver, ids: &[&str]) -> Vec<Got> {
    wait_until(Duration::from_secs(60), || {
        let spans: Vec<Got> = receiver
            .spans()
            .into_iter()
            .filter(|g| {
                g.attr("messaging.message.id")
                    .is_some_and(|id| ids.contains(&id.as_str()))
            })
            .collect();
        let missing: Vec<&&str> = ids
            .iter()
            .filter(|id| {
                !spans
                    .iter()
                    .any(|g| g.attr("messaging.message.id").as_deref() == Some(**id))
            })
            .collect();
        async move {
            if missing.is_empty() {
                Ok(spans)
            } else {
                Err(format!("no span yet of {missing:?}"))
            }
        }
    })
    .await
    .expect("a span of every event")
}

async fn get(agent: &Agent, path: &str) -> String {
    let (code, body) = agent.get(path).await.expect("GET");
    assert_eq!(code, 200, "GET {path}: {body}");
    body
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Everything one side shows of the rows, checked field by field against
/// what it must show; returns every text it printed or served.
async fn check_side(side: &Side, s: &Secrets, rows: &[Row]) -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = Vec::new();
    let shown = |raw: &str| side.shown(s, raw);
    let error = |r: &Row| r.event.last_error.clone().expect("every row has an error");
    let ids: Vec<&str> = rows.iter().map(|r| r.event.id.as_str()).collect();
    let dead = &rows[..2];

    // Spans: the status message of each event's span.
    let spans = spans_of(&side.receiver, &ids).await;
    for r in rows {
        for g in spans
            .iter()
            .filter(|g| g.attr("messaging.message.id").as_deref() == Some(&r.event.id))
        {
            let message = g.span.status.as_ref().map(|st| st.message.clone());
            assert_eq!(
                message.as_deref(),
                Some(shown(&error(r)).as_str()),
                "span status of {}",
                r.event.id
            );
        }
    }
    texts.push(("spans".into(), format!("{spans:?}")));

    // The JSON API.
    let api = get(&side.agent, "/api/v1/dead-letters?since=1h").await;
    let listed = json(&api);
    for r in dead {
        let d = listed["dead_letters"]
            .as_array()
            .expect("dead_letters")
            .iter()
            .find(|d| d["event_id"] == r.event.id.as_str())
            .unwrap_or_else(|| panic!("{} not listed: {api}", r.event.id));
        for (field, raw) in [
            ("last_error", error(r)),
            ("business_key", r.business_key.clone().expect("key")),
            ("summary", r.summary.clone().expect("summary")),
        ] {
            assert_eq!(d[field], shown(&raw).as_str(), "{field} of {}", r.event.id);
        }
        let history = d["history"].as_array().expect("history");
        if r.event.id == rows[1].event.id {
            assert_eq!(history.len(), 1, "the ignore of d2: {d}");
            assert_eq!(history[0]["last_error"], shown(&error(r)).as_str());
        }
    }
    texts.push(("/api/v1/dead-letters".into(), api));
    for r in rows {
        let path = format!("/api/v1/events/{}", r.event.id);
        let body = get(&side.agent, &path).await;
        let v = json(&body);
        let trace = v["trace"].as_str().expect("the trace text");
        let line = format!("  last error      {}\n", shown(&error(r)));
        assert!(trace.contains(&line), "{path}: no {line:?} in {trace}");
        let attempts = v["trajectories"][0]["attempts"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: no trajectory: {body}"));
        let errors: Vec<&str> = attempts
            .iter()
            .filter_map(|a| a["error"].as_str())
            .collect();
        assert!(!errors.is_empty(), "{path}: no error in the trajectory");
        for e in errors {
            assert_eq!(e, shown(&error(r)), "{path}: trajectory error");
        }
        texts.push((path, body));
    }

    // The pages: the same texts, HTML-escaped after masking.
    let page = get(&side.agent, "/dead-letters?since=1h").await;
    for r in dead {
        for raw in [
            error(r),
            r.business_key.clone().expect("key"),
            r.summary.clone().expect("summary"),
        ] {
            let want = html(&shown(&raw));
            assert!(page.contains(&want), "/dead-letters: no {want:?}");
        }
    }
    texts.push(("/dead-letters".into(), page));
    for r in rows {
        let path = format!("/events/{}", r.event.id);
        let page = get(&side.agent, &path).await;
        let want = html(&shown(&error(r)));
        assert!(
            page.matches(&want).count() >= 2,
            "{path}: {want:?} in the trace text and the trajectory:\n{page}"
        );
        texts.push((path, page));
    }

    // The status page and its JSON show none of the three columns; they
    // are searched for the secrets all the same.
    for path in ["/", "/api/v1/status"] {
        texts.push((path.into(), get(&side.agent, path).await));
    }

    // The commands.
    for r in rows {
        let out = run(&["trace", "--config", &side.config, &r.event.id]);
        let line = format!("  last error      {}\n", shown(&error(r)));
        assert!(out.contains(&line), "trace: no {line:?} in\n{out}");
        texts.push((format!("trace {}", r.event.id), out));
    }
    let out = run(&["dead-letters", "--config", &side.config, "--since", "1h"]);
    for r in dead {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("\t{}\t", r.event.id)))
            .unwrap_or_else(|| panic!("dead-letters: no line of {}:\n{out}", r.event.id));
        assert!(
            line.ends_with(&format!("\t{}", shown(&error(r)))),
            "dead-letters: {line}"
        );
    }
    texts.push(("dead-letters".into(), out));
    let out = run(&[
        "dead-letters",
        "history",
        "--config",
        &side.config,
        "--source",
        &side.source,
        &rows[1].event.id,
    ]);
    let line = out
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("history:\n{out}"));
    assert!(
        line.ends_with(&format!("\t{}", shown(&error(&rows[1])))),
        "history: {line}"
    );
    texts.push(("dead-letters history".into(), out));
    texts
}

async fn masks(db: Db, tag: &str) {
    let tables = db.fresh_tables(tag).await;
    let t = &tables.inbox;
    for col in ["business_key", "summary"] {
        db.pool
            .raw(&format!("ALTER TABLE {t} ADD COLUMN {col} TEXT"))
            .await
            .unwrap_or_else(|e| panic!("add {col}: {e}"));
    }
    let audit = common::unique_name("audit", tag);
    db.register_table(&audit);
    let ddl = run(&[
        "schema",
        "--dialect",
        db.dialect.cli_name(),
        "--audit-table",
        &audit,
    ]);
    for stmt in split_statements(&ddl) {
        db.pool.raw(&stmt).await.expect("create the audit table");
    }
    let s = Secrets::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sides = Vec::new();
    for on in [true, false] {
        let source = format!("{tag}-{}", if on { "on" } else { "off" });
        let receiver = Receiver::start().await;
        let server = if on {
            format!(
                "[server]\nredact_builtins = [\"email\", \"card\"]\n\n\
                 [[server.redact]]\npattern = \"tok_[0-9]+\"\nreplace = {}\n\n",
                toml_str(TOKEN_MASK)
            )
        } else {
            String::new()
        };
        let config = format!(
            "{server}[[sources]]\nname = {name}\nkind = \"inbox\"\ndsn = {dsn}\ntable = {table}\n\
             poll_interval = \"300ms\"\noverlap = \"10s\"\ntimeout = \"2s\"\n\
             columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
             received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
             attempts = \"attempts\", deliveries = \"deliveries\", last_error = \"last_error\", \
             updated_at = \"updated_at\", business_key = \"business_key\", summary = \"summary\" }}\n\
             [sources.dead_letter_actions]\ndsn = {dsn}\naudit_table = {audit}\n\n\
             [tracing]\notlp_endpoint = {otlp}\nprotocol = \"grpc\"\nsample_ratio = 1.0\ntimeout = \"5s\"\n",
            name = toml_str(&source),
            dsn = toml_str(&db.dsn),
            table = toml_str(t),
            audit = toml_str(&audit),
            otlp = toml_str(&receiver.grpc_endpoint()),
        );
        let path = dir.path().join(format!("{source}.toml"));
        std::fs::write(&path, &config).expect("write the config");
        let agent = Agent::start(&config);
        sides.push(Side {
            on,
            source,
            config: path.to_str().expect("utf-8 path").to_string(),
            agent,
            receiver,
        });
    }
    for side in &sides {
        side.agent.wait_ready(READY_TIMEOUT).await;
    }

    // The rows, written after both agents started, so both see them change.
    let now = db.now_ms().await;
    let rows = rows(&s, tag, now);
    for r in &rows {
        let (sql, args) = r.event.insert_stmt(db.dialect, t);
        db.pool.execute(&sql, &args).await.expect("insert a row");
        db.exec(
            &format!("UPDATE {t} SET business_key = ?, summary = ? WHERE event_id = ?"),
            &[
                V::opt_text(r.business_key.clone()),
                V::opt_text(r.summary.clone()),
                V::text(&r.event.id),
            ],
        )
        .await;
    }
    let long = straddling(&s, tag, now);
    let (sql, args) = long.insert_stmt(db.dialect, t);
    db.pool.execute(&sql, &args).await.expect("insert a row");
    // One audited ignore per side, so that the history holds the error too.
    // Its line holds the event id and status words only.
    let mut ignored = Vec::new();
    for side in &sides {
        let out = run(&[
            "dead-letters",
            "ignore",
            "--config",
            &side.config,
            "--source",
            &side.source,
            "--operator",
            "oncall",
            "--reason",
            "test",
            "--yes",
            &rows[1].event.id,
        ]);
        assert!(out.starts_with("ignored "), "ignore: {out}");
        ignored.push(out);
    }

    for (side, ignore) in sides.iter().zip(ignored) {
        let mut texts = check_side(side, &s, &rows).await;
        texts.push(("dead-letters ignore".into(), ignore));
        // The straddling address: with masks on, the text stops at the last
        // whitespace before the cut; without, the page shows the 201
        // characters read.
        let error = long.last_error.clone().expect("an error");
        let want = if side.on {
            format!("{}…", &error[..190])
        } else {
            error[..201].to_string()
        };
        let api = get(&side.agent, "/api/v1/dead-letters?since=1h").await;
        let listed = json(&api);
        let d3 = listed["dead_letters"]
            .as_array()
            .expect("dead_letters")
            .iter()
            .find(|d| d["event_id"] == long.id.as_str())
            .unwrap_or_else(|| panic!("{} not listed: {api}", long.id));
        assert_eq!(d3["last_error"], want.as_str(), "the cut last_error");
        texts.push(("/api/v1/dead-letters (d3)".into(), api));
        texts.push(("the agent's log".into(), side.agent.stderr()));
        if side.on {
            for (what, text) in &texts {
                for secret in s.all().into_iter().chain(s.starts()) {
                    assert!(
                        !text.contains(secret),
                        "{what} shows the secret {secret:?} with masks on:\n{text}"
                    );
                }
            }
        }
        // The id that is no card shows on both sides.
        let all: String = texts.iter().map(|(_, t)| t.as_str()).collect();
        assert!(
            all.contains(&format!("order-{}", s.id16)),
            "the 16-digit id that fails the Luhn check is shown"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_masks_secrets_everywhere_they_leave_and_only_when_configured() {
    masks(Db::sqlite().await, "rdl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_masks_secrets_everywhere_they_leave_and_only_when_configured() {
    masks(Db::postgres().await, "rdp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_masks_secrets_everywhere_they_leave_and_only_when_configured() {
    masks(Db::mysql().await, "rdm").await;
}

/// A pattern that does not compile and an unknown built-in: `check-config`
/// exits 2 naming each key, and a good file passes.
#[test]
fn bad_patterns_are_check_config_errors_by_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = "[[sources]]\nname = \"s\"\nkind = \"inbox\"\ndsn = \"sqlite:///tmp/x.db\"\ntable = \"inbox\"\n";
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf-8").to_string()
    };
    let bad = write(
        "bad.toml",
        &format!(
            "[server]\nredact_builtins = [\"email\", \"phone\"]\n\n\
             [[server.redact]]\npattern = \"tok_[0-9]+\"\n\n\
             [[server.redact]]\npattern = \"(unclosed\"\nreplace = \"x\"\n\n{source}"
        ),
    );
    let out = Cmd::new(["check-config", &bad]).output();
    assert_eq!(out.code, Some(2), "{}", out.describe());
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines,
        [
            "server.redact[1].pattern: not a regular expression: unclosed group",
            "server.redact_builtins[1]: unknown built-in \"phone\": expected one of email, card",
        ],
        "{}",
        out.describe()
    );
    let good = write(
        "good.toml",
        &format!(
            "[server]\nredact_builtins = [\"email\", \"card\"]\n\n\
             [[server.redact]]\npattern = \"tok_[0-9]+\"\n\n{source}"
        ),
    );
    let out = Cmd::new(["check-config", &good]).output();
    assert_eq!(out.code, Some(0), "{}", out.describe());
}
