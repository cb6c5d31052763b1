//! Status words the map does not know (issue 35): `doctor` reads the table's words
//! and names each unmapped one with the `[sources.statuses]` line that maps it, and a
//! running agent whose rows are mostly rejected shows the source as degraded — on
//! the status page, in `/api/v1/status` and in `inboxwatch_source_degraded` — until
//! the words are mapped.

use crate::common;

use std::time::Duration;

use common::scenarios::{CONVERGE, inbox_source_toml};
use common::workload::InboxEvent;
use common::{Agent, Cmd, Db, READY_TIMEOUT, V, wait_until};

/// The status words the workload writes, and how many rows get each.
const WORDS: [(&str, usize); 5] = [
    ("queued", 5),
    ("done", 4),
    ("pending", 2),
    ("weird-state", 1),
    ("odd\u{1b}[2Jword", 1),
];

/// The lines `doctor` must print for the words above, unmapped.
const DOCTOR_LINES: [&str; 4] = [
    "status word \"queued\" (5 of a sample of 13 rows (the first 10000 at most)) is not mapped: \
     its rows are rejected as unknown_status; add under [sources.statuses]: \
     pending = [\"pending\", \"queued\"]",
    "status word \"done\" (4 of a sample of 13 rows (the first 10000 at most)) is not mapped: \
     its rows are rejected as unknown_status; add under [sources.statuses]: \
     succeeded = [\"succeeded\", \"done\"]",
    "status word \"odd\\x1b[2Jword\" (1 of a sample of 13 rows (the first 10000 at most)) is \
     not mapped: its rows are rejected as unknown_status; add it under [sources.statuses] to \
     the words of what it means, e.g. failed = [\"failed\", \"odd\\u001B[2Jword\"]",
    "status word \"weird-state\" (1 of a sample of 13 rows (the first 10000 at most)) is not \
     mapped: its rows are rejected as unknown_status; add it under [sources.statuses] to the \
     words of what it means, e.g. failed = [\"failed\", \"weird-state\"]",
];

/// The map that knows every word of [`WORDS`].
const MAPPED: &str = "[sources.statuses]\npending = [\"pending\", \"queued\"]\n\
     succeeded = [\"succeeded\", \"done\"]\nfailed = [\"failed\", \"weird-state\"]\n\
     dead = [\"dead\", \"odd\\u001b[2Jword\"]\n";

async fn write_rows(db: &Db, table: &str, short: &str) {
    let now = db.now_ms().await;
    let mut i = 0;
    for (word, n) in WORDS {
        for _ in 0..n {
            let ev =
                InboxEvent::pending(format!("{short}-w-{i:02}"), Some("order.paid".into()), now);
            let (sql, args) = ev.insert_stmt(db.dialect, table);
            db.pool.execute(&sql, &args).await.expect("insert");
            db.exec(
                &format!("UPDATE {table} SET status = ? WHERE event_id = ?"),
                &[V::text(word), V::text(&ev.id)],
            )
            .await;
            i += 1;
        }
    }
}

fn doctor(config: &str) -> common::Outcome {
    let file = tempfile::NamedTempFile::new().expect("temp config");
    std::fs::write(file.path(), config).expect("write the config");
    Cmd::new(["doctor", "--config"])
        .arg(file.path())
        .timeout(Duration::from_secs(60))
        .output()
}

/// What `/api/v1/status` says of `source`: (state, error, numbers.degraded).
async fn api_state(agent: &Agent, source: &str) -> Result<(String, String, String), String> {
    let s = agent.api_source(source).await?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    Ok((
        text(&s["state"]),
        text(&s["error"]),
        text(&s["numbers"]["degraded"]),
    ))
}

async fn unmapped_words_are_named_and_degrade_the_source(db: &Db, short: &str) {
    let tables = db.fresh_tables(short).await;
    let source = format!("{short}-words");
    let config = inbox_source_toml(&source, &db.dsn, &tables.inbox);
    let agent = Agent::start(&config);
    agent.wait_ready(READY_TIMEOUT).await;
    write_rows(db, &tables.inbox, short).await;

    // doctor names each unmapped word, with its count and the line that maps it.
    let out = doctor(&config);
    let dump = format!("exit {:?}\n{}{}", out.code, out.stdout, out.stderr);
    assert_eq!(out.code, Some(1), "{dump}");
    assert!(
        !out.stdout.contains('\u{1b}'),
        "a raw ESC reached the terminal:\n{dump}"
    );
    let warned: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("warning: status word "))
        .collect();
    let want: Vec<&str> = DOCTOR_LINES
        .iter()
        .map(|l| l.strip_prefix("status word ").expect("a status word line"))
        .collect();
    assert_eq!(warned, want, "{dump}");

    // The agent: 11 of the 13 rows read are rejected as unknown_status.
    let labels =
        |reason: &'static str| [("source", source.clone()), ("reason", reason.to_string())];
    let res = wait_until(CONVERGE, || async {
        let m = agent.try_scrape().await?;
        let l = labels("unknown_status");
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let degraded = m.get("inboxwatch_source_degraded", &l);
        let others = m.sum("inboxwatch_source_degraded", &[("source", &source)]);
        let rejected = m.get("inboxwatch_rows_rejected_total", &l);
        let api = api_state(&agent, &source).await?;
        let want_api = (
            "degraded".to_string(),
            "most rows read lately were rejected (unknown_status); `inboxwatch doctor` says why"
                .to_string(),
            "unknown_status".to_string(),
        );
        if degraded == Some(1.0) && others == 1.0 && rejected == Some(11.0) && api == want_api {
            Ok(())
        } else {
            Err(format!(
                "degraded {degraded:?} (sum {others}), rejected {rejected:?}, api {api:?}"
            ))
        }
    })
    .await;
    if let Err(e) = res {
        panic!("the source is not shown degraded: {e}\n{}", agent.stderr());
    }
    let (_, page) = agent.get("/").await.expect("the status page");
    assert!(
        page.contains("<span class=\"degraded\" data-field=\"state\">degraded</span>"),
        "{page}"
    );
    agent.terminate(Duration::from_secs(10));

    // Mapped: doctor is content, the agent reads every row and is up.
    let mapped = format!("{config}{MAPPED}");
    let out = doctor(&mapped);
    let dump = format!("exit {:?}\n{}{}", out.code, out.stdout, out.stderr);
    assert!(
        out.stdout.contains(
            "ok:      status words in a sample of 13 rows (the first 10000 at most): queued, \
             done, pending"
        ) && out.stdout.contains("every one mapped"),
        "{dump}"
    );
    assert!(!out.stdout.contains("warning: status word"), "{dump}");
    let agent = Agent::start(&mapped);
    agent.wait_ready(READY_TIMEOUT).await;
    db.exec(
        &format!("UPDATE {} SET updated_at = {{ts}}", tables.inbox),
        &[V::text(db.dialect.ts_text(db.now_ms().await))],
    )
    .await;
    let polls = agent.wait_polls(&source, 3, Duration::ZERO).await;
    let api = api_state(&agent, &source).await.expect("the status API");
    assert_eq!(
        (
            polls.sum("inboxwatch_source_degraded", &[("source", &source)]),
            polls.sum("inboxwatch_rows_rejected_total", &[("source", &source)]),
            api.0.as_str(),
            api.2.as_str(),
        ),
        (0.0, 0.0, "up", ""),
        "{}",
        agent.stderr()
    );
}

/// Guards issue 35's silent rejections on PostgreSQL: every unmapped word named by
/// `doctor` with the line to add, the source degraded while most rows are rejected,
/// and up once the words are mapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unmapped_status_words_are_named_and_degrade_the_source() {
    let db = Db::postgres().await;
    unmapped_words_are_named_and_degrade_the_source(&db, "pgwords").await;
}

/// The same on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_unmapped_status_words_are_named_and_degrade_the_source() {
    let db = Db::sqlite().await;
    unmapped_words_are_named_and_degrade_the_source(&db, "litewords").await;
}
