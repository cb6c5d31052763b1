//! `doctor`'s checks of a RabbitMQ source: the management API and the
//! user's tags, one poll as the agent would run it, and per watched queue
//! what its series can and cannot say: lag seconds absent and why, its
//! dead-letter target, no consumer.

use std::time::Instant;

use serde::Deserialize;

use super::RabbitSource;
use super::client::Api;
use super::config::RabbitSpec;
use super::fetch::{self, label};
use crate::sources::kind::Finding;
use crate::sources::poll_loop::Source as _;

/// Queues described one by one up to this many; the rest are counted.
const LISTED: usize = 50;

#[derive(Deserialize)]
struct Overview {
    rabbitmq_version: Option<String>,
    management_version: Option<String>,
}

#[derive(Deserialize)]
struct Whoami {
    name: String,
    #[serde(default)]
    tags: serde_json::Value,
}

pub(crate) async fn check(spec: &RabbitSpec) -> Vec<Finding> {
    let mut out = Vec::new();
    let api = Api::new(spec, spec.timeout);
    match api
        .get::<Overview>("/api/overview?columns=rabbitmq_version,management_version")
        .await
    {
        Ok(o) => out.push(Finding::Ok(format!(
            "{}: RabbitMQ {}, management plugin {}",
            api.base(),
            o.rabbitmq_version.as_deref().unwrap_or("?"),
            o.management_version.as_deref().unwrap_or("?")
        ))),
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    }
    if let Ok(me) = api.get::<Whoami>("/api/whoami").await {
        let tags: Vec<String> = match &me.tags {
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            serde_json::Value::String(s) => s
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        if tags.iter().any(|t| t == "administrator") {
            out.push(Finding::Warn(format!(
                "user \"{}\" is tagged administrator: a user tagged monitoring suffices (read-only)",
                me.name
            )));
        } else {
            out.push(Finding::Ok(format!(
                "user \"{}\", tags: {}",
                me.name,
                tags.join(", ")
            )));
        }
    }
    if let Some(url) = &spec.election {
        use crate::coordination::Lock as _;
        let mut lock = super::election::RabbitElection::for_source(spec, url);
        out.push(match lock.try_acquire().await {
            Ok(true) => Finding::Ok(format!(
                "election: amqp://{}:{} as \"{}\" declares the lock queue {}{} (no agent holds it now)",
                url.host, url.port, url.username, super::election::QUEUE_PREFIX, spec.name
            )),
            Ok(false) => Finding::Ok(format!(
                "election: amqp://{}:{} as \"{}\": an agent holds the lock queue {}{} and exports the source",
                url.host, url.port, url.username, super::election::QUEUE_PREFIX, spec.name
            )),
            Err(e) => Finding::Error(format!("election: {e}")),
        });
        lock.release().await;
    } else {
        out.push(Finding::Warn(
            "no [sources.election]: every agent configured with this source exports it".into(),
        ));
    }
    let mut source = RabbitSource::new(spec.clone());
    let started = Instant::now();
    match tokio::time::timeout(spec.timeout, source.poll()).await {
        Ok(Ok(stats)) => {
            let series = crate::telemetry::snapshot::count(&spec.name).unwrap_or(0);
            out.push(Finding::Ok(format!(
                "one poll in {:.0} ms: {} queues listed, {series} series",
                started.elapsed().as_secs_f64() * 1000.0,
                stats.rows_read
            )));
        }
        Ok(Err(e)) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
        Err(_) => {
            out.push(Finding::Error(format!(
                "one poll did not finish within {:?}",
                spec.timeout
            )));
            return out;
        }
    }
    let read = match fetch::fetch(&api, spec, &mut fetch::StreamConns::default()).await {
        Ok(r) => r,
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    for vhost in &read.refused {
        out.push(Finding::Warn(super::refused_note(vhost, &spec.username)));
    }
    for note in &read.stream_notes {
        out.push(Finding::Warn(note.clone()));
    }
    let has_streams = read
        .vhosts
        .iter()
        .any(|vh| vh.watched_streams(&spec.queues).next().is_some());
    if has_streams && spec.streams.is_some() && spec.stream_consumers.is_empty() {
        out.push(Finding::Warn(
            "no stream_consumers: streams get no consumer rows (RabbitMQ lists no names offsets are stored under: name them)".into(),
        ));
    }
    let mut listed = 0;
    let mut rest = 0;
    for vh in &read.vhosts {
        for row in vh.rows.values().filter(|r| spec.queues.is_match(&r.name)) {
            if listed >= LISTED {
                rest += 1;
                continue;
            }
            listed += 1;
            if row.kind == "stream" {
                out.extend(stream_findings(spec, vh, row));
            } else {
                out.extend(queue_findings(vh, row));
            }
        }
    }
    if listed == 0 {
        out.push(Finding::Warn(
            "no queue matches vhosts and queues: nothing is watched".into(),
        ));
    }
    if rest > 0 {
        out.push(Finding::Ok(format!("and {rest} more queues")));
    }
    out
}

/// What `doctor` says of one watched stream: what the stream protocol read
/// of it, or why nothing.
fn stream_findings(
    spec: &RabbitSpec,
    vh: &fetch::VhostRead,
    row: &fetch::QueueRow,
) -> Vec<Finding> {
    let name = label(&vh.vhost, &row.name);
    if spec.streams.is_none() {
        return vec![Finding::Warn(format!(
            "queue \"{name}\" (stream): its message count only; set streams_url (rabbitmq-stream://host:5552) and stream_consumers to read its consumers' offsets"
        ))];
    }
    let Some(read) = vh.streams.get(&row.name) else {
        return vec![Finding::Warn(format!(
            "queue \"{name}\" (stream): not read over the stream protocol this time (see above)"
        ))];
    };
    let Some(last) = read.last else {
        return vec![Finding::Ok(format!(
            "queue \"{name}\" (stream): holds no message yet"
        ))];
    };
    let now = super::wall_now();
    let mut line = format!(
        "queue \"{name}\" (stream): last message at offset {}, written {:.1} s ago",
        last.last_offset(),
        (now - last.timestamp_ms as f64 / 1000.0).max(0.0)
    );
    let tracked: Vec<String> = read
        .consumers
        .iter()
        .map(|(c, stored, _)| {
            format!(
                "\"{c}\" stored {stored} (lag {})",
                last.last_offset().saturating_sub(*stored)
            )
        })
        .collect();
    let untracked: Vec<String> = spec
        .stream_consumers
        .iter()
        .filter(|c| !read.consumers.iter().any(|(n, _, _)| n == *c))
        .map(|c| format!("\"{c}\""))
        .collect();
    if !tracked.is_empty() {
        line.push_str(&format!("; consumers {}", tracked.join(", ")));
    }
    if !untracked.is_empty() {
        line.push_str(&format!("; no offset stored by {}", untracked.join(", ")));
    }
    if let Some(n) = vh
        .subscribers
        .as_ref()
        .map(|s| s.get(&row.name).copied().unwrap_or(0))
    {
        line.push_str(&format!("; {n} subscriptions attached"));
    }
    vec![if tracked.is_empty() {
        Finding::Warn(line)
    } else {
        Finding::Ok(line)
    }]
}

/// What `doctor` says of one watched queue.
fn queue_findings(vh: &fetch::VhostRead, row: &fetch::QueueRow) -> Vec<Finding> {
    let name = label(&vh.vhost, &row.name);
    let mut out = Vec::new();
    let ready = row.messages_ready.unwrap_or(0);
    let seconds = if row.head_timestamp().is_some() {
        "lag seconds from its head message's timestamp".to_string()
    } else if row.kind == "quorum" {
        "no lag seconds: a quorum queue reports no head message timestamp".to_string()
    } else if ready > 0 {
        "no lag seconds: its head message has no timestamp property (the publisher sets none)"
            .to_string()
    } else {
        "empty: lag seconds 0 (from the head message's timestamp when it has messages, if publishers set one)"
            .to_string()
    };
    let dead = match row.dead_letter() {
        None => "no dead-letter exchange".to_string(),
        Some((exchange, key)) => {
            let via = format!(
                "dead letters go to exchange \"{exchange}\"{}",
                key.map(|k| format!(" with routing key \"{k}\""))
                    .unwrap_or_default()
            );
            match vh
                .targets
                .get(&row.dead_letter().expect("has one"))
                .cloned()
                .flatten()
            {
                None => {
                    out.push(Finding::Warn(format!(
                        "queue \"{name}\": {via}, which does not exist: dead-lettered messages are dropped"
                    )));
                    String::new()
                }
                Some(t) if t.is_empty() => {
                    out.push(Finding::Warn(format!(
                        "queue \"{name}\": {via}, bound to no queue: dead-lettered messages are dropped"
                    )));
                    String::new()
                }
                Some(t) => {
                    let uncountable: Vec<&String> = t
                        .iter()
                        .filter(|q| {
                            vh.rows.get(*q).is_none_or(|r| {
                                r.backing_queue_status.and_then(|b| b.next_seq_id).is_none()
                            })
                        })
                        .collect();
                    if !uncountable.is_empty() {
                        out.push(Finding::Warn(format!(
                            "queue \"{name}\": dead-letter target {} keeps no enqueue count (not a classic queue): its dead letters are not counted",
                            uncountable
                                .iter()
                                .map(|q| format!("\"{q}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    }
                    format!(
                        "{via} → {}",
                        t.iter()
                            .map(|q| format!("\"{q}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            }
        }
    };
    let line = [format!("queue \"{name}\" ({})", row.kind), seconds, dead]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if row.head_timestamp().is_none() && (row.kind == "quorum" || ready > 0) {
        out.insert(0, Finding::Warn(line));
    } else {
        out.insert(0, Finding::Ok(line));
    }
    if row.consumers == Some(0) {
        out.push(Finding::Warn(format!(
            "queue \"{name}\" has no consumer{}",
            if ready > 0 {
                format!(": {ready} messages wait")
            } else {
                String::new()
            }
        )));
    }
    out
}
