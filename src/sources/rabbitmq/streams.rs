//! The stream protocol (RabbitMQ 3.9 and later, port 5552), as much of it as
//! reading a stream queue's consumers takes, in the agent's own frames: the
//! handshake (peer properties, SASL PLAIN, tune, open the vhost), a stored
//! offset by name (`QueryOffset`), and the head of one chunk (`Subscribe`
//! with a credit of one chunk, its `Deliver`, `Unsubscribe`): the chunk's
//! first offset, record count and timestamp. Nothing is written: offsets
//! are read, never stored, and a subscription takes nothing from a stream.
//!
//! A frame is `size: u32` then `key: u16`, `version: u16` and, for requests
//! and their responses, `correlation id: u32` (a response's key has the top
//! bit set). Strings are `i16` length + bytes, arrays `i32` count + items.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::config::{RabbitSpec, StreamsUrl};

const PEER_PROPERTIES: u16 = 0x0011;
const SASL_HANDSHAKE: u16 = 0x0012;
const SASL_AUTHENTICATE: u16 = 0x0013;
const TUNE: u16 = 0x0014;
const OPEN: u16 = 0x0015;
const CLOSE: u16 = 0x0016;
const HEARTBEAT: u16 = 0x0017;
const SUBSCRIBE: u16 = 0x0007;
const DELIVER: u16 = 0x0008;
const QUERY_OFFSET: u16 = 0x000b;
const UNSUBSCRIBE: u16 = 0x000c;
const RESPONSE: u16 = 0x8000;

const OK: u16 = 0x01;
const STREAM_DOES_NOT_EXIST: u16 = 0x02;
const SUBSCRIPTION_ID_EXISTS: u16 = 0x03;
const SUBSCRIPTION_ID_DOES_NOT_EXIST: u16 = 0x04;
const AUTHENTICATION_FAILURE: u16 = 0x08;
const VHOST_ACCESS_FAILURE: u16 = 0x0c;
const ACCESS_REFUSED: u16 = 0x10;
const NO_OFFSET: u16 = 0x13;

/// The largest frame read whole (a delivered chunk is not: its header is
/// read, its messages skipped).
const MAX_FRAME: usize = 1024 * 1024;
/// What a `Deliver` is read of: the subscription id and the chunk's header.
const DELIVER_HEAD: usize = 1 + 32;

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Start {
    /// The last chunk of messages (not of offset tracking).
    Last,
    /// The chunk holding this offset.
    Offset(u64),
}

/// The head of one chunk of messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chunk {
    pub first_offset: u64,
    pub records: u32,
    /// When the chunk was written, in milliseconds since the epoch.
    pub timestamp_ms: i64,
}

impl Chunk {
    /// The offset of its last message.
    pub fn last_offset(&self) -> u64 {
        self.first_offset + u64::from(self.records.max(1)) - 1
    }
}

/// What went wrong; never holds the password.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StreamError {
    /// The connection to `at` failed or was closed: it is dropped.
    #[error("{at}: {message}")]
    Connection { at: String, message: String },
    /// The broker at `at` refused this request with `code`; the
    /// connection stays usable.
    #[error("{at}: {message}")]
    Refused {
        at: String,
        code: u16,
        message: String,
    },
}

/// One connection, opened on one vhost.
pub struct Conn {
    io: TcpStream,
    at: String,
    next_id: u32,
    patience: Duration,
    /// The heartbeat agreed: a connection idle longer is closed by the
    /// broker, so it is not used again.
    heartbeat: Duration,
    last_used: std::time::Instant,
}

/// A frame read: its key and what follows the key and version.
struct Frame {
    key: u16,
    body: Vec<u8>,
}

impl Conn {
    /// Connects to `url`, authenticates as the source's user and opens
    /// `vhost`, each step within `patience`.
    pub async fn open(
        url: &StreamsUrl,
        spec: &RabbitSpec,
        vhost: &str,
        patience: Duration,
    ) -> Result<Conn, StreamError> {
        let at = url.to_string();
        let lost = |m: String| lost(&at, m);
        let io = tokio::time::timeout(patience, TcpStream::connect((url.host.as_str(), url.port)))
            .await
            .map_err(|_| lost(format!("no connection within {patience:?}")))?
            .map_err(|e| {
                lost(format!(
                    "{e} (is the rabbitmq_stream plugin enabled, and this its port?)"
                ))
            })?;
        io.set_nodelay(true).ok();
        let mut conn = Conn {
            io,
            at: at.clone(),
            next_id: 1,
            patience,
            heartbeat: Duration::ZERO,
            last_used: std::time::Instant::now(),
        };
        let mut props = Vec::new();
        props.extend(2i32.to_be_bytes());
        for (k, v) in [("product", "inboxwatch"), ("connection_name", "inboxwatch")] {
            string(&mut props, k);
            string(&mut props, v);
        }
        conn.request(PEER_PROPERTIES, &props).await?;
        conn.request(SASL_HANDSHAKE, &[]).await?;
        let mut auth = Vec::new();
        string(&mut auth, "PLAIN");
        let plain = format!("\0{}\0{}", spec.username, spec.password.expose());
        auth.extend((plain.len() as i32).to_be_bytes());
        auth.extend(plain.as_bytes());
        let refused_user = |e: StreamError| match e {
            StreamError::Refused {
                code: AUTHENTICATION_FAILURE,
                ..
            } => lost(format!(
                "the broker refused user \"{}\": wrong username or password",
                spec.username
            )),
            e => e,
        };
        conn.request(SASL_AUTHENTICATE, &auth)
            .await
            .map_err(refused_user)?;
        // The server proposes the frame size and heartbeat; the agent
        // agrees to them (it answers heartbeats while it reads).
        let tune = conn.frame_keyed(TUNE).await?;
        conn.heartbeat = Duration::from_secs(u64::from(u32_at(&tune.body, 4).unwrap_or(0)));
        let mut reply = Vec::with_capacity(16);
        reply.extend(TUNE.to_be_bytes());
        reply.extend(1u16.to_be_bytes());
        reply.extend(tune.body.get(..8).unwrap_or(&[0; 8]));
        conn.send(&reply).await?;
        let mut open = Vec::new();
        string(&mut open, vhost);
        conn.request(OPEN, &open).await.map_err(|e| match e {
            StreamError::Refused {
                code: VHOST_ACCESS_FAILURE,
                ..
            } => lost(format!(
                "user \"{}\" may not open vhost \"{vhost}\"",
                spec.username
            )),
            e => e,
        })?;
        Ok(conn)
    }

    /// Whether the broker may have closed it for idleness (no frame for a
    /// heartbeat interval; it closes after two).
    pub fn stale(&self) -> bool {
        !self.heartbeat.is_zero() && self.last_used.elapsed() >= self.heartbeat
    }

    /// The offset `reference` stored on `stream`; `None` when it stored none.
    pub async fn query_offset(
        &mut self,
        reference: &str,
        stream: &str,
    ) -> Result<Option<u64>, StreamError> {
        let mut body = Vec::new();
        string(&mut body, reference);
        string(&mut body, stream);
        match self.request(QUERY_OFFSET, &body).await {
            Ok(rest) => Ok(Some(u64_at(&rest, 0).ok_or_else(|| self.garbled())?)),
            Err(StreamError::Refused {
                code: NO_OFFSET, ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The head of the chunk `from` names in `stream`, read by a
    /// subscription with a credit of one chunk, then unsubscribed. `None`
    /// when no chunk came within `wait` (nothing there yet).
    pub async fn chunk(
        &mut self,
        stream: &str,
        from: Start,
        wait: Duration,
    ) -> Result<Option<Chunk>, StreamError> {
        const ID: u8 = 0;
        let mut body = vec![ID];
        string(&mut body, stream);
        match from {
            Start::Last => {
                body.extend(2u16.to_be_bytes());
            }
            Start::Offset(o) => {
                body.extend(4u16.to_be_bytes());
                body.extend(o.to_be_bytes());
            }
        }
        body.extend(1u16.to_be_bytes()); // credit: one chunk
        body.extend(0i32.to_be_bytes()); // no properties
        let mut delivered = None;
        self.request_keeping(SUBSCRIBE, &body, &mut delivered)
            .await?;
        let chunk = match delivered {
            Some(c) => Some(c),
            None => self.deliver_within(wait).await?,
        };
        let mut late = None;
        match self.request_keeping(UNSUBSCRIBE, &[ID], &mut late).await {
            // The stream was deleted meanwhile, and the subscription with it.
            Err(StreamError::Refused {
                code: SUBSCRIPTION_ID_DOES_NOT_EXIST,
                ..
            }) => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        Ok(chunk.or(late))
    }

    fn chunk_of(&self, body: &[u8]) -> Result<Chunk, StreamError> {
        parse_chunk(body).ok_or_else(|| self.garbled())
    }

    fn garbled(&self) -> StreamError {
        lost(&self.at, "an answer too short to read")
    }

    /// Sends a request and reads frames up to its response: what follows
    /// its response code when that is OK.
    async fn request(&mut self, key: u16, body: &[u8]) -> Result<Vec<u8>, StreamError> {
        let mut ignored = None;
        self.request_keeping(key, body, &mut ignored).await
    }

    /// [`Conn::request`], keeping a chunk delivered meanwhile.
    async fn request_keeping(
        &mut self,
        key: u16,
        body: &[u8],
        delivered: &mut Option<Chunk>,
    ) -> Result<Vec<u8>, StreamError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mut frame = Vec::with_capacity(8 + body.len());
        frame.extend(key.to_be_bytes());
        frame.extend(1u16.to_be_bytes());
        frame.extend(id.to_be_bytes());
        frame.extend(body);
        self.send(&frame).await?;
        self.last_used = std::time::Instant::now();
        loop {
            let f = self.frame().await?;
            if f.key == DELIVER {
                *delivered = Some(self.chunk_of(&f.body)?);
                continue;
            }
            if f.key != key | RESPONSE || u32_at(&f.body, 0) != Some(id) {
                continue;
            }
            let code = f
                .body
                .get(4..6)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or_else(|| self.garbled())?;
            if code == SUBSCRIPTION_ID_EXISTS {
                // A subscription left behind: the connection is out of step.
                return Err(lost(
                    &self.at,
                    format!(
                        "{} answered code {code} (subscription id already exists)",
                        name_of(key)
                    ),
                ));
            }
            if code != OK {
                return Err(StreamError::Refused {
                    at: self.at.clone(),
                    code,
                    message: format!("{} answered code {code}{}", name_of(key), meaning(code)),
                });
            }
            return Ok(f.body[6..].to_vec());
        }
    }

    /// The chunk of the next `Deliver`, if one begins to arrive within
    /// `wait`. Only the wait for its first byte is cut short (a peek, which
    /// reads nothing): a frame once begun is read whole, within the
    /// connection's patience, so the connection never stops inside a frame.
    async fn deliver_within(&mut self, wait: Duration) -> Result<Option<Chunk>, StreamError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut first = [0u8; 1];
            match tokio::time::timeout_at(deadline, self.io.peek(&mut first)).await {
                Err(_) => return Ok(None),
                Ok(Ok(0)) => {
                    return Err(lost(&self.at, "the broker closed the connection"));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(lost(&self.at, e.to_string())),
            }
            let f = self.frame().await?;
            if f.key == DELIVER {
                return self.chunk_of(&f.body).map(Some);
            }
        }
    }

    /// Reads frames up to one with `key`.
    async fn frame_keyed(&mut self, key: u16) -> Result<Frame, StreamError> {
        loop {
            let f = self.frame().await?;
            if f.key == key {
                return Ok(f);
            }
        }
    }

    /// The next frame that is not a heartbeat (answered) or a close (an
    /// error); within the connection's patience.
    async fn frame(&mut self) -> Result<Frame, StreamError> {
        loop {
            let at = self.at.clone();
            let patience = self.patience;
            let read = async {
                let size = self.io.read_u32().await? as usize;
                if size < 4 {
                    return Err(std::io::Error::other(format!("a frame of {size} bytes")));
                }
                let mut head = [0u8; 4];
                self.io.read_exact(&mut head).await?;
                let key = u16::from_be_bytes([head[0], head[1]]);
                // A chunk is delivered whole; only its header is read, the
                // messages are skipped as they arrive.
                let keep = if key == DELIVER {
                    (size - 4).min(DELIVER_HEAD)
                } else if size <= MAX_FRAME {
                    size - 4
                } else {
                    return Err(std::io::Error::other(format!("a frame of {size} bytes")));
                };
                let mut buf = head.to_vec();
                buf.resize(4 + keep, 0);
                self.io.read_exact(&mut buf[4..]).await?;
                let rest = (size - 4 - keep) as u64;
                if rest > 0 {
                    let skipped =
                        tokio::io::copy(&mut (&mut self.io).take(rest), &mut tokio::io::sink())
                            .await?;
                    if skipped < rest {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Ok(buf)
            };
            let buf = tokio::time::timeout(patience, read)
                .await
                .map_err(|_| lost(&at, format!("no answer within {patience:?}")))?
                .map_err(|e| lost(&at, e.to_string()))?;
            let key = u16::from_be_bytes([buf[0], buf[1]]);
            let body = buf[4..].to_vec();
            match key {
                HEARTBEAT => {
                    let mut beat = Vec::new();
                    beat.extend(HEARTBEAT.to_be_bytes());
                    beat.extend(1u16.to_be_bytes());
                    self.send(&beat).await?;
                }
                CLOSE => {
                    let reason = body.get(6..).and_then(read_string).unwrap_or_default();
                    return Err(lost(
                        &at,
                        format!("the broker closed the connection: {reason}"),
                    ));
                }
                _ => return Ok(Frame { key, body }),
            }
        }
    }

    async fn send(&mut self, frame: &[u8]) -> Result<(), StreamError> {
        let mut out = Vec::with_capacity(4 + frame.len());
        out.extend((frame.len() as u32).to_be_bytes());
        out.extend(frame);
        tokio::time::timeout(self.patience, self.io.write_all(&out))
            .await
            .map_err(|_| {
                lost(
                    &self.at,
                    format!("could not send within {:?}", self.patience),
                )
            })?
            .map_err(|e| lost(&self.at, e.to_string()))
    }
}

/// The connection to `at` is lost: `message` says why.
fn lost(at: &str, message: impl Into<String>) -> StreamError {
    StreamError::Connection {
        at: at.to_string(),
        message: message.into(),
    }
}

/// A `Deliver`'s chunk head: SubscriptionId u8, MagicVersion i8, ChunkType
/// i8, NumEntries u16, NumRecords u32, Timestamp i64, Epoch u64,
/// ChunkFirstOffset u64, …
fn parse_chunk(body: &[u8]) -> Option<Chunk> {
    // Magic 5, version 0; chunk type 0 (messages): anything else is a
    // stream out of step, not numbers.
    if *body.get(1)? >> 4 != 5 || *body.get(2)? != 0 {
        return None;
    }
    Some(Chunk {
        records: u32_at(body, 5)?,
        timestamp_ms: u64_at(body, 9)? as i64,
        first_offset: u64_at(body, 25)?,
    })
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as i16).to_be_bytes());
    out.extend(s.as_bytes());
}

fn read_string(b: &[u8]) -> Option<String> {
    let n = i16::from_be_bytes([*b.first()?, *b.get(1)?]);
    let n = usize::try_from(n).ok()?;
    Some(String::from_utf8_lossy(b.get(2..2 + n)?).into_owned())
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn name_of(key: u16) -> &'static str {
    match key {
        PEER_PROPERTIES => "PeerProperties",
        SASL_HANDSHAKE => "SaslHandshake",
        SASL_AUTHENTICATE => "SaslAuthenticate",
        OPEN => "Open",
        SUBSCRIBE => "Subscribe",
        QUERY_OFFSET => "QueryOffset",
        UNSUBSCRIBE => "Unsubscribe",
        _ => "a request",
    }
}

fn meaning(code: u16) -> &'static str {
    match code {
        STREAM_DOES_NOT_EXIST => " (stream does not exist)",
        SUBSCRIPTION_ID_DOES_NOT_EXIST => " (subscription id does not exist)",
        0x06 => " (stream not available on the node connected to)",
        0x07 => " (SASL mechanism not supported)",
        0x0b => " (authentication failure loopback: the user may log in from localhost only)",
        AUTHENTICATION_FAILURE => " (authentication failure)",
        VHOST_ACCESS_FAILURE => " (vhost access failure)",
        ACCESS_REFUSED => " (access refused: the user needs read permission on the stream)",
        NO_OFFSET => " (no offset stored)",
        _ => "",
    }
}

/// Whether a refusal says the stream is gone (deleted since it was listed).
pub fn is_gone(e: &StreamError) -> bool {
    matches!(
        e,
        StreamError::Refused {
            code: STREAM_DOES_NOT_EXIST,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the chunk header's layout (osiris' chunk format, version 0).
    #[test]
    fn a_delivered_chunk_gives_its_offsets_and_time() {
        let mut body = vec![0u8, 0x50, 0];
        body.extend(3u16.to_be_bytes()); // entries
        body.extend(7u32.to_be_bytes()); // records
        body.extend(1_700_000_000_123i64.to_be_bytes());
        body.extend(1u64.to_be_bytes()); // epoch
        body.extend(42u64.to_be_bytes()); // first offset
        body.extend([0; 16]);
        let c = parse_chunk(&body).expect("a chunk");
        assert_eq!(
            c,
            Chunk {
                first_offset: 42,
                records: 7,
                timestamp_ms: 1_700_000_000_123
            }
        );
        assert_eq!(c.last_offset(), 48);
        assert_eq!(parse_chunk(&body[..30]), None);
        // A tracking chunk, or bytes out of step, are no chunk of messages.
        body[2] = 1;
        assert_eq!(parse_chunk(&body), None);
        body[2] = 0;
        body[1] = 0x17;
        assert_eq!(parse_chunk(&body), None);
    }

    #[test]
    fn strings_round_trip() {
        let mut b = Vec::new();
        string(&mut b, "billing");
        assert_eq!(read_string(&b).as_deref(), Some("billing"));
        assert_eq!(read_string(&b[..4]), None);
    }
}
