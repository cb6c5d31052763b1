//! `inboxwatch trace` and `inboxwatch dead-letters` through the binary, against
//! PostgreSQL and MariaDB: generated events with known timestamps, and the
//! exact text each command must print for them.

use crate::common;

use common::ids::trace_of;
use common::workload::{InboxEvent, OutboxEvent, Status, Target};
use common::{Cmd, Db, toml_str};

/// The span id of an attempt of `process`, worked out outside the agent's code.
fn span_of(service: &str, event_id: &str, attempt: u32) -> String {
    common::ids::span_of("process", service, event_id, attempt)
}

/// RFC 3339 with milliseconds, UTC.
fn ts(ms: i64) -> String {
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64),
    )
    .to_string()
}

fn dur(ms: i64) -> String {
    if ms >= 1000 {
        format!("{:.3}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

fn base_start(e: &InboxEvent) -> i64 {
    e.started_ms.expect("started")
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Cmd::new(args).output();
    (out.code.unwrap_or(-1), out.stdout, out.stderr)
}

struct Case {
    dead: InboxEvent,
    ok: InboxEvent,
    unstarted: InboxEvent,
    old_dead: InboxEvent,
    failed: InboxEvent,
    published: OutboxEvent,
}

async fn seed(db: &Db, inbox: &str, outbox: &str, tag: &str) -> Case {
    let now = db.now_ms().await;
    let base = now - 10 * 60_000;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string();
    let ev = |id: &str, status: Status| InboxEvent {
        id: format!("{tag}-{id}"),
        event_type: Some("order.paid".into()),
        status,
        received_ms: base,
        started_ms: Some(base + 1_250),
        finished_ms: Some(base + 1_400),
        attempts: 1,
        deliveries: 1,
        last_error: None,
        traceparent: None,
        updated_ms: base + 1_400,
    };
    let case = Case {
        dead: InboxEvent {
            attempts: 3,
            deliveries: 2,
            last_error: Some("TimeoutError: upstream did not answer within 5s".into()),
            traceparent: Some(tp.clone()),
            ..ev("dead", Status::Dead)
        },
        ok: ev("ok", Status::Succeeded),
        unstarted: InboxEvent {
            event_type: None,
            started_ms: None,
            finished_ms: Some(base + 2_000),
            updated_ms: base + 2_000,
            deliveries: 3,
            last_error: Some("SchemaError: payload does not match schema v3".into()),
            traceparent: Some("garbage".into()),
            ..ev("unstarted", Status::Dead)
        },
        old_dead: InboxEvent {
            received_ms: now - 3 * 3_600_000,
            started_ms: Some(now - 3 * 3_600_000 + 10),
            finished_ms: Some(now - 3 * 3_600_000 + 20),
            updated_ms: now - 3 * 3_600_000 + 20,
            last_error: Some("HttpError: 503".into()),
            ..ev("old", Status::Dead)
        },
        failed: InboxEvent {
            finished_ms: None,
            attempts: 2,
            updated_ms: base + 1_900,
            last_error: Some("DeadlockDetected: retry the transaction".into()),
            ..ev("failed", Status::Failed)
        },
        published: OutboxEvent {
            id: format!("{tag}-dead"),
            event_type: Some("order.paid".into()),
            created_ms: base - 500,
            published_ms: Some(base - 380),
            traceparent: Some(tp),
            updated_ms: base - 380,
        },
    };
    let target = Target {
        dialect: db.dialect,
        pool: db.pool.clone(),
        table: inbox.to_string(),
    };
    for e in [
        &case.dead,
        &case.ok,
        &case.unstarted,
        &case.old_dead,
        &case.failed,
    ] {
        let (sql, args) = e.insert_stmt(target.dialect, &target.table);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let (sql, args) = case.published.insert_stmt(db.dialect, outbox);
    db.pool
        .execute(&sql, &args)
        .await
        .expect("insert outbox row");
    case
}

async fn lookups(db: Db, tag: &str) {
    let tables = db.fresh_tables(tag).await;
    let case = seed(&db, &tables.inbox, &tables.outbox, tag).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("inboxwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[sources]]\nname = \"lk-inbox\"\nkind = \"inbox\"\ndsn = {dsn}\ntable = {}\nservice_name = \"billing\"\n{}\n\
             [[sources]]\nname = \"lk-outbox\"\nkind = \"outbox\"\ndsn = {dsn}\ntable = {}\nservice_name = \"orders-api\"\n{}",
            toml_str(&tables.inbox),
            common::scenarios::INBOX_COLUMNS,
            toml_str(&tables.outbox),
            common::scenarios::OUTBOX_COLUMNS,
            dsn = toml_str(&db.dsn),
        ),
    )
    .expect("write config");
    let cfg = cfg.to_str().expect("utf-8 path");

    // The dead-lettered event with an outbox row: every fact, exactly.
    let d = &case.dead;
    let (code, out, err) = run(&["trace", &d.id, "--config", cfg]);
    assert_eq!(code, 0, "trace: {err}");
    let expected = format!(
        "event {id}\ntrace id {trace}  (derived from the event id)\n\
         \nsource lk-inbox (inbox {inbox}, service billing)\n\
         \x20 event type      order.paid\n\
         \x20 status          dead (dead)\n\
         \x20 {received}  received\n\
         \x20 {started}  attempt 3 started (earlier attempts' times are not stored), {wait} after receipt\n\
         \x20 {finished}  dead-lettered after {proc} of processing\n\
         \x20 attempts        3\n\
         \x20 deliveries      2 (1 duplicate)\n\
         \x20 last error      TimeoutError: upstream did not answer within 5s\n\
         \x20 span id         {span}  (attempt 3)\n\
         \x20 producer trace  4bf92f3577b34da6a3ce929d0e0e4736 (parent span 00f067aa0ba902b7)\n\
         \nsource lk-outbox (outbox {outbox}, service orders-api)\n\
         \x20 event type      order.paid\n\
         \x20 {created}  created\n\
         \x20 {published}  published after 120ms\n\
         \x20 producer trace  4bf92f3577b34da6a3ce929d0e0e4736 (parent span 00f067aa0ba902b7)\n",
        id = d.id,
        trace = trace_of(&d.id),
        inbox = tables.inbox,
        outbox = tables.outbox,
        received = ts(d.received_ms),
        started = ts(d.started_ms.expect("started")),
        wait = dur(1_250),
        finished = ts(d.finished_ms.expect("finished")),
        proc = dur(150),
        span = span_of("billing", &d.id, 3),
        created = ts(case.published.created_ms),
        published = ts(case.published.published_ms.expect("published")),
    );
    assert_eq!(out, expected, "trace output of a dead-lettered event");

    // Dead on receipt, no type, malformed traceparent; only the inbox source.
    let u = &case.unstarted;
    let (code, out, err) = run(&["trace", &u.id, "--config", cfg, "--source", "lk-inbox"]);
    assert_eq!(code, 0, "trace: {err}");
    let expected = format!(
        "event {id}\ntrace id {trace}  (derived from the event id)\n\
         \nsource lk-inbox (inbox {inbox}, service billing)\n\
         \x20 event type      unknown\n\
         \x20 status          dead (dead)\n\
         \x20 {received}  received\n\
         \x20 {finished}  dead-lettered\n\
         \x20 attempts        1\n\
         \x20 deliveries      3 (2 duplicates)\n\
         \x20 last error      SchemaError: payload does not match schema v3\n\
         \x20 span id         {span}  (attempt 1)\n\
         \x20 producer trace  unreadable traceparent \"garbage\"\n",
        id = u.id,
        trace = trace_of(&u.id),
        inbox = tables.inbox,
        received = ts(u.received_ms),
        finished = ts(u.finished_ms.expect("finished")),
        span = span_of("billing", &u.id, 1),
    );
    assert_eq!(out, expected, "trace output of an event dead on receipt");

    // A failed event waiting for its retry.
    let f = &case.failed;
    let (code, out, err) = run(&["trace", &f.id, "--config", cfg, "--source", "lk-inbox"]);
    assert_eq!(code, 0, "trace: {err}");
    assert!(
        out.contains(&format!(
            "  {}  failed; will be retried (last change of the row)\n",
            ts(f.updated_ms)
        )) && out.contains("  status          failed (failed)\n")
            && out.contains("  producer trace  none (no traceparent stored)\n"),
        "trace output of a failed event:\n{out}"
    );

    // A succeeded event: no error, one attempt.
    let o = &case.ok;
    let (code, out, err) = run(&["trace", &o.id, "--config", cfg, "--source", "lk-inbox"]);
    assert_eq!(code, 0, "trace: {err}");
    assert!(
        out.contains(&format!(
            "  {}  succeeded after 150ms of processing\n",
            ts(o.finished_ms.expect("finished"))
        )) && out.contains(&format!(
            "  {}  attempt 1 started, 1.250s after receipt\n",
            ts(base_start(o))
        )) && !out.contains("last error"),
        "trace output of a succeeded event:\n{out}"
    );

    // An unknown event id: a clear message and exit 1.
    let (code, out, err) = run(&["trace", "no-such-event", "--config", cfg]);
    assert_eq!(code, 1, "unknown event id exits 1 (stdout {out:?})");
    assert_eq!(
        err.trim(),
        "error: event \"no-such-event\" not found in source \"lk-inbox\", \"lk-outbox\""
    );
    let (code, _, err) = run(&["trace", "x", "--config", cfg, "--source", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "error: --source: no source named \"nope\" in the config that this command can read"
    );

    // Dead letters of the last hour: newest first, the 3-hour-old one left out.
    let (code, out, err) = run(&["dead-letters", "--config", cfg, "--since", "1h"]);
    assert_eq!(code, 0, "dead-letters: {err}");
    let row = |e: &InboxEvent| {
        format!(
            "lk-inbox\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            e.id,
            e.label(),
            ts(e.received_ms),
            ts(e.finished_ms.expect("finished")),
            e.attempts,
            trace_of(&e.id),
            e.last_error.as_deref().expect("error")
        )
    };
    let header = "source\tevent_id\tevent_type\tfirst_received\tdead_lettered\tattempts\ttrace_id\tlast_error\n";
    assert_eq!(
        out,
        format!("{header}{}{}", row(&case.unstarted), row(&case.dead)),
        "dead-letters --since 1h"
    );
    let (code, out, _) = run(&["dead-letters", "--config", cfg, "--since", "4h"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        format!(
            "{header}{}{}{}",
            row(&case.unstarted),
            row(&case.dead),
            row(&case.old_dead)
        ),
        "dead-letters --since 4h"
    );
    let (code, out, _) = run(&["dead-letters", "--config", cfg, "--source", "lk-outbox"]);
    assert_eq!(code, 0);
    assert_eq!(out, header, "an outbox source has no dead letters");
    db.cleanup().await;
}

/// Guards the on-call lookups on PostgreSQL: exact `trace` output (timeline,
/// attempts, duplicates, last error, derived trace and span ids, producer
/// context from `traceparent`, outbox publish), the unknown-id message, and
/// the exact `dead-letters` listing within `--since`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_trace_and_dead_letters_print_the_exact_facts() {
    lookups(Db::postgres().await, "lkpg").await;
}

/// The same on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_trace_and_dead_letters_print_the_exact_facts() {
    lookups(Db::mysql().await, "lkmy").await;
}

/// One cause of dead letters: its error class, its fingerprint, how many, and the
/// error text of the i-th.
type Cause = (&'static str, &'static str, usize, fn(usize) -> String);

/// 600 dead letters from three causes whose texts differ in their variable parts
/// (amounts, ids, timestamps, durations), a failing event and an old dead letter with
/// the same texts, and four failing events of a fourth cause: `dead-letters groups`
/// prints exactly four groups, with exact counts of dead letters and of events failing
/// now, first and last seen, owner and latest sample, the latest last seen first.
async fn groups(db: Db, tag: &str) {
    let tables = db.fresh_tables(tag).await;
    let now = db.now_ms().await;
    let base = now - 30 * 60_000;
    let causes: [Cause; 3] = [
        (
            "timeout",
            "timeout after <n>ms calling inventory for order <n>",
            250,
            |i| {
                format!(
                    "timeout after {}ms calling inventory for order {}",
                    3000 + i % 7,
                    10_000 + i
                )
            },
        ),
        (
            "conflict",
            "duplicate key value violates unique constraint \"<value>\"",
            200,
            |i| {
                format!(
                    "duplicate key value violates unique constraint \"payments_pkey\"\nDETAIL: Key (id)=({i}) already exists."
                )
            },
        ),
        (
            "invalid",
            "invalid amount <n> for order <id> at <time>",
            150,
            |i| {
                format!(
                    "invalid amount {}.{:02} for order ord_{:x}a at 2026-12-04T10:{:02}:{:02}.{:03}Z",
                    i,
                    i % 100,
                    i * 7919,
                    i % 60,
                    (i * 7) % 60,
                    i % 1000
                )
            },
        ),
    ];
    let mut events = Vec::new();
    let mut expected = Vec::new();
    let mut n = 0i64;
    for (c, (class, fingerprint, count, text)) in causes.iter().enumerate() {
        let mut first = i64::MAX;
        let mut last = i64::MIN;
        let mut last_id = String::new();
        for i in 0..*count {
            // Interleaved in time: each cause's dead letters spread over the 30 minutes.
            let finished = base + 1_000 + (i as i64) * 6_000 + c as i64 * 1_000;
            n += 1;
            let id = format!("{tag}-{class}-{i}");
            if finished > last {
                last = finished;
                last_id = id.clone();
            }
            first = first.min(finished);
            events.push(InboxEvent {
                id,
                event_type: Some("order.paid".into()),
                status: Status::Dead,
                received_ms: finished - 900,
                started_ms: Some(finished - 500),
                finished_ms: Some(finished),
                attempts: 3,
                deliveries: 1,
                last_error: Some(text(i)),
                traceparent: None,
                updated_ms: finished,
            });
        }
        expected.push((*class, *fingerprint, *count, 0, first, last, last_id));
    }
    assert_eq!(n, 600);
    // Failing now, of the timeouts' cause: the timeouts' group counts it as
    // failing, and it is the group's latest failure. Dead too long ago: in
    // no group.
    expected[0].3 = 1;
    expected[0].5 = now - 60_000;
    expected[0].6 = format!("{tag}-other-0");
    // Failing now, of a cause with no dead letter yet: a group of its own.
    for i in 0..4i64 {
        let at = now - 120_000 + i * 1_000;
        events.push(InboxEvent {
            id: format!("{tag}-failing-{i}"),
            event_type: Some("order.paid".into()),
            status: Status::Failed,
            received_ms: at - 10,
            started_ms: Some(at - 5),
            finished_ms: None,
            attempts: 2,
            deliveries: 1,
            last_error: Some(format!(
                "service unavailable: payments 503 for order {}",
                77 + i
            )),
            traceparent: None,
            updated_ms: at,
        });
    }
    expected.push((
        "server_error",
        "service unavailable: payments <n> for order <n>",
        0,
        4,
        now - 120_000,
        now - 117_000,
        format!("{tag}-failing-3"),
    ));
    for (i, (status, finished)) in [
        (Status::Failed, now - 60_000),
        (Status::Dead, now - 3 * 86_400_000),
    ]
    .into_iter()
    .enumerate()
    {
        events.push(InboxEvent {
            id: format!("{tag}-other-{i}"),
            event_type: Some("order.paid".into()),
            status,
            received_ms: finished - 10,
            started_ms: Some(finished - 5),
            finished_ms: (status == Status::Dead).then_some(finished),
            attempts: 1,
            deliveries: 1,
            last_error: Some((causes[0].3)(1)),
            traceparent: None,
            updated_ms: finished,
        });
    }
    for e in &events {
        let (sql, args) = e.insert_stmt(db.dialect, &tables.inbox);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("inboxwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[sources]]\nname = \"gr-inbox\"\nkind = \"inbox\"\nowner = \"team-payments\"\ndsn = {dsn}\ntable = {}\n{}\n",
            toml_str(&tables.inbox),
            common::scenarios::INBOX_COLUMNS,
            dsn = toml_str(&db.dsn),
        ),
    )
    .expect("write config");
    let cfg = cfg.to_str().expect("utf-8 path");
    let (code, out, err) = run(&["dead-letters", "groups", "--config", cfg]);
    assert_eq!(code, 0, "dead-letters groups: {err}");
    // The latest last seen first: the invalid amounts (1 s after the others' last).
    expected.sort_by_key(|e| std::cmp::Reverse(e.5));
    let mut want = String::from(
        "group\tsource\towner\tevent_type\terror_class\tcount\tfailing\tfirst_seen\tlast_seen\tsample_event_id\tfingerprint\n",
    );
    for (class, fingerprint, count, failing, first, last, last_id) in &expected {
        let key = inboxwatch::fingerprint::Key {
            source: "gr-inbox".into(),
            event_type: "order.paid".into(),
            error_class: class.to_string(),
            fingerprint: fingerprint.to_string(),
        };
        want.push_str(&format!(
            "{}\tgr-inbox\tteam-payments\torder.paid\t{class}\t{count}\t{failing}\t{}\t{}\t{last_id}\t{fingerprint}\n",
            key.id(),
            ts(*first),
            ts(*last),
        ));
    }
    assert_eq!(out, want, "dead-letters groups");
    // A limit below the count: the groups count the latest 100, and say so.
    let (code, out, _) = run(&["dead-letters", "groups", "--config", cfg, "--limit", "100"]);
    assert_eq!(code, 0);
    let counted: u64 = out
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('('))
        .map(|l| {
            l.split('\t')
                .nth(5)
                .expect("count")
                .parse::<u64>()
                .expect("a number")
        })
        .sum();
    assert_eq!(counted, 100, "{out}");
    assert!(
        out.ends_with("(source gr-inbox has more than 100 dead letters within the window: the groups count the latest 100; raise --limit)\n"),
        "{out}"
    );
    db.cleanup().await;
}

/// Guards failure groups (`dead-letters groups`) on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dead_letter_groups_are_exact() {
    groups(Db::postgres().await, "grpg").await;
}

/// The same on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_dead_letter_groups_are_exact() {
    groups(Db::mysql().await, "grmy").await;
}

/// Table data escaped the way `dead-letters` documents it, worked out here:
/// a backslash doubled, each byte of a control character as `\xNN`.
fn escaped(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// What `trace` and the commands' error messages print, as lines: each
/// control character but the newline as `\xNN`, the rest (a backslash too) as
/// it is.
fn terminal(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => "\n".to_string(),
            c if c.is_control() => escaped(&c.to_string()),
            c => c.to_string(),
        })
        .collect()
}

/// No control character but the line ends, and no tab but the columns'.
fn assert_printable(what: &str, out: &str, columns: Option<usize>) {
    for (i, line) in out.lines().enumerate() {
        let bad: Vec<char> = line
            .chars()
            .filter(|c| c.is_control() && (*c != '\t' || columns.is_none()))
            .collect();
        assert!(
            bad.is_empty(),
            "{what}, line {i}: raw control characters {bad:?} reach the terminal: {line:?}"
        );
        if let Some(n) = columns.filter(|_| !line.is_empty()) {
            assert_eq!(
                line.split('\t').count(),
                n,
                "{what}, line {i}: a field split the row: {line:?}"
            );
        }
    }
}

/// Hostile table data through the binary (issue 35): an event id that clears
/// the screen and retitles the terminal (`ESC [2J`, `ESC ]0;…BEL`), one that
/// looks like a flag (`--yes`), and an event type and error text with tabs,
/// CR and newlines. `trace`, `dead-letters`, `dead-letters ignore` and
/// `dead-letters history` print each escaped, and keep one row per line with
/// its columns; `--` before the ids makes `--yes` an id, not the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_table_data_is_printed_escaped_sqlite() {
    let db = Db::sqlite().await;
    let tables = db.fresh_tables("hostile").await;
    let audit = common::unique_name("audit", "hostile");
    db.register_table(&audit);
    let base = db.now_ms().await - 10 * 60_000;
    let hostile = "esc-\x1b[2J\x1b]0;pwned\x07-id";
    let event_type = "order\tpaid\r\nX";
    let error = "boom\x1b[31m red\nsecond line\tcol\\";
    let ev = |id: &str| InboxEvent {
        id: id.to_string(),
        event_type: Some(event_type.into()),
        status: Status::Dead,
        received_ms: base,
        started_ms: Some(base + 1_000),
        finished_ms: Some(base + 1_500),
        attempts: 2,
        deliveries: 1,
        last_error: Some(error.into()),
        traceparent: None,
        updated_ms: base + 1_500,
    };
    for e in [ev(hostile), ev("--yes")] {
        let (sql, args) = e.insert_stmt(db.dialect, &tables.inbox);
        db.pool
            .execute(&sql, &args)
            .await
            .expect("insert inbox row");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("inboxwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}[sources.dead_letter_actions]\ndsn = {dsn}\naudit_table = {}\n",
            common::scenarios::inbox_source_toml("hostile", &db.dsn, &tables.inbox),
            toml_str(&audit),
            dsn = toml_str(&db.dsn),
        ),
    )
    .expect("write config");
    let cfg = cfg.to_str().expect("utf-8 path");
    let (code, ddl, err) = run(&["schema", "--config", cfg]);
    assert_eq!(code, 0, "schema --config: {err}");
    for stmt in common::split_statements(&ddl) {
        if stmt.contains(&audit) {
            db.pool.raw(&stmt).await.expect("create the audit table");
        }
    }

    let (code, out, err) = run(&["trace", "--config", cfg, "--", hostile]);
    assert_eq!(code, 0, "trace: {err}");
    assert_printable("trace", &out, None);
    for want in [
        format!("event {}\n", terminal(hostile)),
        format!("  event type      {}\n", terminal(event_type)),
        format!("  last error      {}\n", terminal(error)),
    ] {
        assert!(out.contains(&want), "trace lacks {want:?}:\n{out}");
    }
    // An id found nowhere is named in the error as printed text too.
    let missing = "gone-\x1b]0;pwned\x07";
    let (code, _, err) = run(&["trace", "--config", cfg, "--", missing]);
    assert_eq!(code, 1, "trace of an unknown id: {err}");
    assert_printable("trace's error", &err, None);
    assert!(
        err.contains(&format!("event \"{}\" not found", terminal(missing))),
        "trace's error names the id escaped: {err}"
    );

    let (code, out, err) = run(&["dead-letters", "--config", cfg]);
    assert_eq!(code, 0, "dead-letters: {err}");
    assert_printable("dead-letters", &out, Some(8));
    for id in [hostile, "--yes"] {
        let row = format!("hostile\t{}\t{}\t", escaped(id), escaped(event_type));
        let line = out
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("dead-letters lacks a row starting {row:?}:\n{out}"));
        assert!(
            line.ends_with(&format!("\t{}", escaped(error))),
            "dead-letters' last_error of {id:?}: {line:?}"
        );
    }

    // `--yes` after `--` is an event id: ignored for real only with the flag
    // before `--`, and then only that row.
    let ignore = |apply: &[&str]| {
        let mut args = vec![
            "dead-letters",
            "ignore",
            "--config",
            cfg,
            "--source",
            "hostile",
            "--operator",
            "alice",
            "--reason",
            "test",
        ];
        args.extend_from_slice(apply);
        args.extend(["--", "--yes", hostile]);
        run(&args)
    };
    let (code, out, err) = ignore(&[]);
    assert_eq!(code, 0, "a dry run: {err}");
    assert!(
        err.contains("dry run: nothing is written"),
        "`--yes` after `--` was taken as the flag:\n{err}"
    );
    assert_printable("dead-letters ignore (dry run)", &out, None);
    assert!(
        out.contains(&format!("would ignore {}:", escaped(hostile)))
            && out.contains("would ignore --yes:"),
        "the dry run names both ids, escaped:\n{out}"
    );
    let (code, out, err) = ignore(&["--yes"]);
    assert_eq!(code, 0, "ignore: {err}\n{out}");
    assert_printable("dead-letters ignore", &out, None);

    let (code, out, err) = run(&[
        "dead-letters",
        "history",
        "--config",
        cfg,
        "--source",
        "hostile",
        "--",
        hostile,
        "--yes",
    ]);
    assert_eq!(code, 0, "history: {err}");
    assert_printable("dead-letters history", &out, Some(8));
    for id in [hostile, "--yes"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{}\tignore\talice\ttest\t", escaped(id))))
            .unwrap_or_else(|| panic!("history lacks the ignore of {id:?}:\n{out}"));
        assert!(
            line.ends_with(&format!("\tdead\t2\t{}", escaped(error))),
            "history's last_error of {id:?}: {line:?}"
        );
    }
    db.cleanup().await;
}
