//! Kafka lag at scale: the agent's cycle time and memory as the number of
//! partitions and consumer groups grows, on a tansu broker of its own.
//!
//! For each point (partitions P, groups G): P/100 topics of 100 partitions
//! (fewer for small P), one record per partition, and G groups, group g
//! committing offset 0 on every partition of topic g mod T — so every
//! committed partition has lag 1 and needs one oldest-record read. Then:
//! * a cold cycle: `inboxwatch doctor` runs one full cycle (metadata, high
//!   watermarks, groups, offsets, and every record read) and prints its time;
//! * steady state: `inboxwatch run` polls every 5 s; the mean of its
//!   `inboxwatch_poll_duration_seconds` over the polls after the first, its
//!   peak RSS (VmHWM) and CPU time.
//!
//! Run: `cargo bench --bench kafka_scale [-- 100x10 1000x100 ... [--topic]]`
//! (`--topic`: the source uses `granularity = "topic"`).
//!
//! `-- 10000x3000 --spread 3`: the same cluster read by 3 agents with
//! `shards = "auto"` (docs/kafka.md, "A cluster split over agents"): the time
//! until every group is exported exactly once (checked over the agents'
//! scrapes), each agent's steady cycle, CPU and RSS, then the time until the
//! two left export every group again after SIGTERM of one agent, and after
//! kill -9 of another (up to 90 s each).
//! (needs tansu, as the tests do; runs the optimized binary `cargo bench` builds).

use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

mod common {
    /// A TCP port nothing listens on right now.
    pub fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    }
}

#[path = "../tests/common/kafka.rs"]
mod kafka_support;

use kafka_support::{Broker, now_ms};

#[path = "common/proc.rs"]
mod proc;
use proc::{bin, cpu_ms, first_value, rss, run_agent, scrape};

struct Point {
    partitions: usize,
    groups: usize,
}

struct Row {
    partitions: usize,
    groups: usize,
    committed: usize,
    setup: Duration,
    cold_ms: f64,
    steady_ms: f64,
    polls: f64,
    /// Mean time of a scrape of /metrics in the steady state.
    scrape_ms: f64,
    scrape_every_ms: u64,
    rss_mb: f64,
    hwm_mb: f64,
    cpu_per_cycle_ms: f64,
    /// tansu's CPU time per cycle over the same polls (on the same cores).
    broker_cpu_per_cycle_ms: f64,
    series: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.contains('x'))
        .collect();
    let points: Vec<Point> = if args.is_empty() {
        ["100x10", "1000x100", "5000x500", "10000x1000"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    } else {
        args
    }
    .iter()
    .map(|s| {
        let (p, g) = s.split_once('x').expect("PARTITIONSxGROUPS");
        Point {
            partitions: p.parse().expect("partitions"),
            groups: g.parse().expect("groups"),
        }
    })
    .collect();
    let per_topic = std::env::args().any(|a| a == "--topic");
    let all: Vec<String> = std::env::args().collect();
    if let Some(n) = all
        .iter()
        .position(|a| a == "--spread")
        .and_then(|i| all.get(i + 1))
    {
        let agents: usize = n.parse().expect("--spread AGENTS");
        for p in &points {
            spread(p, agents).await;
        }
        return;
    }
    let mut rows = Vec::new();
    for p in &points {
        let row = run_point(p, per_topic).await;
        eprintln!(
            "{} partitions x {} groups: cold {:.0} ms, steady {:.1} ms, RSS {:.1} MB",
            row.partitions, row.groups, row.cold_ms, row.steady_ms, row.rss_mb
        );
        rows.push(row);
    }
    let mut out = String::new();
    out.push_str("| partitions | groups | committed partitions | cold cycle (all record reads) | steady cycle (mean) | agent CPU per cycle | broker CPU per cycle | scrape of /metrics (mean) | RSS | peak RSS | series | set-up |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} ms | {:.1} ms (over {:.0} polls) | {:.1} ms | {:.0} ms | {:.0} ms (every {} ms) | {:.1} MB | {:.1} MB | {} | {:.0} s |\n",
            r.partitions,
            r.groups,
            r.committed,
            r.cold_ms,
            r.steady_ms,
            r.polls,
            r.cpu_per_cycle_ms,
            r.broker_cpu_per_cycle_ms,
            r.scrape_ms,
            r.scrape_every_ms,
            r.rss_mb,
            r.hwm_mb,
            r.series,
            r.setup.as_secs_f64()
        ));
    }
    println!(
        "granularity = \"{}\"\n\n{out}",
        if per_topic { "topic" } else { "partition" }
    );
}

/// A tansu broker with `p`'s topics, records and commits; the commits made.
async fn cluster(p: &Point) -> (Broker, usize) {
    let broker = Broker::start().await;
    let per_topic = p.partitions.min(100);
    let topics = p.partitions.div_ceil(per_topic);
    let names: Vec<String> = (0..topics).map(|i| format!("t{i:04}")).collect();
    for n in &names {
        broker.create_topic(n, per_topic as i32).await;
    }
    // One record per partition, each its own batch (see the tests' producer).
    let producer = broker.producer();
    for n in &names {
        for part in 0..per_topic {
            producer.send(n, part as i32, now_ms()).await;
        }
    }
    // Commits with the agent's own client: OffsetCommit v2, no generation
    // (a commit outside any group membership, as an admin tool makes it).
    let connector = inboxwatch::sources::kafka::client::Connector::new(
        "bench".into(),
        Default::default(),
        Duration::from_secs(30),
    );
    let mut conn = connector
        .connect(&broker.bootstrap())
        .await
        .expect("connect");
    let mut committed = 0;
    for g in 0..p.groups {
        let topic = &names[g % topics];
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(format!("group-{g:05}"))))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(StrBytes::default())
            .with_retention_time_ms(-1)
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(
                        (0..per_topic)
                            .map(|i| {
                                OffsetCommitRequestPartition::default()
                                    .with_partition_index(i as i32)
                                    .with_committed_offset(0)
                                    .with_committed_metadata(Some(StrBytes::default()))
                            })
                            .collect(),
                    ),
            ]);
        let resp = conn.send_at(&req, 2).await.expect("OffsetCommit");
        for t in resp.topics {
            for part in t.partitions {
                assert_eq!(
                    part.error_code, 0,
                    "commit of {topic}/{}",
                    part.partition_index
                );
                committed += 1;
            }
        }
    }
    (broker, committed)
}

async fn run_point(p: &Point, per_topic_granularity: bool) -> Row {
    let t0 = Instant::now();
    let (broker, committed) = cluster(p).await;
    let setup = t0.elapsed();

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kafka.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "[[sources]]\nname = \"bench\"\nkind = \"kafka\"\nbrokers = [\"{}\"]\npoll_interval = \"5s\"\ntimeout = \"60s\"\nstatus_window = \"1m\"\ngranularity = \"{}\"\n",
        broker.bootstrap(),
        if per_topic_granularity { "topic" } else { "partition" }
    )
    .unwrap();
    drop(f);

    // Cold: one cycle with every record read.
    let out = Command::new(bin())
        .args(["doctor", "--config"])
        .arg(&cfg)
        .output()
        .expect("inboxwatch doctor");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let cold_ms: f64 = text
        .split("one cycle in ")
        .nth(1)
        .and_then(|s| s.split(" ms").next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "doctor said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let series: usize = text
        .split(" ms: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);

    // Steady state: the agent polling every 5 s, scraped every
    // `--scrape-every` ms (default 5000: once a cycle; Prometheus' default
    // is 15 s). Each scrape renders every series: scraped every 500 ms, as
    // up to 2026-12-04, the scrapes took CPU from the cycles they measured.
    let scrape_every = scrape_every();
    let port = common::free_port();
    let mut agent = run_agent(&cfg, port);
    let pid = agent.id();
    let broker_pid = broker.pid().expect("tansu runs");
    let metric = first_value;
    // Skip the first (cold) poll, then average over the next ones.
    let mut base = None;
    let started = Instant::now();
    let (mut sum, mut count) = (0.0, 0.0);
    let mut scrapes: Vec<f64> = Vec::new();
    while started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(scrape_every).await;
        let asked = Instant::now();
        let Some(m) = scrape(port).await else {
            continue;
        };
        if base.is_some() {
            scrapes.push(asked.elapsed().as_secs_f64() * 1000.0);
        }
        let c = metric(
            &m,
            "inboxwatch_poll_duration_seconds_count{source=\"bench\"}",
        );
        let s = metric(&m, "inboxwatch_poll_duration_seconds_sum{source=\"bench\"}");
        match base {
            None if c >= 1.0 => base = Some((s, c, cpu_ms(pid), cpu_ms(broker_pid))),
            Some((s0, c0, _, _)) => {
                sum = s - s0;
                count = c - c0;
                if count >= 4.0 {
                    break;
                }
            }
            None => {}
        }
    }
    let cpu_per_cycle_ms = base
        .map(|(_, _, cpu0, _)| (cpu_ms(pid) - cpu0) / count.max(1.0))
        .unwrap_or(0.0);
    let broker_cpu_per_cycle_ms = base
        .map(|(_, _, _, cpu0)| (cpu_ms(broker_pid) - cpu0) / count.max(1.0))
        .unwrap_or(0.0);
    let (rss_mb, hwm_mb) = rss(pid);
    let _ = agent.kill();
    let _ = agent.wait();
    Row {
        partitions: p.partitions,
        groups: p.groups,
        committed,
        setup,
        cold_ms,
        steady_ms: if count > 0.0 {
            sum / count * 1000.0
        } else {
            f64::NAN
        },
        polls: count,
        scrape_ms: scrapes.iter().sum::<f64>() / scrapes.len().max(1) as f64,
        scrape_every_ms: scrape_every.as_millis() as u64,
        rss_mb,
        hwm_mb,
        cpu_per_cycle_ms,
        broker_cpu_per_cycle_ms,
        series,
    }
}

/// The groups an agent exports (its `kafka_consumer_group_info` series).
fn groups_of(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("kafka_consumer_group_info{"))
        .filter_map(|l| {
            l.split("group=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect()
}

/// Scrapes the live agents until every one of `groups` groups is exported by
/// exactly one of them (up to `within`); the groups per agent, or why not.
async fn exactly_once(
    ports: &[Option<u16>],
    groups: usize,
    within: Duration,
) -> Result<Vec<usize>, String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < within {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut per = Vec::new();
        let mut seen = std::collections::HashMap::<String, usize>::new();
        let mut ok = true;
        for port in ports {
            let Some(port) = port else {
                per.push(0);
                continue;
            };
            let Some(text) = scrape(*port).await else {
                ok = false;
                break;
            };
            let mine = groups_of(&text);
            per.push(mine.len());
            for g in mine {
                *seen.entry(g).or_default() += 1;
            }
        }
        if !ok {
            continue;
        }
        let doubled = seen.values().filter(|&&n| n > 1).count();
        if seen.len() == groups && doubled == 0 {
            return Ok(per);
        }
        last = format!(
            "{} of {groups} groups exported, {doubled} by two agents, per agent {per:?}",
            seen.len()
        );
    }
    Err(last)
}

/// `agents` agents with `shards = "auto"` on one cluster of `p`.
async fn spread(p: &Point, agents: usize) {
    let (broker, committed) = cluster(p).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kafka.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[sources]]\nname = \"bench\"\nkind = \"kafka\"\nbrokers = [\"{}\"]\npoll_interval = \"5s\"\ntimeout = \"60s\"\nstatus_window = \"1m\"\nshards = \"auto\"\n",
            broker.bootstrap()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut procs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..agents {
        let port = common::free_port();
        let child = run_agent(&cfg, port);
        procs.push(child);
        ports.push(Some(port));
    }
    let per = exactly_once(&ports, p.groups, Duration::from_secs(300))
        .await
        .unwrap_or_else(|e| panic!("not spread within 300 s: {e}"));
    let spread_after = started.elapsed();
    // Steady state: each agent's next 4 polls.
    let poll = "inboxwatch_poll_duration_seconds";
    let mut base = Vec::new();
    for (a, port) in ports.iter().enumerate() {
        let text = scrape(port.unwrap()).await.unwrap_or_default();
        base.push((
            first_value(&text, &format!("{poll}_sum{{source=\"bench\"}}")),
            first_value(&text, &format!("{poll}_count{{source=\"bench\"}}")),
            cpu_ms(procs[a].id()),
        ));
    }
    tokio::time::sleep(Duration::from_secs(21)).await;
    let mut out = String::from(
        "| agent | groups | steady cycle (mean) | agent CPU per cycle | RSS | peak RSS |\n|---|---|---|---|---|---|\n",
    );
    for (a, port) in ports.iter().enumerate() {
        let text = scrape(port.unwrap()).await.unwrap_or_default();
        let (s0, c0, cpu0) = base[a];
        let sum = first_value(&text, &format!("{poll}_sum{{source=\"bench\"}}")) - s0;
        let count = first_value(&text, &format!("{poll}_count{{source=\"bench\"}}")) - c0;
        let (rss_mb, hwm_mb) = rss(procs[a].id());
        out.push_str(&format!(
            "| {a} | {} | {:.1} ms (over {count:.0} polls) | {:.1} ms | {rss_mb:.1} MB | {hwm_mb:.1} MB |\n",
            per[a],
            sum / count.max(1.0) * 1000.0,
            (cpu_ms(procs[a].id()) - cpu0) / count.max(1.0),
        ));
    }
    // The agent holding shard 0 (it exports the high watermarks) goes first.
    let mut holder = 0;
    for (a, port) in ports.iter().enumerate() {
        let text = scrape(port.unwrap()).await.unwrap_or_default();
        if text.contains("\nkafka_topic_partition_high_watermark{") {
            holder = a;
        }
    }
    let termed = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &procs[holder].id().to_string()])
        .status();
    ports[holder] = None;
    let after_term = exactly_once(&ports, p.groups, Duration::from_secs(90)).await;
    let term_took = termed.elapsed();
    let _ = procs[holder].wait();
    let mut kill_line = String::from("not tried (fewer than 3 agents)");
    if agents >= 3 {
        let victim = (0..agents).find(|&a| ports[a].is_some()).expect("an agent");
        let killed = Instant::now();
        let _ = procs[victim].kill();
        let _ = procs[victim].wait();
        ports[victim] = None;
        let after_kill = exactly_once(&ports, p.groups, Duration::from_secs(90)).await;
        kill_line = match after_kill {
            Ok(per) => format!(
                "{:.1} s (groups per agent {per:?})",
                killed.elapsed().as_secs_f64()
            ),
            Err(e) => format!("not within 90 s: {e}"),
        };
    }
    for mut c in procs {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!(
        "{} partitions x {} groups ({committed} committed partitions), {agents} agents, shards = \"auto\"\n\nevery group exported exactly once {:.1} s after the agents started (groups per agent {per:?})\n\n{out}\nafter SIGTERM of agent {holder} (shard 0): {}\n\nafter kill -9 of another: {kill_line}\n",
        p.partitions,
        p.groups,
        spread_after.as_secs_f64(),
        match after_term {
            Ok(per) => format!(
                "{:.1} s (groups per agent {per:?})",
                term_took.as_secs_f64()
            ),
            Err(e) => format!("not within 90 s: {e}"),
        }
    );
}

/// `--scrape-every MS` (default 5000).
fn scrape_every() -> Duration {
    let args: Vec<String> = std::env::args().collect();
    let ms = args
        .iter()
        .position(|a| a == "--scrape-every")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--scrape-every MS"))
        .unwrap_or(5000);
    Duration::from_millis(ms)
}
