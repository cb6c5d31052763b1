//! What the scale benches read of the agent they start: its binary, and its
//! memory and CPU time from `/proc`. Included by each bench with
//! `#[path = "common/proc.rs"] mod proc;`.

/// The agent's binary, optimized: `cargo bench` builds it with the bench
/// (release) profile before the bench runs. Building it again with `cargo
/// build --release` would rebuild its dependencies with other features (the
/// benches' dev-dependencies unify some), and the next `cargo bench` would
/// rebuild them back: minutes per run.
pub fn bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_inboxwatch"))
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
