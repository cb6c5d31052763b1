//! A Kafka source split into shards of its consumer groups over the agents of
//! a DaemonSet (issue 34, `shards`): real `inboxwatch` processes on one
//! config, scraped together every 200 ms throughout, the way Prometheus would.
//! Checked on every round: no consumer group and no topic series is exported
//! by two agents. Checked once the spread settles, against the offsets the
//! test committed: every group exported exactly once, with its exact lag; the
//! topic series (high watermarks) by one agent; the shards gauge summing to
//! the shard count. An agent that goes (SIGTERM on tansu; kill -9 on
//! librdkafka's mock cluster, whose coordinator expires a dead member's
//! session, which tansu 0.6.0's does not) and one that comes move the shards.

use crate::common;
use crate::kafka_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::agent::try_scrape;
use common::{Agent, Metrics, READY_TIMEOUT, wait_until};

const LAG: &str = "kafka_consumer_group_lag_messages";
const HWM: &str = "kafka_topic_partition_high_watermark";
const SHARDS: &str = "inboxwatch_kafka_shards";
const GAPS: &str = "inboxwatch_counting_gaps_total";

/// What the scrapes saw: the latest scrape of each agent, and every round in
/// which a group or a topic partition had two exporters.
#[derive(Default)]
struct Seen {
    ports: Vec<Option<u16>>,
    latest: Vec<Option<Metrics>>,
    rounds: usize,
    doubles: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The groups (with the agents exporting a lag of theirs) and the topic
/// partitions (with the agents exporting their high watermark) of `cluster`.
#[allow(clippy::type_complexity)]
fn exporters(
    latest: &[Option<Metrics>],
    cluster: &str,
) -> (
    BTreeMap<String, BTreeSet<usize>>,
    BTreeMap<String, BTreeSet<usize>>,
) {
    let (mut groups, mut partitions) = (BTreeMap::new(), BTreeMap::new());
    for (a, m) in latest.iter().enumerate() {
        let Some(m) = m else { continue };
        for s in m.series(LAG, &[("cluster", cluster)]) {
            let g = s.labels.get("group").cloned().unwrap_or_default();
            groups.entry(g).or_insert_with(BTreeSet::new).insert(a);
        }
        for s in m.series(HWM, &[("cluster", cluster)]) {
            let p = format!(
                "{}/{}",
                s.labels.get("topic").cloned().unwrap_or_default(),
                s.labels.get("partition").cloned().unwrap_or_default()
            );
            partitions.entry(p).or_insert_with(BTreeSet::new).insert(a);
        }
    }
    (groups, partitions)
}

/// Scrapes every live agent at once every 200 ms until `stop`.
fn spawn_sampler(
    seen: Shared,
    cluster: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let ports = lock(&seen).ports.clone();
            let mut set = tokio::task::JoinSet::new();
            for (a, port) in ports.iter().enumerate() {
                if let Some(port) = *port {
                    set.spawn(async move { (a, try_scrape(port).await) });
                }
            }
            let mut round: Vec<Option<Metrics>> = vec![None; ports.len()];
            while let Some(r) = set.join_next().await {
                if let Ok((a, Ok(m))) = r {
                    round[a] = Some(m);
                }
            }
            let mut s = lock(&seen);
            s.rounds += 1;
            let (groups, partitions) = exporters(&round, cluster);
            for (what, by) in groups.iter().chain(partitions.iter()) {
                if by.len() > 1 {
                    let n = s.rounds;
                    s.doubles
                        .push(format!("round {n}: {what} exported by agents {by:?}"));
                }
            }
            s.latest.resize(round.len(), None);
            for (a, m) in round.into_iter().enumerate() {
                if s.ports[a].is_none() {
                    s.latest[a] = None;
                } else if m.is_some() {
                    s.latest[a] = m;
                }
            }
        }
    })
}

/// Waits until every group of `want` (group → lag summed over partitions) is
/// exported by exactly one live agent with that lag, each of `partitions`
/// topic partitions' high watermark by exactly one, and the live agents'
/// shard gauges are `shards` (sorted); returns the agents' groups.
async fn wait_spread(
    seen: &Shared,
    cluster: &str,
    want: &BTreeMap<String, f64>,
    partitions: usize,
    shards: &[f64],
    within: Duration,
) -> BTreeMap<usize, usize> {
    let res = wait_until(within, || async move {
        let s = lock(seen);
        let (groups, hwms) = exporters(&s.latest, cluster);
        let mut per_agent: BTreeMap<usize, usize> = BTreeMap::new();
        for (g, lag) in want {
            let by = groups
                .get(g)
                .ok_or(format!("group {g} exported by nobody"))?;
            let [a] = by.iter().copied().collect::<Vec<_>>()[..] else {
                return Err(format!("group {g} exported by {by:?}"));
            };
            let m = s.latest[a].as_ref().expect("scraped");
            let got = m.sum(LAG, &[("cluster", cluster), ("group", g)]);
            if got != *lag {
                return Err(format!("group {g}: lag {got} at agent {a}, want {lag}"));
            }
            *per_agent.entry(a).or_default() += 1;
        }
        if groups.len() != want.len() {
            return Err(format!("groups exported: {:?}", groups.keys()));
        }
        if hwms.len() != partitions || hwms.values().any(|by| by.len() != 1) {
            return Err(format!("high watermarks by {hwms:?}"));
        }
        let mut gauges: Vec<f64> = s
            .latest
            .iter()
            .flatten()
            .filter_map(|m| m.get(SHARDS, &[("source", cluster)]))
            .collect();
        gauges.sort_by(f64::total_cmp);
        if gauges != shards {
            return Err(format!("shard gauges {gauges:?}, want {shards:?}"));
        }
        Ok(per_agent)
    })
    .await;
    res.unwrap_or_else(|e| {
        let s = lock(seen);
        panic!(
            "not spread within {within:?}: {e}\n  doubles so far: {:?}",
            s.doubles
        )
    })
}

/// Agents on one config file in one directory, started one by one.
struct Agents {
    // Dropped before `dir`: their drop reads their output files from it.
    agents: Vec<Agent>,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Agents {
    fn new(toml: &str) -> Agents {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("inboxwatch.toml");
        std::fs::write(&config, toml).expect("write the config");
        Agents {
            dir,
            config,
            agents: Vec::new(),
        }
    }

    fn add(&mut self, seen: &Shared) -> usize {
        let i = self.agents.len();
        let agent = Agent::run_file(&self.config)
            .dir(self.dir.path())
            .name(&format!("agent{i}"))
            .env(
                "RUST_LOG",
                "info,inboxwatch::sources::kafka::election=debug",
            )
            .start();
        let mut s = lock(seen);
        s.ports.push(Some(agent.port));
        s.latest.push(None);
        drop(s);
        self.agents.push(agent);
        i
    }

    /// The live agent that exports the topic series (holds shard 0).
    fn topic_holder(&self, seen: &Shared, cluster: &str) -> usize {
        let s = lock(seen);
        let (_, hwms) = exporters(&s.latest, cluster);
        *hwms
            .values()
            .next()
            .and_then(|by| by.iter().next())
            .expect("an agent exports the topic series")
    }
}

/// Lag per group as committed below: group i at (i mod 6) on partition 0 and
/// (i div 6 mod 6) on partition 1 of a topic with 6 records in each.
fn committed(i: usize) -> (i64, i64) {
    ((i % 6) as i64, ((i / 6) % 6) as i64)
}

/// tansu: three agents with `shards = "auto"` share 24 groups, one shard each;
/// SIGTERM the agent with shard 0 → the two left share them (the topic
/// series move too); a new agent → three again. No group or partition ever
/// has two exporters; every handover is counted as a counting gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_agents_split_a_clusters_groups_and_move_them_when_agents_come_and_go() {
    const SOURCE: &str = "split";
    const GROUPS: usize = 24;
    let broker = kafka_support::Broker::start().await;
    let topic = common::unique_name("shards", "t");
    broker.create_topic(&topic, 2).await;
    let producer = broker.producer();
    for p in 0..2 {
        for _ in 0..6 {
            producer.send(&topic, p, kafka_support::now_ms()).await;
        }
    }
    let mut want = BTreeMap::new();
    for i in 0..GROUPS {
        let g = format!("g-{i:02}");
        let (c0, c1) = committed(i);
        let c = broker.committer(&g);
        c.commit(&topic, 0, c0);
        c.commit(&topic, 1, c1);
        want.insert(g, ((6 - c0) + (6 - c1)) as f64);
    }
    let config = kafka_support::kafka_source_toml(
        SOURCE,
        &broker.bootstrap(),
        &format!("shards = \"auto\"\ntopics = {{ include = [\"{topic}\"] }}\n"),
    );
    let seen: Shared = Arc::default();
    let mut agents = Agents::new(&config);
    for _ in 0..3 {
        agents.add(&seen);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(seen.clone(), SOURCE, stop.clone());
    let settled = |shards: &'static [f64]| {
        wait_spread(&seen, SOURCE, &want, 2, shards, Duration::from_secs(60))
    };
    for a in &agents.agents {
        a.wait_ready(READY_TIMEOUT).await;
    }
    let t = Instant::now();
    let spread = settled(&[1.0, 1.0, 1.0]).await;
    eprintln!(
        "three agents: groups per agent {spread:?}, {:?} after ready",
        t.elapsed()
    );
    assert_eq!(
        spread.len(),
        3,
        "every agent carries some of 24 groups: {spread:?}"
    );

    let first = agents.topic_holder(&seen, SOURCE);
    let termed = agents.agents[first].sigterm();
    lock(&seen).ports[first] = None;
    let spread = settled(&[1.0, 1.0]).await;
    eprintln!(
        "after SIGTERM of agent {first}: groups per agent {spread:?}, {:?} later",
        termed.elapsed()
    );
    assert!(!spread.contains_key(&first));
    let exit = agents.agents[first].wait_exit(Duration::from_secs(25));
    assert!(
        exit.is_some_and(|e| e.success()),
        "agent {first} exited: {exit:?}"
    );

    let joined = Instant::now();
    let new = agents.add(&seen);
    agents.agents[new].wait_ready(READY_TIMEOUT).await;
    let spread = settled(&[1.0, 1.0, 1.0]).await;
    eprintln!(
        "agent {new} joined: groups per agent {spread:?}, {:?} later",
        joined.elapsed()
    );
    assert!(
        spread.contains_key(&new),
        "the new agent carries groups: {spread:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    sampler.await.expect("sampler");

    let s = lock(&seen);
    assert!(s.rounds > 50, "{} scrape rounds", s.rounds);
    assert!(
        s.doubles.is_empty(),
        "exported by two agents at once:\n  {}",
        s.doubles.join("\n  ")
    );
    // Every agent that stayed through a rebalance counted its handovers.
    for (a, m) in s.latest.iter().enumerate() {
        let Some(m) = m else { continue };
        let gaps = m.get(GAPS, &[("source", SOURCE), ("reason", "handover")]);
        if a != new {
            assert!(
                gaps.is_some_and(|g| g >= 2.0),
                "agent {a} went through two rebalances, counted {gaps:?}"
            );
        }
    }
}

/// librdkafka's mock cluster, whose coordinator drops a member whose session
/// ended: `shards = 4` over two agents (two each); kill -9 the one holding
/// shard 0 → after the session timeout the other holds all four and exports
/// every group; the time is reported. The mock has no ListGroups: the groups
/// are named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_agents_shards_move_to_the_others_after_its_session_ends() {
    const SOURCE: &str = "split-mock";
    const GROUPS: usize = 12;
    const TOPIC: &str = "orders";
    let mock = rdkafka::mocking::MockCluster::new(1).expect("librdkafka's mock cluster");
    mock.create_topic(TOPIC, 2, 1).expect("topic");
    let bootstrap = mock.bootstrap_servers();
    let producer = kafka_support::producer_for(&bootstrap);
    for p in 0..2 {
        for _ in 0..6 {
            producer.send(TOPIC, p, kafka_support::now_ms()).await;
        }
    }
    let mut want = BTreeMap::new();
    let mut names = Vec::new();
    for i in 0..GROUPS {
        let g = format!("m-{i:02}");
        let (c0, c1) = committed(i);
        let c = kafka_support::committer_for(&bootstrap, &g);
        c.commit(TOPIC, 0, c0);
        c.commit(TOPIC, 1, c1);
        want.insert(g.clone(), ((6 - c0) + (6 - c1)) as f64);
        names.push(format!("\"{g}\""));
    }
    let config = kafka_support::kafka_source_toml(
        SOURCE,
        &bootstrap,
        &format!(
            "shards = 4\ngroups = {{ include = [{}] }}\ntopics = {{ include = [\"{TOPIC}\"] }}\n",
            names.join(", ")
        ),
    );
    let seen: Shared = Arc::default();
    let mut agents = Agents::new(&config);
    agents.add(&seen);
    agents.add(&seen);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(seen.clone(), SOURCE, stop.clone());
    for a in &agents.agents {
        a.wait_ready(READY_TIMEOUT).await;
    }
    wait_spread(
        &seen,
        SOURCE,
        &want,
        2,
        &[2.0, 2.0],
        Duration::from_secs(60),
    )
    .await;
    let first = agents.topic_holder(&seen, SOURCE);
    let killed = agents.agents[first].sigkill();
    lock(&seen).ports[first] = None;
    let spread = wait_spread(&seen, SOURCE, &want, 2, &[4.0], Duration::from_secs(60)).await;
    eprintln!(
        "MEASURED: after kill -9 of agent {first}, agent {:?} exports all {GROUPS} groups {:?} later",
        spread.keys(),
        killed.elapsed()
    );
    stop.store(true, Ordering::SeqCst);
    sampler.await.expect("sampler");
    let s = lock(&seen);
    assert!(
        s.doubles.is_empty(),
        "exported by two agents at once:\n  {}",
        s.doubles.join("\n  ")
    );
}

/// `shards` is 1 to 256 or "auto"; anything else is a config error naming
/// the key and what was written.
#[test]
fn shards_out_of_range_or_misspelled_are_config_errors_naming_the_key() {
    let base = "[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"127.0.0.1:9092\"]\n";
    let check = |extra: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, format!("{base}{extra}\n")).unwrap();
        let out = common::Cmd::new(["check-config"]).arg(&path).output();
        (out.code.unwrap_or(-1), out.stderr + &out.stdout)
    };
    for (bad, said) in [
        ("shards = 0", "got 0"),
        ("shards = 257", "got 257"),
        ("shards = \"automatic\"", "got \"automatic\""),
    ] {
        let (code, out) = check(bad);
        assert_eq!(code, 2, "{bad}: {out}");
        assert!(out.contains("sources[0].shards"), "{bad}: {out}");
        assert!(out.contains(said), "{bad}: {out}");
    }
    for good in ["shards = 1", "shards = 256", "shards = \"auto\""] {
        let (code, out) = check(good);
        assert_eq!(code, 0, "{good}: {out}");
    }
}
