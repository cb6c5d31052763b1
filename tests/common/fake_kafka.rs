//! A fake Kafka broker for the tests no real broker here can serve: SASL
//! session lifetimes (KIP-368; tansu does not enforce
//! `connections.max.reauth.ms`), OAUTHBEARER (KIP-255), and answers a test
//! writes itself (KIP-848 group descriptions, injected errors).
//!
//! It speaks the wire protocol with `kafka-protocol`'s broker half (over TLS
//! with a certificate the test gives, [`FakeConfig::with_tls`]): one task
//! per connection reads size-prefixed requests, decodes the request header
//! for its API key and version, and answers `ApiVersions` (the versions the
//! test configured), `SaslHandshake` / `SaslAuthenticate` (when the test
//! configured SASL, with its check function and session lifetime) itself;
//! every other request goes to the test's [`Handler`], which decodes the body
//! it expects ([`Req::decode`]) and returns the response ([`Req::answer`]) or
//! closes the connection. Every request is recorded (connection, API key,
//! version, what happened to it), and every SASL step with its bytes.
//!
//! [`Cluster`] is a ready handler: a one-broker cluster with topics, records
//! of given timestamps, groups with committed offsets, and a coordinator for
//! the agents' election group.
//!
//! As a KIP-368 broker does, a connection whose session has expired is
//! closed on its next request that is not a re-authentication
//! (`SaslHandshake`), without an answer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::consumer_group_describe_response;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse, DescribeGroupsRequest, DescribeGroupsResponse, FetchRequest,
    FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupResponse, ListGroupsResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetFetchRequest,
    OffsetFetchResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse, SyncGroupResponse,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
    /// TLS on every connection: (certificate chain PEM, private key PEM).
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
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
            tls: None,
        }
    }
}

impl FakeConfig {
    /// Serves TLS with this certificate chain and key (PEM).
    pub fn with_tls(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> FakeConfig {
        self.tls = Some((cert_pem, key_pem));
        self
    }

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
    /// Authenticated, answering these bytes (SCRAM's server-final message).
    AcceptWith(Vec<u8>),
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
    /// Received while the fake was silent: never answered.
    Unanswered,
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
    /// The frame, written only after the delay (the connection waits; others
    /// are answered meanwhile).
    Delayed(Duration, Bytes),
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
    /// Requests are read and never answered.
    silent: AtomicBool,
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
            silent: AtomicBool::new(false),
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
                    let _ = stream.set_nodelay(true);
                    tokio::select! {
                        _ = accept(&s, conn, addr, stream) => {}
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

    /// While `true`, every request, on open connections and new ones, is
    /// read and never answered: a broker whose host is gone or that froze,
    /// as a client sees it (connections stay open, nothing comes back).
    pub fn set_silent(&self, silent: bool) {
        self.shared.silent.store(silent, Ordering::SeqCst);
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

/// Serves one connection, over TLS if the fake has a certificate.
async fn accept(s: &Shared, conn: u64, broker: SocketAddr, stream: TcpStream) {
    match &s.config.tls {
        None => serve(s, conn, broker, stream).await,
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .expect("fake broker: a PEM certificate chain");
            let key = PrivateKeyDer::from_pem_slice(key).expect("fake broker: a PEM private key");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("fake broker: TLS versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("fake broker: the certificate fits its key");
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            if let Ok(tls) = acceptor.accept(stream).await {
                serve(s, conn, broker, tls).await;
            }
        }
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    s: &Shared,
    conn: u64,
    broker: SocketAddr,
    mut stream: S,
) {
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
        if s.silent.load(Ordering::SeqCst) {
            record(s, &req, Outcome::Unanswered);
            // Held open, unanswered, until the fake closes its connections.
            return std::future::pending().await;
        }
        let (reply, outcome) = dispatch(s, &req, &mut auth);
        record(s, &req, outcome);
        match reply {
            Reply::Answer(frame) => {
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
            }
            Reply::Delayed(delay, frame) => {
                tokio::time::sleep(delay).await;
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

fn record(s: &Shared, req: &Req, outcome: Outcome) {
    s.requests.lock().unwrap().push(Recorded {
        conn: req.conn,
        api_key: req.api_key as i16,
        version: req.version,
        client_id: req.header.client_id.as_ref().map(|c| c.to_string()),
        at: Instant::now(),
        outcome,
    });
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
        SaslVerdict::Accept | SaslVerdict::AcceptWith(_) => {
            let lifetime = sasl.session_lifetime_ms;
            let expires =
                (lifetime > 0).then(|| Instant::now() + Duration::from_millis(lifetime as u64));
            *auth = Auth::Done { expires };
            let bytes = match verdict {
                SaslVerdict::AcceptWith(b) => Bytes::from(b),
                _ => Bytes::new(),
            };
            let resp = SaslAuthenticateResponse::default()
                .with_session_lifetime_ms(lifetime)
                .with_auth_bytes(bytes);
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

/// A SCRAM-SHA-256 server (RFC 5802, RFC 7677) for `user` / `password`, as
/// a check function: the server-first message (salt, 4096 iterations), then
/// the client's proof verified and the server signature sent with success.
/// Its state is per connection, so renewals on open connections work.
pub fn scram_sha256(
    user: &str,
    password: &str,
) -> impl Fn(&SaslStep<'_>) -> SaslVerdict + Send + Sync + 'static {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as B64;
    use hmac::{KeyInit, Mac};
    use sha2::Digest as _;
    fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut mac =
            <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }
    const ITERATIONS: u32 = 4096;
    let salt = b"fake-kafka-salt".to_vec();
    // PBKDF2-HMAC-SHA-256, one block.
    let mut block = salt.clone();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password.as_bytes(), &block);
    let mut salted = u.clone();
    for _ in 1..ITERATIONS {
        u = hmac(password.as_bytes(), &u);
        for (o, x) in salted.iter_mut().zip(&u) {
            *o ^= x;
        }
    }
    let user = user.to_string();
    // Per connection: (client-first-bare, server-first).
    let pending: Mutex<HashMap<u64, (String, String)>> = Mutex::new(HashMap::new());
    move |step| {
        let text = String::from_utf8_lossy(step.auth_bytes).to_string();
        if step.step == 0 {
            let Some(bare) = text.strip_prefix("n,,") else {
                return SaslVerdict::Reject("SCRAM: no GS2 header".into());
            };
            let mut name = None;
            let mut nonce = None;
            for part in bare.split(',') {
                if let Some(v) = part.strip_prefix("n=") {
                    name = Some(v.to_string());
                } else if let Some(v) = part.strip_prefix("r=") {
                    nonce = Some(v.to_string());
                }
            }
            if name.as_deref() != Some(user.as_str()) {
                return SaslVerdict::Reject("SCRAM: unknown user".into());
            }
            let Some(nonce) = nonce else {
                return SaslVerdict::Reject("SCRAM: no nonce".into());
            };
            let server_first = format!(
                "r={nonce}{:08x},s={},i={ITERATIONS}",
                fastrand::u32(..),
                B64.encode(&salt)
            );
            pending
                .lock()
                .unwrap()
                .insert(step.conn, (bare.to_string(), server_first.clone()));
            return SaslVerdict::Challenge(server_first.into_bytes());
        }
        let Some((bare, server_first)) = pending.lock().unwrap().remove(&step.conn) else {
            return SaslVerdict::Reject("SCRAM: no exchange in progress".into());
        };
        let Some((without_proof, proof)) = text.rsplit_once(",p=") else {
            return SaslVerdict::Reject("SCRAM: no proof".into());
        };
        let auth_message = format!("{bare},{server_first},{without_proof}");
        let client_key = hmac(&salted, b"Client Key");
        let stored_key = sha2::Sha256::digest(&client_key).to_vec();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let expected: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        if B64.decode(proof).ok() != Some(expected) {
            return SaslVerdict::Reject("SCRAM: wrong proof".into());
        }
        let server_key = hmac(&salted, b"Server Key");
        let verifier = hmac(&server_key, auth_message.as_bytes());
        SaslVerdict::AcceptWith(format!("v={}", B64.encode(verifier)).into_bytes())
    }
}

/// A handler for tests that need nothing but SASL and version negotiation:
/// every other request closes the connection.
pub fn no_handler(_: &Req) -> Reply {
    Reply::Close
}

// ---------------------------------------------------------------------------------
// A one-broker cluster model
// ---------------------------------------------------------------------------------

/// A consumer group of a [`Cluster`].
#[derive(Debug, Clone, Default)]
pub struct FakeGroup {
    /// Members `DescribeGroups` (classic) or `ConsumerGroupDescribe` (KIP-848)
    /// reports.
    pub members: usize,
    /// Committed offsets by (topic, partition).
    pub committed: BTreeMap<(String, i32), i64>,
    pub protocol: GroupProtocol,
}

/// The group protocol of a [`FakeGroup`], as `ListGroups` v5 types it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// Described by `DescribeGroups` (members without assignments).
    #[default]
    Classic,
    /// KIP-848: listed from `ListGroups` v5 on only (a broker before it has
    /// none), described by `ConsumerGroupDescribe` (member i assigned
    /// partition i of each topic the group committed on, at this group
    /// epoch); `DescribeGroups` answers it `Dead`, as Kafka 4 does.
    Consumer { epoch: i32 },
    /// KIP-932: protocol type `share`; `DescribeGroups` answers it `Dead`.
    Share,
}

/// A cluster of one broker (the fake itself) that answers what the Kafka
/// source and the agents' election send: `Metadata`, `ListOffsets`,
/// `ListGroups` (with group types from v5), `DescribeGroups`,
/// `ConsumerGroupDescribe`, `OffsetFetch` (v1–7 and batched v8+),
/// `Fetch` (a batch of the records from the asked offset, with the
/// timestamps the test gave), `FindCoordinator`, and a group coordinator
/// that makes every member of any other group (the election's) its leader.
/// Tests change it between cycles through [`Cluster::handler`]'s shared
/// state.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The broker id the fake has in the metadata.
    pub node_id: i32,
    /// Topic → partitions → the CreateTime (ms) of each record; a record's
    /// offset is its index.
    pub topics: BTreeMap<String, Vec<Vec<i64>>>,
    pub groups: BTreeMap<String, FakeGroup>,
    /// Delays of the next SyncGroup answers, one each, first first (a
    /// coordinator slow to complete a rebalance).
    pub sync_delays: std::collections::VecDeque<Duration>,
    /// Members the coordinator has handed out ids to.
    joined: u64,
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster {
            node_id: 1,
            topics: BTreeMap::new(),
            groups: BTreeMap::new(),
            sync_delays: Default::default(),
            joined: 0,
        }
    }
}

impl Cluster {
    /// A handler answering from `cluster` (locked per request); other APIs
    /// close the connection.
    pub fn handler(cluster: Arc<Mutex<Cluster>>) -> impl Fn(&Req) -> Reply + Send + Sync {
        move |req| cluster.lock().unwrap().answer(req)
    }

    /// The answer to `req`, or `Close` for an API the model does not know.
    pub fn answer(&mut self, req: &Req) -> Reply {
        match req.api_key {
            ApiKey::Metadata => req.answer(&self.metadata(req)),
            ApiKey::ListOffsets => req.answer(&self.list_offsets(req)),
            ApiKey::ListGroups => req.answer(&self.list_groups(req)),
            ApiKey::DescribeGroups => req.answer(&self.describe_groups(req)),
            ApiKey::OffsetFetch => req.answer(&self.offset_fetch(req)),
            ApiKey::Fetch => req.answer(&self.fetch(req)),
            ApiKey::FindCoordinator => req.answer(&self.find_coordinator(req)),
            ApiKey::ConsumerGroupDescribe => req.answer(&self.consumer_group_describe(req)),
            ApiKey::JoinGroup => {
                let join: JoinGroupRequest = req.decode();
                let member = if join.member_id.is_empty() {
                    self.joined += 1;
                    format!("fake-member-{}", self.joined)
                } else {
                    join.member_id.to_string()
                };
                let member = StrBytes::from_string(member);
                req.answer(
                    &JoinGroupResponse::default()
                        .with_generation_id(1)
                        .with_protocol_type(Some(join.protocol_type.clone()))
                        .with_protocol_name(join.protocols.first().map(|p| p.name.clone()))
                        .with_leader(member.clone())
                        .with_member_id(member.clone())
                        .with_members(vec![
                            JoinGroupResponseMember::default().with_member_id(member),
                        ]),
                )
            }
            ApiKey::SyncGroup => match (
                req.answer(&SyncGroupResponse::default()),
                self.sync_delays.pop_front(),
            ) {
                (Reply::Answer(frame), Some(delay)) => Reply::Delayed(delay, frame),
                (reply, _) => reply,
            },
            ApiKey::Heartbeat => req.answer(&HeartbeatResponse::default()),
            ApiKey::LeaveGroup => req.answer(&LeaveGroupResponse::default()),
            _ => Reply::Close,
        }
    }

    fn hwm(&self, topic: &str, partition: i32) -> Option<i64> {
        let parts = self.topics.get(topic)?;
        let records = parts.get(usize::try_from(partition).ok()?)?;
        Some(records.len() as i64)
    }

    fn metadata(&self, req: &Req) -> MetadataResponse {
        let asked: MetadataRequest = req.decode();
        let wanted: Option<Vec<String>> = asked.topics.map(|ts| {
            ts.iter()
                .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
                .collect()
        });
        let names: Vec<String> = match wanted {
            Some(w) => w,
            None => self.topics.keys().cloned().collect(),
        };
        let node = BrokerId(self.node_id);
        let topics = names
            .into_iter()
            .map(|name| {
                let topic = MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
                match self.topics.get(&name) {
                    None => topic.with_error_code(3),
                    Some(parts) => topic.with_partitions(
                        (0..parts.len() as i32)
                            .map(|p| {
                                MetadataResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_leader_id(node)
                                    .with_replica_nodes(vec![node])
                                    .with_isr_nodes(vec![node])
                            })
                            .collect(),
                    ),
                }
            })
            .collect();
        MetadataResponse::default()
            .with_brokers(vec![
                MetadataResponseBroker::default()
                    .with_node_id(node)
                    .with_host(StrBytes::from_string(req.broker.ip().to_string()))
                    .with_port(i32::from(req.broker.port())),
            ])
            .with_controller_id(node)
            .with_topics(topics)
    }

    fn list_offsets(&self, req: &Req) -> ListOffsetsResponse {
        let asked: ListOffsetsRequest = req.decode();
        let topics = asked
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let answer = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index);
                        match self.hwm(t.name.0.as_str(), p.partition_index) {
                            None => answer.with_error_code(3).with_offset(-1),
                            Some(hwm) => answer
                                .with_timestamp(-1)
                                .with_offset(if p.timestamp == -2 { 0 } else { hwm }),
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions)
            })
            .collect();
        ListOffsetsResponse::default().with_topics(topics)
    }

    fn list_groups(&self, req: &Req) -> ListGroupsResponse {
        ListGroupsResponse::default().with_groups(
            self.groups
                .iter()
                .filter(|(_, g)| {
                    req.version >= 5 || !matches!(g.protocol, GroupProtocol::Consumer { .. })
                })
                .map(|(name, g)| {
                    let (protocol_type, group_type) = match g.protocol {
                        GroupProtocol::Classic => ("consumer", "classic"),
                        GroupProtocol::Consumer { .. } => ("consumer", "consumer"),
                        GroupProtocol::Share => ("share", "share"),
                    };
                    ListedGroup::default()
                        .with_group_id(GroupId(StrBytes::from_string(name.clone())))
                        .with_protocol_type(StrBytes::from_static_str(protocol_type))
                        .with_group_state(StrBytes::from_static_str(if g.members > 0 {
                            "Stable"
                        } else {
                            "Empty"
                        }))
                        .with_group_type(StrBytes::from_static_str(group_type))
                })
                .collect(),
        )
    }

    fn consumer_group_describe(&self, req: &Req) -> ConsumerGroupDescribeResponse {
        use consumer_group_describe_response::{
            Assignment, DescribedGroup, Member, TopicPartitions,
        };
        let asked: ConsumerGroupDescribeRequest = req.decode();
        let groups = asked
            .group_ids
            .iter()
            .map(|id| {
                let described = DescribedGroup::default().with_group_id(id.clone());
                let Some((g, epoch)) =
                    self.groups
                        .get(id.0.as_str())
                        .and_then(|g| match g.protocol {
                            GroupProtocol::Consumer { epoch } => Some((g, epoch)),
                            _ => None,
                        })
                else {
                    return described.with_error_code(69); // GROUP_ID_NOT_FOUND
                };
                let mut topics: Vec<&str> = g.committed.keys().map(|(t, _)| t.as_str()).collect();
                topics.dedup();
                let members = (0..g.members as i32)
                    .map(|m| {
                        let assigned = topics
                            .iter()
                            .map(|t| {
                                TopicPartitions::default()
                                    .with_topic_name(TopicName(StrBytes::from_string(
                                        t.to_string(),
                                    )))
                                    .with_partitions(vec![m])
                            })
                            .collect();
                        Member::default()
                            .with_member_id(StrBytes::from_string(format!("member-{m}")))
                            .with_member_epoch(epoch)
                            .with_client_id(StrBytes::from_static_str("fake-consumer"))
                            .with_client_host(StrBytes::from_static_str("/10.0.0.1"))
                            .with_subscribed_topic_names(
                                topics
                                    .iter()
                                    .map(|t| TopicName(StrBytes::from_string(t.to_string())))
                                    .collect(),
                            )
                            .with_assignment(Assignment::default().with_topic_partitions(assigned))
                    })
                    .collect();
                described
                    .with_group_state(StrBytes::from_static_str("Stable"))
                    .with_group_epoch(epoch)
                    .with_assignment_epoch(epoch)
                    .with_assignor_name(StrBytes::from_static_str("uniform"))
                    .with_members(members)
            })
            .collect();
        ConsumerGroupDescribeResponse::default().with_groups(groups)
    }

    fn describe_groups(&self, req: &Req) -> DescribeGroupsResponse {
        let asked: DescribeGroupsRequest = req.decode();
        DescribeGroupsResponse::default().with_groups(
            asked
                .groups
                .iter()
                .map(|id| {
                    let described = DescribedGroup::default()
                        .with_group_id(id.clone())
                        .with_protocol_type(StrBytes::from_static_str("consumer"));
                    match self
                        .groups
                        .get(id.0.as_str())
                        .filter(|g| g.protocol == GroupProtocol::Classic)
                    {
                        // Unknown, or not a classic group.
                        None => described.with_group_state(StrBytes::from_static_str("Dead")),
                        Some(g) => described
                            .with_group_state(StrBytes::from_static_str(if g.members > 0 {
                                "Stable"
                            } else {
                                "Empty"
                            }))
                            .with_members(
                                (0..g.members)
                                    .map(|i| {
                                        DescribedGroupMember::default().with_member_id(
                                            StrBytes::from_string(format!("member-{i}")),
                                        )
                                    })
                                    .collect(),
                            ),
                    }
                })
                .collect(),
        )
    }

    /// A group's committed offsets by topic: (topic, [(partition, offset)]).
    fn committed(&self, group: &str) -> BTreeMap<String, Vec<(i32, i64)>> {
        let mut out: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
        for ((topic, p), offset) in self
            .groups
            .get(group)
            .map(|g| &g.committed)
            .into_iter()
            .flatten()
        {
            out.entry(topic.clone()).or_default().push((*p, *offset));
        }
        out
    }

    fn offset_fetch(&self, req: &Req) -> OffsetFetchResponse {
        let asked: OffsetFetchRequest = req.decode();
        if req.version >= 8 {
            let groups = asked
                .groups
                .iter()
                .map(|g| {
                    let topics = self
                        .committed(g.group_id.0.as_str())
                        .into_iter()
                        .map(|(topic, ps)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(StrBytes::from_string(topic)))
                                .with_partitions(
                                    ps.into_iter()
                                        .map(|(p, offset)| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(offset)
                                                .with_committed_leader_epoch(-1)
                                        })
                                        .collect(),
                                )
                        })
                        .collect();
                    OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id.clone())
                        .with_topics(topics)
                })
                .collect();
            return OffsetFetchResponse::default().with_groups(groups);
        }
        let topics = self
            .committed(asked.group_id.0.as_str())
            .into_iter()
            .map(|(topic, ps)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic)))
                    .with_partitions(
                        ps.into_iter()
                            .map(|(p, offset)| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(offset)
                                    .with_committed_leader_epoch(-1)
                            })
                            .collect(),
                    )
            })
            .collect();
        OffsetFetchResponse::default().with_topics(topics)
    }

    /// Each asked partition: one batch of its records from the fetch offset
    /// (CreateTime as the test gave it), or OFFSET_OUT_OF_RANGE past the end.
    fn fetch(&self, req: &Req) -> FetchResponse {
        let asked: FetchRequest = req.decode();
        let responses = asked
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let name = t.topic.0.as_str();
                        let answer = PartitionData::default().with_partition_index(p.partition);
                        let Some(hwm) = self.hwm(name, p.partition) else {
                            return answer.with_error_code(3);
                        };
                        let answer = answer
                            .with_high_watermark(hwm)
                            .with_last_stable_offset(hwm)
                            .with_log_start_offset(0);
                        if p.fetch_offset < 0 || p.fetch_offset > hwm {
                            return answer.with_error_code(1);
                        }
                        let stamps = &self.topics[name][p.partition as usize];
                        let records: Vec<Record> = (p.fetch_offset..hwm)
                            .map(|offset| Record {
                                transactional: false,
                                control: false,
                                partition_leader_epoch: 0,
                                producer_id: -1,
                                producer_epoch: -1,
                                timestamp_type: TimestampType::Creation,
                                offset,
                                sequence: offset as i32,
                                timestamp: stamps[offset as usize],
                                key: None,
                                value: Some(Bytes::from_static(b"v")),
                                headers: Default::default(),
                                delete_horizon: false,
                            })
                            .collect();
                        if records.is_empty() {
                            return answer.with_records(Some(Bytes::new()));
                        }
                        let mut buf = BytesMut::new();
                        RecordBatchEncoder::encode(
                            &mut buf,
                            &records,
                            &RecordEncodeOptions {
                                version: 2,
                                compression: Compression::None,
                            },
                        )
                        .expect("fake broker: encode a record batch");
                        answer.with_records(Some(buf.freeze()))
                    })
                    .collect();
                FetchableTopicResponse::default()
                    .with_topic(t.topic.clone())
                    .with_partitions(partitions)
            })
            .collect();
        FetchResponse::default().with_responses(responses)
    }

    fn find_coordinator(&self, req: &Req) -> FindCoordinatorResponse {
        let asked: FindCoordinatorRequest = req.decode();
        let host = StrBytes::from_string(req.broker.ip().to_string());
        let port = i32::from(req.broker.port());
        let node = BrokerId(self.node_id);
        if req.version >= 4 {
            FindCoordinatorResponse::default().with_coordinators(
                asked
                    .coordinator_keys
                    .iter()
                    .map(|k| {
                        Coordinator::default()
                            .with_key(k.clone())
                            .with_node_id(node)
                            .with_host(host.clone())
                            .with_port(port)
                    })
                    .collect(),
            )
        } else {
            FindCoordinatorResponse::default()
                .with_node_id(node)
                .with_host(host)
                .with_port(port)
        }
    }
}
