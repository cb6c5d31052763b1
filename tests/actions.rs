//! `inboxwatch dead-letters replay | ignore | history` (issue 13, section 4)
//! through the binary, against PostgreSQL and MariaDB: generated rows with
//! known values, the exact lines each command prints, the exact rows it
//! leaves (table and audit table compared whole before and after), and a
//! running agent counting the replayed events' completions again.

use crate::common;

use std::time::Duration;

use common::scenarios::inbox_source_toml;
use common::workload::{InboxEvent, Status};
use common::{
    Agent, Cmd, Db, Dialect, V, parse_ts, split_statements, toml_str, url_with_user, wait_until,
};

const OPERATOR: &str = "alice@oncall";
const REASON: &str = "payments API fixed (INC-42); re-drive";

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Cmd::new(args).output();
    (out.code.unwrap_or(-1), out.stdout, out.stderr)
}

/// A table name quoted as the dialect's DDL quotes it.
fn sql_table(db: &Db, name: &str) -> String {
    match db.dialect {
        Dialect::Mysql => format!("`{name}`"),
        _ => format!("\"{name}\""),
    }
}

/// Every column of the inbox table, as text, ordered by event id.
async fn table_rows(db: &Db, table: &str) -> Vec<Vec<Option<String>>> {
    let cols = [
        "event_id",
        "event_type",
        "status",
        "received_at",
        "started_at",
        "finished_at",
        "attempts",
        "deliveries",
        "last_error",
        "traceparent",
        "updated_at",
    ];
    let list: Vec<String> = cols
        .iter()
        .map(|c| format!("CAST({c} AS {{text}})"))
        .collect();
    db.query(
        &format!("SELECT {} FROM {table} ORDER BY event_id", list.join(", ")),
        &[],
    )
    .await
}

/// Every column of the audit table but `id`, as text, in insertion order.
async fn audit_rows(db: &Db, audit: &str) -> Vec<Vec<Option<String>>> {
    let cols = [
        "source",
        "event_id",
        "action",
        "operator",
        "reason",
        "at",
        "previous_status",
        "attempts",
        "last_error",
    ];
    let list: Vec<String> = cols
        .iter()
        .map(|c| format!("CAST({c} AS {{text}})"))
        .collect();
    db.query(
        &format!("SELECT {} FROM {audit} ORDER BY id", list.join(", ")),
        &[],
    )
    .await
}

/// One expected audit row; `at` is checked to lie within `[t0, t1]`.
struct Audit<'a> {
    source: &'a str,
    event: &'a InboxEvent,
    action: &'a str,
}

fn check_audit(rows: &[Vec<Option<String>>], want: &[Audit<'_>], t0: i64, t1: i64) {
    assert_eq!(
        rows.len(),
        want.len(),
        "audit rows: {rows:?}, expected {} rows",
        want.len()
    );
    for (row, w) in rows.iter().zip(want) {
        let text = |i: usize| row[i].clone();
        assert_eq!(text(0).as_deref(), Some(w.source), "audit source: {row:?}");
        assert_eq!(text(1).as_deref(), Some(w.event.id.as_str()), "{row:?}");
        assert_eq!(text(2).as_deref(), Some(w.action), "{row:?}");
        assert_eq!(text(3).as_deref(), Some(OPERATOR), "{row:?}");
        assert_eq!(text(4).as_deref(), Some(REASON), "{row:?}");
        let at = text(5).and_then(|t| parse_ts(&t)).expect("audit at");
        assert!(
            (t0..=t1).contains(&at),
            "audit at {at} outside the command's run [{t0}, {t1}]: {row:?}"
        );
        assert_eq!(text(6).as_deref(), Some(w.event.status.word()), "{row:?}");
        assert_eq!(text(7), Some(w.event.attempts.to_string()), "{row:?}");
        assert_eq!(text(8), w.event.last_error.clone(), "{row:?}");
    }
}

/// The seeded rows of one test.
struct Seed {
    dead: Vec<InboxEvent>,
    ok: InboxEvent,
    failed: InboxEvent,
    ignore_kept: InboxEvent,
    ignore_status: InboxEvent,
}

async fn seed(db: &Db, table: &str, tag: &str) -> Seed {
    let base = db.now_ms().await - 10 * 60_000;
    let ev = |id: &str, status: Status, attempts: i32, error: Option<&str>| InboxEvent {
        id: format!("{tag}-{id}"),
        event_type: Some("order.paid".into()),
        status,
        received_ms: base,
        started_ms: Some(base + 1_000),
        finished_ms: (status != Status::Failed).then_some(base + 1_500),
        attempts,
        deliveries: 1,
        last_error: error.map(str::to_string),
        traceparent: None,
        updated_ms: base + 1_500,
    };
    let s = Seed {
        dead: vec![
            ev(
                "d1",
                Status::Dead,
                3,
                Some("TimeoutError: upstream did not answer within 5s"),
            ),
            ev(
                "d2",
                Status::Dead,
                2,
                Some("HttpError: 503 from \"payments\"\nretry later; it's 'down'\\"),
            ),
            ev("d3", Status::Dead, 1, None),
        ],
        ok: ev("ok", Status::Succeeded, 1, None),
        failed: ev("failed", Status::Failed, 2, Some("DeadlockDetected")),
        ignore_kept: ev("ig1", Status::Dead, 5, Some("ValidationError: no amount")),
        ignore_status: ev("ig2", Status::Dead, 4, Some("SchemaError: v3")),
    };
    for e in s
        .dead
        .iter()
        .chain([&s.ok, &s.failed, &s.ignore_kept, &s.ignore_status])
    {
        let (sql, args) = e.insert_stmt(db.dialect, table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    s
}

/// An inbox source on `table` with `[sources.dead_letter_actions]` writing
/// with `action_dsn` (plus `extra` keys) and `statuses` before it.
fn config(
    name: &str,
    db: &Db,
    table: &str,
    statuses: &str,
    action_dsn: &str,
    extra: &str,
) -> String {
    format!(
        "{}{statuses}\n[sources.dead_letter_actions]\ndsn = {}\n{extra}",
        inbox_source_toml(name, &db.dsn, table),
        toml_str(action_dsn),
    )
}

fn write(dir: &std::path::Path, file: &str, text: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write config");
    path.to_str().expect("utf-8 path").to_string()
}

/// A login role (PostgreSQL) or user (MariaDB) that may only SELECT `tables`.
/// SQLite has no users: the same file opened read-only.
async fn read_only_user(db: &Db, user: &str, tables: &[&str]) -> String {
    if db.dialect == Dialect::Sqlite {
        return format!("{}?mode=ro", db.dsn);
    }
    db.register_role(user);
    let mut stmts = Vec::new();
    match db.dialect {
        Dialect::Postgres => {
            stmts.push(format!("CREATE ROLE {user} LOGIN PASSWORD 'ro-secret'"));
            for t in tables {
                stmts.push(format!("GRANT SELECT ON {t} TO {user}"));
            }
        }
        _ => {
            for host in ["%", "localhost", "127.0.0.1"] {
                stmts.push(format!(
                    "CREATE USER '{user}'@'{host}' IDENTIFIED BY 'ro-secret'"
                ));
                for t in tables {
                    stmts.push(format!("GRANT SELECT ON {t} TO '{user}'@'{host}'"));
                }
            }
        }
    }
    for s in stmts {
        db.exec(&s, &[] as &[V]).await;
    }
    url_with_user(&db.dsn, user, "ro-secret")
}

async fn replay_and_ignore(db: Db, tag: &str) {
    let tables = db.fresh_tables(tag).await;
    let table = tables.inbox.as_str();
    let audit = common::unique_name("audit", tag);
    db.register_table(&audit);
    let s = seed(&db, table, tag).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let main_toml = config(
        "act",
        &db,
        table,
        "",
        &db.dsn,
        &format!(
            "audit_table = {}\nreset_attempts = true\n",
            toml_str(&audit)
        ),
    );
    let cfg = write(dir.path(), "act.toml", &main_toml);

    // The audit table, from `schema --config`.
    let (code, ddl, err) = run(&["schema", "--config", &cfg]);
    assert_eq!(code, 0, "schema --config: {err}");
    assert!(
        ddl.contains("-- source \"act\": the audit table of dead-letters replay / ignore\n")
            && ddl.contains(&format!(
                "CREATE TABLE IF NOT EXISTS {}",
                sql_table(&db, &audit)
            )),
        "schema --config prints the audit table:\n{ddl}"
    );
    for stmt in split_statements(&ddl) {
        db.pool
            .raw(&stmt)
            .await
            .unwrap_or_else(|e| panic!("the audit DDL does not execute: {e}\n{stmt}"));
    }

    // The agent watches the table from before the replay, and has read the
    // (empty) audit table.
    let agent = Agent::start(&main_toml);
    agent.wait_ready(Duration::from_secs(30)).await;
    common::wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        match m.get("inbox_dead_letter_replays_total", &[("source", "act")]) {
            Some(0.0) => Ok(()),
            other => Err(format!("replays {other:?}")),
        }
    })
    .await
    .expect("the agent has read the audit table");

    let ids: Vec<&str> = s
        .dead
        .iter()
        .map(|e| e.id.as_str())
        .chain([s.ok.id.as_str(), s.failed.id.as_str()])
        .collect();
    let missing = format!("{tag}-missing");
    let mut args = vec![
        "dead-letters",
        "replay",
        "--config",
        &cfg,
        "--source",
        "act",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
    ];
    args.extend(ids.iter().copied());
    args.push(&missing);
    let dead_line = |verb: &str, e: &InboxEvent| {
        format!(
            "{verb} {}: status \"dead\" → \"pending\", attempts {} → 0, updated_at → now; audit row in \"{audit}\"\n",
            e.id, e.attempts
        )
    };
    let refusals = format!(
        "refused {}: status is \"succeeded\" (succeeded), not dead; nothing changed\n\
         refused {}: status is \"failed\" (failed), not dead; nothing changed\n\
         refused {missing}: not found\n",
        s.ok.id, s.failed.id
    );

    // Without --yes: what it would do, and nothing written.
    let before = table_rows(&db, table).await;
    let (code, out, err) = run(&args);
    assert_eq!(code, 1, "a dry run with refusals exits 1: {out}{err}");
    let would: String = s
        .dead
        .iter()
        .map(|e| dead_line("would replay", e))
        .collect();
    assert_eq!(out, format!("{would}{refusals}"), "dry-run lines");
    assert!(
        err.contains(
            "dry run: nothing is written; add --yes before the event ids (and their --) to apply"
        ),
        "{err}"
    );
    assert_eq!(
        table_rows(&db, table).await,
        before,
        "a dry run changed the table"
    );
    assert!(
        audit_rows(&db, &audit).await.is_empty(),
        "a dry run wrote an audit row"
    );

    // With --yes: the dead rows go back to pending, the others are refused.
    args.push("--yes");
    let t0 = db.now_ms().await;
    let (code, out, err) = run(&args);
    let t1 = db.now_ms().await;
    assert_eq!(code, 1, "refusals exit 1: {out}{err}");
    let done: String = s.dead.iter().map(|e| dead_line("replayed", e)).collect();
    assert_eq!(out, format!("{done}{refusals}"), "replay lines");
    let after = table_rows(&db, table).await;
    assert_eq!(after.len(), before.len());
    for (b, a) in before.iter().zip(&after) {
        let id = b[0].as_deref().unwrap_or_default();
        if s.dead.iter().any(|e| e.id == id) {
            assert_eq!(a[2].as_deref(), Some("pending"), "replayed status: {a:?}");
            assert_eq!(a[6].as_deref(), Some("0"), "attempts reset: {a:?}");
            let updated = a[10].as_deref().and_then(parse_ts).expect("updated_at");
            assert!((t0..=t1).contains(&updated), "updated_at bumped: {a:?}");
            let untouched = |r: &Vec<Option<String>>| {
                let mut r = r.clone();
                for i in [2, 6, 10] {
                    r[i] = None;
                }
                r
            };
            assert_eq!(
                untouched(a),
                untouched(b),
                "only status, attempts, updated_at change"
            );
        } else {
            assert_eq!(a, b, "a refused or other row changed");
        }
    }
    let want: Vec<Audit<'_>> = s
        .dead
        .iter()
        .map(|e| Audit {
            source: "act",
            event: e,
            action: "replay",
        })
        .collect();
    check_audit(&audit_rows(&db, &audit).await, &want, t0, t1);

    // The agent sees them pending again; the consumer completes them; each
    // counts one completion again (docs/metrics.md: a re-driven event).
    let pending = [
        ("source", "act"),
        ("event_type", "order.paid"),
        ("status", "pending"),
    ];
    common::wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        match m.get("inbox_backlog_messages", &pending) {
            Some(v) if v == s.dead.len() as f64 => Ok(()),
            other => Err(format!("pending backlog {other:?}")),
        }
    })
    .await
    .expect("the agent sees the replayed rows pending");
    // The first replayed event dies again; the others succeed.
    let now = db.now_ms().await;
    for (i, e) in s.dead.iter().enumerate() {
        let again = i == 0;
        let done = InboxEvent {
            status: if again {
                Status::Dead
            } else {
                Status::Succeeded
            },
            started_ms: Some(now - 200),
            finished_ms: Some(now - 100),
            attempts: 1,
            last_error: again.then(|| "TimeoutError: upstream did not answer within 9s".into()),
            updated_ms: now,
            ..e.clone()
        };
        let (sql, args) = done.update_stmt(db.dialect, table);
        db.pool.execute(&sql, &args).await.expect("complete a row");
    }
    let succeeded = s.dead.len() as f64 - 1.0;
    let completed = |outcome: &'static str| {
        [
            ("source", "act"),
            ("event_type", "order.paid"),
            ("outcome", outcome),
        ]
    };
    common::wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        let ok = m.get("inbox_messages_completed_total", &completed("succeeded"));
        let dead = m.sum(
            "inbox_messages_completed_total",
            &completed("dead_lettered"),
        );
        // Each replay counted, and the one event dead again, by the class
        // of the error it died with this time: the class of the one dead
        // letter the agent counted (every class's series exists, at 0).
        let replays = m.get("inbox_dead_letter_replays_total", &[("source", "act")]);
        let again: Vec<(String, f64)> = m
            .series(
                "inbox_dead_letters_after_replay_total",
                &[("source", "act")],
            )
            .filter(|x| x.value > 0.0)
            .map(|x| (x.labels["error_class"].clone(), x.value))
            .collect();
        let classes: Vec<(String, f64)> = m
            .series("inbox_dead_letters_total", &[("source", "act")])
            .filter(|x| x.value > 0.0)
            .map(|x| (x.labels["error_class"].clone(), x.value))
            .collect();
        if ok == Some(succeeded)
            && dead == 1.0
            && replays == Some(s.dead.len() as f64)
            && again == classes
        {
            Ok(())
        } else {
            Err(format!(
                "succeeded {ok:?}, dead_lettered {dead}, replays {replays:?}, after replay \
                 {again:?}, dead letters by class {classes:?}"
            ))
        }
    })
    .await
    .expect("the replayed events count as completions again");
    common::stays(Duration::from_secs(2), || async {
        let m = agent.try_scrape().await?;
        let ok = m.get("inbox_messages_completed_total", &completed("succeeded"));
        let again = m.sum(
            "inbox_dead_letters_after_replay_total",
            &[("source", "act")],
        );
        if ok == Some(succeeded) && again == 1.0 {
            Ok(())
        } else {
            Err(format!("succeeded {ok:?}, after replay {again}"))
        }
    })
    .await
    .expect("counted once");
    agent.terminate(Duration::from_secs(10));

    // ignore without ignored_status: only the audit row.
    let before = table_rows(&db, table).await;
    let t0 = db.now_ms().await;
    let (code, out, err) = run(&[
        "dead-letters",
        "ignore",
        "--config",
        &cfg,
        "--source",
        "act",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
        "--yes",
        &s.ignore_kept.id,
    ]);
    let t1 = db.now_ms().await;
    assert_eq!(code, 0, "ignore: {out}{err}");
    assert_eq!(
        out,
        format!(
            "ignored {}: status \"dead\" kept, attempts 5 kept; audit row in \"{audit}\"\n",
            s.ignore_kept.id
        )
    );
    assert_eq!(
        table_rows(&db, table).await,
        before,
        "ignore changed the row"
    );
    let rows = audit_rows(&db, &audit).await;
    check_audit(
        &rows[3..],
        &[Audit {
            source: "act",
            event: &s.ignore_kept,
            action: "ignore",
        }],
        t0,
        t1,
    );

    // ignore with ignored_status: the status word too (and updated_at).
    let ig_toml = config(
        "act-ig",
        &db,
        table,
        "statuses = { dead = [\"dead\", \"discarded\"] }\n",
        &db.dsn,
        &format!(
            "audit_table = {}\nignored_status = \"discarded\"\n",
            toml_str(&audit)
        ),
    );
    let ig_cfg = write(dir.path(), "ig.toml", &ig_toml);
    let before = table_rows(&db, table).await;
    let t0 = db.now_ms().await;
    let (code, out, err) = run(&[
        "dead-letters",
        "ignore",
        "--config",
        &ig_cfg,
        "--source",
        "act-ig",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
        "--yes",
        &s.ignore_status.id,
    ]);
    let t1 = db.now_ms().await;
    assert_eq!(code, 0, "ignore: {out}{err}");
    assert_eq!(
        out,
        format!(
            "ignored {}: status \"dead\" → \"discarded\", attempts 4 kept, updated_at → now; audit row in \"{audit}\"\n",
            s.ignore_status.id
        )
    );
    let after = table_rows(&db, table).await;
    for (b, a) in before.iter().zip(&after) {
        if b[0].as_deref() == Some(s.ignore_status.id.as_str()) {
            assert_eq!(a[2].as_deref(), Some("discarded"), "{a:?}");
            let updated = a[10].as_deref().and_then(parse_ts).expect("updated_at");
            assert!((t0..=t1).contains(&updated), "updated_at bumped: {a:?}");
            assert_eq!(
                (&a[..2], &a[3..10]),
                (&b[..2], &b[3..10]),
                "the rest unchanged"
            );
        } else {
            assert_eq!(a, b, "another row changed");
        }
    }
    let rows = audit_rows(&db, &audit).await;
    check_audit(
        &rows[4..],
        &[Audit {
            source: "act-ig",
            event: &s.ignore_status,
            action: "ignore",
        }],
        t0,
        t1,
    );

    // The history, over the agent's own DSN, oldest first.
    let (code, out, err) = run(&[
        "dead-letters",
        "history",
        "--config",
        &cfg,
        "--source",
        "act",
        &s.dead[1].id,
        &s.ignore_kept.id,
        &s.ok.id,
    ]);
    assert_eq!(code, 0, "history: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "event_id\taction\toperator\treason\tat\tprevious_status\tattempts\tlast_error"
    );
    let d2 = &s.dead[1];
    assert_eq!(lines.len(), 3, "history:\n{out}");
    assert!(
        lines[1].starts_with(&format!("{}\treplay\t{OPERATOR}\t{REASON}\t", d2.id))
            && lines[1].ends_with(&format!(
                "\tdead\t2\t{}",
                // Escaped as every printed field of table data is: a backslash
                // doubled, a control character as \xNN.
                d2.last_error
                    .as_deref()
                    .expect("error")
                    .replace('\\', "\\\\")
                    .replace('\n', "\\x0a")
            )),
        "history of a replay: {}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!("{}\tignore\t{OPERATOR}\t", s.ignore_kept.id)),
        "history of an ignore: {}",
        lines[2]
    );
    // A source whose audit table does not exist has no history, and no error.
    let none_toml = config(
        "act-none",
        &db,
        table,
        "",
        &db.dsn,
        "audit_table = \"no_such_audit_table\"\n",
    );
    let none_cfg = write(dir.path(), "none.toml", &none_toml);
    let (code, out, err) = run(&[
        "dead-letters",
        "history",
        "--config",
        &none_cfg,
        "--source",
        "act-none",
        &d2.id,
    ]);
    assert_eq!(code, 0, "history without an audit table: {err}");
    assert_eq!(out.lines().count(), 1, "only the header: {out}");

    // The agent's read-only user as the action DSN: a clear permission
    // error, nothing changes.
    let user = format!("iwact{}{:04x}", std::process::id(), fastrand::u16(..));
    let ro = read_only_user(&db, &user, &[table, &audit]).await;
    let ro_toml = config(
        "act-ro",
        &db,
        table,
        "",
        &ro,
        &format!("audit_table = {}\n", toml_str(&audit)),
    );
    let ro_cfg = write(dir.path(), "ro.toml", &ro_toml);
    let before = (table_rows(&db, table).await, audit_rows(&db, &audit).await);
    let (code, out, err) = run(&[
        "dead-letters",
        "replay",
        "--config",
        &ro_cfg,
        "--source",
        "act-ro",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
        "--yes",
        &s.ignore_kept.id,
    ]);
    assert_eq!(code, 1, "a read-only action DSN fails: {out}{err}");
    assert!(
        out.starts_with(&format!(
            "failed {}: permission denied: the dead_letter_actions DSN's user needs SELECT and UPDATE on \"{table}\" and INSERT on \"{audit}\" (",
            s.ignore_kept.id
        )) && out.ends_with("; nothing changed\n")
            && out.lines().count() == 1
            && !out.contains("ro-secret"),
        "permission error line: {out}"
    );
    assert_eq!(
        (table_rows(&db, table).await, audit_rows(&db, &audit).await),
        before,
        "a refused write changed something"
    );
    db.cleanup().await;
}

/// Guards issue 13's replay and ignore on PostgreSQL: dry run writes nothing,
/// `--yes` re-drives only dead rows (refusing the others by name), the audit
/// rows are exact, a running agent counts the re-driven completions again,
/// `ignore` writes only the audit row (and the ignored status when set), the
/// history reads back, and a read-only action DSN fails cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replay_and_ignore_are_audited_and_exact() {
    replay_and_ignore(Db::postgres().await, "acpg").await;
}

/// The same on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_replay_and_ignore_are_audited_and_exact() {
    replay_and_ignore(Db::mysql().await, "acmy").await;
}

/// The same on SQLite (`BEGIN IMMEDIATE` instead of a row lock; the file
/// opened read-only stands for the read-only user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replay_and_ignore_are_audited_and_exact() {
    replay_and_ignore(Db::sqlite().await, "acli").await;
}

/// Guards a replay under status rules: the rules, not the new word alone,
/// decide what the row means, so the row is re-read after the update; one the
/// rules still read as dead is refused and rolled back, one they read as
/// pending (here: once its attempts are reset) is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_the_status_rules_still_read_as_dead_is_rolled_back() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("acrule").await;
    let table = tables.inbox.as_str();
    let audit = common::unique_name("audit", "acrule");
    db.register_table(&audit);
    let base = db.now_ms().await - 60_000;
    let row = InboxEvent {
        id: "rule-1".into(),
        event_type: Some("order.paid".into()),
        status: Status::Failed,
        received_ms: base,
        started_ms: Some(base + 10),
        finished_ms: None,
        attempts: 3,
        deliveries: 1,
        last_error: Some("ValidationError".into()),
        traceparent: None,
        updated_ms: base + 20,
    };
    let (sql, args) = row.insert_stmt(db.dialect, table);
    db.pool.execute(&sql, &args).await.expect("insert");
    let rules = "[[sources.status_rules]]\nmeaning = \"dead\"\nwhen = \"attempts >= 3\"\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = |file: &str, reset: bool| {
        write(
            dir.path(),
            file,
            &config(
                "rules",
                &db,
                table,
                rules,
                &db.dsn,
                &format!(
                    "audit_table = {}\nreplay_status = \"pending\"\nreset_attempts = {reset}\n",
                    toml_str(&audit)
                ),
            ),
        )
    };
    let keep = cfg("keep.toml", false);
    let reset = cfg("reset.toml", true);
    let (code, ddl, err) = run(&["schema", "--config", &keep]);
    assert_eq!(code, 0, "{err}");
    for stmt in split_statements(&ddl) {
        db.pool.raw(&stmt).await.expect("DDL");
    }
    let replay = |config: &str| {
        run(&[
            "dead-letters",
            "replay",
            "--config",
            config,
            "--source",
            "rules",
            "--operator",
            OPERATOR,
            "--reason",
            REASON,
            "--yes",
            "rule-1",
        ])
    };
    let before = (table_rows(&db, table).await, audit_rows(&db, &audit).await);
    let (code, out, err) = replay(&keep);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        out,
        "refused rule-1: with status \"pending\" the status rules say the row is dead, not pending \
         (sources[0].dead_letter_actions.replay_status); nothing changed\n"
    );
    assert_eq!(
        (table_rows(&db, table).await, audit_rows(&db, &audit).await),
        before,
        "a refused replay changed something"
    );
    let t0 = db.now_ms().await;
    let (code, out, err) = replay(&reset);
    let t1 = db.now_ms().await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out,
        format!(
            "replayed rule-1: status \"failed\" → \"pending\", attempts 3 → 0, updated_at → now; \
             audit row in \"{audit}\"\n"
        )
    );
    let after = table_rows(&db, table).await;
    assert_eq!(after[0][2].as_deref(), Some("pending"));
    assert_eq!(after[0][6].as_deref(), Some("0"));
    check_audit(
        &audit_rows(&db, &audit).await,
        &[Audit {
            source: "rules",
            event: &row,
            action: "replay",
        }],
        t0,
        t1,
    );
    db.cleanup().await;
}

/// Guards the exit code 2 of bad usage, each with a message naming what is
/// wrong (no database is reached).
#[test]
fn bad_usage_exits_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dsn = "postgres://postgres@127.0.0.1:1/test";
    let cfg = write(
        dir.path(),
        "usage.toml",
        &format!(
            "[[sources]]\nname = \"plain\"\nkind = \"inbox\"\ndsn = \"{dsn}\"\ntable = \"inbox\"\n\
             [[sources]]\nname = \"out\"\nkind = \"outbox\"\ndsn = \"{dsn}\"\ntable = \"outbox\"\n\
             [[sources]]\nname = \"act\"\nkind = \"inbox\"\ndsn = \"{dsn}\"\ntable = \"inbox\"\n\
             [sources.dead_letter_actions]\ndsn = \"{dsn}\"\n"
        ),
    );
    let base = ["dead-letters", "replay", "--config", &cfg];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--source", "act", "--reason", "r", "e1"],
            "--operator <OPERATOR>",
        ),
        (
            vec!["--source", "act", "--operator", "o", "e1"],
            "--reason <REASON>",
        ),
        (
            vec!["--source", "act", "--operator", "o", "--reason", "r"],
            "give either event ids or a group or filter (--group, --error-class, --event-type, --since, --until) or --resume RUN_ID, not both and not neither",
        ),
        (
            vec![
                "--source",
                "act",
                "--operator",
                "o",
                "--reason",
                "r",
                "--group",
                "g",
                "e1",
            ],
            "give either event ids or a group or filter",
        ),
        (
            vec![
                "--source",
                "act",
                "--operator",
                "o",
                "--reason",
                "r",
                "--group",
                "g",
                "--rate",
                "0/s",
            ],
            "invalid value '0/s' for '--rate <RATE>': \"0/s\": expected events per second from 1 to 10000, e.g. `100/s`",
        ),
        (
            vec!["--source", "act", "--operator", " ", "--reason", "r", "e1"],
            "error: --operator: must not be empty (it is recorded in the audit table)",
        ),
        (
            vec!["--source", "nope", "--operator", "o", "--reason", "r", "e1"],
            "error: --source: no source named \"nope\" in the config",
        ),
        (
            vec![
                "--source",
                "plain",
                "--operator",
                "o",
                "--reason",
                "r",
                "e1",
            ],
            "error: --source: source \"plain\" has no [sources.dead_letter_actions]",
        ),
        (
            vec!["--source", "out", "--operator", "o", "--reason", "r", "e1"],
            "error: --source: source \"out\" is of kind \"outbox\", which offers no dead-letter actions (replay / ignore)",
        ),
    ];
    for (extra, message) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter().copied());
        let (code, out, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: exit 2 (stdout {out:?}, stderr {err:?})");
        assert!(err.contains(message), "{args:?}: stderr names it: {err}");
        assert!(out.is_empty(), "{args:?}: nothing on stdout: {out}");
    }
    // `schema --audit-table`: the audit table's DDL, or a name refused.
    let (code, out, err) = run(&["schema", "--dialect", "sqlite", "--audit-table", "acts"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("CREATE TABLE IF NOT EXISTS \"acts\" (\n    id              INTEGER PRIMARY KEY AUTOINCREMENT,"),
        "{out}"
    );
    let (code, _, err) = run(&["schema", "--dialect", "postgres", "--audit-table", "a;b"]);
    assert_eq!(code, 2);
    assert_eq!(err.trim(), "--audit-table: \"a;b\" is not a table name");
    // The listing keeps its form, and wants its config.
    let (code, _, err) = run(&["dead-letters"]);
    assert_eq!(code, 2);
    assert!(err.contains("--config"), "{err}");
}

/// Guards the keys of `[sources.dead_letter_actions]`: each problem named at
/// its key by `check-config`.
#[test]
fn action_settings_are_checked_at_their_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dsn = "postgres://postgres@127.0.0.1:1/test";
    let cases = [
        (
            "replay_status = \"dead\"\n",
            "",
            "sources[0].dead_letter_actions.replay_status",
            "\"dead\" is not a pending or failed word",
        ),
        (
            "ignored_status = \"skipped\"\n",
            "",
            "sources[0].dead_letter_actions.ignored_status",
            "\"skipped\" is not a status word of this source",
        ),
        (
            "audit_table = \"a;b\"\n",
            "",
            "sources[0].dead_letter_actions.audit_table",
            "is not a table name",
        ),
        (
            "",
            "[[sources.status_rules]]\nmeaning = \"dead\"\nwhen = \"finished_at IS NOT NULL\"\n",
            "sources[0].dead_letter_actions.replay_status",
            "required with status_rules",
        ),
        ("frobnicate = true\n", "", "frobnicate", ""),
    ];
    for (keys, rules, key, message) in cases {
        let cfg = write(
            dir.path(),
            "c.toml",
            &format!(
                "[[sources]]\nname = \"s\"\nkind = \"inbox\"\ndsn = \"{dsn}\"\ntable = \"inbox\"\n\
                 columns = {{ finished_at = \"finished_at\" }}\n{rules}\
                 [sources.dead_letter_actions]\ndsn = \"{dsn}\"\n{keys}"
            ),
        );
        let (code, _, err) = run(&["check-config", &cfg]);
        assert_eq!(code, 2, "{keys}{rules}: exit 2, stderr {err}");
        assert!(
            err.contains(key) && err.contains(message),
            "{keys}{rules}: names {key} ({message}): {err}"
        );
    }
    for (body, key, message) in [
        (
            String::new(),
            "sources[0].dead_letter_actions.dsn",
            "required (or dsn_file)",
        ),
        (
            "dsn = \"mysql://root@127.0.0.1:3306/test\"\n".to_string(),
            "sources[0].dead_letter_actions.dsn",
            "a mysql DSN, but the source's table is on postgres",
        ),
    ] {
        let cfg = write(
            dir.path(),
            "d.toml",
            &format!(
                "[[sources]]\nname = \"s\"\nkind = \"inbox\"\ndsn = \"{dsn}\"\ntable = \"inbox\"\n\
                 [sources.dead_letter_actions]\n{body}"
            ),
        );
        let (code, _, err) = run(&["check-config", &cfg]);
        assert_eq!(code, 2, "{body}: exit 2, stderr {err}");
        assert!(err.contains(key) && err.contains(message), "{body}: {err}");
    }
}

/// Guards "run never opens the action DSN": the action DSN points at a
/// listener of the test; an agent polling the source for a few seconds never
/// connects to it, while the replay command does at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_never_opens_the_action_dsn() {
    let db = Db::postgres().await;
    let tables = db.fresh_tables("acrun").await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("addr").port();
    let action_dsn = format!("postgres://writer@127.0.0.1:{port}/test");
    let toml = config("act-run", &db, &tables.inbox, "", &action_dsn, "");
    // Dead rows, so that every page that names the replay command has one to show.
    let seeded = seed(&db, &tables.inbox, "run").await;
    let agent = Agent::start(&toml);
    agent.wait_ready(Duration::from_secs(30)).await;
    // Several polls, counted by the agent itself.
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let polls = m.sum(
            "inboxwatch_poll_duration_seconds_count",
            &[("source", "act-run")],
        );
        (polls >= 3.0 && m.get("inboxwatch_source_up", &[("source", "act-run")]) == Some(1.0))
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "{polls} polls, source_up {:?}",
                    m.get("inboxwatch_source_up", &[("source", "act-run")])
                )
            })
    })
    .await
    .expect("the agent polls the source");
    // Every page and API answers, the dead letters among them read from the table.
    let dead = &seeded.dead[0].id;
    for path in [
        "/".to_string(),
        "/dead-letters".into(),
        "/dead-letters?source=act-run".into(),
        format!("/events/{dead}"),
        "/api/v1/status".into(),
        "/api/v1/dead-letters".into(),
        "/api/v1/dead-letters?source=act-run".into(),
        format!("/api/v1/events/{dead}"),
        "/metrics".into(),
    ] {
        let (code, body) = agent.get(&path).await.expect("GET a page");
        assert_eq!(code, 200, "{path}: {body}");
        if path.contains("dead-letters") || path.contains("/events/") {
            for d in &seeded.dead {
                if path.contains("/events/") && d.id != *dead {
                    continue;
                }
                assert!(
                    body.contains(&d.id),
                    "{path} does not show {}: {body}",
                    d.id
                );
            }
        }
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the agent connected to the action DSN: {other:?}"),
    }
    agent.terminate(Duration::from_secs(10));

    // The control: the command does connect there.
    listener.set_nonblocking(false).expect("blocking");
    let accepted = std::thread::spawn(move || listener.accept().map(drop).is_ok());
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = write(dir.path(), "run.toml", &toml);
    let (code, out, err) = run(&[
        "dead-letters",
        "replay",
        "--config",
        &cfg,
        "--source",
        "act-run",
        "--operator",
        "o",
        "--reason",
        "r",
        "e1",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(
            "error: source \"act-run\": sources[0].dead_letter_actions.dsn: cannot connect to"
        ),
        "{err}"
    );
    assert!(
        accepted.join().expect("accept thread"),
        "the command connected"
    );
    db.cleanup().await;
}

/// The error text of dead letter `i` of cause `cause`: one cause, its
/// variable parts (addresses, ids, amounts, durations) changing with `i`.
fn bulk_error(cause: usize, i: usize) -> String {
    match cause {
        0 => format!(
            "TimeoutError: upstream 10.0.{}.{} did not answer within {}ms",
            i % 7,
            i % 250,
            500 + i
        ),
        1 => format!("HttpError: 503 from payments for order 7f3a{i:04x}-0c1d-4e2f-9a8b-{i:012x}"),
        _ => format!(
            "ValidationError: amount {}.{:02} for customer {} is negative",
            1000 + i,
            i % 100,
            90_000 + i
        ),
    }
}

/// The rows of a two-column query, as text.
async fn pairs(db: &Db, query: &str) -> Vec<(String, String)> {
    db.query(query, &[])
        .await
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                r[1].clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// `(event_id, status)` of every row, by event id.
async fn statuses(db: &Db, table: &str) -> Vec<(String, String)> {
    pairs(
        db,
        &format!("SELECT event_id, status FROM {table} ORDER BY event_id"),
    )
    .await
}

/// The audit table's event ids, sorted.
async fn audited(db: &Db, audit: &str) -> Vec<String> {
    db.query(
        &format!("SELECT event_id FROM {audit} ORDER BY event_id"),
        &[],
    )
    .await
    .into_iter()
    .map(|r| r[0].clone().unwrap_or_default())
    .collect()
}

/// A dead letter of `bulk_seed`'s kind.
fn bulk_dead(id: String, error: String, base: i64) -> InboxEvent {
    InboxEvent {
        id,
        event_type: Some("order.paid".into()),
        status: Status::Dead,
        received_ms: base,
        started_ms: Some(base + 1_000),
        finished_ms: Some(base + 1_500),
        attempts: 3,
        deliveries: 1,
        last_error: Some(error),
        traceparent: None,
        updated_ms: base + 1_500,
    }
}

/// A bulk test's tables and config: 600 dead letters, 200 of each of three
/// causes, the audit and runs tables made from `schema --config`.
struct BulkSeed {
    _dir: tempfile::TempDir,
    table: String,
    audit: String,
    runs: String,
    cfg: String,
    base: i64,
}

async fn bulk_seed(db: &Db, tag: &str) -> BulkSeed {
    let tables = db.fresh_tables(tag).await;
    let table = tables.inbox.clone();
    let audit = common::unique_name("audit", tag);
    let runs = format!("{audit}_runs");
    db.register_table(&audit);
    db.register_table(&runs);
    let base = db.now_ms().await - 10 * 60_000;
    for i in 0..600 {
        let e = bulk_dead(format!("{tag}-{i:04}"), bulk_error(i % 3, i), base);
        let (sql, args) = e.insert_stmt(db.dialect, &table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = write(
        dir.path(),
        "bulk.toml",
        &config(
            "bulk",
            db,
            &table,
            "",
            &db.dsn,
            &format!("audit_table = {}\n", toml_str(&audit)),
        ),
    );
    let (code, ddl, err) = run(&["schema", "--config", &cfg]);
    assert_eq!(code, 0, "schema --config: {err}");
    for stmt in split_statements(&ddl) {
        db.exec(&stmt, &[] as &[V]).await;
    }
    BulkSeed {
        _dir: dir,
        table,
        audit,
        runs,
        cfg,
        base,
    }
}

/// The id of the failure group whose errors begin with `prefix`, from
/// `dead-letters groups` (which must show three groups of 200).
fn group_of(cfg: &str, prefix: &str) -> String {
    let (code, groups, err) = run(&["dead-letters", "groups", "--config", cfg]);
    assert_eq!(code, 0, "dead-letters groups: {err}");
    let rows: Vec<Vec<&str>> = groups
        .lines()
        .skip(1)
        .map(|l| l.split('\t').collect())
        .collect();
    assert_eq!(rows.len(), 3, "three groups:\n{groups}");
    assert!(rows.iter().all(|r| r[5] == "200"), "200 each:\n{groups}");
    rows.iter()
        .find(|r| r[10].starts_with(prefix))
        .unwrap_or_else(|| panic!("the group of {prefix}:\n{groups}"))[0]
        .to_string()
}

/// `(event_id, run_id)` of every audit row, by event id, then row id.
async fn audit_runs(db: &Db, audit: &str) -> Vec<(String, String)> {
    pairs(
        db,
        &format!("SELECT event_id, run_id FROM {audit} ORDER BY event_id, id"),
    )
    .await
}

/// The run id a bulk run's first line on stderr names.
fn run_id_of(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split(':').next())
        .unwrap_or_else(|| panic!("no run line on stderr:\n{stderr}"))
        .to_string()
}

/// The runs table's rows: id, source, action, operator, reason, selection,
/// rate, total, done, skipped, failed, whether it finished, event_ids.
async fn run_rows(db: &Db, runs: &str) -> Vec<Vec<Option<String>>> {
    let cols = [
        "id",
        "source",
        "action",
        "operator",
        "reason",
        "selection",
        "rate",
        "total",
        "done",
        "skipped",
        "failed",
    ];
    let list: Vec<String> = cols
        .iter()
        .map(|c| format!("CAST({c} AS {{text}})"))
        .collect();
    db.query(
        &format!(
            "SELECT {}, CASE WHEN finished_at IS NULL THEN 'running' ELSE 'finished' END, \
             CAST(event_ids AS {{text}}) FROM {runs} ORDER BY id",
            list.join(", ")
        ),
        &[],
    )
    .await
}

/// The row a run should have left.
fn want_run(
    id: &str,
    selection: &str,
    rate: u32,
    counts: [usize; 4],
    state: &str,
    snapshot: &[String],
) -> Vec<Option<String>> {
    let [total, done, skipped, failed] = counts;
    [
        id.to_string(),
        "bulk".into(),
        "replay".into(),
        OPERATOR.into(),
        REASON.into(),
        selection.into(),
        rate.to_string(),
        total.to_string(),
        done.to_string(),
        skipped.to_string(),
        failed.to_string(),
        state.into(),
        serde_json::to_string(snapshot).expect("json"),
    ]
    .into_iter()
    .map(Some)
    .collect()
}

async fn bulk_replay(db: Db, tag: &str) {
    let seed = bulk_seed(&db, tag).await;
    let (table, audit, cfg) = (seed.table.as_str(), seed.audit.clone(), seed.cfg.clone());
    let base = seed.base;
    let dead = |id: String, error: String| bulk_dead(id, error, base);

    // Three groups of 200; the timeouts' group is replayed.
    let group = group_of(&cfg, "TimeoutError");
    let snapshot: Vec<String> = (0..600)
        .filter(|i| i % 3 == 0)
        .map(|i| format!("{tag}-{i:04}"))
        .collect();

    // Without --yes: the count, the first twenty ids, the command; nothing written.
    let before = (statuses(&db, table).await, audited(&db, &audit).await);
    let args = [
        "dead-letters",
        "replay",
        "--config",
        &cfg,
        "--source",
        "bulk",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
        "--group",
        &group,
        "--rate",
        "100/s",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "dry run: {err}");
    let mut want = String::from("200 dead letters would be replayed\n");
    for id in &snapshot[..20] {
        want.push_str(&format!("{id}\n"));
    }
    want.push_str(&format!(
        "… and 180 more\nto apply: inboxwatch dead-letters replay --config {cfg} --source bulk \
         --operator {OPERATOR} --reason '{REASON}' --group {group} --rate 100/s --yes\n"
    ));
    assert_eq!(out, want);
    assert_eq!(
        (statuses(&db, table).await, audited(&db, &audit).await),
        before,
        "a dry run writes nothing"
    );

    // Applied at 100/s; ten more timeouts die once the run has begun: the
    // run replays its snapshot only.
    let mut apply: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    apply.push("--yes".into());
    let started = std::time::Instant::now();
    let child = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = apply.iter().map(String::as_str).collect();
        run(&args)
    });
    wait_until(Duration::from_secs(30), || async {
        if audited(&db, &audit).await.is_empty() {
            Err("no audit row yet".to_string())
        } else {
            Ok(())
        }
    })
    .await
    .expect("the run begins");
    let late: Vec<String> = (600..610).map(|i| format!("{tag}-{i:04}")).collect();
    for (n, id) in late.iter().enumerate() {
        let e = dead(id.clone(), bulk_error(0, 600 + 3 * n));
        let (sql, args) = e.insert_stmt(db.dialect, table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let (code, out, err) = child.await.expect("the run");
    let elapsed = started.elapsed();
    assert_eq!(code, 0, "bulk replay: {out}{err}");
    let run_id = run_id_of(&err);
    assert_eq!(
        out,
        format!("run {run_id}: replay: 200, skipped (no longer dead): 0, failed: 0\n")
    );
    // The cap is a lower bound: 200 events at 100/s take two seconds at least.
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}");
    let want: Vec<(String, String)> = (0..610)
        .map(|i| {
            let id = format!("{tag}-{i:04}");
            let status = if i < 600 && i % 3 == 0 {
                "pending"
            } else {
                "dead"
            };
            (id, status.to_string())
        })
        .collect();
    assert_eq!(statuses(&db, table).await, want);
    assert_eq!(
        audited(&db, &audit).await,
        snapshot,
        "one audit row per event"
    );
    // Each audit row names the run; the run's row says what it was and did.
    let want: Vec<(String, String)> = snapshot
        .iter()
        .map(|id| (id.clone(), run_id.clone()))
        .collect();
    assert_eq!(audit_runs(&db, &audit).await, want);
    assert_eq!(
        run_rows(&db, &seed.runs).await,
        vec![want_run(
            &run_id,
            &format!("--group {group}"),
            100,
            [200, 200, 0, 0],
            "finished",
            &snapshot
        )]
    );
}

/// A bulk run stopped part-way — by SIGTERM (`term`), or killed — then
/// resumed: the resumed run does the rest of its snapshot and nothing twice,
/// not even events it replayed that died again before the resume.
async fn bulk_resume(db: Db, tag: &str, term: bool) {
    let seed = bulk_seed(&db, tag).await;
    let (table, audit, cfg) = (seed.table.as_str(), seed.audit.as_str(), seed.cfg.as_str());
    let group = group_of(cfg, "HttpError");
    let snapshot: Vec<String> = (0..600)
        .filter(|i| i % 3 == 1)
        .map(|i| format!("{tag}-{i:04}"))
        .collect();
    let base = [
        "dead-letters",
        "replay",
        "--config",
        cfg,
        "--source",
        "bulk",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
    ];
    let err_file = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = std::process::Command::new(common::BIN)
        .args(base)
        .args(["--group", &group, "--rate", "20/s", "--yes"])
        .stdout(std::process::Stdio::null())
        .stderr(err_file.reopen().expect("reopen"))
        .spawn()
        .expect("spawn the run");
    // Killed once 40 to 100 events are done: 200 at 20/s would take 10 s.
    let killed_at = wait_until(Duration::from_secs(60), || async {
        let n = audited(&db, audit).await.len();
        if n >= 40 {
            Ok(n)
        } else {
            Err(format!("{n} audit rows"))
        }
    })
    .await
    .expect("the run gets going");
    if term {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(sent.success(), "kill -TERM: {sent:?}");
    } else {
        child.kill().expect("kill the run");
    }
    let status = child.wait().expect("wait for the run");
    let err = std::fs::read_to_string(err_file.path()).expect("stderr");
    let run_id = run_id_of(&err);
    let first = audit_runs(&db, audit).await;
    let done: Vec<String> = first.iter().map(|(id, _)| id.clone()).collect();
    if term {
        // Stopped between events: it says how far it got and how to resume,
        // and its row has the counts.
        assert_eq!(status.code(), Some(1), "{status:?}\n{err}");
        let last = err.lines().last().unwrap_or_default();
        assert_eq!(
            last,
            format!(
                "error: run {run_id} interrupted after {n} of 200 events (replay: {n}, skipped: 0, \
                 failed: 0); resume with: inboxwatch \
                 dead-letters replay --config {cfg} --source bulk --operator {OPERATOR} --reason \
                 '{REASON}' --resume {run_id} --yes",
                n = done.len()
            )
        );
        let runs = run_rows(&db, &seed.runs).await;
        assert_eq!(runs[0][8], Some(done.len().to_string()), "{runs:?}");
    } else {
        assert_eq!(status.code(), None, "killed: {status:?}");
    }
    assert!(
        (killed_at..200).contains(&done.len()),
        "{} done when killed (at least {killed_at}, fewer than 200)",
        done.len()
    );
    assert!(first.iter().all(|(_, r)| *r == run_id), "{first:?}");
    assert_eq!(done, snapshot[..done.len()], "done in the snapshot's order");
    let runs = run_rows(&db, &seed.runs).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0][11].as_deref(), Some("running"), "{runs:?}");

    // Ten of the replayed events die again before the resume: they were
    // this run's, and are not replayed a second time.
    let again: Vec<String> = done[..10].to_vec();
    let ids: Vec<String> = again.iter().map(|id| format!("'{id}'")).collect();
    db.exec(
        &format!(
            "UPDATE {table} SET status = 'dead' WHERE event_id IN ({})",
            ids.join(", ")
        ),
        &[] as &[V],
    )
    .await;

    // Without --yes: what is left, and the command; nothing written.
    let mut resume: Vec<&str> = base.to_vec();
    resume.extend(["--resume", &run_id]);
    let before = (statuses(&db, table).await, audited(&db, audit).await);
    let (code, out, err) = run(&resume);
    assert_eq!(code, 0, "resume dry run: {err}");
    let left = &snapshot[done.len()..];
    let mut want = format!(
        "{} of the 200 dead letters of run {run_id} would be replayed ({} were already)\n",
        left.len(),
        done.len()
    );
    for id in left.iter().take(20) {
        want.push_str(&format!("{id}\n"));
    }
    if left.len() > 20 {
        want.push_str(&format!("… and {} more\n", left.len() - 20));
    }
    want.push_str(&format!(
        "to apply: inboxwatch dead-letters replay --config {cfg} --source bulk --operator \
         {OPERATOR} --reason '{REASON}' --resume {run_id} --yes\n"
    ));
    assert_eq!(out, want);
    assert_eq!(
        (statuses(&db, table).await, audited(&db, audit).await),
        before,
        "a dry run writes nothing"
    );

    // Resumed at 100/s: the rest, once each.
    resume.extend(["--rate", "100/s", "--yes"]);
    let (code, out, err) = run(&resume);
    assert_eq!(code, 0, "resume: {out}{err}");
    assert_eq!(
        out,
        format!("run {run_id}: replay: 200, skipped (no longer dead): 0, failed: 0\n")
    );
    let want: Vec<(String, String)> = snapshot
        .iter()
        .map(|id| (id.clone(), run_id.clone()))
        .collect();
    assert_eq!(audit_runs(&db, audit).await, want, "each event once");
    let want: Vec<(String, String)> = (0..600)
        .map(|i| {
            let id = format!("{tag}-{i:04}");
            let replayed = i % 3 == 1 && !again.contains(&id);
            let status = if replayed { "pending" } else { "dead" };
            (id, status.to_string())
        })
        .collect();
    assert_eq!(statuses(&db, table).await, want);
    assert_eq!(
        run_rows(&db, &seed.runs).await,
        vec![want_run(
            &run_id,
            &format!("--group {group}"),
            20,
            [200, 200, 0, 0],
            "finished",
            &snapshot
        )]
    );

    // A finished run has nothing to resume.
    let (code, out, err) = run(&resume);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("run {run_id} finished at "))
            && out.ends_with(
                ": nothing to resume (replay: 200, skipped (no longer dead): 0, failed: 0)\n"
            ),
        "{out}"
    );
    // Resuming it as an ignore is refused, naming the run's action.
    let mut wrong: Vec<&str> = resume.clone();
    wrong[1] = "ignore";
    let (code, _, err) = run(&wrong);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err,
        format!(
            "error: --resume: run \"{run_id}\" is a replay run: resume it with `dead-letters replay`\n"
        )
    );
}

/// Bulk replay of one failure group at a capped rate (issue 36, item 2):
/// its snapshot exactly, once each, audited; a dry run writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bulk_replay_of_a_group_is_its_snapshot() {
    bulk_replay(Db::postgres().await, "bkpg").await;
}

/// The same on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_bulk_replay_of_a_group_is_its_snapshot() {
    bulk_replay(Db::mysql().await, "bkmy").await;
}

/// The same on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bulk_replay_of_a_group_is_its_snapshot() {
    bulk_replay(Db::sqlite().await, "bksq").await;
}

/// A bulk run interrupted by SIGTERM (issue 36, item 2) and resumed with
/// `--resume`: nothing twice, the run's row finished with its counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_interrupted_bulk_run_resumes_without_doing_anything_twice() {
    bulk_resume(Db::postgres().await, "brpg", true).await;
}

/// The same on MariaDB, the run killed (SIGKILL) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_interrupted_bulk_run_resumes_without_doing_anything_twice() {
    bulk_resume(Db::mysql().await, "brmy", false).await;
}

/// The same on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_interrupted_bulk_run_resumes_without_doing_anything_twice() {
    bulk_resume(Db::sqlite().await, "brsq", true).await;
}

/// A replayed event that dies again before the agent's next poll sees it
/// pending (a fast consumer), where the agent saw it dead-lettered before:
/// the agent, which reads the replay from the audit table before the rows,
/// counts the death as a dead letter again (and a success as a completion
/// again), besides the event failed again after replay.
async fn replay_and_death_within_one_poll(db: Db, tag: &str) {
    let tables = db.fresh_tables(tag).await;
    let table = tables.inbox.as_str();
    let audit = common::unique_name("audit", tag);
    db.register_table(&audit);
    db.register_table(&format!("{audit}_runs"));
    let ids: Vec<String> = (0..5).map(|i| format!("{tag}-{i}")).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    // Polls 4 s apart: the replay and what follows it fit between two.
    let toml = config(
        "fast",
        &db,
        table,
        "",
        &db.dsn,
        &format!("audit_table = {}\n", toml_str(&audit)),
    )
    .replace("poll_interval = \"300ms\"", "poll_interval = \"4s\"");
    let cfg = write(dir.path(), "fast.toml", &toml);
    let (code, ddl, err) = run(&["schema", "--config", &cfg]);
    assert_eq!(code, 0, "schema --config: {err}");
    for stmt in split_statements(&ddl) {
        db.exec(&stmt, &[] as &[V]).await;
    }
    let agent = Agent::start(&toml);
    agent.wait_ready(Duration::from_secs(30)).await;
    common::wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        match m.get("inbox_dead_letter_replays_total", &[("source", "fast")]) {
            Some(0.0) => Ok(()),
            other => Err(format!("replays {other:?}")),
        }
    })
    .await
    .expect("the agent has read the audit table");
    // Five events dead-lettered while the agent watches: it remembers them
    // finished.
    let base = db.now_ms().await;
    for id in &ids {
        let e = bulk_dead(
            id.clone(),
            "TimeoutError: upstream did not answer".into(),
            base,
        );
        let (sql, args) = e.insert_stmt(db.dialect, table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let completed = |outcome: &'static str| {
        [
            ("source", "fast"),
            ("event_type", "order.paid"),
            ("outcome", outcome),
        ]
    };
    common::wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        match m.sum(
            "inbox_messages_completed_total",
            &completed("dead_lettered"),
        ) {
            5.0 => Ok(()),
            other => Err(format!("dead_lettered {other}")),
        }
    })
    .await
    .expect("the agent counts the five dead letters");
    // Just after a poll: replayed, then three die again and two succeed.
    agent.wait_polls("fast", 1, Duration::ZERO).await;
    let mut args = vec![
        "dead-letters",
        "replay",
        "--config",
        &cfg,
        "--source",
        "fast",
        "--operator",
        OPERATOR,
        "--reason",
        REASON,
        "--yes",
    ];
    args.extend(ids.iter().map(String::as_str));
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "replay: {out}{err}");
    let now = db.now_ms().await;
    for (i, id) in ids.iter().enumerate() {
        let again = i < 3;
        let e = InboxEvent {
            status: if again {
                Status::Dead
            } else {
                Status::Succeeded
            },
            started_ms: Some(now - 200),
            finished_ms: Some(now - 100),
            attempts: 4,
            last_error: again.then(|| "TimeoutError: upstream did not answer again".into()),
            updated_ms: now,
            ..bulk_dead(id.clone(), String::new(), base)
        };
        let (sql, args) = e.update_stmt(db.dialect, table);
        db.pool.execute(&sql, &args).await.expect("update a row");
    }
    let counted = agent
        .wait_for_polls(&["fast"], Duration::ZERO, 3, |m| {
            let got = (
                m.sum("inbox_dead_letter_replays_total", &[("source", "fast")]),
                m.sum(
                    "inbox_dead_letters_after_replay_total",
                    &[("source", "fast")],
                ),
                m.sum("inbox_dead_letters_total", &[("source", "fast")]),
                m.sum(
                    "inbox_messages_completed_total",
                    &completed("dead_lettered"),
                ),
                m.sum("inbox_messages_completed_total", &completed("succeeded")),
            );
            if got == (5.0, 3.0, 8.0, 8.0, 2.0) {
                Ok(got)
            } else {
                Err(format!(
                    "(replays, after replay, dead letters, dead_lettered, succeeded) = {got:?}, \
                     want (5, 3, 8, 8, 2)"
                ))
            }
        })
        .await;
    counted.expect("counted after the polls that followed");
    agent.terminate(Duration::from_secs(10));
}

/// Guards the re-opening of a replayed event on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_replayed_event_dead_again_within_one_poll_is_a_dead_letter_again() {
    replay_and_death_within_one_poll(Db::postgres().await, "rapg").await;
}

/// The same on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_replayed_event_dead_again_within_one_poll_is_a_dead_letter_again() {
    replay_and_death_within_one_poll(Db::mysql().await, "ramy").await;
}
