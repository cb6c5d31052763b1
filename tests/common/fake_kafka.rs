//! A fake Kafka broker for the tests no real broker here can serve: SASL
//! session lifetimes (KIP-368; tansu does not enforce
//! `connections.max.reauth.ms`), OAUTHBEARER (KIP-255), and answers a test
//! writes itself (KIP-848 group descriptions, injected errors).
//!
//! It speaks the wire protocol with `kafka-protocol`'s broker half: one task
//! per connection reads size-prefixed requests, decodes the request header
//! for its API key and version, and answers `ApiVersions` (the versions the
//! test configured), `SaslHandshake` / `SaslAuthenticate` (when the test
//! configured SASL, with its check function and session lifetime) itself;
//! every other request goes to the test's [`Handler`], which decodes the body
//! it expects ([`Req::decode`]) and returns the response ([`Req::answer`]) or
//! closes the connection. Every request is recorded (connection, API key,
//! version, what happened to it), and every SASL step with its bytes.
//!
//! As a KIP-368 broker does, a connection whose session has expired is
//! closed on its next request that is not a re-authentication
//! (`SaslHandshake`), without an answer.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// `SASL_AUTHENTICATION_FAILED`.
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// `UNSUPPORTED_SASL_MECHANISM`.
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

/// Largest request the fake accepts.
const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// Answers the requests the fake does not answer itself.
pub type Handler = Arc<dyn Fn(&Req) -> Reply + Send + Sync>;

/// Judges one SASL step.
pub type SaslCheck = Arc<dyn Fn(&SaslStep<'_>) -> SaslVerdict + Send + Sync>;

/// What the fake advertises and enforces.
#[derive(Clone)]
pub struct FakeConfig {
    /// `ApiVersions`' answer: (API key, min version, max version).
    pub api_versions: Vec<(ApiKey, i16, i16)>,
    /// SASL required on every connection; `None`: no authentication.
    pub sasl: Option<FakeSasl>,
}

impl Default for FakeConfig {
    /// The read APIs at the ranges of a Kafka 4.0 broker, no SASL.
    fn default() -> FakeConfig {
        FakeConfig {
            api_versions: vec![
                (ApiKey::Fetch, 4, 17),
                (ApiKey::ListOffsets, 1, 9),
                (ApiKey::Metadata, 0, 13),
                (ApiKey::OffsetFetch, 1, 9),
                (ApiKey::FindCoordinator, 0, 6),
                (ApiKey::JoinGroup, 0, 9),
                (ApiKey::Heartbeat, 0, 4),
                (ApiKey::LeaveGroup, 0, 5),
                (ApiKey::SyncGroup, 0, 5),
                (ApiKey::DescribeGroups, 0, 6),
                (ApiKey::ListGroups, 0, 5),
                (ApiKey::SaslHandshake, 0, 1),
                (ApiKey::SaslAuthenticate, 0, 2),
                (ApiKey::ApiVersions, 0, 4),
                (ApiKey::ConsumerGroupDescribe, 0, 1),
            ],
            sasl: None,
        }
    }
}

impl FakeConfig {
    /// Requires SASL with `mechanisms`, each step judged by `check`, every
    /// session `session_lifetime_ms` long (0: no expiry).
    pub fn with_sasl(
        mut self,
        mechanisms: &[&str],
        session_lifetime_ms: i64,
        check: impl Fn(&SaslStep<'_>) -> SaslVerdict + Send + Sync + 'static,
    ) -> FakeConfig {
        self.sasl = Some(FakeSasl {
            mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
            session_lifetime_ms,
            check: Arc::new(check),
        });
        self
    }
}

/// The SASL the fake requires.
#[derive(Clone)]
pub struct FakeSasl {
    /// The mechanisms `SaslHandshake` accepts.
    pub mechanisms: Vec<String>,
    /// Returned by `SaslAuthenticate` v1+ on success and enforced: the next
    /// request after it ran out that is not a `SaslHandshake` closes the
    /// connection. 0: sessions do not expire.
    pub session_lifetime_ms: i64,
    pub check: SaslCheck,
}

/// One `SaslAuthenticate` as the check function sees it.
#[derive(Debug)]
pub struct SaslStep<'a> {
    pub conn: u64,
    pub mechanism: &'a str,
    /// 0 for the first `SaslAuthenticate` after a handshake.
    pub step: usize,
    pub auth_bytes: &'a [u8],
    /// The connection was authenticated before this handshake (KIP-368).
    pub reauthentication: bool,
}

/// What the check function decides about a step.
#[derive(Debug, Clone)]
pub enum SaslVerdict {
    /// Authenticated; the session starts now.
    Accept,
    /// Answer these bytes and wait for the next step (SCRAM's server-first
    /// message, OAUTHBEARER's error challenge).
    Challenge(Vec<u8>),
    /// `SASL_AUTHENTICATION_FAILED` with this message, then the connection is
    /// closed.
    Reject(String),
}

/// What happened to a recorded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered (by the fake or the handler).
    Answered,
    /// The session had expired and it was not a re-authentication: closed.
    ClosedExpired,
    /// Sent before authentication finished: closed.
    ClosedUnauthenticated,
    /// The handler closed the connection.
    ClosedByHandler,
    /// A failed authentication: answered, then closed.
    Rejected,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Connection number, from 1 in accept order.
    pub conn: u64,
    pub api_key: i16,
    pub version: i16,
    pub client_id: Option<String>,
    pub at: Instant,
    pub outcome: Outcome,
}

/// One SASL step the fake received.
#[derive(Debug, Clone)]
pub struct SaslRecord {
    pub conn: u64,
    pub mechanism: String,
    pub step: usize,
    pub auth_bytes: Vec<u8>,
    pub reauthentication: bool,
    pub at: Instant,
}

/// A request for the handler.
pub struct Req {
    pub conn: u64,
    /// The fake's own address (for a `Metadata` answer naming itself).
    pub broker: SocketAddr,
    pub api_key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    body: Bytes,
}

impl Req {
    /// The request body as `R` (the type of `api_key`); panics if it does
    /// not decode, which is a bug of the client or of the test.
    pub fn decode<R: Decodable>(&self) -> R {
        let mut body = self.body.clone();
        R::decode(&mut body, self.version).unwrap_or_else(|e| {
            panic!(
                "fake broker: cannot decode {:?} v{} from connection {}: {e}",
                self.api_key, self.version, self.conn
            )
        })
    }

    /// Answers with `response` (the response type of `api_key`) at the
    /// request's version.
    pub fn answer<R: Encodable>(&self, response: &R) -> Reply {
        Reply::Answer(encode_response(
            self.api_key,
            self.version,
            self.header.correlation_id,
            response,
        ))
    }
}

/// The handler's decision.
pub enum Reply {
    /// A complete response frame (made by [`Req::answer`]).
    Answer(Bytes),
    /// Close the connection without answering.
    Close,
}

/// What the connection tasks share with the test.
struct Shared {
    config: FakeConfig,
    handler: Handler,
    requests: Mutex<Vec<Recorded>>,
    sasl: Mutex<Vec<SaslRecord>>,
    connections: AtomicU64,
    /// Accepted connections are closed at once.
    refusing: AtomicBool,
    /// Bumped to close every open connection.
    generation: watch::Sender<u64>,
}

/// A running fake broker; dropping it stops it.
pub struct FakeKafka {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKafka {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.generation.send_modify(|g| *g += 1);
    }
}

impl FakeKafka {
    /// Starts a fake broker on a port of its own on 127.0.0.1 (bound here
    /// and kept), answering with `config` and `handler`.
    pub async fn start(
        config: FakeConfig,
        handler: impl Fn(&Req) -> Reply + Send + Sync + 'static,
    ) -> FakeKafka {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake broker: bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("local_addr of a bound listener");
        let shared = Arc::new(Shared {
            config,
            handler: Arc::new(handler),
            requests: Mutex::new(Vec::new()),
            sasl: Mutex::new(Vec::new()),
            connections: AtomicU64::new(0),
            refusing: AtomicBool::new(false),
            generation: watch::channel(0).0,
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                if s.refusing.load(Ordering::SeqCst) {
                    drop(stream);
                    continue;
                }
                let conn = s.connections.fetch_add(1, Ordering::SeqCst) + 1;
                let s = s.clone();
                tokio::spawn(async move {
                    let mut generation = s.generation.subscribe();
                    generation.mark_unchanged();
                    tokio::select! {
                        _ = serve(&s, conn, addr, stream) => {}
                        _ = generation.changed() => {}
                    }
                });
            }
        });
        FakeKafka {
            addr,
            shared,
            accept,
        }
    }

    /// `host:port` for a client's bootstrap list.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The requests of one API.
    pub fn requests_of(&self, key: ApiKey) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.api_key == key as i16)
            .collect()
    }

    /// Every SASL step received so far, in order.
    pub fn sasl_steps(&self) -> Vec<SaslRecord> {
        self.shared.sasl.lock().unwrap().clone()
    }

    /// Connections accepted so far (refused ones not counted).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connection numbers that sent at least one request.
    pub fn connections_used(&self) -> HashSet<u64> {
        self.requests().iter().map(|r| r.conn).collect()
    }

    /// Closes every open connection.
    pub fn close_connections(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// While `true`, connections are accepted and closed at once, and the
    /// open ones are closed: a broker that is down, on the same port.
    pub fn set_refusing(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::SeqCst);
        if refusing {
            self.close_connections();
        }
    }
}

/// Where one connection's authentication stands.
#[derive(Debug)]
enum Auth {
    /// No SASL configured: everything is allowed.
    Open,
    /// Before a handshake, or between a handshake and its success.
    Pending {
        mechanism: Option<String>,
        step: usize,
        reauthentication: bool,
    },
    /// Authenticated; `expires` is when the session ends (`None`: never).
    Done { expires: Option<Instant> },
}

async fn serve(s: &Shared, conn: u64, broker: SocketAddr, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut auth = if s.config.sasl.is_some() {
        Auth::Pending {
            mechanism: None,
            step: 0,
            reauthentication: false,
        }
    } else {
        Auth::Open
    };
    loop {
        let Ok(len) = stream.read_i32().await else {
            return;
        };
        if len < 4 || len as usize > MAX_REQUEST {
            return;
        }
        let mut frame = vec![0u8; len as usize];
        if stream.read_exact(&mut frame).await.is_err() {
            return;
        }
        let mut body = Bytes::from(frame);
        let key = i16::from_be_bytes([body[0], body[1]]);
        let version = i16::from_be_bytes([body[2], body[3]]);
        let Ok(api_key) = ApiKey::try_from(key) else {
            return;
        };
        let Ok(header) = RequestHeader::decode(&mut body, api_key.request_header_version(version))
        else {
            return;
        };
        let req = Req {
            conn,
            broker,
            api_key,
            version,
            header,
            body,
        };
        let (reply, outcome) = dispatch(s, &req, &mut auth);
        s.requests.lock().unwrap().push(Recorded {
            conn,
            api_key: key,
            version,
            client_id: req.header.client_id.as_ref().map(|c| c.to_string()),
            at: Instant::now(),
            outcome,
        });
        match reply {
            Reply::Answer(frame) => {
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
            }
            Reply::Close => return,
        }
        if outcome == Outcome::Rejected {
            let _ = stream.flush().await;
            return;
        }
    }
}

/// Answers one request according to the connection's authentication.
fn dispatch(s: &Shared, req: &Req, auth: &mut Auth) -> (Reply, Outcome) {
    match req.api_key {
        ApiKey::ApiVersions => (api_versions(s, req), Outcome::Answered),
        ApiKey::SaslHandshake if s.config.sasl.is_some() => handshake(s, req, auth),
        ApiKey::SaslAuthenticate if s.config.sasl.is_some() => authenticate(s, req, auth),
        _ => match auth {
            Auth::Pending { .. } => (Reply::Close, Outcome::ClosedUnauthenticated),
            Auth::Done {
                expires: Some(at), ..
            } if Instant::now() >= *at => (Reply::Close, Outcome::ClosedExpired),
            _ => match (s.handler)(req) {
                Reply::Close => (Reply::Close, Outcome::ClosedByHandler),
                answer => (answer, Outcome::Answered),
            },
        },
    }
}

fn api_versions(s: &Shared, req: &Req) -> Reply {
    let keys = s
        .config
        .api_versions
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    req.answer(&ApiVersionsResponse::default().with_api_keys(keys))
}

fn handshake(s: &Shared, req: &Req, auth: &mut Auth) -> (Reply, Outcome) {
    let sasl = s.config.sasl.as_ref().expect("called with SASL configured");
    let hs: SaslHandshakeRequest = req.decode();
    let offered: Vec<StrBytes> = sasl
        .mechanisms
        .iter()
        .map(|m| StrBytes::from_string(m.clone()))
        .collect();
    let resp = SaslHandshakeResponse::default().with_mechanisms(offered);
    if !sasl.mechanisms.iter().any(|m| m == hs.mechanism.as_str()) {
        let resp = resp.with_error_code(UNSUPPORTED_SASL_MECHANISM);
        return (req.answer(&resp), Outcome::Rejected);
    }
    let reauthentication = matches!(auth, Auth::Done { .. });
    *auth = Auth::Pending {
        mechanism: Some(hs.mechanism.to_string()),
        step: 0,
        reauthentication,
    };
    (req.answer(&resp), Outcome::Answered)
}

fn authenticate(s: &Shared, req: &Req, auth: &mut Auth) -> (Reply, Outcome) {
    let sasl = s.config.sasl.as_ref().expect("called with SASL configured");
    let Auth::Pending {
        mechanism: Some(mechanism),
        step,
        reauthentication,
    } = auth
    else {
        // No handshake first: ILLEGAL_SASL_STATE, as Kafka answers.
        let resp = SaslAuthenticateResponse::default()
            .with_error_code(34)
            .with_error_message(Some(StrBytes::from_static_str(
                "SaslAuthenticate without a SaslHandshake",
            )));
        return (req.answer(&resp), Outcome::Rejected);
    };
    let body: SaslAuthenticateRequest = req.decode();
    let verdict = {
        let at = SaslStep {
            conn: req.conn,
            mechanism,
            step: *step,
            auth_bytes: &body.auth_bytes,
            reauthentication: *reauthentication,
        };
        s.sasl.lock().unwrap().push(SaslRecord {
            conn: req.conn,
            mechanism: mechanism.clone(),
            step: *step,
            auth_bytes: body.auth_bytes.to_vec(),
            reauthentication: *reauthentication,
            at: Instant::now(),
        });
        (sasl.check)(&at)
    };
    match verdict {
        SaslVerdict::Accept => {
            let lifetime = sasl.session_lifetime_ms;
            let expires =
                (lifetime > 0).then(|| Instant::now() + Duration::from_millis(lifetime as u64));
            *auth = Auth::Done { expires };
            let resp = SaslAuthenticateResponse::default().with_session_lifetime_ms(lifetime);
            (req.answer(&resp), Outcome::Answered)
        }
        SaslVerdict::Challenge(bytes) => {
            *step += 1;
            let resp = SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(bytes));
            (req.answer(&resp), Outcome::Answered)
        }
        SaslVerdict::Reject(message) => {
            let resp = SaslAuthenticateResponse::default()
                .with_error_code(SASL_AUTHENTICATION_FAILED)
                .with_error_message(Some(StrBytes::from_string(message)));
            (req.answer(&resp), Outcome::Rejected)
        }
    }
}

/// A response frame: size, header (the version `api_key` answers `version`
/// with), body.
fn encode_response<R: Encodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &R,
) -> Bytes {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, api_key.response_header_version(version))
        .expect("fake broker: encode a response header");
    response
        .encode(&mut buf, version)
        .unwrap_or_else(|e| panic!("fake broker: encode the {api_key:?} v{version} response: {e}"));
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

/// A handler for tests that need nothing but SASL and version negotiation:
/// every other request closes the connection.
pub fn no_handler(_: &Req) -> Reply {
    Reply::Close
}
