//! A child process of a test: the agent, a Kafka broker, Prometheus, Alertmanager.
//! Its stdout and stderr go to files (no pipe can fill up and stall it); it is
//! killed and reaped on drop, and if the test is panicking what it printed is shown.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Outcome, ROOT, strip_ansi};

/// How much of each stream a failing test prints (the end of it).
const OUTPUT_SHOWN: usize = 120_000;

/// A running child process with its output in files.
pub struct Proc {
    /// What failure messages call it (`agent 2`, `prometheus`, …).
    pub name: String,
    // Behind a lock so that every method takes `&self` (the status of an exited
    // child is kept by `Child` itself).
    child: Mutex<Child>,
    pid: u32,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stdin closed and its output in `{dir}/{file_stem}.stdout`
    /// and `.stderr`; panics naming `name` if it cannot be started.
    pub fn spawn(name: &str, cmd: &mut Command, dir: &Path, file_stem: &str) -> Proc {
        let stdout = dir.join(format!("{file_stem}.stdout"));
        let stderr = dir.join(format!("{file_stem}.stderr"));
        let create = |p: &Path| {
            std::fs::File::create(p)
                .unwrap_or_else(|e| panic!("create {} for {name}: {e}", p.display()))
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(create(&stdout))
            .stderr(create(&stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {name} ({:?}): {e}", cmd.get_program()));
        Proc {
            name: name.to_string(),
            pid: child.id(),
            child: Mutex::new(child),
            stdout,
            stderr,
        }
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Everything it wrote to stdout so far, without colour codes.
    pub fn stdout(&self) -> String {
        read_text(&self.stdout)
    }

    /// Everything it wrote to stderr so far, without colour codes.
    pub fn stderr(&self) -> String {
        read_text(&self.stderr)
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.child().try_wait().ok().flatten()
    }

    /// Panics if the process has exited.
    pub fn assert_running(&self) {
        if let Some(status) = self.exited() {
            panic!("{} exited with {status} during the test", self.name);
        }
    }

    /// `kill <signal> <pid>` (`-TERM`, `-9`, …); panics if `kill` fails.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([signal, pid.as_str()])
            .status()
            .unwrap_or_else(|e| panic!("run `kill {signal} {pid}` ({}): {e}", self.name));
        assert!(
            status.success(),
            "`kill {signal} {pid}` ({}) failed: {status}",
            self.name
        );
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (unless it has exited already), then waits up to `timeout` for it to exit.
    pub fn terminate(&self, timeout: Duration) -> Option<ExitStatus> {
        if self.exited().is_none() {
            self.signal("-TERM");
        }
        self.wait_exit(timeout)
    }

    /// SIGKILL and reap.
    pub fn kill(&self) {
        let mut child = self.child();
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The end of its stderr and stdout, for failure messages.
    pub fn output_tail(&self) -> String {
        format!(
            "--- stderr ---\n{}\n--- stdout ---\n{}",
            tail(self.stderr(), OUTPUT_SHOWN),
            tail(self.stdout(), OUTPUT_SHOWN)
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- {} output (exit {:?}) -----\n{}\n----- end of {} output -----",
                self.name,
                self.exited(),
                self.output_tail(),
                self.name
            );
        }
    }
}

fn read_text(path: &Path) -> String {
    strip_ansi(&String::from_utf8_lossy(
        &std::fs::read(path).unwrap_or_default(),
    ))
}

/// The last `max` bytes of `s` (on a character boundary), marked as cut.
pub fn tail(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let cut = s.len() - max;
    let cut = (cut..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(cut);
    format!("[... {cut} bytes cut ...]\n{}", &s[cut..])
}

/// Runs `program` (a tool, not the binary under test: that is [`super::Cmd`]) with
/// `args` in the checkout's root, to completion; `Err` if it cannot be started.
pub fn run_in_root<S: AsRef<std::ffi::OsStr>>(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[S],
) -> std::io::Result<Outcome> {
    Command::new(program)
        .args(args)
        .current_dir(ROOT)
        .stdin(Stdio::null())
        .output()
        .map(Outcome::from)
}
