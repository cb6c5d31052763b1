//! `doctor`'s checks of a Redis Streams source: the server (connects, logs
//! in, its version: entries-added and a group's lag need Redis 7.0), the
//! watched streams and their groups, the dead-letter streams, then one poll
//! as the agent runs it, with what it warns of.

use super::RedisStreamsSource;
use super::client::{connect, text};
use super::config::{RedisStreamsSpec, Streams};
use super::observe::Judge;
use crate::sources::kind::Finding;
use crate::sources::poll_loop::Source as _;

/// Groups listed one per line up to this many, then counted.
const LISTED: usize = 50;

pub(crate) async fn check(spec: &RedisStreamsSpec) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut conn = match connect(&spec.server, spec.timeout).await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::Error(format!("{}: {e}", spec.server.shown())));
            return out;
        }
    };
    let info: redis::Value = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap_or(redis::Value::Nil);
    let version = text(&info)
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("redis_version:")
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let tls = if spec.server.tls.is_some() {
        " over TLS"
    } else {
        ""
    };
    out.push(Finding::Ok(format!(
        "{}: connected{tls}, Redis {version}",
        spec.server.shown()
    )));
    if major < 7 {
        out.push(Finding::Warn(format!(
            "Redis {version}: before 7.0 a stream has no entries-added and a group no lag; \
             queue_messages_published_total is missing and every lag is counted from ids"
        )));
    }
    if let Streams::Pattern(p) = &spec.streams {
        match super::fetch::scan(&mut conn, p).await {
            Ok(found) if found.is_empty() => {
                out.push(Finding::Warn(format!("no stream matches \"{p}\" yet")))
            }
            Ok(found) => out.push(Finding::Ok(format!(
                "{} streams match \"{p}\"",
                found.len()
            ))),
            Err(e) => out.push(Finding::Error(format!("SCAN: {e}"))),
        }
    }
    let mut source = RedisStreamsSource::new(spec.clone());
    let started = std::time::Instant::now();
    match tokio::time::timeout(spec.timeout, source.poll()).await {
        Ok(Ok(_)) => out.push(Finding::Ok(format!(
            "one poll in {:.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        ))),
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
    let Some(said) = source.last.take() else {
        return out;
    };
    for (stream, why) in &said.missing {
        out.push(Finding::Error(format!("stream \"{stream}\": {why}")));
    }
    let mut listed = 0;
    let mut rest = 0;
    for s in &said.streams {
        if s.groups.is_empty() {
            out.push(Finding::Warn(format!(
                "stream \"{}\" ({} entries) has no consumer group: nothing to watch there",
                s.name, s.length
            )));
        }
        for g in &s.groups {
            if listed < LISTED {
                out.push(Finding::Ok(format!(
                    "stream \"{}\" group \"{}\": {} consumers, {} pending, last delivered {}",
                    s.name, g.name, g.consumers, g.pending, g.last_delivered
                )));
                listed += 1;
            } else {
                rest += 1;
            }
        }
    }
    if rest > 0 {
        out.push(Finding::Ok(format!("and {rest} more groups")));
    }
    for (from, to) in &spec.dead_letter_streams {
        match said.dead_letter_streams.get(to) {
            Some(Some(n)) => out.push(Finding::Ok(format!(
                "dead-letter stream \"{to}\" of \"{from}\": {n} entries added so far"
            ))),
            Some(None) => out.push(Finding::Warn(format!(
                "dead-letter stream \"{to}\" of \"{from}\" does not exist yet: counted from its first entry"
            ))),
            None => {}
        }
    }
    let (_, warnings) = Judge::default().observe(spec, &said);
    for w in warnings {
        if !matches!(w, super::observe::Warning::Missing { .. }) {
            out.push(Finding::Warn(w.to_string()));
        }
    }
    out
}
