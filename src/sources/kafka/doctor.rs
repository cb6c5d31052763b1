//! `doctor`'s checks of a Kafka source: the API versions the first
//! reachable broker offers, and one full cycle as the agent would run it.

use super::KafkaSource;
use super::client;
use super::config::KafkaSpec;
use crate::sources::kind::Finding;
use crate::sources::run::Source as _;

/// The negotiated API versions of the first reachable broker, then one full
/// cycle of the Kafka source, as the agent would run it.
pub(crate) async fn check(spec: &KafkaSpec) -> Vec<Finding> {
    use kafka_protocol::messages::{
        DescribeGroupsRequest, FetchRequest, ListGroupsRequest, ListOffsetsRequest,
        MetadataRequest, OffsetFetchRequest,
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
        "{}: Metadata {}, ListOffsets {}, ListGroups {}, DescribeGroups {}, OffsetFetch {}, Fetch {}",
        c.addr(),
        v(c.version::<MetadataRequest>()),
        v(c.version::<ListOffsetsRequest>()),
        v(c.version::<ListGroupsRequest>()),
        v(c.version::<DescribeGroupsRequest>()),
        v(c.version::<OffsetFetchRequest>()),
        v(c.version::<FetchRequest>()),
    )));
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
    let mut source = KafkaSource::new(spec.clone());
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
    out
}
