//! `doctor`'s checks of a Kafka source: the API versions the first
//! reachable broker offers, one full cycle as the agent would run it, and
//! the group protocol (classic or KIP-848 consumer) of each group it read.

use super::KafkaSource;
use super::client;
use super::config::KafkaSpec;
use super::fetch::Protocol;
use super::shards::{Shards, shard_of};
use crate::sources::kind::Finding;
use crate::sources::poll_loop::Source as _;

/// The negotiated API versions of the first reachable broker, then one full
/// cycle of the Kafka source, as the agent would run it.
pub(crate) async fn check(spec: &KafkaSpec) -> Vec<Finding> {
    use kafka_protocol::messages::{
        ConsumerGroupDescribeRequest, DescribeGroupsRequest, FetchRequest, FindCoordinatorRequest,
        ListGroupsRequest, ListOffsetsRequest, MetadataRequest, OffsetFetchRequest,
    };
    let mut out = Vec::new();
    let connector =
        client::Connector::new(spec.client_id.clone(), spec.security.clone(), spec.timeout);
    let c = match connector.connect_any(&spec.brokers).await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding::Error(e.to_string()));
            return out;
        }
    };
    let v = |r: Result<i16, client::KafkaError>| {
        r.map(|v| format!("v{v}"))
            .unwrap_or_else(|_| "unsupported".into())
    };
    out.push(Finding::Ok(format!(
        "{}: Metadata {}, ListOffsets {}, ListGroups {}, FindCoordinator {}, DescribeGroups {}, ConsumerGroupDescribe {}, OffsetFetch {}, Fetch {}",
        c.addr(),
        v(c.version::<MetadataRequest>()),
        v(c.version::<ListOffsetsRequest>()),
        v(c.version::<ListGroupsRequest>()),
        v(c.version::<FindCoordinatorRequest>()),
        v(c.version::<DescribeGroupsRequest>()),
        v(c.version::<ConsumerGroupDescribeRequest>()),
        v(c.version::<OffsetFetchRequest>()),
        v(c.version::<FetchRequest>()),
    )));
    if c.version::<ListGroupsRequest>().is_err() {
        out.push(Finding::Warn(
            "no ListGroups: only the groups named plainly in groups.include are watched".into(),
        ));
    } else if c.version::<ListGroupsRequest>().is_ok_and(|v| v < 5) {
        out.push(Finding::Ok(
            "ListGroups below v5: groups are taken as classic (brokers before Kafka 3.8 have no KIP-848 groups)".into(),
        ));
    }
    if c.version::<OffsetFetchRequest>().is_ok_and(|v| v < 8) {
        out.push(Finding::Warn(
            "OffsetFetch below v8: one request per group each cycle instead of one per 100 groups"
                .into(),
        ));
    }
    if let Some(sasl) = &spec.security.sasl {
        let transport = if spec.security.tls.is_some() {
            "over TLS"
        } else {
            "without TLS"
        };
        let session = match c.session_lifetime() {
            Some(d) => format!(
                "the broker's session lasts {}, renewed in place after 85 %",
                humantime::format_duration(d)
            ),
            None => "the broker sets no session lifetime".into(),
        };
        out.push(Finding::Ok(format!(
            "SASL {} {transport}: authenticated; {session}",
            sasl.mechanism.as_str()
        )));
    }
    let mut source = KafkaSource::new(spec.clone(), None);
    let started = std::time::Instant::now();
    out.push(
        match tokio::time::timeout(spec.timeout, source.poll()).await {
            Ok(Ok(stats)) => {
                let series = crate::telemetry::snapshot::count(&spec.name).unwrap_or(0);
                Finding::Ok(format!(
                    "one cycle in {:.0} ms: {series} series, {} records read for lag seconds",
                    started.elapsed().as_secs_f64() * 1000.0,
                    stats.rows_read
                ))
            }
            Ok(Err(e)) => Finding::Error(e.to_string()),
            Err(_) => Finding::Error(format!(
                "one cycle did not finish within {:?}",
                spec.timeout
            )),
        },
    );
    out.extend(groups(&source).into_iter().map(Finding::Ok));
    if let Some(line) = shards_line(spec, source.groups.keys()) {
        out.push(Finding::Ok(line));
    }
    out
}

/// How a split source's groups fall into its shards: one line, from the
/// groups this cycle read (all of them: doctor reads every shard).
fn shards_line<'a>(spec: &KafkaSpec, groups: impl Iterator<Item = &'a String>) -> Option<String> {
    let of = match spec.shards {
        Shards::One => return None,
        Shards::Fixed(n) => n,
        Shards::Auto => {
            return Some(
                "shards = \"auto\": the groups are split into one shard per agent present, by a hash of the group id; the cycle above read every group".into(),
            );
        }
    };
    let mut per = vec![0usize; of as usize];
    for g in groups {
        per[shard_of(g, of) as usize] += 1;
    }
    let per: Vec<String> = per.iter().map(usize::to_string).collect();
    Some(format!(
        "shards = {of}: groups per shard {}; each agent present exports some shards (shard 0 also the topic series); the cycle above read every group",
        per.join(", ")
    ))
}

/// Groups listed one per line up to this many, then counted.
const GROUPS_LISTED: usize = 50;

/// One line per group read in the cycle: its protocol, members and (for
/// KIP-848 groups) group epoch; past `GROUPS_LISTED`, a count per protocol.
fn groups(source: &KafkaSource) -> Vec<String> {
    let mut out = Vec::new();
    for (name, (protocol, members, epoch)) in source.groups.iter().take(GROUPS_LISTED) {
        let protocol = match protocol {
            Protocol::Classic => "classic protocol".to_string(),
            Protocol::Consumer => "consumer protocol (KIP-848)".to_string(),
        };
        let members = match members {
            Some(1) => ", 1 member".to_string(),
            Some(n) => format!(", {n} members"),
            None => ", members unknown".to_string(),
        };
        let epoch = epoch
            .map(|e| format!(", group epoch {e}"))
            .unwrap_or_default();
        out.push(format!("group \"{name}\": {protocol}{members}{epoch}"));
    }
    let rest: Vec<Protocol> = source
        .groups
        .values()
        .skip(GROUPS_LISTED)
        .map(|g| g.0)
        .collect();
    if !rest.is_empty() {
        let consumer = rest.iter().filter(|p| **p == Protocol::Consumer).count();
        out.push(format!(
            "and {} more groups: {} classic, {consumer} consumer protocol (KIP-848)",
            rest.len(),
            rest.len() - consumer
        ));
    }
    out
}
