//! NATS JetStream at scale: the agent's poll time and memory for many
//! streams and durable consumers, on a `nats-server -js` of its own.
//!
//! For each point (streams S, consumers C per stream, messages M per
//! stream): S streams of M messages, each with C durable pull consumers;
//! consumer j has been delivered 2j messages and acknowledged j of them, so
//! every consumer has pending messages (one read for the next undelivered
//! message's time) and all but the first unacknowledged ones (one read for
//! the oldest's time). Then:
//! * a cold poll: `inboxwatch doctor` runs one full poll (every time read)
//!   and prints its time;
//! * steady state: `inboxwatch run` polls every 5 s; the mean of its
//!   `inboxwatch_poll_duration_seconds` over the polls after the first (the
//!   times are cached then), its peak RSS (VmHWM) and CPU time per poll.
//!
//! Run: `cargo bench --bench nats_scale [-- 1000x5x10 1000x5x200 ...]`
//! (needs `nats-server` on the PATH; the numbers of docs/performance-brokers.md).

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::Client;
use futures_util::StreamExt;
use serde_json::json;

#[path = "common/proc.rs"]
mod proc;
use proc::{bin, cpu_ms, rss, run_agent, scrape};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Point {
    streams: usize,
    consumers: usize,
    messages: usize,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let points: Vec<Point> = if args.is_empty() {
        vec!["1000x5x10".into(), "1000x5x200".into()]
    } else {
        args
    }
    .iter()
    .map(|a| {
        let n: Vec<usize> = a.split('x').map(|p| p.parse().expect("SxCxM")).collect();
        Point {
            streams: n[0],
            consumers: n[1],
            messages: n[2],
        }
    })
    .collect();
    let mut out = String::from(
        "| streams | consumers | messages per stream | cold poll (all time reads) | steady poll (mean) | agent CPU per poll | RSS | peak RSS | series | set-up |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in &points {
        let row = run_point(p).await;
        println!("{row}");
        out.push_str(&row);
        out.push('\n');
    }
    println!("\n{out}");
}

/// One JetStream API request.
async fn api(client: &Client, subject: String, body: serde_json::Value) {
    let reply = client
        .request(subject.clone(), body.to_string().into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert!(v.get("error").is_none(), "{subject}: {v}");
}

async fn run_point(p: &Point) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = free_port();
    let mut server = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.path().join("store"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server on the PATH");
    let url = format!("nats://127.0.0.1:{port}");
    let client = loop {
        match async_nats::connect(&url).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let setup = Instant::now();
    for s in 0..p.streams {
        let name = format!("S{s}");
        api(
            &client,
            format!("$JS.API.STREAM.CREATE.{name}"),
            json!({"name": name, "subjects": [format!("s{s}.>")], "storage": "file"}),
        )
        .await;
        for _ in 0..p.messages {
            client
                .publish(format!("s{s}.m"), "m".into())
                .await
                .expect("publish");
        }
        for c in 0..p.consumers {
            let consumer = format!("C{c}");
            api(
                &client,
                format!("$JS.API.CONSUMER.DURABLE.CREATE.{name}.{consumer}"),
                json!({"stream_name": name, "config": {"durable_name": consumer, "ack_policy": "explicit", "ack_wait": 3_600_000_000_000u64}}),
            )
            .await;
            let take = (2 * c).min(p.messages);
            if take == 0 {
                continue;
            }
            let inbox = client.new_inbox();
            let mut sub = client.subscribe(inbox.clone()).await.expect("subscribe");
            client
                .publish_with_reply(
                    format!("$JS.API.CONSUMER.MSG.NEXT.{name}.{consumer}"),
                    inbox,
                    json!({"batch": take, "no_wait": true}).to_string().into(),
                )
                .await
                .expect("pull");
            let mut got = 0;
            while got < take {
                let m = sub.next().await.expect("a message");
                let Some(reply) = m.reply else { break };
                if got < c {
                    client.publish(reply, "+ACK".into()).await.expect("ack");
                }
                got += 1;
            }
        }
    }
    client.flush().await.expect("flush");
    let setup_s = setup.elapsed().as_secs_f64();

    let config_dir = tempfile::tempdir().expect("a temp dir");
    let config = config_dir.path().join("nats.toml");
    std::fs::write(
        &config,
        format!(
            "[[sources]]\nname = \"scale\"\nkind = \"nats\"\nurl = \"{url}\"\npoll_interval = \"5s\"\ntimeout = \"60s\"\n"
        ),
    )
    .expect("write the config");
    let doctor = Command::new(bin())
        .args(["doctor", "--config"])
        .arg(&config)
        .output()
        .expect("doctor");
    let text = String::from_utf8_lossy(&doctor.stdout).to_string();
    let cold_ms: f64 = text
        .split("one poll in ")
        .nth(1)
        .and_then(|t| t.split(" ms").next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no poll time in doctor's output: {text}"));

    let listen = free_port();
    let mut agent = run_agent(&config, listen);
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // The first poll, then four more.
    let (mut first_sum, mut first_count, mut first_cpu) = (0.0, 0.0, 0.0);
    let deadline = Instant::now() + Duration::from_secs(600);
    let (sum, count, series, text) = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(Instant::now() < deadline, "the agent did not poll");
        let Some(text) = scrape(listen).await else {
            continue;
        };
        let count = value(
            &text,
            "inboxwatch_poll_duration_seconds_count{source=\"scale\"",
        );
        let sum = value(
            &text,
            "inboxwatch_poll_duration_seconds_sum{source=\"scale\"",
        );
        if count >= 1.0 && first_count == 0.0 {
            (first_sum, first_count, first_cpu) = (sum, count, cpu_ms(agent.id()));
        }
        if count >= first_count + 4.0 && first_count > 0.0 {
            let series = text.lines().filter(|l| l.starts_with("queue_")).count();
            break (sum, count, series, text);
        }
    };
    let _ = text;
    let polls = count - first_count;
    let steady_ms = (sum - first_sum) / polls * 1000.0;
    let cpu_per_poll = (cpu_ms(agent.id()) - first_cpu) / polls;
    let (rss_mb, hwm_mb) = rss(agent.id());
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::io::stdout().flush();
    format!(
        "| {} | {} | {} | {cold_ms:.0} ms | {steady_ms:.1} ms | {cpu_per_poll:.0} ms | {rss_mb:.1} MB | {hwm_mb:.1} MB | {series} | {setup_s:.0} s |",
        p.streams,
        p.streams * p.consumers,
        p.messages
    )
}
