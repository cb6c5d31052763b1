//! Redis Streams at scale: the agent's poll time and memory on 1,000
//! streams × 5 consumer groups (by default), on a `redis-server` of its
//! own, beside redis_exporter's scrape of the same streams when its binary
//! is installed (Debian's `prometheus-redis-exporter`).
//!
//! Per point (streams S, groups G): S streams `bench:sNNNN` of 100 entries,
//! each with G groups; every group was delivered 60 entries and
//! acknowledged 50, so every group lags (40), holds 10 pending entries and
//! needs every read of a poll (the first undelivered entry, the pending
//! summary, the scan of its pending entries). Then:
//! * a cold poll: `inboxwatch doctor` runs one poll (with the `SCAN`) and
//!   prints its time;
//! * steady state: `inboxwatch run` polls every 5 s; the mean of its
//!   `inboxwatch_poll_duration_seconds` over the polls after the first, its
//!   RSS and peak RSS, CPU per poll, and its series;
//! * redis_exporter (`-check-streams 'bench:*'`): the mean time of 5
//!   scrapes of its `/metrics`, its RSS and its `redis_stream*` series.
//!
//! Run: `cargo bench --bench redis_streams_scale [-- 1000x5 100x5 ...]`
//! (needs `redis-server`; runs the optimized binary `cargo bench` builds).

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/proc.rs"]
mod proc;
use proc::{bin, cpu_ms, first_value, rss, run_agent, scrape};

/// A TCP port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Entries per stream, delivered and acknowledged per group.
const ENTRIES: usize = 100;
const DELIVERED: usize = 60;
const ACKED: usize = 50;

struct Row {
    streams: usize,
    groups: usize,
    setup: Duration,
    cold_ms: f64,
    steady_ms: f64,
    polls: f64,
    cpu_per_poll_ms: f64,
    rss_mb: f64,
    hwm_mb: f64,
    series: usize,
    exporter: Option<Exporter>,
}

struct Exporter {
    scrape_ms: f64,
    rss_mb: f64,
    series: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.contains('x') && !a.starts_with('-'))
        .collect();
    let points = if args.is_empty() {
        vec!["1000x5".to_string()]
    } else {
        args
    };
    let mut rows = Vec::new();
    for p in &points {
        let (s, g) = p.split_once('x').expect("STREAMSxGROUPS");
        let row = run_point(s.parse().expect("streams"), g.parse().expect("groups")).await;
        eprintln!(
            "{} streams x {} groups: cold {:.0} ms, steady {:.1} ms, RSS {:.1} MB",
            row.streams, row.groups, row.cold_ms, row.steady_ms, row.rss_mb
        );
        rows.push(row);
    }
    let mut out = String::from(
        "| streams | groups | cold poll | steady poll (mean) | agent CPU per poll | RSS | peak RSS | series | redis_exporter scrape (mean of 5) | its RSS | its stream series | set-up |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let (scrape, erss, eseries) = match &r.exporter {
            Some(e) => (
                format!("{:.1} ms", e.scrape_ms),
                format!("{:.1} MB", e.rss_mb),
                e.series.to_string(),
            ),
            None => ("not installed".into(), "-".into(), "-".into()),
        };
        out.push_str(&format!(
            "| {} | {} | {:.0} ms | {:.1} ms (over {:.0} polls) | {:.1} ms | {:.1} MB | {:.1} MB | {} | {scrape} | {erss} | {eseries} | {:.0} s |\n",
            r.streams,
            r.groups * r.streams,
            r.cold_ms,
            r.steady_ms,
            r.polls,
            r.cpu_per_poll_ms,
            r.rss_mb,
            r.hwm_mb,
            r.series,
            r.setup.as_secs_f64()
        ));
    }
    println!("{out}");
}

/// A `redis-server` of the bench's own, killed on drop.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let port = free_port();
        let dir = tempfile::tempdir().expect("a temp dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package)");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "redis-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The streams, groups, deliveries and acknowledgements, pipelined per stream.
fn populate(url: &str, streams: usize, groups: usize) {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_connection().expect("connect");
    for s in 0..streams {
        let key = format!("bench:s{s:04}");
        let mut pipe = redis::pipe();
        for _ in 0..ENTRIES {
            pipe.cmd("XADD").arg(&key).arg("*").arg("n").arg(1).ignore();
        }
        for g in 0..groups {
            pipe.cmd("XGROUP")
                .arg("CREATE")
                .arg(&key)
                .arg(format!("g{g}"))
                .arg("0")
                .ignore();
        }
        pipe.query::<()>(&mut conn).expect("the entries and groups");
        let ids: Vec<String> = {
            let reply: redis::Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(ACKED)
                .query(&mut conn)
                .expect("XRANGE");
            match reply {
                redis::Value::Array(entries) => entries
                    .iter()
                    .filter_map(|e| match e {
                        redis::Value::Array(f) => match f.first() {
                            Some(redis::Value::BulkString(b)) => {
                                Some(String::from_utf8_lossy(b).into_owned())
                            }
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        let mut pipe = redis::pipe();
        for g in 0..groups {
            pipe.cmd("XREADGROUP")
                .arg("GROUP")
                .arg(format!("g{g}"))
                .arg("c1")
                .arg("COUNT")
                .arg(DELIVERED)
                .arg("STREAMS")
                .arg(&key)
                .arg(">")
                .ignore();
            pipe.cmd("XACK")
                .arg(&key)
                .arg(format!("g{g}"))
                .arg(&ids)
                .ignore();
        }
        pipe.query::<()>(&mut conn)
            .expect("deliveries and acknowledgements");
    }
}

async fn run_point(streams: usize, groups: usize) -> Row {
    let t0 = Instant::now();
    let server = Server::start();
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    populate(&url, streams, groups);
    let setup = t0.elapsed();

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("redis.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "[[sources]]\nname = \"bench\"\nkind = \"redis_streams\"\nurl = \"{url}\"\ndiscover = \"pattern\"\npattern = \"bench:*\"\npoll_interval = \"5s\"\ntimeout = \"60s\"\nstatus_window = \"1m\"\n"
    )
    .unwrap();
    drop(f);

    let out = Command::new(bin())
        .args(["doctor", "--config"])
        .arg(&cfg)
        .output()
        .expect("inboxwatch doctor");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let cold_ms: f64 = text
        .split("one poll in ")
        .nth(1)
        .and_then(|s| s.split(" ms").next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "doctor said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });

    let port = free_port();
    let mut agent = run_agent(&cfg, port);
    let pid = agent.id();
    let metric = first_value;
    let mut base = None;
    let started = Instant::now();
    let (mut sum, mut count) = (0.0, 0.0);
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(m) = scrape(port).await else {
            continue;
        };
        let c = metric(
            &m,
            "inboxwatch_poll_duration_seconds_count{source=\"bench\"}",
        );
        let s = metric(&m, "inboxwatch_poll_duration_seconds_sum{source=\"bench\"}");
        last = m;
        match base {
            None if c >= 1.0 => base = Some((s, c, cpu_ms(pid))),
            Some((s0, c0, _)) => {
                sum = s - s0;
                count = c - c0;
                if count >= 4.0 {
                    break;
                }
            }
            None => {}
        }
    }
    let cpu_per_poll_ms = base
        .map(|(_, _, cpu0)| (cpu_ms(pid) - cpu0) / count.max(1.0))
        .unwrap_or(0.0);
    let series = last
        .lines()
        .filter(|l| l.starts_with("queue_") && l.contains("source=\"bench\""))
        .count();
    let (rss_mb, hwm_mb) = rss(pid);
    let _ = agent.kill();
    let _ = agent.wait();
    let exporter = exporter(server.port).await;
    Row {
        streams,
        groups,
        setup,
        cold_ms,
        steady_ms: if count > 0.0 {
            sum / count * 1000.0
        } else {
            f64::NAN
        },
        polls: count,
        cpu_per_poll_ms,
        rss_mb,
        hwm_mb,
        series,
        exporter,
    }
}

/// redis_exporter on the same server, if installed: the mean time of 5
/// scrapes (after one to warm up), its RSS, its stream series.
async fn exporter(redis_port: u16) -> Option<Exporter> {
    let port = free_port();
    let mut child = Command::new("prometheus-redis-exporter")
        .args(["-redis.addr", &format!("redis://127.0.0.1:{redis_port}")])
        .args(["-check-streams", "bench:*"])
        .args(["-web.listen-address", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let started = Instant::now();
    let mut body = None;
    while started.elapsed() < Duration::from_secs(30) && body.is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        body = scrape(port).await;
    }
    let mut times = Vec::new();
    let mut last = body.unwrap_or_default();
    for _ in 0..5 {
        let t = Instant::now();
        if let Some(b) = scrape(port).await {
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            last = b;
        }
    }
    let (rss_mb, _) = rss(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let series = last
        .lines()
        .filter(|l| l.starts_with("redis_stream"))
        .count();
    (!times.is_empty()).then(|| Exporter {
        scrape_ms: times.iter().sum::<f64>() / times.len() as f64,
        rss_mb,
        series,
    })
}
