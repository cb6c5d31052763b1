//! `doctor`'s checks of a NATS source: it connects, JetStream answers, the
//! election's bucket can be read, one full poll as the agent would run it,
//! and the consumers that cannot say everything (`ack_policy = none`).

use std::sync::Arc;

use super::NatsSource;
use super::client::{self, SharedEvents};
use super::clock::ServerClock;
use super::config::NatsSpec;
use crate::sources::kind::Finding;
use crate::sources::poll_loop::Source as _;

/// Consumers named one per line up to this many.
const LISTED: usize = 20;

pub(crate) async fn check(spec: &NatsSpec) -> Vec<Finding> {
    let mut out = Vec::new();
    let c = match tokio::time::timeout(spec.timeout, client::connect(spec, SharedEvents::default()))
        .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
        Err(_) => {
            out.push(Finding::Error(format!(
                "{}: no connection within {:?}",
                client::servers_text(spec),
                spec.timeout
            )));
            return out;
        }
    };
    let info = c.server_info();
    out.push(Finding::Ok(format!(
        "{}: NATS {} ({}){}",
        client::servers_text(spec),
        info.version,
        info.server_name,
        if spec.tls.is_some() { ", over TLS" } else { "" }
    )));
    #[derive(serde::Deserialize)]
    struct Account {
        streams: usize,
        consumers: usize,
    }
    match client::request::<Account>(&c, "$JS.API.INFO".into(), String::new()).await {
        Ok(a) => out.push(Finding::Ok(format!(
            "JetStream enabled: {} streams, {} consumers in the account",
            a.streams, a.consumers
        ))),
        Err(e) => {
            out.push(Finding::Error(format!(
                "JetStream does not answer (is it enabled for this account?): {e}"
            )));
            return out;
        }
    }
    #[derive(serde::Deserialize)]
    struct Bucket {
        config: BucketConfig,
    }
    #[derive(serde::Deserialize)]
    struct BucketConfig {
        #[serde(default)]
        max_age: u64,
    }
    let bucket = &spec.election_bucket;
    let info = client::request::<Bucket>(
        &c,
        format!("$JS.API.STREAM.INFO.KV_{bucket}"),
        String::new(),
    )
    .await;
    out.push(match info {
        // A lease that never expires would keep a crashed owner's source
        // from every other agent.
        Ok(b) if b.config.max_age == 0 || b.config.max_age > 120_000_000_000 => {
            Finding::Warn(format!(
                "election: KV bucket {bucket} keeps values {}: a crashed owner's lease would hold its sources that long (the agents create it with 20 s)",
                if b.config.max_age == 0 {
                    "for ever".to_string()
                } else {
                    format!("{} s", b.config.max_age / 1_000_000_000)
                }
            ))
        }
        Ok(b) => Finding::Ok(format!(
            "election: KV bucket {bucket} found (leases last {} s)",
            b.config.max_age / 1_000_000_000
        )),
        Err(_) => Finding::Ok(format!(
            "election: KV bucket {bucket} not found yet; the first agent creates it (the account needs the right to)"
        )),
    });
    // Doctor holds no lease: the server's clock is not read, so lag seconds
    // are left out of this poll.
    let mut source = NatsSource::new(Arc::new(spec.clone()), ServerClock::default());
    let started = std::time::Instant::now();
    let polled = tokio::time::timeout(spec.timeout, source.poll()).await;
    match polled {
        Ok(Ok(stats)) => {
            let (streams, consumers) = source.seen;
            out.push(Finding::Ok(format!(
                "one poll in {:.0} ms: {streams} streams and {consumers} durable consumers watched, {} messages read for their times (lag seconds need the server's clock, read by the running agent's lease)",
                started.elapsed().as_secs_f64() * 1000.0,
                stats.rows_read
            )));
            if streams == 0 {
                out.push(Finding::Warn(format!(
                    "no stream matches {}.streams",
                    spec.key
                )));
            } else if consumers == 0 {
                out.push(Finding::Warn(format!(
                    "no durable consumer matches {}.consumers",
                    spec.key
                )));
            }
            let mut none: Vec<String> = source
                .warned
                .iter()
                .map(|(s, c)| format!("{s}/{c}"))
                .collect();
            none.sort();
            for name in none.iter().take(LISTED) {
                out.push(Finding::Warn(format!(
                    "consumer {name} has ack_policy = none: it has no unacknowledged count (and no oldest unacknowledged age)"
                )));
            }
            if none.len() > LISTED {
                out.push(Finding::Warn(format!(
                    "and {} more consumers with ack_policy = none",
                    none.len() - LISTED
                )));
            }
        }
        Ok(Err(e)) => out.push(Finding::Error(e.to_string())),
        Err(_) => out.push(Finding::Error(format!(
            "one poll did not finish within {:?}",
            spec.timeout
        ))),
    }
    crate::telemetry::snapshot::clear(&spec.name);
    out
}
