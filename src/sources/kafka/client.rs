//! A minimal Kafka client on the wire protocol: one connection per broker,
//! one request in flight per connection, API versions negotiated per broker,
//! TLS and SASL (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), re-authenticated
//! before the session the broker granted runs out (KIP-368). It sends only
//! the read requests the source needs (and the group-membership requests of
//! the election); it never joins or commits for a watched group. The one
//! writer is `dead-letters replay --topic` (`replay.rs`: `InitProducerId`
//! and `Produce`), run by a person with credentials of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use super::config::{Credentials, KafkaSecurity, SaslMechanism, SaslSettings, TokenSettings};
use super::{oauth, scram};

/// Largest response the client accepts (a fetch is capped far below this).
const MAX_RESPONSE: usize = 128 * 1024 * 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("cannot connect to {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("{addr}: {message}")]
    Io { addr: String, message: String },
    #[error("{addr}: authentication failed: {message}")]
    Auth { addr: String, message: String },
    #[error("{addr}: the broker supports no version of {api} that inboxwatch speaks")]
    Unsupported { addr: String, api: &'static str },
    #[error("{0}")]
    Protocol(String),
    #[error("request to {addr} timed out after {after:?}")]
    Timeout { addr: String, after: Duration },
}

impl KafkaError {
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            KafkaError::Connect { .. } | KafkaError::Timeout { .. }
        )
    }

    /// The connection broke while a request was written or its answer
    /// read (a broker closes connections idle longer than its
    /// `connections.max.idle.ms`): a new connection may well succeed.
    pub fn is_broken_connection(&self) -> bool {
        matches!(self, KafkaError::Io { .. })
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// The versions of each API this client implements: (min, max). A request
/// is sent at the highest version both sides speak.
fn implemented(key: i16) -> Option<(i16, i16)> {
    Some(match ApiKey::try_from(key).ok()? {
        // v11: the last version before tagged fields; some brokers send
        // tagged fields in flexible fetch responses that their version lacks.
        ApiKey::Fetch => (4, 11),
        ApiKey::ListOffsets => (1, 7),
        ApiKey::Metadata => (1, 12),
        ApiKey::OffsetFetch => (1, 8),
        ApiKey::FindCoordinator => (0, 4),
        // The election's group requests stay below the flexible versions,
        // which every broker since 2.3 answers and some mock brokers parse
        // badly.
        ApiKey::JoinGroup => (0, 5),
        ApiKey::Heartbeat => (0, 3),
        ApiKey::LeaveGroup => (0, 3),
        ApiKey::SyncGroup => (0, 3),
        ApiKey::DescribeGroups => (0, 5),
        // v5: each group's type (`classic` or KIP-848's `consumer`).
        ApiKey::ListGroups => (0, 5),
        ApiKey::ConsumerGroupDescribe => (0, 1),
        ApiKey::SaslHandshake => (1, 1),
        ApiKey::SaslAuthenticate => (0, 2),
        ApiKey::ApiVersions => (0, 3),
        // `dead-letters replay --topic` only, with the write credentials of
        // `[sources.dead_letter_actions]`. InitProducerId up to v4: tansu
        // 0.6 answers an idempotent producer only from v3 on, which carries
        // the producer id and epoch (-1, -1). Produce below the flexible
        // versions.
        ApiKey::InitProducerId => (0, 4),
        ApiKey::Produce => (3, 8),
        _ => return None,
    })
}

/// One connection to one broker.
pub struct Connection {
    addr: String,
    stream: Box<dyn Stream>,
    correlation: i32,
    client_id: StrBytes,
    versions: HashMap<i16, i16>,
    /// The broker's own (min, max) per API key.
    ranges: HashMap<i16, (i16, i16)>,
    timeout: Duration,
    /// What the connection authenticated with, for re-authentication.
    auth: Option<Auth>,
    /// When the SASL session must be renewed (KIP-368): before the first
    /// request after it. `None`: the session does not expire.
    reauthenticate_at: Option<Instant>,
    /// The length of the last session the broker granted.
    session_lifetime: Option<Duration>,
}

/// SASL settings and the tokens of their connector.
#[derive(Clone)]
struct Auth {
    security: Arc<KafkaSecurity>,
    tokens: Arc<oauth::Tokens>,
}

impl Auth {
    fn sasl(&self) -> &SaslSettings {
        self.security
            .sasl
            .as_ref()
            .expect("Auth is made only with SASL settings")
    }
}

/// The share of a session's lifetime after which the next request first
/// re-authenticates (Kafka's Java client renews at 85 to 95 %).
const REAUTHENTICATE_AFTER: f64 = 0.85;

/// How to reach brokers: TLS, SASL, client id, timeouts.
#[derive(Clone)]
pub struct Connector {
    pub client_id: String,
    pub security: Arc<KafkaSecurity>,
    pub tls: Option<tokio_rustls::TlsConnector>,
    /// Longest wait for one request's answer.
    pub timeout: Duration,
    /// OAUTHBEARER tokens shared by the connections this connector opens.
    tokens: Arc<oauth::Tokens>,
    /// Longest wait for a new connection (TCP and TLS handshake each).
    pub connect_timeout: Duration,
}

impl Connector {
    pub fn new(client_id: String, security: KafkaSecurity, timeout: Duration) -> Connector {
        let tls = security
            .tls
            .as_ref()
            .map(|t| tokio_rustls::TlsConnector::from(t.client_config.clone()));
        Connector {
            client_id,
            security: Arc::new(security),
            tls,
            timeout,
            tokens: Arc::default(),
            connect_timeout: timeout,
        }
    }

    /// The same with a shorter wait for new connections, so that a broker
    /// that does not answer costs a cycle little.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Connector {
        self.connect_timeout = connect_timeout.min(self.timeout);
        self
    }

    /// Connects to the first of `brokers` that answers (the bootstrap list).
    pub async fn connect_any(&self, brokers: &[String]) -> Result<Connection, KafkaError> {
        let mut last = KafkaError::Protocol("no bootstrap brokers configured".into());
        for addr in brokers {
            match self.connect(addr).await {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Connects, negotiates versions and authenticates.
    pub async fn connect(&self, addr: &str) -> Result<Connection, KafkaError> {
        let connect_err = |message: String| KafkaError::Connect {
            addr: addr.to_string(),
            message,
        };
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_err(format!("no answer within {:?}", self.connect_timeout)))?
            .map_err(|e| connect_err(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Stream> = match &self.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| connect_err(format!("not a TLS server name: {e}")))?;
                let s = tokio::time::timeout(self.connect_timeout, tls.connect(name, tcp))
                    .await
                    .map_err(|_| connect_err("TLS handshake timed out".into()))?
                    .map_err(|e| connect_err(format!("TLS handshake failed: {e}")))?;
                Box::new(s)
            }
        };
        let mut conn = Connection {
            addr: addr.to_string(),
            stream,
            correlation: 0,
            client_id: StrBytes::from_string(self.client_id.clone()),
            versions: HashMap::new(),
            ranges: HashMap::new(),
            timeout: self.timeout,
            auth: self.security.sasl.is_some().then(|| Auth {
                security: self.security.clone(),
                tokens: self.tokens.clone(),
            }),
            reauthenticate_at: None,
            session_lifetime: None,
        };
        conn.negotiate().await?;
        conn.authenticate().await?;
        Ok(conn)
    }
}

impl Connection {
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn negotiate(&mut self) -> Result<(), KafkaError> {
        // v0: every broker answers it (newer versions add nothing the
        // negotiation needs, and some brokers drop a connection that sends a
        // version they do not know instead of answering UNSUPPORTED_VERSION).
        let resp: ApiVersionsResponse = self.roundtrip(&ApiVersionsRequest::default(), 0).await?;
        if resp.error_code != 0 {
            return Err(self.protocol(format!("ApiVersions failed with {}", resp.error_code)));
        }
        for k in &resp.api_keys {
            self.ranges
                .insert(k.api_key, (k.min_version, k.max_version));
            if let Some((lo, hi)) = implemented(k.api_key) {
                let v = hi.min(k.max_version);
                if v >= lo.max(k.min_version) {
                    self.versions.insert(k.api_key, v);
                }
            }
        }
        Ok(())
    }

    /// The version `R` is sent at on this connection.
    pub fn version<R: Request>(&self) -> Result<i16, KafkaError> {
        self.versions
            .get(&R::KEY)
            .copied()
            .ok_or_else(|| KafkaError::Unsupported {
                addr: self.addr.clone(),
                api: api_name(R::KEY),
            })
    }

    /// The lowest version of `R` the broker takes.
    pub fn broker_min<R: Request>(&self) -> Option<i16> {
        self.ranges.get(&R::KEY).map(|r| r.0)
    }

    /// Sends `req` at a version of the caller's choice (one both sides speak).
    pub async fn send_at<R: Request>(
        &mut self,
        req: &R,
        version: i16,
    ) -> Result<R::Response, KafkaError> {
        self.reauthenticate_if_due().await?;
        self.roundtrip(req, version).await
    }

    /// Sends `req` at the negotiated version and reads its response.
    pub async fn send<R: Request>(&mut self, req: &R) -> Result<R::Response, KafkaError> {
        let v = self.version::<R>()?;
        self.reauthenticate_if_due().await?;
        self.roundtrip(req, v).await
    }

    async fn roundtrip<R: Request>(
        &mut self,
        req: &R,
        version: i16,
    ) -> Result<R::Response, KafkaError> {
        let after = self.timeout;
        match tokio::time::timeout(after, self.roundtrip_inner(req, version)).await {
            Ok(r) => r,
            Err(_) => Err(KafkaError::Timeout {
                addr: self.addr.clone(),
                after,
            }),
        }
    }

    /// Sends `req` and returns the response body undecoded (after its
    /// header), for responses some brokers encode loosely.
    pub async fn send_raw<R: Request>(&mut self, req: &R) -> Result<Bytes, KafkaError> {
        let v = self.version::<R>()?;
        self.reauthenticate_if_due().await?;
        let after = self.timeout;
        match tokio::time::timeout(after, self.exchange(req, v)).await {
            Ok(r) => r,
            Err(_) => Err(KafkaError::Timeout {
                addr: self.addr.clone(),
                after,
            }),
        }
    }

    async fn roundtrip_inner<R: Request>(
        &mut self,
        req: &R,
        version: i16,
    ) -> Result<R::Response, KafkaError> {
        let mut body = self.exchange(req, version).await?;
        let resp = R::Response::decode(&mut body, version).map_err(|e| {
            self.protocol(format!(
                "decoding the {} v{version} response: {e}",
                api_name(R::KEY)
            ))
        })?;
        Ok(resp)
    }

    /// Writes one request, reads its response up to the end of the header.
    async fn exchange<R: Request>(&mut self, req: &R, version: i16) -> Result<Bytes, KafkaError> {
        self.correlation = self.correlation.wrapping_add(1);
        let correlation = self.correlation;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(self.client_id.clone()));
        let mut buf = BytesMut::with_capacity(256);
        buf.put_i32(0);
        header
            .encode(&mut buf, R::header_version(version))
            .map_err(|e| self.protocol(format!("encoding a request header: {e}")))?;
        req.encode(&mut buf, version)
            .map_err(|e| self.protocol(format!("encoding {} v{version}: {e}", api_name(R::KEY))))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let io = |e: std::io::Error, addr: &str| KafkaError::Io {
            addr: addr.to_string(),
            message: format!("{} v{version}: {e}", api_name(R::KEY)),
        };
        self.stream
            .write_all(&buf)
            .await
            .map_err(|e| io(e, &self.addr))?;
        self.stream.flush().await.map_err(|e| io(e, &self.addr))?;
        let len = self
            .stream
            .read_i32()
            .await
            .map_err(|e| io(e, &self.addr))?;
        if len < 0 || len as usize > MAX_RESPONSE {
            return Err(self.protocol(format!("response of {len} bytes")));
        }
        let mut body = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut body)
            .await
            .map_err(|e| io(e, &self.addr))?;
        let mut body = Bytes::from(body);
        let rh = ResponseHeader::decode(&mut body, R::Response::header_version(version))
            .map_err(|e| self.protocol(format!("decoding a response header: {e}")))?;
        if rh.correlation_id != correlation {
            return Err(self.protocol(format!(
                "response correlation id {} for request {correlation}",
                rh.correlation_id
            )));
        }
        Ok(body)
    }

    fn protocol(&self, message: String) -> KafkaError {
        KafkaError::Protocol(format!("{}: {message}", self.addr))
    }

    /// How long the broker's last SASL session on this connection lasts
    /// (KIP-368); `None`: no SASL, or a session without an end.
    pub fn session_lifetime(&self) -> Option<Duration> {
        self.session_lifetime
    }

    /// Renews the SASL session on this connection when it is due (KIP-368:
    /// `SaslHandshake` and `SaslAuthenticate` again, which a broker accepts
    /// even after the session ran out; any other request then closes the
    /// connection). A failure is the request's error: the caller drops the
    /// connection and the next request connects anew.
    async fn reauthenticate_if_due(&mut self) -> Result<(), KafkaError> {
        if self
            .reauthenticate_at
            .is_some_and(|at| Instant::now() >= at)
        {
            self.authenticate().await?;
            debug!(broker = %self.addr, "Re-authenticated the SASL session.");
        }
        Ok(())
    }

    /// Authenticates with the connector's SASL settings, if any, and notes
    /// when the session the broker grants must be renewed.
    async fn authenticate(&mut self) -> Result<(), KafkaError> {
        let Some(auth) = self.auth.clone() else {
            return Ok(());
        };
        let sasl = auth.sasl();
        let started = Instant::now();
        self.reauthenticate_at = None;
        let auth_err = |addr: &str, message: String| KafkaError::Auth {
            addr: addr.to_string(),
            message,
        };
        let mechanism = sasl.mechanism;
        let hs = SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str(mechanism.as_str()));
        let v = self.version::<SaslHandshakeRequest>()?;
        let resp = self.roundtrip(&hs, v).await?;
        if resp.error_code != 0 {
            let offered: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(auth_err(
                &self.addr,
                format!(
                    "the broker does not accept {} (it offers {})",
                    mechanism.as_str(),
                    offered.join(", ")
                ),
            ));
        }
        let last = match (&sasl.credentials, mechanism) {
            (Credentials::Password { username, password }, SaslMechanism::Plain) => {
                let mut token = Vec::new();
                token.push(0);
                token.extend_from_slice(username.as_bytes());
                token.push(0);
                token.extend_from_slice(password.expose().as_bytes());
                self.sasl_step(Bytes::from(token)).await?
            }
            (Credentials::Password { username, password }, _) => {
                let mut scram = scram::Client::new(mechanism, username, password.expose());
                let first = scram.client_first();
                let server_first = self.sasl_step(Bytes::from(first)).await?;
                let final_msg = scram
                    .client_final(&server_first.auth_bytes)
                    .map_err(|m| auth_err(&self.addr, m))?;
                let server_final = self.sasl_step(Bytes::from(final_msg)).await?;
                scram
                    .verify_server(&server_final.auth_bytes)
                    .map_err(|m| auth_err(&self.addr, m))?;
                server_final
            }
            (Credentials::Token(settings), _) => self.oauth_bearer(&auth, settings).await?,
        };
        self.session_lifetime = None;
        if last.session_lifetime_ms > 0 {
            let lifetime = Duration::from_millis(last.session_lifetime_ms as u64);
            self.reauthenticate_at = Some(started + lifetime.mul_f64(REAUTHENTICATE_AFTER));
            self.session_lifetime = Some(lifetime);
        }
        Ok(())
    }

    /// OAUTHBEARER's exchange: the token with its extensions; a refusal
    /// (an error code, or RFC 7628's error challenge, acknowledged so that
    /// the broker ends the exchange with its message) drops the token kept
    /// for the next authentication.
    async fn oauth_bearer(
        &mut self,
        auth: &Auth,
        settings: &TokenSettings,
    ) -> Result<SaslAuthenticateResponse, KafkaError> {
        let auth_err = |addr: &str, message: String| KafkaError::Auth {
            addr: addr.to_string(),
            message,
        };
        let refused = |why: String| {
            format!(
                "the broker refused the OAUTHBEARER token of {}: {why}",
                settings.source_key()
            )
        };
        let token = auth
            .tokens
            .token(settings)
            .await
            .map_err(|m| auth_err(&self.addr, m))?;
        let first = oauth::client_first(&token, &settings.extensions);
        drop(token);
        let resp = self
            .sasl_exchange(Bytes::from(first))
            .await
            .inspect_err(|_| auth.tokens.forget())?;
        if resp.error_code != 0 {
            auth.tokens.forget();
            return Err(auth_err(&self.addr, refused(sasl_error(&resp))));
        }
        if !resp.auth_bytes.is_empty() {
            auth.tokens.forget();
            let challenge = oauth::server_error(&resp.auth_bytes);
            let why = match self
                .sasl_exchange(Bytes::from_static(oauth::ERROR_ACKNOWLEDGEMENT))
                .await
            {
                Ok(last) if last.error_code != 0 => format!("{} ({challenge})", sasl_error(&last)),
                _ => challenge,
            };
            return Err(auth_err(&self.addr, refused(why)));
        }
        Ok(resp)
    }

    /// One `SaslAuthenticate` round trip that must succeed.
    async fn sasl_step(&mut self, token: Bytes) -> Result<SaslAuthenticateResponse, KafkaError> {
        let resp = self.sasl_exchange(token).await?;
        if resp.error_code != 0 {
            return Err(KafkaError::Auth {
                addr: self.addr.clone(),
                message: sasl_error(&resp),
            });
        }
        Ok(resp)
    }

    /// One `SaslAuthenticate` round trip, its answer as it is.
    async fn sasl_exchange(
        &mut self,
        token: Bytes,
    ) -> Result<SaslAuthenticateResponse, KafkaError> {
        let req = SaslAuthenticateRequest::default().with_auth_bytes(token);
        let v = self.version::<SaslAuthenticateRequest>()?;
        self.roundtrip(&req, v).await
    }
}

/// The broker's message of a failed `SaslAuthenticate`, or its error code.
fn sasl_error(resp: &SaslAuthenticateResponse) -> String {
    resp.error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_else(|| error_name(resp.error_code))
}

/// A readable name of an API key for errors.
pub fn api_name(key: i16) -> &'static str {
    match ApiKey::try_from(key) {
        Ok(ApiKey::Fetch) => "Fetch",
        Ok(ApiKey::ListOffsets) => "ListOffsets",
        Ok(ApiKey::Metadata) => "Metadata",
        Ok(ApiKey::OffsetFetch) => "OffsetFetch",
        Ok(ApiKey::FindCoordinator) => "FindCoordinator",
        Ok(ApiKey::JoinGroup) => "JoinGroup",
        Ok(ApiKey::Heartbeat) => "Heartbeat",
        Ok(ApiKey::LeaveGroup) => "LeaveGroup",
        Ok(ApiKey::SyncGroup) => "SyncGroup",
        Ok(ApiKey::DescribeGroups) => "DescribeGroups",
        Ok(ApiKey::ListGroups) => "ListGroups",
        Ok(ApiKey::ConsumerGroupDescribe) => "ConsumerGroupDescribe",
        Ok(ApiKey::SaslHandshake) => "SaslHandshake",
        Ok(ApiKey::SaslAuthenticate) => "SaslAuthenticate",
        Ok(ApiKey::ApiVersions) => "ApiVersions",
        Ok(ApiKey::InitProducerId) => "InitProducerId",
        Ok(ApiKey::Produce) => "Produce",
        _ => "an API",
    }
}

/// The name of a Kafka error code, for messages.
pub fn error_name(code: i16) -> String {
    match kafka_protocol::ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?}"),
        None => format!("error code {code}"),
    }
}
