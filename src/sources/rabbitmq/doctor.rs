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
    let read = match fetch::fetch(&api, spec).await {
        Ok(r) => r,
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    for vhost in &read.refused {
        out.push(Finding::Warn(super::refused_note(vhost, &spec.username)));
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
            out.extend(queue_findings(vh, row));
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

/// What `doctor` says of one watched queue.
fn queue_findings(vh: &fetch::VhostRead, row: &fetch::QueueRow) -> Vec<Finding> {
    let name = label(&vh.vhost, &row.name);
    let mut out = Vec::new();
    if row.kind == "stream" {
        out.push(Finding::Warn(format!(
            "queue \"{name}\" (stream): its message count only; its consumers' offsets need the stream protocol, which this kind does not read"
        )));
        return out;
    }
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
