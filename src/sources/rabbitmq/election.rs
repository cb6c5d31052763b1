//! One owner per RabbitMQ source, by RabbitMQ's own lock: an exclusive,
//! auto-delete queue of a fixed name (`inboxwatch.election.<source>`),
//! declared on an AMQP 0-9-1 connection the owner holds open. The broker
//! lets one connection at a time declare it (the others get 405
//! RESOURCE_LOCKED) and deletes it the moment that connection goes — a
//! leaving or killed agent at once, a lost host after two missed AMQP
//! heartbeats ([`HEARTBEAT_SECS`]). The owner re-declares it every
//! heartbeat of the election, which proves both the connection and the
//! ownership.
//!
//! The connection uses `election_url`'s own credentials: a `monitoring`
//! user may not declare queues; the lock's user needs configure rights on
//! that one name and nothing else. The few frames the lock needs (the
//! handshake, Channel.Open, Queue.Declare, Connection.Close) are written
//! here, over plain TCP.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::config::{ElectionUrl, RabbitSpec};
use crate::coordination::Lock;

/// The AMQP heartbeat the lock asks for, in seconds: the broker drops a
/// silent connection (and so the lock) after two.
pub const HEARTBEAT_SECS: u16 = 10;
/// Longest wait for connecting and for one answer.
const PATIENCE: Duration = Duration::from_secs(3);
/// The prefix of the lock queues' names.
pub const QUEUE_PREFIX: &str = "inboxwatch.election.";

const FRAME_METHOD: u8 = 1;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CHANNEL: u16 = 1;

pub struct RabbitElection {
    source: String,
    queue: String,
    url: ElectionUrl,
    conn: Option<Conn>,
}

struct Conn {
    stream: TcpStream,
    channel_open: bool,
}

/// A method frame read: its channel, class, method and arguments.
struct Method {
    channel: u16,
    class: u16,
    method: u16,
    args: Vec<u8>,
}

impl RabbitElection {
    pub fn for_source(spec: &RabbitSpec, url: &ElectionUrl) -> RabbitElection {
        RabbitElection {
            source: spec.name.clone(),
            queue: format!("{QUEUE_PREFIX}{}", spec.name),
            url: url.clone(),
            conn: None,
        }
    }

    /// Where errors say the lock is (never the credentials).
    fn at(&self) -> String {
        format!("amqp://{}:{}", self.url.host, self.url.port)
    }

    async fn connect(&self) -> Result<Conn, String> {
        let at = self.at();
        let mut stream = tokio::time::timeout(
            PATIENCE,
            TcpStream::connect((self.url.host.as_str(), self.url.port)),
        )
        .await
        .map_err(|_| format!("{at}: no connection within {PATIENCE:?}"))?
        .map_err(|e| format!("{at}: {e}"))?;
        stream.set_nodelay(true).ok();
        let io = |e: std::io::Error| format!("{at}: {e}");
        stream
            .write_all(b"AMQP\x00\x00\x09\x01")
            .await
            .map_err(io)?;
        let mut conn = Conn {
            stream,
            channel_open: false,
        };
        conn.expect(&at, 0, (10, 10)).await?; // Connection.Start
        let mut start_ok = Vec::new();
        table(
            &mut start_ok,
            &[
                ("product", "inboxwatch"),
                ("connection_name", "inboxwatch election"),
            ],
        );
        short(&mut start_ok, "PLAIN");
        long(
            &mut start_ok,
            format!("\0{}\0{}", self.url.username, self.url.password.expose()).as_bytes(),
        );
        short(&mut start_ok, "en_US");
        conn.send(&at, 0, (10, 11), &start_ok).await?;
        // Connection.Tune, or a close when the credentials are refused.
        let tune = conn.expect(&at, 0, (10, 30)).await.map_err(|e| {
            if e.contains("connection closed") {
                format!("{at}: the broker refused user \"{}\" (wrong password, or no access to the vhost)", self.url.username)
            } else {
                e
            }
        })?;
        let channel_max = u16::from_be_bytes([tune.args[0], tune.args[1]]);
        let frame_max =
            u32::from_be_bytes([tune.args[2], tune.args[3], tune.args[4], tune.args[5]]);
        let mut tune_ok = Vec::new();
        tune_ok.extend(channel_max.to_be_bytes());
        tune_ok.extend(frame_max.max(4096).to_be_bytes());
        tune_ok.extend(HEARTBEAT_SECS.to_be_bytes());
        conn.send(&at, 0, (10, 31), &tune_ok).await?;
        let mut open = Vec::new();
        short(&mut open, &self.url.vhost);
        short(&mut open, "");
        open.push(0);
        conn.send(&at, 0, (10, 40), &open).await?;
        conn.expect(&at, 0, (10, 41)).await?; // Connection.OpenOk
        Ok(conn)
    }

    /// Declares the lock queue on a held connection: Ok(true) when this
    /// connection has it, Ok(false) when another holds it.
    async fn declare(&mut self) -> Result<bool, String> {
        let at = self.at();
        if self.conn.is_none() {
            self.conn = Some(self.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected");
        if !conn.channel_open {
            conn.send(&at, CHANNEL, (20, 10), &[0]).await?;
            conn.expect(&at, CHANNEL, (20, 11)).await?;
            conn.channel_open = true;
        }
        let mut declare = vec![0, 0];
        short(&mut declare, &self.queue);
        declare.push(0b0000_1100); // exclusive, auto-delete
        declare.extend(0u32.to_be_bytes()); // no arguments
        conn.send(&at, CHANNEL, (50, 10), &declare).await?;
        let m = conn.read_method(&at).await?;
        match (m.channel, m.class, m.method) {
            (CHANNEL, 50, 11) => Ok(true),
            (CHANNEL, 20, 40) => {
                let code = u16::from_be_bytes([m.args[0], m.args[1]]);
                conn.send(&at, CHANNEL, (20, 41), &[]).await?;
                conn.channel_open = false;
                match code {
                    405 => Ok(false),
                    _ => Err(format!(
                        "{at}: declaring {}: {}",
                        self.queue,
                        close_text(&m.args)
                    )),
                }
            }
            (_, c, mm) => Err(format!("{at}: unexpected method {c}.{mm}")),
        }
    }
}

impl Conn {
    async fn send(
        &mut self,
        at: &str,
        channel: u16,
        (class, method): (u16, u16),
        args: &[u8],
    ) -> Result<(), String> {
        let mut frame = Vec::with_capacity(12 + args.len());
        frame.push(FRAME_METHOD);
        frame.extend(channel.to_be_bytes());
        frame.extend(((args.len() + 4) as u32).to_be_bytes());
        frame.extend(class.to_be_bytes());
        frame.extend(method.to_be_bytes());
        frame.extend(args);
        frame.push(FRAME_END);
        tokio::time::timeout(PATIENCE, self.stream.write_all(&frame))
            .await
            .map_err(|_| format!("{at}: no progress within {PATIENCE:?}"))?
            .map_err(|e| format!("{at}: {e}"))
    }

    /// The next method frame, heartbeats skipped.
    async fn read_method(&mut self, at: &str) -> Result<Method, String> {
        loop {
            let mut head = [0u8; 7];
            let read = async {
                self.stream.read_exact(&mut head).await?;
                let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
                if size > 1 << 20 {
                    return Err(std::io::Error::other("frame too large"));
                }
                let mut body = vec![0u8; size + 1];
                self.stream.read_exact(&mut body).await?;
                Ok(body)
            };
            let body = tokio::time::timeout(PATIENCE, read)
                .await
                .map_err(|_| format!("{at}: no answer within {PATIENCE:?}"))?
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        format!("{at}: connection closed by the broker")
                    } else {
                        format!("{at}: {e}")
                    }
                })?;
            if head[0] == FRAME_HEARTBEAT {
                continue;
            }
            if head[0] != FRAME_METHOD || body.len() < 5 {
                return Err(format!("{at}: unexpected frame type {}", head[0]));
            }
            let channel = u16::from_be_bytes([head[1], head[2]]);
            let class = u16::from_be_bytes([body[0], body[1]]);
            let method = u16::from_be_bytes([body[2], body[3]]);
            let args = body[4..body.len() - 1].to_vec();
            if (class, method) == (10, 50) {
                // Connection.Close: answer and report.
                let _ = self.send(at, 0, (10, 51), &[]).await;
                return Err(format!(
                    "{at}: the broker closed the connection: {}",
                    close_text(&args)
                ));
            }
            return Ok(Method {
                channel,
                class,
                method,
                args,
            });
        }
    }

    async fn expect(&mut self, at: &str, channel: u16, want: (u16, u16)) -> Result<Method, String> {
        let m = self.read_method(at).await?;
        if (m.channel, m.class, m.method) == (channel, want.0, want.1) {
            Ok(m)
        } else if (m.class, m.method) == (20, 40) {
            Err(format!("{at}: {}", close_text(&m.args)))
        } else {
            Err(format!(
                "{at}: expected method {}.{}, got {}.{}",
                want.0, want.1, m.class, m.method
            ))
        }
    }
}

/// `405 RESOURCE_LOCKED - …` from a Close's arguments.
fn close_text(args: &[u8]) -> String {
    if args.len() < 3 {
        return "closed".into();
    }
    let code = u16::from_be_bytes([args[0], args[1]]);
    let len = args[2] as usize;
    let text = args
        .get(3..3 + len)
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    format!("{code} {text}")
}

fn short(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    out.push(b.len() as u8);
    out.extend(b);
}

fn long(out: &mut Vec<u8>, b: &[u8]) {
    out.extend((b.len() as u32).to_be_bytes());
    out.extend(b);
}

/// A field table of long strings.
fn table(out: &mut Vec<u8>, fields: &[(&str, &str)]) {
    let mut t = Vec::new();
    for (k, v) in fields {
        short(&mut t, k);
        t.push(b'S');
        long(&mut t, v.as_bytes());
    }
    long(out, &t);
}

impl Lock for RabbitElection {
    fn source(&self) -> &str {
        &self.source
    }

    fn patience(&self) -> Duration {
        PATIENCE * 3
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        self.declare().await
    }

    async fn renew(&mut self) -> Result<bool, String> {
        self.declare().await
    }

    async fn abandon(&mut self) {
        // Whatever a failed operation left half-read is dropped with the
        // connection; the broker deletes the queue with it.
        self.conn = None;
    }

    async fn release(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let at = self.at();
            let mut close = Vec::new();
            close.extend(200u16.to_be_bytes());
            short(&mut close, "bye");
            close.extend([0, 0, 0, 0]);
            if conn.send(&at, 0, (10, 50), &close).await.is_ok() {
                let _ = tokio::time::timeout(PATIENCE, async {
                    while let Ok(m) = conn.read_method(&at).await {
                        if (m.class, m.method) == (10, 51) {
                            break;
                        }
                    }
                })
                .await;
            }
        }
    }
}
