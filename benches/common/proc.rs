//! What the scale benches read of the agent they start: its binary, and its
//! memory and CPU time from `/proc`. Included by each bench with
//! `#[path = "common/proc.rs"] mod proc;`.

/// The agent's binary, optimized: `cargo bench` builds it with the bench
/// (release) profile before the bench runs. Building it again with `cargo
/// build --release` would rebuild its dependencies with other features (the
/// benches' dev-dependencies unify some), and the next `cargo bench` would
/// rebuild them back: minutes per run.
///
/// `INBOXWATCH_BENCH_BIN=<path>` runs another build instead (a before/after
/// pair in one session).
pub fn bin() -> std::path::PathBuf {
    std::env::var_os("INBOXWATCH_BENCH_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_inboxwatch")))
}

/// (VmRSS, VmHWM) in MB.
pub fn rss(pid: u32) -> (f64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// User + system CPU time of a process, in ms.
pub fn cpu_ms(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are 11 and 12 after the command name;
    // 100 ticks a second.
    (ticks(11) + ticks(12)) * 1000.0 / 100.0
}

/// `inboxwatch run --config <config> --listen 127.0.0.1:<port>`, its output
/// dropped.
pub fn run_agent(config: &std::path::Path, port: u16) -> std::process::Child {
    std::process::Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        // `INBOXWATCH_BENCH_LOG=<filter>`: the agent logs that to the bench's
        // stderr (`inboxwatch::sources::kafka::fetch=debug`: a Kafka cycle's
        // steps, timed).
        .env(
            "INBOXWATCH_LOG",
            std::env::var("INBOXWATCH_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(if std::env::var_os("INBOXWATCH_BENCH_LOG").is_some() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .spawn()
        .expect("inboxwatch run")
}

/// GET /metrics of the agent on 127.0.0.1:`port`; `None` while it does not
/// answer. (Not in rabbitmq_scale, which is synchronous.)
#[allow(dead_code)]
pub async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// The value of the first sample whose line starts with `prefix` (0 if none).
/// (Not in nats_scale, which sums a family's samples.)
#[allow(dead_code)]
pub fn first_value(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
