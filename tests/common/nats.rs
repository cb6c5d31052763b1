//! NATS JetStream for the `nats::` suite: the machine's server
//! (127.0.0.1:4222), private servers a test starts and restarts (`nats-server
//! -js -p PORT -sd DIR`, with a password or TLS), and a small JetStream
//! client on async-nats' core client: streams, durable pull consumers,
//! publishes with the time they were acknowledged, pulls, and the three
//! acknowledgements (ack, nak, term).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use async_nats::{Client, ConnectOptions};
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::free_port;
use super::process::Proc;

/// The machine's server.
pub const SHARED_URL: &str = "nats://127.0.0.1:4222";

/// A private `nats-server -js` with its store in a directory of its own.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    proc: Option<Proc>,
}

impl Server {
    /// Starts one with `extra` arguments (`--user`, `--tls…`).
    pub async fn start(dir: &Path, extra: &[&str]) -> Server {
        let mut s = Server {
            port: free_port(),
            dir: dir.to_path_buf(),
            args: extra.iter().map(|a| a.to_string()).collect(),
            proc: None,
        };
        s.run().await;
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn run(&mut self) {
        let store = self.dir.join("store");
        let mut cmd = Command::new("nats-server");
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-sd",
        ])
        .arg(&store)
        .args(&self.args);
        self.proc = Some(Proc::spawn(
            "nats-server",
            &mut cmd,
            &self.dir,
            "nats-server",
        ));
        super::wait_until(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .expect("nats-server listens");
    }

    /// Stops it (SIGTERM) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            let _ = p.terminate(Duration::from_secs(10));
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.stop();
        self.run().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One delivery of a pull.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub reply: String,
    pub stream_seq: u64,
    pub delivered: u64,
}

/// A JetStream client of the test's own.
#[derive(Clone)]
pub struct Js {
    pub client: Client,
}

impl Js {
    pub async fn connect(url: &str) -> Js {
        Js::connect_with(url, ConnectOptions::new()).await
    }

    pub async fn connect_with(url: &str, options: ConnectOptions) -> Js {
        let client = options
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        Js { client }
    }

    /// A JetStream API request; panics on an error answer.
    pub async fn api(&self, subject: &str, body: Value) -> Value {
        let reply = self
            .client
            .request(subject.to_string(), body.to_string().into())
            .await
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        let v: Value = serde_json::from_slice(&reply.payload).expect("JSON");
        assert!(v.get("error").is_none(), "{subject}: {v}");
        v
    }

    pub async fn create_stream(&self, name: &str, subjects: &[&str]) {
        self.api(
            &format!("$JS.API.STREAM.CREATE.{name}"),
            json!({"name": name, "subjects": subjects, "storage": "file", "num_replicas": 1}),
        )
        .await;
    }

    pub async fn delete_stream(&self, name: &str) {
        self.api(&format!("$JS.API.STREAM.DELETE.{name}"), json!({}))
            .await;
    }

    /// A durable pull consumer with explicit acks; `extra` adds to its config.
    pub async fn create_consumer(&self, stream: &str, name: &str, extra: Value) {
        let mut config = json!({
            "durable_name": name,
            "ack_policy": "explicit",
            "deliver_policy": "all",
            "ack_wait": 120_000_000_000u64,
        });
        for (k, v) in extra.as_object().expect("an object") {
            config[k] = v.clone();
        }
        self.api(
            &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
            json!({"stream_name": stream, "config": config}),
        )
        .await;
    }

    /// Publishes and waits for the stream's acknowledgement: the sequence,
    /// and the time right after it (the stored time is before).
    pub async fn publish(&self, subject: &str) -> (u64, SystemTime) {
        let reply = self
            .client
            .request(subject.to_string(), "m".into())
            .await
            .unwrap_or_else(|e| panic!("publish {subject}: {e}"));
        let v: Value = serde_json::from_slice(&reply.payload).expect("a PubAck");
        let seq = v["seq"].as_u64().unwrap_or_else(|| panic!("{v}"));
        (seq, SystemTime::now())
    }

    /// Pulls up to `batch` messages (no wait): what the server delivers now.
    pub async fn fetch(&self, stream: &str, consumer: &str, batch: usize) -> Vec<Delivery> {
        let inbox = self.client.new_inbox();
        let mut sub = self
            .client
            .subscribe(inbox.clone())
            .await
            .expect("subscribe");
        self.client
            .publish_with_reply(
                format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
                inbox,
                json!({"batch": batch, "no_wait": true}).to_string().into(),
            )
            .await
            .expect("pull");
        let mut out = Vec::new();
        while out.len() < batch {
            let m = tokio::time::timeout(Duration::from_secs(10), sub.next())
                .await
                .expect("a pull answers within 10 s")
                .expect("a message");
            let Some(reply) = m.reply.as_ref().map(|r| r.to_string()) else {
                break; // a status: no more messages
            };
            if !reply.starts_with("$JS.ACK.") {
                break;
            }
            let tokens: Vec<&str> = reply.split('.').collect();
            // $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
            let n = tokens.len();
            out.push(Delivery {
                stream_seq: tokens[n - 4].parse().expect("stream seq"),
                delivered: tokens[n - 5].parse().expect("delivered"),
                reply,
            });
        }
        out
    }

    /// A long pull left waiting (a member present) for `expires`, while the
    /// returned subscription to its inbox lives (the server drops a pull
    /// nobody listens for).
    pub async fn wait_pull(
        &self,
        stream: &str,
        consumer: &str,
        expires: Duration,
    ) -> async_nats::Subscriber {
        let inbox = self.client.new_inbox();
        let sub = self
            .client
            .subscribe(inbox.clone())
            .await
            .expect("subscribe");
        self.client
            .publish_with_reply(
                format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
                inbox,
                json!({"batch": 1, "expires": expires.as_nanos() as u64})
                    .to_string()
                    .into(),
            )
            .await
            .expect("pull");
        self.client.flush().await.expect("flush");
        sub
    }

    async fn answer(&self, d: &Delivery, what: &'static str) {
        // With a reply subject the server confirms the acknowledgement.
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.client.request(d.reply.clone(), what.into()),
        )
        .await;
    }

    pub async fn ack(&self, d: &Delivery) {
        self.answer(d, "+ACK").await
    }

    pub async fn nak(&self, d: &Delivery) {
        self.answer(d, "-NAK").await
    }

    pub async fn term(&self, d: &Delivery) {
        self.answer(d, "+TERM").await
    }

    /// `$JS.API.CONSUMER.INFO` as the server says it.
    pub async fn consumer_info(&self, stream: &str, consumer: &str) -> Value {
        self.api(
            &format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
            json!({}),
        )
        .await
    }
}

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir`:
/// (`ca.pem`, `server.pem`, `server.key`).
pub fn certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = dir.join(format!("{name}-ca.key"));
    let ca = dir.join(format!("{name}-ca.pem"));
    let key = dir.join(format!("{name}-server.key"));
    let csr = dir.join(format!("{name}-server.csr"));
    let cert = dir.join(format!("{name}-server.pem"));
    let ext = dir.join(format!("{name}-ext.cnf"));
    std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |p: &PathBuf| p.to_str().unwrap().to_string();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={name} test CA"),
        "-keyout",
        &p(&ca_key),
        "-out",
        &p(&ca),
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &p(&key),
        "-out",
        &p(&csr),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&ca),
        "-CAkey",
        &p(&ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&cert),
    ]);
    (ca, cert, key)
}

/// A NATS JWT (v2) of `claims` for `subject`, signed by `issuer`: what
/// `nsc` writes, for an operator-mode server the test configures.
pub fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: Value) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = URL_SAFE_NO_PAD.encode(json!({"typ": "JWT", "alg": "ed25519-nkey"}).to_string());
    let claims = json!({
        "jti": format!("{name}{now}"),
        "iat": now,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// An operator, an account with JetStream and a user of it: the server's
/// configuration (operator mode, the account preloaded in memory) and the
/// user's `.creds` file.
pub fn operator_mode() -> (String, String) {
    let operator = nkeys::KeyPair::new_operator();
    // JetStream needs a system account to start in operator mode.
    let system = nkeys::KeyPair::new_account();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        json!({"system_account": system.public_key(), "type": "operator", "version": 2}),
    );
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                "wildcards": true, "conn": -1, "leaf": -1,
            },
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account",
            "version": 2,
        }),
    );
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "acc",
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                "wildcards": true, "conn": -1, "leaf": -1,
                "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
            },
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account",
            "version": 2,
        }),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "watcher",
        json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2,
        }),
    );
    let server = format!(
        "operator: {operator_jwt}\nsystem_account: {}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {}: {system_jwt}\n  {}: {account_jwt}\n}}\n",
        system.public_key(),
        system.public_key(),
        account.public_key()
    );
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n",
        user.seed().expect("a seed")
    );
    (server, creds)
}
