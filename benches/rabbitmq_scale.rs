//! RabbitMQ at scale, beside its own Prometheus plugin: 10,000 classic
//! queues on the machine's RabbitMQ (a vhost of the bench's own, deleted at
//! the end), one timestamped message in each, all dead-lettering into one
//! exchange. Then:
//! * cold: `inboxwatch doctor` runs one poll as the agent would and prints
//!   its time;
//! * steady: `inboxwatch run` polls every 15 s; the mean of its
//!   `inboxwatch_poll_duration_seconds` over the polls after the first, its
//!   peak RSS (VmHWM), its CPU per poll, and the broker's (`beam.smp`, from
//!   /proc) CPU per poll above its idle rate (measured just before, with
//!   nothing reading it);
//! * one page of 500 queues and the whole vhost in one request, with the
//!   agent's columns: why the agent does not page;
//! * the peer: scrapes of `rabbitmq_prometheus`' `/metrics/per-object` on
//!   15692 (every queue of the broker, each with its ~20 families): time,
//!   size, and the broker CPU per scrape above idle.
//!
//! Run: `cargo bench --bench rabbitmq_scale [-- QUEUES]` (default 10000;
//! needs the machine's RabbitMQ with the management and prometheus plugins,
//! as the tests do; runs the optimized binary `cargo bench` builds).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

#[path = "common/proc.rs"]
mod proc;
use proc::{bin, cpu_ms, first_value, rss, run_agent};

const POLL: Duration = Duration::from_secs(15);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let queues: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let vhost = format!("iw_bench_{}", std::process::id());
    let beam = beam_pid();
    let t0 = Instant::now();
    http("PUT", 15672, &format!("/api/vhosts/{vhost}"), Some("{}"));
    http(
        "PUT",
        15672,
        &format!("/api/permissions/{vhost}/guest"),
        Some(r#"{"configure":".*","write":".*","read":".*"}"#),
    );
    let url = format!("amqp://guest:guest@127.0.0.1:5672/{vhost}");
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("AMQP");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("dlx".into()),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let mut confirms = Vec::with_capacity(queues);
    for i in 0..queues {
        let name = format!("orders.{i:05}");
        ch.queue_declare(name.as_str().into(), durable, args.clone())
            .await
            .expect("declare");
        confirms.push(
            ch.basic_publish(
                "".into(),
                name.as_str().into(),
                BasicPublishOptions::default(),
                b"x",
                BasicProperties::default().with_timestamp(stamp),
            )
            .await
            .expect("publish"),
        );
    }
    for c in confirms {
        c.await.expect("confirm");
    }
    conn.close(200, "done".into()).await.ok();
    // Wait for every queue's statistics (emitted every 5 s).
    loop {
        let body = http(
            "GET",
            15672,
            &format!("/api/queues/{vhost}?page=1&page_size=1&columns=name"),
            None,
        );
        let total = body
            .split("\"total_count\":")
            .nth(1)
            .and_then(|s| s.split([',', '}']).next())
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or(0);
        if total >= queues {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(6));
    let setup = t0.elapsed();

    // The broker idle, for its baseline CPU rate.
    let idle_for = Duration::from_secs(30);
    let c0 = cpu_ms(beam);
    std::thread::sleep(idle_for);
    let idle_rate = (cpu_ms(beam) - c0) / idle_for.as_secs_f64(); // ms per s

    // The peer: three scrapes of /metrics/per-object.
    let mut scrape_ms = Vec::new();
    let mut scrape_cpu = Vec::new();
    let (mut bytes, mut lines) = (0, 0);
    for _ in 0..3 {
        let c = cpu_ms(beam);
        let t = Instant::now();
        let body = http("GET", 15692, "/metrics/per-object", None);
        let took = t.elapsed();
        scrape_ms.push(took.as_secs_f64() * 1000.0);
        scrape_cpu.push(cpu_ms(beam) - c - idle_rate * took.as_secs_f64());
        bytes = body.len();
        lines = body.lines().filter(|l| !l.starts_with('#')).count();
        std::thread::sleep(Duration::from_secs(2));
    }

    // Why the agent does not page: one page of 500 against the whole
    // vhost in one request, the same columns.
    let columns = inboxwatch::sources::rabbitmq::fetch::COLUMNS;
    let timed = |path: &str| {
        let c = cpu_ms(beam);
        let t = Instant::now();
        let body = http("GET", 15672, path, None);
        let took = t.elapsed().as_secs_f64();
        (
            took * 1000.0,
            cpu_ms(beam) - c - idle_rate * took,
            body.len(),
        )
    };
    let page = timed(&format!(
        "/api/queues/{vhost}?page=1&page_size=500&sort=name&columns={columns}"
    ));
    std::thread::sleep(Duration::from_secs(2));
    let whole = timed(&format!("/api/queues/{vhost}?columns={columns}"));

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rabbitmq.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "[[sources]]\nname = \"bench\"\nkind = \"rabbitmq\"\nmanagement_url = \"http://127.0.0.1:15672\"\n\
         username = \"guest\"\npassword = \"guest\"\nvhosts = \"{vhost}\"\npoll_interval = \"{}s\"\n\
         timeout = \"60s\"\nstatus_window = \"1m\"\n",
        POLL.as_secs()
    )
    .unwrap();
    drop(f);

    // Cold: one poll by doctor.
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

    // Steady: the agent polling.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let mut agent = run_agent(&cfg, port);
    let pid = agent.id();
    let metric = first_value;
    let mut base = None;
    let started = Instant::now();
    let (mut sum, mut count, mut series) = (0.0, 0.0, 0);
    let mut broker_ms = 0.0;
    while started.elapsed() < Duration::from_secs(150) {
        std::thread::sleep(Duration::from_millis(500));
        let m = http("GET", port, "/metrics", None);
        let c = metric(
            &m,
            "inboxwatch_poll_duration_seconds_count{source=\"bench\"}",
        );
        let s = metric(&m, "inboxwatch_poll_duration_seconds_sum{source=\"bench\"}");
        match base {
            None if c >= 1.0 => base = Some((s, c, cpu_ms(pid), cpu_ms(beam), Instant::now())),
            Some((s0, c0, _, b0, at)) if c > c0 => {
                sum = s - s0;
                count = c - c0;
                series = m
                    .lines()
                    .filter(|l| l.starts_with("queue_messages{"))
                    .count();
                // The broker's CPU above idle over the polls since the base.
                broker_ms = cpu_ms(beam) - b0 - idle_rate * at.elapsed().as_secs_f64();
                if count >= 4.0 {
                    break;
                }
            }
            _ => {}
        }
    }
    let agent_cpu = base
        .map(|(_, _, c0, _, _)| (cpu_ms(pid) - c0) / count.max(1.0))
        .unwrap_or(f64::NAN);
    let (rss_mb, hwm_mb) = rss(pid);
    let _ = agent.kill();
    let _ = agent.wait();
    http("DELETE", 15672, &format!("/api/vhosts/{vhost}"), None);

    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "RabbitMQ {} queues (setup {:.0} s), broker idle {:.0} ms CPU/s",
        queues,
        setup.as_secs_f64(),
        idle_rate
    );
    println!(
        "| | time | broker CPU above idle | agent CPU | agent RSS (peak) | output |\n|---|---|---|---|---|---|"
    );
    println!("| inboxwatch, cold poll (doctor) | {cold_ms:.0} ms | | | | |");
    println!(
        "| inboxwatch, steady poll (mean of {count:.0}) | {:.0} ms | {:.0} ms / poll | {agent_cpu:.0} ms / poll | {rss_mb:.1} MB ({hwm_mb:.1} MB) | {series} queues |",
        sum / count.max(1.0) * 1000.0,
        broker_ms / count.max(1.0),
    );
    println!(
        "| management API, one page of 500 queues | {:.0} ms | {:.0} ms | | | {:.2} MB |",
        page.0,
        page.1,
        page.2 as f64 / 1e6
    );
    println!(
        "| management API, all {queues} queues in one request | {:.0} ms | {:.0} ms | | | {:.2} MB |",
        whole.0,
        whole.1,
        whole.2 as f64 / 1e6
    );
    println!(
        "| rabbitmq_prometheus /metrics/per-object (mean of 3) | {:.0} ms | {:.0} ms / scrape | | | {:.1} MB, {lines} samples |",
        mean(&scrape_ms),
        mean(&scrape_cpu),
        bytes as f64 / 1e6,
    );
}

/// One HTTP/1.0 request as guest (the management API) or plain (the
/// others): the body.
fn http(method: &str, port: u16, path: &str, body: Option<&str>) -> String {
    let body = body.unwrap_or("");
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The broker's Erlang VM.
fn beam_pid() -> u32 {
    let out = Command::new("pgrep")
        .args(["-o", "beam.smp"])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a running beam.smp (RabbitMQ)")
}
