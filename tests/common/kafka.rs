//! A tansu broker of the test's own (in-memory storage, a free port) and
//! rdkafka clients to produce and commit against it.
//!
//! Self-contained but for `crate::common::free_port`: `benches/kafka_scale.rs`
//! includes this file too, with a `common` of its own that has only that.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::free_port;

/// The tansu binary: `TANSU`, else `~/.cargo/bin/tansu`, else `tansu` on PATH.
pub fn tansu_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU") {
        return PathBuf::from(p);
    }
    if let Some(home) = std::env::var_os("HOME") {
        let p = PathBuf::from(home).join(".cargo/bin/tansu");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("tansu")
}

/// A tansu broker process; killed on drop.
pub struct Broker {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub async fn start() -> Broker {
        Broker::start_on(free_port()).await
    }

    pub async fn start_on(port: u16) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir for the broker");
        let log = dir.path().join("tansu.log");
        let mut b = Broker {
            child: None,
            port,
            log,
            _dir: dir,
        };
        b.spawn().await;
        b
    }

    async fn spawn(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::File::create(&self.log).expect("broker log");
        let child = Command::new(tansu_bin())
            .args([
                "broker",
                "--storage-engine",
                "memory://tansu/",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start tansu ({}): {e}; scripts/test.sh installs it",
                    tansu_bin().display()
                )
            });
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        let started = Instant::now();
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tansu did not listen on {addr}: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker process's id (the Kafka bench reads its CPU time).
    #[allow(dead_code)]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the broker (its in-memory data goes with it).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.bootstrap())
            .set("broker.address.family", "v4")
            .set("socket.timeout.ms", "10000");
        c
    }

    pub async fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> =
            self.client().create().expect("admin client");
        let r = admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics");
        for t in r {
            t.unwrap_or_else(|(n, e)| panic!("creating topic {n}: {e}"));
        }
    }

    pub async fn delete_topic(&self, name: &str) {
        let admin: AdminClient<DefaultClientContext> =
            self.client().create().expect("admin client");
        let r = admin
            .delete_topics(
                &[name],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("delete_topics");
        for t in r {
            t.unwrap_or_else(|(n, e)| panic!("deleting topic {n}: {e}"));
        }
    }

    pub async fn delete_group(&self, name: &str) {
        let admin: AdminClient<DefaultClientContext> =
            self.client().create().expect("admin client");
        let r = admin
            .delete_groups(
                &[name],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("delete_groups");
        for g in r {
            g.unwrap_or_else(|(n, e)| panic!("deleting group {n}: {e}"));
        }
    }

    /// A producer that sends one record per batch. tansu 0.6.0 reports a
    /// wrong high watermark after a multi-record batch (a batch of 10 on an
    /// empty partition gives 1), so every record is its own batch and each
    /// send waits for its delivery before the next.
    pub fn producer(&self) -> Producer {
        producer_for(&self.bootstrap())
    }

    /// A consumer in `group`, assigned partitions by hand (it does not join
    /// the group as a member), committing explicit offsets.
    pub fn committer(&self, group: &str) -> Committer {
        let c: BaseConsumer = self
            .client()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        Committer { c }
    }

    /// A consumer that joins `group` as a member (subscribed to `topic`: the
    /// coordinator assigns it the partitions) and never commits by itself; a
    /// background thread polls it so that it stays a member until dropped.
    pub fn member(&self, group: &str, topic: &str) -> Member {
        let c: BaseConsumer = self
            .client()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .create()
            .expect("consumer");
        c.subscribe(&[topic]).expect("subscribe");
        let c = std::sync::Arc::new(c);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    // Records are not needed, only the membership.
                    let _ = c.poll(Duration::from_millis(100));
                }
            })
        };
        Member {
            c,
            stop,
            thread: Some(thread),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A producer to the brokers at `bootstrap` that sends one record per batch
/// ([`Broker::producer`]).
pub fn producer_for(bootstrap: &str) -> Producer {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("socket.timeout.ms", "10000")
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .set("acks", "all")
        .set("message.timeout.ms", "10000")
        .create()
        .expect("producer");
    Producer { p }
}

pub struct Producer {
    p: FutureProducer,
}

/// A consumer of `group` at the brokers at `bootstrap` that commits explicit
/// offsets without joining the group ([`Broker::committer`]).
pub fn committer_for(bootstrap: &str, group: &str) -> Committer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("socket.timeout.ms", "10000")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .expect("consumer");
    Committer { c }
}

impl Producer {
    /// Sends one record with the given CreateTime; returns its offset.
    pub async fn send(&self, topic: &str, partition: i32, timestamp_ms: i64) -> i64 {
        let payload = format!("record at {timestamp_ms}");
        let rec = FutureRecord::<(), _>::to(topic)
            .partition(partition)
            .payload(&payload)
            .timestamp(timestamp_ms);
        match self
            .p
            .send(rec, Timeout::After(Duration::from_secs(10)))
            .await
        {
            Ok(d) => d.offset,
            Err((e, _)) => panic!("producing to {topic}/{partition}: {e}"),
        }
    }
}

/// One record to produce, every part chosen by the test.
pub struct Produced<'a> {
    pub partition: i32,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub value: Option<&'a [u8]>,
}

impl Producer {
    /// Sends `r` to `topic` (one record per batch); returns its offset.
    pub async fn send_record(&self, topic: &str, r: &Produced<'_>) -> i64 {
        let mut headers = rdkafka::message::OwnedHeaders::new();
        for (k, v) in r.headers {
            headers = headers.insert(rdkafka::message::Header {
                key: k,
                value: Some(*v),
            });
        }
        let mut rec = FutureRecord::<[u8], [u8]>::to(topic)
            .partition(r.partition)
            .timestamp(r.timestamp_ms)
            .headers(headers);
        if let Some(k) = r.key {
            rec = rec.key(k);
        }
        if let Some(v) = r.value {
            rec = rec.payload(v);
        }
        match self
            .p
            .send(rec, Timeout::After(Duration::from_secs(10)))
            .await
        {
            Ok(d) => d.offset,
            Err((e, _)) => panic!("producing to {topic}/{}: {e}", r.partition),
        }
    }
}

pub struct Committer {
    c: BaseConsumer,
}

impl Committer {
    /// Consumes `partition` from the start up to `offset` (exclusive), then
    /// commits `offset` for it: the group's position is then exactly there.
    pub fn consume_and_commit(&self, topic: &str, partition: i32, offset: i64) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Beginning)
            .expect("tpl");
        self.c.assign(&tpl).expect("assign");
        let mut next = 0;
        let started = Instant::now();
        while next < offset {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "consumed only up to {next} of {topic}/{partition}, wanted {offset}"
            );
            if let Some(m) = self.c.poll(Duration::from_millis(200)) {
                let m = m.expect("consume");
                next = rdkafka::Message::offset(&m) + 1;
            }
        }
        self.commit(topic, partition, offset);
    }

    /// Commits `offset` for the partition without consuming.
    pub fn commit(&self, topic: &str, partition: i32, offset: i64) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .expect("tpl");
        self.c.commit(&tpl, CommitMode::Sync).expect("commit");
    }
}

/// A group member (see [`Broker::member`]).
pub struct Member {
    c: std::sync::Arc<BaseConsumer>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    /// Whether the coordinator has assigned it partitions yet.
    pub fn assigned(&self) -> usize {
        self.c.assignment().map(|a| a.count()).unwrap_or(0)
    }

    /// Commits `offset` for the partition (as the member).
    pub fn commit(&self, topic: &str, partition: i32, offset: i64) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .expect("tpl");
        self.c.commit(&tpl, CommitMode::Sync).expect("commit");
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// A `[[sources]]` entry of kind kafka.
pub fn kafka_source_toml(name: &str, bootstrap: &str, extra: &str) -> String {
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"kafka\"\nbrokers = [\"{bootstrap}\"]\npoll_interval = \"500ms\"\nstatus_window = \"4s\"\n{extra}\n"
    )
}
