//! Redis for the Redis Streams suites: the machine's shared server
//! (`INBOXWATCH_TEST_REDIS`, default `redis://127.0.0.1:6379`; each test
//! keeps to keys of its own prefix), a private `redis-server` a test may
//! stop, restart, give a password or TLS, and a client that writes streams,
//! groups, deliveries, acknowledgements and claims with the ids (and so the
//! times) it was given.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::process::Proc;
use super::{free_port, wait_until};

/// The shared server's URL (no database: tests add `/N`).
pub fn shared_url() -> String {
    std::env::var("INBOXWATCH_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Milliseconds since the epoch on this machine's clock (the server's too).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A connection that writes the workload; every call panics on an error
/// (a test's own step that fails is the test's failure).
pub struct Redis {
    conn: redis::Connection,
}

impl Redis {
    /// Connects to `url` (the shared server when a test has no server of its own).
    pub fn connect(url: &str) -> Redis {
        let client = redis::Client::open(url).unwrap_or_else(|e| panic!("redis url {url}: {e}"));
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        Redis { conn }
    }

    /// Runs one command.
    pub fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Runs one command, returning the server's error.
    pub fn try_cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> Result<T, String> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn).map_err(|e| e.to_string())
    }

    /// `XADD stream <ms>-0`: an entry whose id is the time `ms`; returns it.
    pub fn add_at(&mut self, stream: &str, ms: u64) -> String {
        self.cmd(&["XADD", stream, &format!("{ms}-0"), "n", "1"])
    }

    /// `XADD stream *`; returns the id.
    pub fn add(&mut self, stream: &str) -> String {
        self.cmd(&["XADD", stream, "*", "n", "1"])
    }

    /// `XGROUP CREATE stream group from MKSTREAM`.
    pub fn group(&mut self, stream: &str, group: &str, from: &str) {
        let _: String = self.cmd(&["XGROUP", "CREATE", stream, group, from, "MKSTREAM"]);
    }

    /// `XREADGROUP GROUP group consumer COUNT n STREAMS stream >`: the ids delivered.
    pub fn deliver(&mut self, stream: &str, group: &str, consumer: &str, n: usize) -> Vec<String> {
        let reply: redis::Value = self.cmd(&[
            "XREADGROUP",
            "GROUP",
            group,
            consumer,
            "COUNT",
            &n.to_string(),
            "STREAMS",
            stream,
            ">",
        ]);
        let mut ids = Vec::new();
        if let redis::Value::Array(streams) = reply {
            for s in streams {
                let redis::Value::Array(parts) = s else {
                    continue;
                };
                let Some(redis::Value::Array(entries)) = parts.get(1) else {
                    continue;
                };
                for e in entries {
                    if let redis::Value::Array(fields) = e
                        && let Some(redis::Value::BulkString(id)) = fields.first()
                    {
                        ids.push(String::from_utf8_lossy(id).into_owned());
                    }
                }
            }
        }
        ids
    }

    /// `XACK stream group ids…`.
    pub fn ack(&mut self, stream: &str, group: &str, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let mut args = vec!["XACK", stream, group];
        args.extend(ids.iter().map(String::as_str));
        let acked: i64 = self.cmd(&args);
        assert_eq!(acked as usize, ids.len(), "XACK {stream} {group}");
    }

    /// `XCLAIM stream group consumer 0 ids…`: a redelivery (each delivery
    /// count goes up by one).
    pub fn claim(&mut self, stream: &str, group: &str, consumer: &str, ids: &[String]) {
        let mut args = vec!["XCLAIM", stream, group, consumer, "0"];
        args.extend(ids.iter().map(String::as_str));
        let _: redis::Value = self.cmd(&args);
    }

    /// Deletes keys.
    pub fn del(&mut self, keys: &[&str]) {
        let mut args = vec!["DEL"];
        args.extend(keys);
        let _: i64 = self.cmd(&args);
    }
}

/// The milliseconds of an id `ms-seq`.
pub fn ms_of(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("an entry id")
}

/// A `redis-server` of the test's own on a free port of 127.0.0.1, keeping
/// nothing on disk but what `SHUTDOWN SAVE` writes to its directory (so a
/// restart finds the streams again). Killed on drop.
pub struct PrivateRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    proc: Option<Proc>,
    /// Whether clients reach it over TLS.
    tls: bool,
    password: Option<String>,
    /// A TLS server's CA, certificate and key.
    pki: Option<tempfile::TempDir>,
}

impl PrivateRedis {
    /// Plain TCP, no password.
    pub fn start() -> PrivateRedis {
        let mut server = PrivateRedis::with(Vec::new(), false, None, None);
        server.spawn();
        server
    }

    /// With `requirepass`.
    pub fn with_password(password: &str) -> PrivateRedis {
        let mut server = PrivateRedis::with(
            vec!["--requirepass".into(), password.into()],
            false,
            Some(password.into()),
            None,
        );
        server.spawn();
        server
    }

    /// TLS only, with a server certificate for localhost / 127.0.0.1 signed
    /// by the CA at [`PrivateRedis::ca`] (made with `openssl`).
    pub fn with_tls() -> PrivateRedis {
        let pki = tempfile::tempdir().expect("a temp dir for the certificates");
        let (_, chain, key) = super::otlp::test_pki(pki.path());
        let dir = pki.path();
        std::fs::write(dir.join("server-chain.pem"), chain).expect("write the chain");
        std::fs::write(dir.join("server-key.pem"), key).expect("write the key");
        let path = |f: &str| dir.join(f).display().to_string();
        let args = vec![
            "--tls-cert-file".into(),
            path("server-chain.pem"),
            "--tls-key-file".into(),
            path("server-key.pem"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let mut server = PrivateRedis::with(args, true, None, Some(pki));
        server.spawn();
        server
    }

    fn with(
        args: Vec<String>,
        tls: bool,
        password: Option<String>,
        pki: Option<tempfile::TempDir>,
    ) -> PrivateRedis {
        PrivateRedis {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temp dir for redis-server"),
            args,
            proc: None,
            tls,
            password,
            pki,
        }
    }

    /// The CA certificate of a TLS server.
    pub fn ca(&self) -> PathBuf {
        self.pki
            .as_ref()
            .expect("a TLS server")
            .path()
            .join("ca.pem")
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        if self.tls {
            cmd.args(["--port", "0", "--tls-port", &port]);
        } else {
            cmd.args(["--port", &port]);
        }
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args);
        let proc = Proc::spawn("redis-server", &mut cmd, self.dir.path(), "redis");
        self.proc = Some(proc);
        let port = self.port;
        let ready = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(wait_until(
                Duration::from_secs(20),
                || async move {
                    std::net::TcpStream::connect(("127.0.0.1", port))
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            ))
        });
        if let Err(e) = ready {
            panic!(
                "redis-server on port {port} did not listen: {e}\n{}",
                self.proc
                    .as_ref()
                    .map(|p| p.output_tail())
                    .unwrap_or_default()
            );
        }
    }

    /// `redis://127.0.0.1:PORT` (with the password if it has one).
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Saves its data and stops (`SHUTDOWN SAVE`), and waits for the exit.
    pub fn stop(&mut self) {
        let mut r = Redis::connect(&self.url());
        let _ = r.try_cmd::<redis::Value>(&["SHUTDOWN", "SAVE"]);
        if let Some(p) = self.proc.take() {
            assert!(
                p.wait_exit(Duration::from_secs(20)).is_some(),
                "redis-server did not stop"
            );
        }
    }

    /// Starts it again on the same port and directory (it loads what it saved).
    pub fn restart(&mut self) {
        self.spawn();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
    }
}
