//! What the Redis server says of the watched streams, fetched without
//! judging it (`observe.rs` judges). One poll is a few pipelined round
//! trips, whatever the number of streams:
//! 1. with `discover = "pattern"`, `SCAN … MATCH pattern TYPE stream` until
//!    the cursor comes back to 0;
//! 2. `TIME` (the broker's clock), then per stream `XINFO STREAM` and
//!    `XINFO GROUPS`, and `XINFO STREAM` of each dead-letter stream;
//! 3. per group: the `XPENDING` summary (count, smallest id), the first
//!    entry after its last-delivered id (`XRANGE key (id + COUNT 1`), the
//!    extended `XPENDING` of at most `redelivery_scan_limit` entries (their
//!    delivery counts), and, only where Redis cannot say the group's lag, the
//!    ids after its last-delivered id, at most `lag_count_limit`.
//!
//! No read scans a stream's entries but the last, bounded one. The
//! commands of one round are not one transaction: a stream written during
//! the round may be seen a few entries apart between two commands.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use redis::{Pipeline, Value};

use super::client::{ClientError, error, field, int, items, text};
use super::config::{RedisStreamsSpec, Streams};
use super::id::Id;

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: usize = 1000;

/// One poll's answers.
#[derive(Debug, Default, Clone)]
pub struct Said {
    /// The broker's clock (`TIME`), in milliseconds since the epoch.
    pub now_ms: u64,
    /// The watched streams that exist, in the order watched.
    pub streams: Vec<StreamSaid>,
    /// Watched names that are not streams now: name and the server's word.
    pub missing: Vec<(String, String)>,
    /// Dead-letter stream → its `entries-added` (its length before Redis
    /// 7.0); `None` when it does not exist.
    pub dead_letter_streams: BTreeMap<String, Option<u64>>,
}

/// One stream's `XINFO STREAM` and `XINFO GROUPS`, and its groups' reads.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StreamSaid {
    pub name: String,
    /// `XLEN`.
    pub length: u64,
    /// Entries ever added (Redis 7.0+).
    pub entries_added: Option<u64>,
    pub first_entry: Option<Id>,
    pub last_entry: Option<Id>,
    pub groups: Vec<GroupSaid>,
}

/// One consumer group of a stream.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GroupSaid {
    pub name: String,
    /// Consumers the group knows (idle or not).
    pub consumers: u64,
    /// Entries delivered and not acknowledged (`XPENDING` count).
    pub pending: u64,
    /// The pending count `XINFO GROUPS` gave in the same answer as
    /// `entries_read`: what the group read less this is what it has
    /// acknowledged. `pending` is read later, by `XPENDING`, and a delivery
    /// in between would make that difference go back.
    pub pending_with_read: u64,
    pub last_delivered: Id,
    /// The group's logical read counter (nil after `XGROUP SETID` without `ENTRIESREAD`).
    pub entries_read: Option<u64>,
    /// Redis's own lag (nil when it cannot say).
    pub lag: Option<u64>,
    /// The smallest pending id (`XPENDING` summary).
    pub smallest_pending: Option<Id>,
    /// The first entry after `last_delivered`.
    pub next_undelivered: Option<Id>,
    /// Pending entries read by the scan, and those of them delivered more than once.
    pub scanned: u64,
    pub redelivered: u64,
    /// Ids after `last_delivered`, counted (at most `lag_count_limit`) when
    /// Redis cannot say the lag and the ids alone cannot either.
    pub counted_after: Option<u64>,
}

/// Reads everything a poll needs.
pub async fn fetch(
    conn: &mut MultiplexedConnection,
    spec: &RedisStreamsSpec,
) -> Result<Said, ClientError> {
    let names = match &spec.streams {
        Streams::Named(names) => names.clone(),
        Streams::Pattern(p) => scan(conn, p).await?,
    };
    let mut said = streams(conn, spec, &names).await?;
    groups(conn, spec, &mut said.streams).await?;
    Ok(said)
}

/// Every stream key whose name matches `pattern`, sorted.
pub async fn scan(
    conn: &mut MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, ClientError> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply: Value = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg("stream")
            .query_async(conn)
            .await
            .map_err(command)?;
        let [next, keys] = items(&reply) else {
            return Err(ClientError::Command(
                "SCAN: an answer of another shape".into(),
            ));
        };
        out.extend(items(keys).iter().filter_map(text));
        cursor = text(next).unwrap_or_else(|| "0".into());
        if cursor == "0" {
            break;
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Round 2: `TIME`, the streams and their groups, the dead-letter streams.
async fn streams(
    conn: &mut MultiplexedConnection,
    spec: &RedisStreamsSpec,
    names: &[String],
) -> Result<Said, ClientError> {
    let dead: Vec<&String> = spec
        .dead_letter_streams
        .iter()
        .filter(|(from, _)| names.contains(from))
        .map(|(_, to)| to)
        .collect();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("TIME");
    for n in names {
        pipe.cmd("XINFO").arg("STREAM").arg(n);
        pipe.cmd("XINFO").arg("GROUPS").arg(n);
    }
    for d in &dead {
        pipe.cmd("XINFO").arg("STREAM").arg(d.as_str());
    }
    let replies = run(conn, &pipe).await?;
    let mut replies = replies.iter();
    let mut said = Said {
        now_ms: time(replies.next())?,
        ..Said::default()
    };
    for n in names {
        let (Some(info), Some(groups)) = (replies.next(), replies.next()) else {
            return Err(short());
        };
        if let Some(e) = error(info).or_else(|| error(groups)) {
            said.missing.push((n.clone(), e));
            continue;
        }
        said.streams.push(stream(n, info, groups));
    }
    for d in dead {
        let info = replies.next().ok_or_else(short)?;
        let added = match error(info) {
            Some(_) => None,
            None => field(info, "entries-added")
                .and_then(int)
                .or_else(|| field(info, "length").and_then(int))
                .map(|n| n.max(0) as u64),
        };
        said.dead_letter_streams.insert(d.clone(), added);
    }
    Ok(said)
}

/// A stream from its `XINFO STREAM` and `XINFO GROUPS` answers.
fn stream(name: &str, info: &Value, groups: &Value) -> StreamSaid {
    let count = |v: &Value, f: &str| field(v, f).and_then(int).map(|n| n.max(0) as u64);
    let entry_id = |f: &str| {
        field(info, f)
            .and_then(|e| items(e).first())
            .and_then(text)
            .and_then(|t| Id::parse(&t))
    };
    StreamSaid {
        name: name.to_string(),
        length: count(info, "length").unwrap_or(0),
        entries_added: count(info, "entries-added"),
        first_entry: entry_id("first-entry"),
        last_entry: entry_id("last-entry"),
        groups: items(groups)
            .iter()
            .map(|g| GroupSaid {
                name: field(g, "name").and_then(text).unwrap_or_default(),
                consumers: count(g, "consumers").unwrap_or(0),
                pending: count(g, "pending").unwrap_or(0),
                pending_with_read: count(g, "pending").unwrap_or(0),
                last_delivered: field(g, "last-delivered-id")
                    .and_then(text)
                    .and_then(|t| Id::parse(&t))
                    .unwrap_or_default(),
                entries_read: count(g, "entries-read"),
                lag: count(g, "lag"),
                ..GroupSaid::default()
            })
            .collect(),
    }
}

/// What each group needs read in round 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Pending,
    Next,
    Scan,
    Count,
}

/// Round 3: per group, the pending summary, the next undelivered entry,
/// the bounded scan of pending entries, and the bounded count of ids where
/// Redis cannot say the lag.
async fn groups(
    conn: &mut MultiplexedConnection,
    spec: &RedisStreamsSpec,
    streams: &mut [StreamSaid],
) -> Result<(), ClientError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut asked: Vec<(usize, usize, Ask)> = Vec::new();
    for (si, s) in streams.iter().enumerate() {
        for (gi, g) in s.groups.iter().enumerate() {
            let after = format!("({}", g.last_delivered);
            pipe.cmd("XPENDING").arg(&s.name).arg(&g.name);
            asked.push((si, gi, Ask::Pending));
            let behind = s.last_entry.is_some_and(|last| last > g.last_delivered);
            if behind {
                pipe.cmd("XRANGE")
                    .arg(&s.name)
                    .arg(&after)
                    .arg("+")
                    .arg("COUNT")
                    .arg(1);
                asked.push((si, gi, Ask::Next));
            }
            if g.pending > 0 {
                pipe.cmd("XPENDING")
                    .arg(&s.name)
                    .arg(&g.name)
                    .arg("-")
                    .arg("+")
                    .arg(spec.redelivery_scan_limit);
                asked.push((si, gi, Ask::Scan));
            }
            let ids_say = s.first_entry.is_none_or(|first| first > g.last_delivered);
            if g.lag.is_none() && behind && !ids_say {
                pipe.cmd("XRANGE")
                    .arg(&s.name)
                    .arg(&after)
                    .arg("+")
                    .arg("COUNT")
                    .arg(spec.lag_count_limit);
                asked.push((si, gi, Ask::Count));
            }
        }
    }
    if asked.is_empty() {
        return Ok(());
    }
    let replies = run(conn, &pipe).await?;
    if replies.len() != asked.len() {
        return Err(short());
    }
    for ((si, gi, ask), reply) in asked.into_iter().zip(&replies) {
        let g = &mut streams[si].groups[gi];
        if error(reply).is_some() {
            // The group or stream went between the rounds: read next poll.
            continue;
        }
        match ask {
            Ask::Pending => {
                let summary = items(reply);
                if let Some(n) = summary.first().and_then(int) {
                    g.pending = n.max(0) as u64;
                }
                g.smallest_pending = summary.get(1).and_then(text).and_then(|t| Id::parse(&t));
            }
            Ask::Next => {
                g.next_undelivered = items(reply)
                    .first()
                    .and_then(|e| items(e).first())
                    .and_then(text)
                    .and_then(|t| Id::parse(&t));
            }
            Ask::Scan => {
                let entries = items(reply);
                g.scanned = entries.len() as u64;
                g.redelivered = entries
                    .iter()
                    .filter(|e| items(e).get(3).and_then(int).is_some_and(|d| d > 1))
                    .count() as u64;
            }
            Ask::Count => g.counted_after = Some(items(reply).len() as u64),
        }
    }
    Ok(())
}

/// Runs a pipeline whose errors come back as values.
async fn run(conn: &mut MultiplexedConnection, pipe: &Pipeline) -> Result<Vec<Value>, ClientError> {
    pipe.query_async::<Vec<Value>>(conn).await.map_err(command)
}

/// `TIME`'s answer in milliseconds.
fn time(reply: Option<&Value>) -> Result<u64, ClientError> {
    let reply = reply.ok_or_else(short)?;
    if let Some(e) = error(reply) {
        return Err(ClientError::Command(format!("TIME: {e}")));
    }
    match items(reply) {
        [secs, micros] => {
            let (Some(s), Some(us)) = (int(secs), int(micros)) else {
                return Err(ClientError::Command("TIME: not numbers".into()));
            };
            Ok(s.max(0) as u64 * 1000 + us.max(0) as u64 / 1000)
        }
        _ => Err(ClientError::Command(
            "TIME: an answer of another shape".into(),
        )),
    }
}

fn short() -> ClientError {
    ClientError::Command("the server answered fewer replies than commands sent".into())
}

/// A failed command: the connection is dropped and made again next poll.
pub fn command(e: redis::RedisError) -> ClientError {
    ClientError::Command(e.to_string())
}
