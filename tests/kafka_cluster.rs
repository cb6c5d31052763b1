//! The Kafka source on a cluster of several brokers that changes under it
//! (issue 15), against librdkafka's mock cluster (rdkafka's `mocking`: three
//! brokers in this process, on real TCP ports): partition leaders moved, the
//! group coordinator moved, request errors injected, a broker taken down and
//! brought back. Every check is exact against the records the test produced
//! (with known timestamps) and the offsets it committed.
//!
//! The mock has no ListGroups (nor DescribeGroups): the source watches the
//! group named in `groups.include`, as on any cluster without ListGroups.
//! Its error injection is per API, for whichever client sends the next such
//! request; the test's own clients send no ListOffsets and no OffsetFetch.

use crate::common;
use crate::kafka_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Agent, Metrics, READY_TIMEOUT, wait_until};
use kafka_support::{Committer, Producer, committer_for, now_ms, producer_for};
use rdkafka::mocking::{MockCluster, MockCoordinator};
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const SOURCE: &str = "kc";
const GROUP: &str = "billing";
const TOPIC: &str = "orders";
const LAG: &str = "kafka_consumer_group_lag_messages";
const LAG_S: &str = "kafka_consumer_group_lag_seconds";
const STATUS: &str = "kafka_consumer_group_status";
const UNAVAILABLE: &str = "inboxwatch_kafka_partitions_unavailable";
const RETRIES: &str = "inboxwatch_kafka_retries_total";
const UP: &str = "inboxwatch_source_up";
const POLLS: &str = "inboxwatch_poll_duration_seconds_count";

/// The mock cluster, the topic's records and the group's commits.
struct Cluster {
    mock: MockCluster<'static, DefaultProducerContext>,
    producer: Producer,
    committer: Committer,
    /// Timestamp (ms) of each record, by partition, at its offset.
    records: BTreeMap<i32, Vec<i64>>,
    /// The group's committed offset per partition.
    committed: BTreeMap<i32, i64>,
    /// When the cluster was set up (ms): the agent, started after, reads its
    /// clock for lag seconds later than this.
    since: i64,
}

impl Cluster {
    /// Three brokers; `orders` with one partition per entry of `leaders`
    /// (its leader's broker id), `records[p]` records on partition p, and
    /// `GROUP` committed at `commits[p]`, coordinated by broker `coordinator`;
    /// the agent's election group by broker `election` (the mock's
    /// FindCoordinator names a broker that is down, where Kafka would move the
    /// group, so each test keeps that one up).
    async fn start(
        leaders: &[i32],
        records: &[i64],
        commits: &[i64],
        coordinator: i32,
        election_broker: i32,
    ) -> Cluster {
        let mock = MockCluster::new(3).expect("librdkafka's mock cluster");
        mock.create_topic(TOPIC, leaders.len() as i32, 3)
            .expect("create the topic");
        for (p, &leader) in leaders.iter().enumerate() {
            mock.partition_leader(TOPIC, p as i32, Some(leader))
                .expect("set the leader");
        }
        mock.coordinator(MockCoordinator::Group(GROUP.into()), coordinator)
            .expect("set the coordinator");
        let election = format!("inboxwatch-election.{SOURCE}");
        mock.coordinator(MockCoordinator::Group(election), election_broker)
            .expect("set the election's coordinator");
        let bootstrap = mock.bootstrap_servers();
        let mut cluster = Cluster {
            producer: producer_for(&bootstrap),
            committer: committer_for(&bootstrap, GROUP),
            mock,
            records: BTreeMap::new(),
            committed: BTreeMap::new(),
            since: 0,
        };
        for (p, &n) in records.iter().enumerate() {
            cluster.produce(p as i32, n).await;
        }
        for (p, &offset) in commits.iter().enumerate() {
            cluster.commit(p as i32, offset);
        }
        cluster.since = now_ms();
        cluster
    }

    /// Produces `n` records on partition `p`, 3 s apart, ending 60 s ago.
    async fn produce(&mut self, p: i32, n: i64) {
        let base = now_ms() - 60_000 - n * 3_000;
        for i in 0..n {
            let ts = base + i * 3_000;
            let offset = self.producer.send(TOPIC, p, ts).await;
            let log = self.records.entry(p).or_default();
            assert_eq!(offset, log.len() as i64, "offsets are dense");
            log.push(ts);
        }
    }

    fn commit(&mut self, p: i32, offset: i64) {
        self.committer.commit(TOPIC, p, offset);
        self.committed.insert(p, offset);
    }

    /// `[[sources]]` watching `GROUP` by name on all three brokers.
    fn config(&self) -> String {
        let brokers: Vec<String> = self
            .mock
            .bootstrap_servers()
            .split(',')
            .map(|b| format!("{b:?}"))
            .collect();
        format!(
            "[[sources]]\nname = \"{SOURCE}\"\nkind = \"kafka\"\nbrokers = [{}]\n\
             poll_interval = \"500ms\"\ntimeout = \"5s\"\nstatus_window = \"30s\"\n\
             groups = {{ include = [\"{GROUP}\"] }}\n",
            brokers.join(", ")
        )
    }

    /// Differences between the scrape and the truth: lag in messages and
    /// seconds of every committed partition not in `away`, no lag series for
    /// those in `away`, and `away.len()` partitions unavailable.
    fn diff(&self, m: &Metrics, away: &[i32]) -> Result<(), String> {
        let mut problems = Vec::new();
        let now = now_ms();
        for (&p, &committed) in &self.committed {
            let part = p.to_string();
            let labels = [
                ("cluster", SOURCE),
                ("group", GROUP),
                ("topic", TOPIC),
                ("partition", part.as_str()),
            ];
            let lag = m.get(LAG, &labels);
            if away.contains(&p) {
                if lag.is_some() || m.get(LAG_S, &labels).is_some() {
                    problems.push(format!("p{p} is unavailable but has lag series"));
                }
                continue;
            }
            let log = &self.records[&p];
            let want = log.len() as i64 - committed;
            if lag != Some(want as f64) {
                problems.push(format!("p{p}: lag {lag:?}, want {want}"));
            }
            // The age of the record at the committed offset, as the agent saw it
            // at some cycle between its start and this scrape.
            let (low, high) = if want == 0 {
                (0.0, 0.0)
            } else {
                let ts = log[committed as usize];
                (
                    (self.since - ts) as f64 / 1000.0,
                    (now - ts) as f64 / 1000.0,
                )
            };
            match m.get(LAG_S, &labels) {
                Some(s) if (low..=high).contains(&s) => {}
                s => problems.push(format!(
                    "p{p}: lag seconds {s:?}, want between {low} and {high}"
                )),
            }
        }
        let unavailable = m.get(UNAVAILABLE, &[("source", SOURCE)]);
        if unavailable != Some(away.len() as f64) {
            problems.push(format!(
                "{UNAVAILABLE} {unavailable:?}, want {}",
                away.len()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

fn status(m: &Metrics) -> Option<String> {
    m.series(STATUS, &[("cluster", SOURCE), ("group", GROUP)])
        .find(|s| s.value == 1.0)
        .map(|s| s.labels["status"].clone())
}

fn retries(m: &Metrics, reason: &str) -> f64 {
    m.sum(RETRIES, &[("source", SOURCE), ("reason", reason)])
}

fn polls(m: &Metrics) -> f64 {
    m.get(POLLS, &[("source", SOURCE)]).unwrap_or(0.0)
}

/// One scrape: the source's `up`, the group's status.
type Seen = (Option<f64>, Option<String>);

/// Scrapes every 100 ms and keeps what each scrape said of the source being
/// up and the group's status.
struct Watch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(agent: &Agent) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let port = agent.port;
        let task = {
            let (stop, seen) = (stop.clone(), seen.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(m) = common::agent::try_scrape(port).await {
                        let up = m.get(UP, &[("source", SOURCE)]);
                        seen.lock().unwrap().push((up, status(&m)));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Watch { stop, seen, task }
    }

    /// Stops; returns how many scrapes there were, how many had the source
    /// down, and the statuses seen.
    async fn finish(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the watch panicked");
        let seen = self.seen.lock().unwrap();
        let down = seen.iter().filter(|(up, _)| *up == Some(0.0)).count();
        let mut statuses: Vec<String> = seen.iter().filter_map(|(_, s)| s.clone()).collect();
        statuses.dedup();
        (seen.len(), down, statuses)
    }
}

/// Waits until the agent has finished `n` more polls than it had at `m`,
/// then returns a scrape (the last of those polls complete).
async fn after_polls(agent: &Agent, m: &Metrics, n: f64) -> Metrics {
    let from = polls(m);
    wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        let done = polls(&m) - from;
        (done >= n)
            .then_some(m)
            .ok_or_else(|| format!("{done} polls since"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()))
}

async fn exact(agent: &Agent, cluster: &Cluster, away: &[i32]) -> Metrics {
    wait_until(Duration::from_secs(20), || async {
        let m = agent.try_scrape().await?;
        cluster.diff(&m, away)?;
        Ok(m)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()))
}

/// Guards leader changes (issue 15): partition leaders moved between two
/// cycles, with records produced to the new leader and a new commit → the
/// second cycle after the change is exact (lag, lag seconds, nothing
/// unavailable); then NOT_LEADER_OR_FOLLOWER injected on the next
/// ListOffsets → the one partition that request carried is asked again
/// after fresh metadata within the cycle (`retries_total{reason="leader"}`
/// +1), nothing is unavailable, lag stays exact and the group never shows
/// `error` nor the source down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moved_leaders_keep_lag_exact_and_a_not_leader_answer_is_retried() {
    let mut cluster = Cluster::start(&[1, 2, 3], &[10, 8, 6], &[4, 8, 1], 1, 3).await;
    let agent = Agent::start(&cluster.config());
    agent.wait_ready(READY_TIMEOUT).await;
    let watch = Watch::start(&agent);
    exact(&agent, &cluster, &[]).await;

    // p0: 1 → 2, p2: 3 → 1; new records on p0 at its new leader, a new commit.
    cluster.mock.partition_leader(TOPIC, 0, Some(2)).unwrap();
    cluster.mock.partition_leader(TOPIC, 2, Some(1)).unwrap();
    cluster.produce(0, 2).await;
    cluster.commit(0, 5);
    let m = agent.scrape().await;
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[])
        .unwrap_or_else(|e| panic!("two polls after the move: {e}\n{}", agent.stderr()));

    // Leaders now: broker 1 leads p2 alone and is asked first.
    let before = retries(&m, "leader");
    cluster.mock.request_errors(
        RDKafkaApiKey::ListOffsets,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION],
    );
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[])
        .unwrap_or_else(|e| panic!("after NOT_LEADER_OR_FOLLOWER: {e}\n{}", agent.stderr()));
    assert_eq!(retries(&m, "leader") - before, 1.0, "one partition retried");
    assert_eq!(retries(&m, "coordinator"), 0.0);

    let (scrapes, down, statuses) = watch.finish().await;
    assert!(scrapes > 10, "{scrapes} scrapes");
    assert_eq!(down, 0, "the source was down in {down} scrapes");
    assert!(
        !statuses.iter().any(|s| s == "error"),
        "statuses seen: {statuses:?}"
    );
}

/// Guards coordinator changes (issue 15): NOT_COORDINATOR injected on the next
/// OffsetFetch → the group is asked again after a fresh FindCoordinator within
/// the cycle (`retries_total{reason="coordinator"}` exactly +1), its status
/// never `error`; then the coordinator moved to broker 2 and broker 1 (the old
/// coordinator, the first bootstrap broker, leader of p0) taken down → the
/// group is read from its new coordinator, p0 is unavailable (1), p1 and p2
/// exact, the source up throughout and the status never `error`; broker 1
/// back → all exact, nothing unavailable. Last, NOT_COORDINATOR twice → the
/// retry fails too and that cycle's status is `error` (only what still fails
/// after the retry is), the next cycle ok again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_that_moved_or_refuses_is_asked_again_within_the_cycle() {
    let mut cluster = Cluster::start(&[1, 2, 3], &[10, 8, 6], &[4, 8, 1], 1, 3).await;
    let agent = Agent::start(&cluster.config());
    agent.wait_ready(READY_TIMEOUT).await;
    let watch = Watch::start(&agent);
    let m = exact(&agent, &cluster, &[]).await;

    let before = retries(&m, "coordinator");
    cluster.mock.request_errors(
        RDKafkaApiKey::OffsetFetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR],
    );
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[])
        .unwrap_or_else(|e| panic!("after NOT_COORDINATOR: {e}\n{}", agent.stderr()));
    assert_eq!(retries(&m, "coordinator") - before, 1.0);

    cluster
        .mock
        .coordinator(MockCoordinator::Group(GROUP.into()), 2)
        .unwrap();
    cluster.mock.broker_down(1).unwrap();
    cluster.commit(2, 3);
    exact(&agent, &cluster, &[0]).await;
    let m = agent.scrape().await;
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[0])
        .unwrap_or_else(|e| panic!("with broker 1 down: {e}\n{}", agent.stderr()));
    assert_eq!(status(&m).as_deref(), Some("ok"));

    cluster.mock.broker_up(1).unwrap();
    exact(&agent, &cluster, &[]).await;
    let (scrapes, down, statuses) = watch.finish().await;
    assert!(scrapes > 10, "{scrapes} scrapes");
    assert_eq!(down, 0, "the source was down in {down} scrapes");
    assert!(
        !statuses.iter().any(|s| s == "error"),
        "statuses seen: {statuses:?}"
    );

    // Twice: the retry fails too.
    let watch = Watch::start(&agent);
    let m = agent.scrape().await;
    let before = retries(&m, "coordinator");
    cluster.mock.request_errors(
        RDKafkaApiKey::OffsetFetch,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        ],
    );
    let m = after_polls(&agent, &m, 3.0).await;
    cluster.diff(&m, &[]).unwrap();
    assert_eq!(retries(&m, "coordinator") - before, 1.0);
    let (_, down, statuses) = watch.finish().await;
    assert_eq!(down, 0);
    assert!(
        statuses.iter().any(|s| s == "error"),
        "the cycle whose retry failed shows error: {statuses:?}"
    );
    assert_eq!(statuses.last().map(String::as_str), Some("ok"));
}

/// Guards broker loss (issue 15): broker 3, leader of p2 and p3, down → exactly
/// 2 partitions unavailable with no lag series, p0 and p1 exact (a commit on
/// p0 during the outage included), the source up and the group's status never
/// `error` throughout; broker 3 back, with records produced to p2 and a commit
/// → the next cycles are exact again with nothing unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_down_makes_its_partitions_unavailable_and_the_rest_stays_exact() {
    let mut cluster = Cluster::start(&[1, 2, 3, 3], &[10, 8, 6, 5], &[4, 8, 1, 2], 2, 1).await;
    let agent = Agent::start(&cluster.config());
    agent.wait_ready(READY_TIMEOUT).await;
    let watch = Watch::start(&agent);
    exact(&agent, &cluster, &[]).await;

    cluster.mock.broker_down(3).unwrap();
    cluster.commit(0, 7);
    exact(&agent, &cluster, &[2, 3]).await;
    let m = agent.scrape().await;
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[2, 3])
        .unwrap_or_else(|e| panic!("with broker 3 down: {e}\n{}", agent.stderr()));

    cluster.mock.broker_up(3).unwrap();
    // A new producer: the first one waits out its reconnect backoff.
    cluster.producer = producer_for(&cluster.mock.bootstrap_servers());
    cluster.produce(2, 3).await;
    cluster.commit(2, 4);
    exact(&agent, &cluster, &[]).await;
    let m = agent.scrape().await;
    let m = after_polls(&agent, &m, 2.0).await;
    cluster
        .diff(&m, &[])
        .unwrap_or_else(|e| panic!("after broker 3 is back: {e}\n{}", agent.stderr()));

    let (scrapes, down, statuses) = watch.finish().await;
    assert!(scrapes > 10, "{scrapes} scrapes");
    assert_eq!(down, 0, "the source was down in {down} scrapes");
    assert!(
        !statuses.iter().any(|s| s == "error"),
        "statuses seen: {statuses:?}"
    );
}

/// Guards lag seconds on record batches as real producers write them (issue 18):
/// records produced with lz4 (p0) and snappy (p1) compression, many to a batch
/// (all enqueued before any is awaited, `linger.ms` 200), committed in the middle
/// of a batch: the lag is exact and the lag seconds are the age of exactly the
/// record at the committed offset — not of the batch's first or last record.
/// tansu 0.6.0 miscounts watermarks for such batches; librdkafka's mock keeps
/// them as produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compressed_multi_record_batches_give_exact_lag_and_record_ages() {
    let mut cluster = Cluster::start(&[1, 2], &[0, 0], &[], 1, 3).await;
    let bootstrap = cluster.mock.bootstrap_servers();
    for (p, codec) in [(0, "lz4"), (1, "snappy")] {
        let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("broker.address.family", "v4")
            .set("linger.ms", "200")
            .set("batch.num.messages", "1000")
            .set("compression.type", codec)
            .set("acks", "all")
            .create()
            .unwrap_or_else(|e| panic!("a {codec} producer: {e}"));
        // 60 records, 30 s apart (far more than the agent's start takes, so
        // that only the committed record's age fits between the bounds `diff`
        // checks), ending two minutes ago; every one enqueued before the first
        // delivery is awaited, so that they share batches.
        let base = now_ms() - 120_000 - 60 * 30_000;
        let stamps: Vec<i64> = (0..60).map(|i| base + i * 30_000).collect();
        let mut pending = Vec::new();
        for &ts in &stamps {
            let payload = format!("record at {ts} ({codec})");
            let rec = rdkafka::producer::FutureRecord::<(), _>::to(TOPIC)
                .partition(p)
                .payload(&payload)
                .timestamp(ts);
            pending.push(
                producer
                    .send_result(rec)
                    .unwrap_or_else(|(e, _)| panic!("enqueue on p{p}: {e}")),
            );
        }
        let mut offsets = Vec::new();
        for d in pending {
            let d = d
                .await
                .expect("delivery report")
                .unwrap_or_else(|(e, _)| panic!("produce on p{p}: {e}"));
            offsets.push(d.offset);
        }
        assert_eq!(
            offsets,
            (0..60).collect::<Vec<i64>>(),
            "p{p}: dense offsets in the order enqueued"
        );
        cluster.records.insert(p, stamps);
    }
    // Mid-batch commits: 23 of 60 on p0, 41 of 60 on p1.
    cluster.commit(0, 23);
    cluster.commit(1, 41);
    cluster.since = now_ms();
    let agent = Agent::start(&cluster.config());
    agent.wait_ready(READY_TIMEOUT).await;
    // `exact` holds the lag, and the age of exactly the committed record (its
    // neighbours are 30 s older or younger) between its two bounds.
    exact(&agent, &cluster, &[]).await;
}
