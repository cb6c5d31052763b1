//! The pages the agent serves (`/`, `/dead-letters`, `/events/{id}`), loaded
//! in a real browser (Debian's headless Chromium, `--dump-dom`: the DOM after
//! the page's own parsing and any script it ran), from a real agent on
//! PostgreSQL and from the demo:
//!
//! * the status page's numbers equal `/metrics` scraped just before and just
//!   after the page (a gauge that moved between the two is bracketed);
//! * the dead-letter list equals a direct query, newest first, with the
//!   business key, summary, attempts, last error and trace link of each;
//! * an event id and a `last_error` holding `<script>`, `<img onerror>`,
//!   quotes and newlines are shown as text: nothing runs (the title a script
//!   would change is unchanged) and no such element is in the DOM;
//! * `[server] pages = false` leaves only `/metrics`, `/healthz`, `/readyz`.
//!
//! Screenshots of each page are kept in `target/test-artifacts/pages/`.
//! Needs `chromium` (Debian package; `scripts/test.sh` installs it): without
//! it the tests fail, they do not skip.

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::workload::{InboxEvent, Status, Target};
use common::{Agent, Db, Metrics, READY_TIMEOUT, toml_str, wait_until};
use regex::Regex;

const TITLE_STATUS: &str = "status · inboxwatch";

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "{} is missing: the page tests need Debian's chromium (apt-get install chromium; \
         scripts/test.sh installs it), or CHROMIUM=/path/to/chromium",
        path.display()
    );
    path
}

pub(crate) fn browser(args: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("a browser profile directory");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM of `path` after Chromium loaded it (and ran whatever it would run).
fn dom(port: u16, path: &str) -> String {
    browser(&["--dump-dom", &format!("http://127.0.0.1:{port}{path}")])
}

/// Keeps a screenshot of `path` as a test artifact.
fn screenshot(port: u16, path: &str, name: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts/pages");
    std::fs::create_dir_all(&dir).expect("the artifact directory");
    let file = dir.join(format!("{name}.png"));
    browser(&[
        "--window-size=1400,1800",
        &format!("--screenshot={}", file.display()),
        &format!("http://127.0.0.1:{port}{path}"),
    ]);
    assert!(
        std::fs::metadata(&file).is_ok_and(|m| m.len() > 1000),
        "no screenshot at {}",
        file.display()
    );
}

fn title(dom: &str) -> String {
    Regex::new(r"<title>(.*?)</title>")
        .unwrap()
        .captures(dom)
        .map(|c| c[1].to_string())
        .unwrap_or_default()
}

/// HTML text back to the characters it shows.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Every `data-value="key"` number of the page section `within`, by key.
fn values(dom: &str) -> Vec<(String, f64)> {
    Regex::new(r#"data-value="([^"]+)">([^<]*)<"#)
        .unwrap()
        .captures_iter(dom)
        .map(|c| {
            let v: f64 = c[2]
                .parse()
                .unwrap_or_else(|_| panic!("{} is not a number: {:?}", &c[1], &c[2]));
            (unescape(&c[1]), v)
        })
        .collect()
}

fn value(values: &[(String, f64)], key: &str) -> f64 {
    let found: Vec<f64> = values
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {key} on the page: {values:?}");
    found[0]
}

/// The section of the status page that shows one source.
fn card<'a>(dom: &'a str, source: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"source-{source}\""))
        .unwrap_or_else(|| panic!("no card of source {source} on the page:\n{dom}"));
    let rest = &dom[start..];
    let end = rest[1..]
        .find("class=\"card\"")
        .map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

/// What the page prints for a number: at most three decimals.
fn shown(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// `page` lies between what `/metrics` said just before and just after it.
fn bracketed(what: &str, page: f64, before: f64, after: f64) {
    let (lo, hi) = (shown(before.min(after)), shown(before.max(after)));
    assert!(
        page >= lo - 1e-9 && page <= hi + 1e-9,
        "{what}: the page says {page}, /metrics said {before} before and {after} after"
    );
}

/// The status page's numbers of `source` against the two scrapes around it.
fn check_status_numbers(card: &str, source: &str, before: &Metrics, after: &Metrics) {
    let v = values(card);
    let s = [("source", source)];
    let sum = |m: &Metrics, name: &str, extra: &[(&str, &str)]| {
        let mut labels = s.to_vec();
        labels.extend_from_slice(extra);
        m.sum(name, &labels)
    };
    for status in ["pending", "processing", "failed"] {
        bracketed(
            &format!("backlog {status}"),
            value(&v, &format!("backlog_{status}")),
            sum(before, "inbox_backlog_messages", &[("status", status)]),
            sum(after, "inbox_backlog_messages", &[("status", status)]),
        );
    }
    let max = |m: &Metrics, name: &str, extra: &[(&str, &str)]| {
        let mut labels = s.to_vec();
        labels.extend_from_slice(extra);
        m.series(name, &labels)
            .map(|x| x.value)
            .filter(|x| !x.is_nan())
            .fold(f64::NEG_INFINITY, f64::max)
    };
    bracketed(
        "oldest unprocessed age",
        value(&v, "oldest_age_seconds"),
        max(before, "inbox_oldest_unprocessed_age_seconds", &[]),
        max(after, "inbox_oldest_unprocessed_age_seconds", &[]),
    );
    bracketed(
        "P95",
        value(&v, "p95_seconds"),
        max(
            before,
            "inbox_processing_duration_quantile_seconds",
            &[("quantile", "0.95")],
        ),
        max(
            after,
            "inbox_processing_duration_quantile_seconds",
            &[("quantile", "0.95")],
        ),
    );
    for (key, name, extra) in [
        ("stuck", "inbox_stuck_messages", &[][..]),
        ("deliveries_total", "inbox_deliveries_total", &[][..]),
        (
            "duplicate_deliveries_total",
            "inbox_duplicate_deliveries_total",
            &[][..],
        ),
        (
            "attempt_failures_total",
            "inbox_attempt_failures_total",
            &[][..],
        ),
        // The agent is younger than 15 minutes: every dead letter it counted.
        (
            "dead_letters_recent",
            "inbox_messages_completed_total",
            &[("outcome", "dead_lettered")][..],
        ),
    ] {
        bracketed(
            key,
            value(&v, key),
            sum(before, name, extra),
            sum(after, name, extra),
        );
    }
    // The attempts histogram, bucket by bucket (not cumulative on the page).
    let buckets: Vec<(String, f64)> = v
        .iter()
        .filter_map(|(k, x)| {
            k.strip_prefix("attempts_le_")
                .map(|le| (le.to_string(), *x))
        })
        .collect();
    let cumulative =
        |m: &Metrics, le: &str| sum(m, "inbox_delivery_attempts_bucket", &[("le", le)]);
    let mut les: Vec<String> = after
        .series("inbox_delivery_attempts_bucket", &s)
        .filter_map(|x| x.labels.get("le").cloned())
        .collect();
    les.sort_by(|a, b| {
        let f = |x: &str| x.parse::<f64>().unwrap_or(f64::INFINITY);
        f(a).total_cmp(&f(b))
    });
    les.dedup();
    let mut below = 0.0;
    let mut expected = Vec::new();
    for le in &les {
        let c = cumulative(after, le);
        if c - below > 0.0 {
            expected.push((le.clone(), c - below));
        }
        below = c;
    }
    assert_eq!(buckets, expected, "completed events by attempts");
}

async fn stable_scrapes(agent: &Agent) -> Metrics {
    // Counters that no longer move: the workload is over and the agent has read it all.
    wait_until(Duration::from_secs(60), || async {
        let a = agent.try_scrape().await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let b = agent.try_scrape().await?;
        let names = [
            "inbox_messages_received_total",
            "inbox_deliveries_total",
            "inbox_messages_completed_total",
            "inbox_attempt_failures_total",
        ];
        for n in names {
            if a.sum(n, &[]) != b.sum(n, &[]) {
                return Err(format!("{n} still moves"));
            }
        }
        Ok(b)
    })
    .await
    .expect("the counters settle")
}

fn event(id: &str, status: Status, base: i64) -> InboxEvent {
    InboxEvent {
        id: id.to_string(),
        event_type: Some("orders.paid".into()),
        status,
        received_ms: base,
        started_ms: Some(base + 100),
        finished_ms: None,
        attempts: 1,
        deliveries: 1,
        last_error: None,
        traceparent: None,
        updated_ms: base + 100,
    }
}

const HOSTILE_ID: &str = "evt-<script>document.title='pwned'</script>\"&'x";
/// Issue 35: the event page shows the business key, as text.
const HOSTILE_KEY: &str = "<b>k&1</b>";
const HOSTILE_ERROR: &str = "ValidationError: <img src=x onerror=\"document.title='pwned'\">\n\
                             second line with \"double\" and 'single' quotes & <b>bold</b>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pages_show_what_metrics_and_the_table_say() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("pages").await;
    let t = &tables.inbox;
    db.pool
        .raw(&format!(
            "ALTER TABLE {t} ADD COLUMN business_key TEXT, ADD COLUMN summary TEXT"
        ))
        .await
        .expect("add the business_key and summary columns");
    // The audit table of replays and ignores, from `schema --audit-table`.
    let audit = common::unique_name("audit", "pages");
    db.register_table(&audit);
    let ddl =
        common::Cmd::new(["schema", "--dialect", "postgres", "--audit-table", &audit]).output();
    assert!(ddl.success(), "schema --audit-table: {}", ddl.describe());
    db.pool
        .raw(&ddl.stdout)
        .await
        .expect("create the audit table");
    let config = format!(
        "[server]\ntrace_url = \"http://traces.example/explore?trace={{trace_id}}\"\n\n\
         [[sources]]\nname = \"pages-pg\"\nkind = \"inbox\"\ndsn = {dsn}\ntable = {table}\nowner = \"team-pages\"\n\
         poll_interval = \"300ms\"\noverlap = \"10s\"\ntimeout = \"2s\"\n\
         objectives = {{ oldest_age = \"30s\", p95 = \"2s\" }}\n\
         columns = {{ event_id = \"event_id\", event_type = \"event_type\", status = \"status\", \
         received_at = \"received_at\", started_at = \"started_at\", finished_at = \"finished_at\", \
         attempts = \"attempts\", deliveries = \"deliveries\", last_error = \"last_error\", \
         updated_at = \"updated_at\", business_key = \"business_key\", summary = \"summary\" }}\n\
         [sources.dead_letter_actions]\ndsn = {dsn}\naudit_table = {audit}\n",
        dsn = toml_str(&db.dsn),
        table = toml_str(t),
        audit = toml_str(&audit),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;

    // What happens after the agent started: new events, duplicates, retries,
    // successes and dead letters (a hostile one among them), and some backlog.
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: t.clone(),
    };
    let now = db.now_ms().await;
    let mut rows = Vec::new();
    for i in 0..12 {
        let base = now + i * 10;
        let mut e = event(&format!("pg-ok-{i}"), Status::Succeeded, base);
        e.finished_ms = Some(base + 150 + i * 40);
        e.updated_ms = base + 150 + i * 40;
        e.attempts = 1 + (i % 3) as i32;
        e.deliveries = 1 + (i % 2) as i32;
        rows.push(e);
    }
    for (i, (err, key)) in [
        (
            "TimeoutError: upstream did not answer within 5s",
            "order-1001",
        ),
        ("PermissionDenied: 403 from ledger", "order-1002"),
        (HOSTILE_ERROR, HOSTILE_KEY),
    ]
    .iter()
    .enumerate()
    {
        let base = now + 200 + i as i64 * 500;
        let id = if i == 2 {
            HOSTILE_ID.to_string()
        } else {
            format!("pg-dead-{i}")
        };
        let mut e = event(&id, Status::Dead, base);
        e.attempts = 3 + i as i32;
        e.finished_ms = Some(base + 300);
        e.updated_ms = base + 300;
        e.last_error = Some(err.to_string());
        rows.push(e);
        let _ = key;
    }
    for i in 0..3 {
        let mut e = event(
            &format!("pg-pending-{i}"),
            Status::Pending,
            now - 5_000 - i * 1000,
        );
        e.started_ms = None;
        e.updated_ms = now + 50;
        rows.push(e);
    }
    let mut e = event("pg-failed-0", Status::Failed, now + 20);
    e.attempts = 2;
    e.last_error = Some("ConnectionResetError: peer reset".into());
    rows.push(e);
    for e in &rows {
        let (sql, args) = e.insert_stmt(target.dialect, &target.table);
        db.pool.execute(&sql, &args).await.expect("insert a row");
    }
    for (i, key) in ["order-1001", "order-1002", HOSTILE_KEY].iter().enumerate() {
        let id = if i == 2 {
            HOSTILE_ID.to_string()
        } else {
            format!("pg-dead-{i}")
        };
        db.pool
            .execute(
                &format!("UPDATE {t} SET business_key = $1, summary = $2 WHERE event_id = $3"),
                &[
                    common::V::text(*key),
                    common::V::text(format!("sha256:{i:064}")),
                    common::V::text(id),
                ],
            )
            .await
            .expect("set business keys");
    }

    // The status page against /metrics around it.
    let before = stable_scrapes(&agent).await;
    let page = dom(agent.port, "/");
    let after = agent.scrape().await;
    assert_eq!(title(&page), TITLE_STATUS);
    let c = card(&page, "pages-pg");
    assert!(c.contains("data-field=\"state\">up<"), "state up:\n{c}");
    check_status_numbers(c, "pages-pg", &before, &after);
    for link in ["/metrics", "/healthz", "/readyz", "/dead-letters"] {
        assert!(
            page.contains(&format!("href=\"{link}\"")),
            "a link to {link}"
        );
    }
    screenshot(agent.port, "/", "status-postgres");

    // The dead-letter list against a direct query, newest first.
    let listed = dom(agent.port, "/dead-letters?since=1h");
    assert_eq!(title(&listed), "dead letters · inboxwatch");
    let expected: Vec<String> = db
        .query(
            &format!(
                "SELECT event_id FROM {t} WHERE status = 'dead' \
                 AND finished_at >= now() - interval '1 hour' ORDER BY finished_at DESC, event_id"
            ),
            &[],
        )
        .await
        .into_iter()
        .map(|r| r[0].clone().expect("an event id"))
        .collect();
    assert_eq!(expected.len(), 3);
    let ids: Vec<String> = Regex::new(r#"data-field="event_id"><a href="[^"]*">([^<]*)</a>"#)
        .unwrap()
        .captures_iter(&listed)
        .map(|c| unescape(&c[1]))
        .collect();
    assert_eq!(ids, expected, "dead letters, newest first");
    let row_of = |id: &str| -> String {
        let rows: Vec<&str> = listed.split("<tr class=\"dead-letter\">").skip(1).collect();
        rows.into_iter()
            .find(|r| unescape(r).contains(&format!(">{id}</a>")))
            .unwrap_or_else(|| panic!("no row of {id}"))
            .to_string()
    };
    let r = row_of("pg-dead-1");
    let field = |row: &str, f: &str| -> String {
        Regex::new(&format!(r#"data-field="{f}">(.*?)</td>"#))
            .unwrap()
            .captures(row)
            .map(|c| c[1].to_string())
            .unwrap_or_else(|| panic!("no {f} in {row}"))
    };
    // Issue 35: the owner on the page (it was in the JSON only), and the
    // window as people say it ("within 1 h", not humantime's "1h"; "1 day",
    // not "1day").
    assert_eq!(field(&r, "owner"), "team-pages");
    assert!(
        listed.contains("newest first · within 1 h ·"),
        "the dead-letter page's window: {listed}"
    );
    assert_eq!(field(&r, "business_key"), "order-1002");
    assert_eq!(field(&r, "summary"), format!("sha256:{:064}", 1));
    assert_eq!(field(&r, "attempts"), "4");
    let last_error = |row: &str| -> String {
        Regex::new(r#"(?s)data-field="last_error">(.*?)</pre>"#)
            .unwrap()
            .captures(row)
            .map(|c| unescape(&c[1]))
            .unwrap_or_else(|| panic!("no last_error in {row}"))
    };
    assert_eq!(last_error(&r), "PermissionDenied: 403 from ledger");
    let trace = common::otlp::hex(&sha2_16("pg-dead-1"));
    assert!(
        r.contains(&format!(
            "href=\"http://traces.example/explore?trace={trace}\">{trace}</a>"
        )),
        "the trace id links to trace_url: {r}"
    );
    let cfg = agent.dir().join("inboxwatch.toml");
    let cfg = cfg.to_str().expect("a UTF-8 path");
    assert!(
        unescape(&r).contains(&format!(
            "inboxwatch dead-letters replay --config {cfg} --source pages-pg --operator \"$USER\" --reason '…' -- pg-dead-1"
        )),
        "the replay command names the agent's config: {r}"
    );

    // An audited ignore shows on the page with its operator and reason.
    let ignored = common::Cmd::new([
        "dead-letters",
        "ignore",
        "--config",
        cfg,
        "--source",
        "pages-pg",
        "--operator",
        "alice",
        "--reason",
        "known bad <payload>",
        "--yes",
        "pg-dead-1",
    ])
    .output();
    assert!(
        ignored.success(),
        "dead-letters ignore: {}",
        ignored.describe()
    );
    let listed = dom(agent.port, "/dead-letters?since=1h");
    let r = listed
        .split("<tr class=\"dead-letter\">")
        .skip(1)
        .find(|r| r.contains(">pg-dead-1</a>"))
        .expect("the row of pg-dead-1")
        .to_string();
    let action = Regex::new(r#"<li data-field="action">(.*?)</li>"#)
        .unwrap()
        .captures(&r)
        .map(|c| unescape(&Regex::new("<[^>]+>").unwrap().replace_all(&c[1], "")))
        .unwrap_or_else(|| panic!("no audit history in {r}"));
    assert!(
        action.contains(" ignore by alice: known bad <payload> (was dead, 4 attempts)"),
        "{action}"
    );

    // Nothing hostile ran or became an element, and it reads as written.
    assert_eq!(title(&listed), "dead letters · inboxwatch", "no script ran");
    let body = &listed[listed.find("<body").expect("a body")..];
    for tag in ["<script", "<img", "<b>"] {
        assert!(!body.contains(tag), "{tag} became an element:\n{body}");
    }
    let hostile = row_of(HOSTILE_ID);
    assert_eq!(
        last_error(&hostile),
        HOSTILE_ERROR,
        "the hostile error shows as written"
    );
    assert_eq!(unescape(&field(&hostile, "business_key")), HOSTILE_KEY);
    screenshot(
        agent.port,
        "/dead-letters?since=1h",
        "dead-letters-postgres",
    );

    // The event page of the hostile id: found, shown as text, nothing ran.
    let path = format!("/events/{}", percent(HOSTILE_ID));
    let ev = dom(agent.port, &path);
    assert_eq!(title(&ev), "event · inboxwatch", "no script ran");
    let ev_body = &ev[ev.find("<body").expect("a body")..];
    for tag in ["<script", "<img", "<b>"] {
        assert!(
            !ev_body.contains(tag),
            "{tag} became an element:\n{ev_body}"
        );
    }
    let trace_text = Regex::new(r#"(?s)<pre data-field="trace">(.*?)</pre>"#)
        .unwrap()
        .captures(ev_body)
        .map(|c| unescape(&c[1]))
        .expect("the trace text");
    assert!(
        trace_text.contains(&format!("\n  business key    {HOSTILE_KEY}\n")),
        "the business key on the event page: {trace_text}"
    );
    let shown_id = Regex::new(r#"<code data-field="event_id">(.*?)</code>"#)
        .unwrap()
        .captures(&ev)
        .map(|c| unescape(&c[1]))
        .expect("the event id");
    assert_eq!(shown_id, HOSTILE_ID);
    assert!(
        unescape(ev_body).contains("dead"),
        "the trace text: {ev_body}"
    );
    screenshot(agent.port, &path, "event-postgres");

    // Issue 36: a dead letter replayed through the audited command that dies again
    // is marked "failed again after replay"; one only ignored is not.
    let replayed = common::Cmd::new([
        "dead-letters",
        "replay",
        "--config",
        cfg,
        "--source",
        "pages-pg",
        "--operator",
        "bob",
        "--reason",
        "fixed the ledger timeout",
        "--yes",
        "pg-dead-0",
    ])
    .output();
    assert!(
        replayed.success(),
        "dead-letters replay: {}",
        replayed.describe()
    );
    db.pool
        .raw(&format!(
            "UPDATE {t} SET status = 'dead', attempts = attempts + 1, \
             finished_at = now() + interval '1 second', updated_at = now() + interval '1 second' \
             WHERE event_id = 'pg-dead-0'"
        ))
        .await
        .expect("the replayed event dies again");
    let (_, body) = agent
        .get("/api/v1/dead-letters?since=1h")
        .await
        .expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let flags: std::collections::BTreeMap<&str, bool> = v["dead_letters"]
        .as_array()
        .expect("dead_letters")
        .iter()
        .map(|d| {
            (
                d["event_id"].as_str().expect("id"),
                d["failed_again_after_replay"].as_bool().expect("a flag"),
            )
        })
        .collect();
    assert_eq!(
        flags,
        [
            ("pg-dead-0", true),
            ("pg-dead-1", false),
            (HOSTILE_ID, false)
        ]
        .into_iter()
        .collect(),
        "{body}"
    );
    let listed = dom(agent.port, "/dead-letters?since=1h");
    let again: Vec<&str> = listed
        .split("<tr class=\"dead-letter\">")
        .skip(1)
        .filter(|r| r.contains("data-field=\"failed_again\">failed again after replay<"))
        .collect();
    assert_eq!(again.len(), 1, "{listed}");
    assert!(again[0].contains(">pg-dead-0</a>"), "{}", again[0]);

    db.cleanup().await;
}

/// Milliseconds since the epoch as the pages print times.
fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64))
        .to_string()
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn sha2_16(s: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(s.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_has_a_status_page_that_matches_its_metrics() {
    let agent = Agent::demo();
    agent.wait_ready(READY_TIMEOUT).await;
    let first = agent
        .stdout()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        first,
        format!(
            "inboxwatch demo: the status page is http://127.0.0.1:{}/",
            agent.port
        ),
        "the demo prints the page's address first"
    );
    // Some completions first, so that every number is there.
    wait_until(Duration::from_secs(60), || async {
        let m = agent.try_scrape().await?;
        if m.sum(
            "inbox_messages_completed_total",
            &[("outcome", "dead_lettered")],
        ) > 0.0
        {
            Ok(())
        } else {
            Err("no dead letter yet".to_string())
        }
    })
    .await
    .expect("the demo dead-letters events");
    let before = agent.scrape().await;
    let page = dom(agent.port, "/");
    let after = agent.scrape().await;
    assert_eq!(title(&page), TITLE_STATUS);
    let c = card(&page, "demo-inbox");
    assert!(c.contains("data-field=\"state\">up<"), "state up:\n{c}");
    // The demo never stops: counters are bracketed by the two scrapes.
    let v = values(c);
    for (key, name, labels) in [
        ("deliveries_total", "inbox_deliveries_total", &[][..]),
        (
            "duplicate_deliveries_total",
            "inbox_duplicate_deliveries_total",
            &[][..],
        ),
        (
            "attempt_failures_total",
            "inbox_attempt_failures_total",
            &[][..],
        ),
        (
            "dead_letters_recent",
            "inbox_messages_completed_total",
            &[("outcome", "dead_lettered")][..],
        ),
        ("stuck", "inbox_stuck_messages", &[][..]),
    ] {
        bracketed(
            key,
            value(&v, key),
            before.sum(name, labels),
            after.sum(name, labels),
        );
    }
    screenshot(agent.port, "/", "status-demo");
    let listed = dom(agent.port, "/dead-letters");
    assert!(
        listed.matches("<tr class=\"dead-letter\">").count() >= 1,
        "the demo's dead letters are listed"
    );
    screenshot(agent.port, "/dead-letters", "dead-letters-demo");

    // The ignore command the page prints runs as it is, with `--yes` added
    // where the dry run says (before the ids' `--`), and its audit row shows on
    // the page.
    let (_, body) = agent.get("/api/v1/dead-letters").await.expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let first = &v["dead_letters"][0];
    let id = first["event_id"].as_str().expect("an event id").to_string();
    let command = first["ignore_command"]
        .as_str()
        .expect("the ignore command");
    let rest = command
        .strip_prefix("inboxwatch ")
        .expect("the command starts with inboxwatch")
        .replace("'…'", "'a drill'")
        .replacen(" -- ", " --yes -- ", 1);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("\"$BIN\" {rest}"))
        .env("BIN", common::BIN)
        .env("USER", "demo-operator")
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "{command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, body) = agent
        .get(&format!("/api/v1/events/{}", percent(&id)))
        .await
        .expect("GET the event");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let action = &v["actions"][0][1][0];
    assert_eq!(
        (
            action["action"].as_str(),
            action["operator"].as_str(),
            action["reason"].as_str()
        ),
        (Some("ignore"), Some("demo-operator"), Some("a drill")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_off_leaves_only_the_metrics_endpoints() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("off.db");
    std::fs::write(&db, b"").expect("an empty file");
    let config = format!(
        "[server]\npages = false\n\n[[sources]]\nname = \"off\"\nkind = \"inbox\"\n\
         dsn = {}\ntable = \"inbox\"\n",
        toml_str(&format!("sqlite://{}", db.display()))
    );
    let agent = Agent::start(&config);
    // Listening: /healthz answers.
    wait_until(Duration::from_secs(30), || async {
        match agent.get("/healthz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/healthz: {other:?}")),
        }
    })
    .await
    .expect("the agent listens");
    for path in [
        "/",
        "/dead-letters",
        "/events/x",
        "/api/v1/status",
        "/api/v1/dead-letters",
    ] {
        let (code, _) = agent.get(path).await.expect("an answer");
        assert_eq!(code, 404, "{path} with pages = false");
    }
    for path in ["/metrics", "/healthz"] {
        let (code, _) = agent.get(path).await.expect("an answer");
        assert_eq!(code, 200, "{path}");
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The trajectory store stays bounded: 100,000 failing events, each with 3
/// attempts and a 300-character error, and then one event with 20, leave the
/// journal at its 2,000 events of at most 12 attempts (the history's bound is a unit test of
/// `http::status`). Nextest runs each test in its own process, so the
/// process's RSS is this test's.
#[test]
fn the_journal_stays_bounded_under_100k_failing_events() {
    use inboxwatch::journal::{ATTEMPTS, Attempt, EVENTS, Journal, Outcome};
    use std::sync::Arc;
    let journal = Journal::default();
    let source: Arc<str> = Arc::from("orders");
    let class: Arc<str> = Arc::from("timeout");
    let before = rss_kib();
    let error = "TimeoutError: upstream did not answer ".repeat(8);
    for i in 0..100_001u32 {
        let id = format!("evt-{i:06}");
        let attempts = if i == 100_000 { 20 } else { 3 };
        for n in 1..=attempts {
            journal.record(
                &source,
                &id,
                Some("orders.paid"),
                Some(1),
                n..n,
                Attempt {
                    number: n,
                    observed: true,
                    started: Some(i64::from(n)),
                    ended: Some(i64::from(n) + 1),
                    outcome: if n == attempts {
                        Outcome::DeadLettered
                    } else {
                        Outcome::Failed
                    },
                    error_class: Some(class.clone()),
                    error: Some(format!("{error} #{i}/{n}")),
                },
            );
        }
    }
    assert_eq!(journal.len(), EVENTS);
    // The newest events are the ones kept, each with its bounded trail.
    let last = journal
        .trail("orders", "evt-100000")
        .expect("the newest event");
    assert_eq!(last.attempts.len(), ATTEMPTS);
    assert_eq!(last.elided as usize, 20 - ATTEMPTS);
    assert!(journal.trail("orders", "evt-000000").is_none());
    let grown = rss_kib().saturating_sub(before);
    println!(
        "journal: 100,000 failing events x 3 attempts -> {} events kept, RSS grew by {grown} KiB",
        journal.len()
    );
    // Unbounded, this would be about 100,000 x 3 x 450 bytes = 130 MiB.
    assert!(
        grown < 32 * 1024,
        "the journal grew the process by {grown} KiB"
    );
}

/// One step of an event's life as the consumer writes it.
async fn step(db: &Db, table: &str, id: &str, status: &str, attempts: i32, error: &str) {
    let finished = if status == "dead" { "now()" } else { "NULL" };
    db.pool
        .execute(
            &format!(
                "UPDATE {table} SET status = $1, attempts = $2, last_error = $3, \
                 started_at = now() - interval '50 milliseconds', finished_at = {finished}, \
                 updated_at = now() WHERE event_id = $4"
            ),
            &[
                common::V::text(status),
                common::V::Int(attempts),
                common::V::text(error),
                common::V::text(id),
            ],
        )
        .await
        .expect("update the row");
}

/// What `/api/v1/events/{id}` says of the event's attempts: (number,
/// observed, outcome, error class).
async fn trajectory(agent: &Agent, id: &str) -> Vec<(u64, bool, String, Option<String>)> {
    let (code, body) = agent
        .get(&format!("/api/v1/events/{}", percent(id)))
        .await
        .expect("GET /api/v1/events");
    if code != 200 {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    v["trajectories"][0]["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["number"].as_u64().expect("number"),
                        x["observed"].as_bool().expect("observed"),
                        x["outcome"].as_str().expect("outcome").to_string(),
                        x["error_class"].as_str().map(str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The retry trajectory of one event: each attempt the agent saw, with its
/// error class; the attempt that started and failed between two polls is
/// "not observed"; the dead letter's class filters the dead-letter page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_event_page_shows_the_retry_trajectory_the_agent_saw() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("traj").await;
    let t = &tables.inbox;
    let config = format!(
        "[[sources]]\nname = \"traj-pg\"\nkind = \"inbox\"\ndsn = {dsn}\ntable = {table}\n\
         poll_interval = \"300ms\"\noverlap = \"10s\"\ntimeout = \"2s\"\n{}",
        common::scenarios::INBOX_COLUMNS,
        dsn = toml_str(&db.dsn),
        table = toml_str(t),
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    let id = "traj-1";
    let now = db.now_ms().await;
    let mut e = event(id, Status::Failed, now);
    e.last_error = Some("TimeoutError: ledger did not answer in 2s".into());
    // The row shows its first failed attempt with this change time.
    let first_failed = rfc3339(e.updated_ms);
    let (sql, args) = e.insert_stmt(db.dialect, t);
    db.pool.execute(&sql, &args).await.expect("insert");

    let wait_for = |want: Vec<(u64, bool, &'static str, Option<&'static str>)>| {
        let agent = &agent;
        async move {
            let want: Vec<(u64, bool, String, Option<String>)> = want
                .into_iter()
                .map(|(n, o, out, c)| (n, o, out.to_string(), c.map(str::to_string)))
                .collect();
            wait_until(Duration::from_secs(30), || {
                let want = want.clone();
                async move {
                    let got = trajectory(agent, id).await;
                    if got == want {
                        Ok(())
                    } else {
                        Err(format!("trajectory {got:?}, want {want:?}"))
                    }
                }
            })
            .await
            .expect("the trajectory the agent saw");
        }
    };
    let mut seen = vec![(1, true, "failed", Some("timeout"))];
    wait_for(seen.clone()).await;
    // Attempt 2 starts and fails between two polls; attempt 3 fails with a 503.
    step(
        &db,
        t,
        id,
        "failed",
        3,
        "HttpError: 503 Service Unavailable from ledger",
    )
    .await;
    seen.push((2, false, "failed", None));
    seen.push((3, true, "failed", Some("server_error")));
    wait_for(seen.clone()).await;
    // Attempt 4 is dead-lettered with a permanent error.
    step(
        &db,
        t,
        id,
        "dead",
        4,
        "ValidationError: amount must be positive",
    )
    .await;
    seen.push((4, true, "dead_lettered", Some("invalid")));
    wait_for(seen.clone()).await;

    // A replay that resets the attempts, then one more failure: counted
    // anew, and the trajectory goes on.
    let failures = |m: &Metrics| m.sum("inbox_attempt_failures_total", &[("source", "traj-pg")]);
    // The three failed attempts so far (the fourth is the dead letter). The
    // journal shows a change as soon as the poll reads it; a series of a new
    // error class shows its amounts one poll later, so wait for them rather
    // than read a count that is about to grow.
    let before = 3.0;
    wait_until(Duration::from_secs(30), || async {
        let now = failures(&agent.try_scrape().await?);
        if now == before {
            Ok(())
        } else {
            Err(format!("failed attempts {now}, want {before}"))
        }
    })
    .await
    .expect("the failed attempts before the replay are counted");
    step(
        &db,
        t,
        id,
        "pending",
        0,
        "ValidationError: amount must be positive",
    )
    .await;
    step(
        &db,
        t,
        id,
        "failed",
        1,
        "TimeoutError: ledger did not answer in 2s",
    )
    .await;
    seen.push((1, true, "failed", Some("timeout")));
    wait_for(seen.clone()).await;
    wait_until(Duration::from_secs(30), || async {
        let now = failures(&agent.try_scrape().await?);
        if now == before + 1.0 {
            Ok(())
        } else {
            Err(format!("failed attempts {now}, want {}", before + 1.0))
        }
    })
    .await
    .expect("the failure after a replay that reset the attempts is counted");
    step(
        &db,
        t,
        id,
        "dead",
        2,
        "ValidationError: amount must be positive",
    )
    .await;
    seen.push((2, true, "dead_lettered", Some("invalid")));
    wait_for(seen.clone()).await;

    // The page, in the browser: one row per attempt, the missed one marked.
    let page = dom(agent.port, &format!("/events/{id}"));
    let rows: Vec<(String, String)> =
        Regex::new(r#"<tr class="attempt" data-observed="(true|false)"><td>(\d+)</td>"#)
            .unwrap()
            .captures_iter(&page)
            .map(|c| (c[2].to_string(), c[1].to_string()))
            .collect();
    assert_eq!(
        rows,
        [
            ("1", "true"),
            ("2", "false"),
            ("3", "true"),
            ("4", "true"),
            ("1", "true"),
            ("2", "true")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .to_vec()
    );
    assert!(page.contains("not observed"), "{page}");
    screenshot(
        agent.port,
        &format!("/events/{id}"),
        "event-trajectory-postgres",
    );

    // Issue 35: the dead-letter page shows when the first attempt failed,
    // the time the row showed it (the replay does not move it).
    let listed = dom(agent.port, "/dead-letters?since=1h");
    let shown = Regex::new(r#"data-field="first_failed_at">(.*?)</td>"#)
        .unwrap()
        .captures(&listed)
        .map(|c| c[1].to_string())
        .unwrap_or_else(|| panic!("no first_failed_at on the page:\n{listed}"));
    assert_eq!(
        shown, first_failed,
        "the first failure on the dead-letter page"
    );

    // The dead letter carries its class, and the class filters the list.
    let (_, body) = agent
        .get("/api/v1/dead-letters?since=1h&error_class=invalid")
        .await
        .expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        v["dead_letters"][0]["first_failed_at"].as_str(),
        Some(first_failed.as_str())
    );
    let listed: Vec<&str> = v["dead_letters"]
        .as_array()
        .expect("dead_letters")
        .iter()
        .map(|d| d["event_id"].as_str().expect("id"))
        .collect();
    assert_eq!(listed, vec![id]);
    let (_, body) = agent
        .get("/api/v1/dead-letters?since=1h&error_class=timeout")
        .await
        .expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["dead_letters"].as_array().map(Vec::len), Some(0));
    // A class no source has is a bad request naming the classes there are.
    let (code, body) = agent
        .get("/api/v1/dead-letters?error_class=bogus")
        .await
        .expect("GET");
    assert_eq!(
        (code, body.trim()),
        (
            400,
            "error_class: \"bogus\" is not a class of these sources; their classes: \
             conflict, connection, invalid, other, permission, server_error, throttled, timeout, unknown"
        )
    );

    // 250 newer dead letters of another class: the list is cut at 200 and
    // says so, and the class filter still finds the older one.
    db.pool
        .raw(&format!(
            "INSERT INTO {t} (event_id, event_type, status, received_at, started_at, finished_at, \
             attempts, deliveries, last_error, updated_at) \
             SELECT 'bulk-' || g, 'orders.paid', 'dead', now(), now(), now() + interval '1 second', \
             3, 1, 'TimeoutError: bulk', now() + interval '1 second' FROM generate_series(1, 250) g"
        ))
        .await
        .expect("insert 250 dead letters");
    let (_, body) = agent
        .get("/api/v1/dead-letters?since=1h")
        .await
        .expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["dead_letters"].as_array().map(Vec::len), Some(200));
    assert_eq!(v["cut"], serde_json::json!(["traj-pg"]));
    // Dead at first sight, after 3 attempts no poll saw: no first failure.
    assert_eq!(
        v["dead_letters"][0]["first_failed_at"],
        serde_json::Value::Null,
        "{}",
        v["dead_letters"][0]
    );
    let (_, body) = agent
        .get("/api/v1/dead-letters?since=1h&error_class=invalid")
        .await
        .expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let listed: Vec<&str> = v["dead_letters"]
        .as_array()
        .expect("dead_letters")
        .iter()
        .map(|d| d["event_id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        listed,
        vec![id],
        "the class filter looks past the newest 200"
    );
    assert_eq!(v["cut"], serde_json::json!([]));
    db.cleanup().await;
}

/// Issue 35: a burst of dead letters colours the status card. `BURST`
/// events dead-lettered within a minute on one source, more than the 30 in 5
/// minutes of `InboxDeadLetterSpike`'s floor, show red with their count; a
/// quieter source's few dead letters in the same minutes do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_status_card_shows_a_dead_letter_burst_in_red() {
    const BURST: usize = 45;
    const QUIET: usize = 3;
    let db = Db::postgres().await;
    let busy = db.fresh_tables("burst").await.inbox;
    let quiet = db.fresh_tables("quiet").await.inbox;
    let source = |name: &str, table: &str| {
        format!(
            "[[sources]]\nname = \"{name}\"\nkind = \"inbox\"\ndsn = {dsn}\ntable = {table}\n\
             poll_interval = \"300ms\"\noverlap = \"10s\"\ntimeout = \"2s\"\n{}\n",
            common::scenarios::INBOX_COLUMNS,
            dsn = toml_str(&db.dsn),
            table = toml_str(table),
        )
    };
    let agent = Agent::start(&format!(
        "{}{}",
        source("burst-pg", &busy),
        source("quiet-pg", &quiet)
    ));
    agent.wait_ready(READY_TIMEOUT).await;
    let now = db.now_ms().await;
    for (table, prefix, count) in [(&busy, "burst", BURST), (&quiet, "quiet", QUIET)] {
        for i in 0..count {
            let base = now + i as i64 * 20;
            let mut e = event(&format!("{prefix}-{i}"), Status::Dead, base);
            e.attempts = 3;
            e.finished_ms = Some(base + 200);
            e.updated_ms = base + 200;
            e.last_error = Some("ValidationError: amount must be positive".into());
            let (sql, args) = e.insert_stmt(db.dialect, table);
            db.pool
                .execute(&sql, &args)
                .await
                .expect("insert a dead letter");
        }
    }
    let dead = |m: &Metrics, source: &str| {
        m.sum(
            "inbox_messages_completed_total",
            &[("source", source), ("outcome", "dead_lettered")],
        )
    };
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let got = (dead(&m, "burst-pg"), dead(&m, "quiet-pg"));
        if got == (BURST as f64, QUIET as f64) {
            Ok(())
        } else {
            Err(format!("dead letters {got:?}"))
        }
    })
    .await
    .expect("the agent counts every dead letter");

    let page = dom(agent.port, "/");
    let burst = |card: &str| -> (String, f64) {
        let c = Regex::new(
            r#"<span class="(\w+)" data-field="dead_letter_burst"><span data-value="dead_letters_5m">([^<]*)</span>"#,
        )
        .unwrap()
        .captures(card)
        .unwrap_or_else(|| panic!("no dead-letter burst on the card:\n{card}"));
        (c[1].to_string(), c[2].parse().expect("a count"))
    };
    assert_eq!(
        burst(card(&page, "burst-pg")),
        ("over".to_string(), BURST as f64),
        "the burst is red"
    );
    assert_eq!(
        burst(card(&page, "quiet-pg")),
        ("ok".to_string(), QUIET as f64),
        "a few dead letters are not a burst"
    );
    let (_, body) = agent.get("/api/v1/status").await.expect("GET");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let five: Vec<(String, Option<f64>)> = v["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("a name").to_string(),
                s["numbers"]["dead_letters_5m"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        five,
        vec![
            ("burst-pg".to_string(), Some(BURST as f64)),
            ("quiet-pg".to_string(), Some(QUIET as f64))
        ]
    );
    screenshot(agent.port, "/", "status-burst-postgres");
    db.cleanup().await;
}

/// One cause of dead letters: error class, fingerprint, count, the text of the i-th.
type Cause = (&'static str, &'static str, usize, fn(usize) -> String);

/// Issue 36: `/dead-letters` opens on the failure groups, the latest last seen first,
/// each with its exact count, first and last seen, owner and fingerprint, expanding to
/// its latest events; `?group=ID` lists exactly that group's dead letters; markup in an
/// error text stays text; `/api/v1/dead-letter-groups` says the same as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dead_letter_page_opens_on_failure_groups() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("groups").await;
    let t = &tables.inbox;
    let now = db.now_ms().await;
    let base = now - 20 * 60_000;
    let causes: [Cause; 3] = [
        (
            "timeout",
            "timeout after <n>ms calling stock for order <n>",
            12,
            |i| {
                format!(
                    "timeout after {}ms calling stock for order {}",
                    500 + i,
                    9_000 + i
                )
            },
        ),
        (
            "invalid",
            "ValidationError: <b>amount</b> <n> is not a price",
            8,
            |i| format!("ValidationError: <b>amount</b> {i}.5 is not a price"),
        ),
        (
            "conflict",
            "duplicate key value violates unique constraint \"<value>\"",
            5,
            |_| "duplicate key value violates unique constraint \"pay_pkey\"".to_string(),
        ),
    ];
    let mut events = Vec::new();
    // (class, fingerprint, count, first, last, ids newest first)
    let mut truth = Vec::new();
    for (c, (class, fingerprint, count, text)) in causes.iter().enumerate() {
        let mut ids = Vec::new();
        let mut times = Vec::new();
        for i in 0..*count {
            let finished = base + (i as i64) * 30_000 + (c as i64) * 7_000;
            let id = format!("grp-{class}-{i}");
            let mut e = event(&id, Status::Dead, finished - 300);
            e.finished_ms = Some(finished);
            e.updated_ms = finished;
            e.attempts = 3;
            e.last_error = Some(text(i));
            events.push(e);
            ids.push(id);
            times.push(finished);
        }
        ids.reverse();
        truth.push((
            *class,
            *fingerprint,
            *count,
            times[0],
            *times.last().expect("one"),
            ids,
        ));
    }
    // Three events failing now, of a cause with no dead letter: a group of
    // their own, the latest (their failures are the newest).
    let mut failing_ids = Vec::new();
    for i in 0..3i64 {
        let at = now - 90_000 + i * 10_000;
        let id = format!("grp-failing-{i}");
        let mut e = event(&id, Status::Failed, at - 300);
        e.finished_ms = None;
        e.updated_ms = at;
        e.attempts = 2;
        e.last_error = Some(format!(
            "service unavailable: stock {} for order {}",
            503,
            40 + i
        ));
        events.push(e);
        failing_ids.push((id, at));
    }
    failing_ids.reverse();
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: t.clone(),
    };
    for e in &events {
        let (sql, args) = e.insert_stmt(target.dialect, &target.table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let config = format!(
        "[[sources]]\nname = \"groups-pg\"\nkind = \"inbox\"\ndsn = {dsn}\ntable = {table}\nowner = \"team-groups\"\n\
         poll_interval = \"500ms\"\n{columns}\n",
        dsn = toml_str(&db.dsn),
        table = toml_str(t),
        columns = common::scenarios::INBOX_COLUMNS,
    );
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    truth.sort_by_key(|g| std::cmp::Reverse(g.4));

    // The API: three groups, exact.
    let (code, body) = agent
        .get("/api/v1/dead-letter-groups?since=1h")
        .await
        .expect("GET");
    assert_eq!(code, 200, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let groups = api["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 4, "{body}");
    // First the failing events' group: no dead letter, three failing now.
    let f = &groups[0];
    assert_eq!(f["error_class"], "server_error", "{f}");
    assert_eq!(
        f["fingerprint"], "service unavailable: stock <n> for order <n>",
        "{f}"
    );
    assert_eq!((&f["count"], &f["failing"]), (&0.into(), &3.into()), "{f}");
    assert_eq!(f["first_seen"], rfc3339(failing_ids[2].1), "{f}");
    assert_eq!(f["last_seen"], rfc3339(failing_ids[0].1), "{f}");
    assert_eq!(f["sample_event_id"], failing_ids[0].0.as_str(), "{f}");
    assert_eq!(f["events"], serde_json::json!([]), "{f}");
    let listed: Vec<&str> = f["failing_events"]
        .as_array()
        .expect("failing events")
        .iter()
        .map(|e| e[0].as_str().expect("an id"))
        .collect();
    assert_eq!(
        listed,
        failing_ids
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>()
    );
    let failing_group = f["id"].as_str().expect("an id").to_string();
    let mut ids = Vec::new();
    for (g, (class, fingerprint, count, first, last, latest)) in groups[1..].iter().zip(&truth) {
        assert_eq!(g["failing"], 0, "{g}");
        assert_eq!(g["source"], "groups-pg");
        assert_eq!(g["owner"], "team-groups");
        assert_eq!(g["event_type"], "orders.paid");
        assert_eq!(g["error_class"], *class, "{g}");
        assert_eq!(g["fingerprint"], *fingerprint, "{g}");
        assert_eq!(g["count"], *count as u64, "{g}");
        assert_eq!(g["first_seen"], rfc3339(*first), "{g}");
        assert_eq!(g["last_seen"], rfc3339(*last), "{g}");
        assert_eq!(g["sample_event_id"], latest[0].as_str(), "{g}");
        let listed: Vec<&str> = g["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e[0].as_str().expect("an id"))
            .collect();
        assert_eq!(
            listed,
            latest.iter().map(String::as_str).collect::<Vec<_>>()
        );
        ids.push(g["id"].as_str().expect("an id").to_string());
    }
    assert_eq!(api["cut"], serde_json::json!([]));

    // The page: the same groups in the same order, markup as text.
    let page = dom(agent.port, "/dead-letters?since=1h");
    screenshot(agent.port, "/dead-letters?since=1h", "dead-letter-groups");
    let rows: Vec<&str> = page.split("<tr class=\"group\"").skip(1).collect();
    assert_eq!(rows.len(), 4, "{page}");
    assert!(
        rows[0].starts_with(&format!(" data-group=\"{failing_group}\""))
            && rows[0].contains("<td data-field=\"count\">0</td><td data-field=\"failing\">3</td>")
            && rows[0].contains(&format!(
                "{}</a> <span class=\"muted\">{} (failing)</span>",
                failing_ids[0].0,
                rfc3339(failing_ids[0].1)
            )),
        "{}",
        rows[0]
    );
    for ((row, id), (class, fingerprint, count, ..)) in rows[1..].iter().zip(&ids).zip(&truth) {
        assert!(row.starts_with(&format!(" data-group=\"{id}\"")), "{row}");
        assert!(row.contains("<td data-field=\"failing\">0</td>"), "{row}");
        assert!(
            row.contains(&format!("<td data-field=\"count\">{count}</td>")),
            "{row}"
        );
        assert!(
            row.contains(&format!("<td data-field=\"error_class\">{class}</td>")),
            "{row}"
        );
        let shown = fingerprint
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(
            row.contains(&format!("<pre data-field=\"fingerprint\">{shown}</pre>")),
            "{row}"
        );
    }
    assert!(
        !page.contains("<b>amount</b>"),
        "markup ran as markup: {page}"
    );
    // Expanded: one group's dead letters, exactly.
    let (class, _, count, _, _, latest) = &truth[1];
    let listed = dom(
        agent.port,
        &format!("/dead-letters?since=1h&group={}", ids[1]),
    );
    let listed_ids: Vec<String> = listed
        .split("<td data-field=\"event_id\">")
        .skip(1)
        .map(|cell| {
            let text = cell.split("</a>").next().expect("a link");
            text.rsplit('>').next().expect("its text").to_string()
        })
        .collect();
    assert_eq!(listed_ids.len(), *count, "{class}: {listed}");
    assert_eq!(&listed_ids, latest, "{class}");
    assert!(!listed.contains("<tr class=\"group\""), "{listed}");
    // A bad group id is refused by name.
    let (code, body) = agent
        .get("/api/v1/dead-letter-groups?group=nothex")
        .await
        .expect("GET");
    assert_eq!(code, 400);
    assert_eq!(
        body,
        "group: \"nothex\" is not a group id (16 hex digits)\n"
    );
    drop(agent);
    db.cleanup().await;
}
