//! The agent's connection to a NATS server and the JetStream API requests
//! it sends: plain requests on `$JS.API.…`, their JSON answers read into
//! the few fields a poll needs (2.9 and later servers answer them alike).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::config::{Auth, NatsSpec};
use crate::sources::poll_loop::SourceError;

/// When the connection was last lost and regained (the event callback's
/// record), for the dead-letter advisories' counting gaps.
#[derive(Debug, Default)]
pub struct Events {
    /// Since when the connection is down, if it is.
    pub down_since: Option<SystemTime>,
    /// Periods the connection was down and came back (from, to), not yet
    /// taken.
    pub outages: Vec<(SystemTime, SystemTime)>,
}

/// Shared with the client's event callback.
pub type SharedEvents = Arc<Mutex<Events>>;

/// The servers as the messages show them (never with credentials: the
/// configuration refuses them in the url).
pub fn servers_text(spec: &NatsSpec) -> String {
    spec.servers.join(",")
}

/// Connects to the source's servers, with its credentials and TLS; a
/// refusal names the key at fault, never the secret.
pub async fn connect(spec: &NatsSpec, events: SharedEvents) -> Result<Client, SourceError> {
    let mut options = match &spec.auth {
        Auth::None => ConnectOptions::new(),
        Auth::Password { user, password } => {
            ConnectOptions::with_user_and_password(user.clone(), password.expose().to_string())
        }
        Auth::Token(t) => ConnectOptions::with_token(t.expose().to_string()),
        Auth::NKey { seed, .. } => ConnectOptions::with_nkey(seed.expose().to_string()),
        Auth::Credentials { jwt, seed, .. } => {
            // Read when the configuration was checked: it is a user seed.
            let pair =
                nkeys::KeyPair::from_seed(seed.expose()).map_err(|_| SourceError::Connect {
                    dsn: servers_text(spec),
                    message: format!("{}.credentials_file: not an NKey seed", spec.key),
                })?;
            let pair = Arc::new(pair);
            ConnectOptions::with_jwt(jwt.clone(), move |nonce| {
                let pair = pair.clone();
                async move { pair.sign(&nonce).map_err(async_nats::AuthError::new) }
            })
        }
    };
    options = options
        .name("inboxwatch")
        .connection_timeout(spec.timeout.min(Duration::from_secs(10)))
        .request_timeout(Some(spec.timeout))
        .ignore_discovered_servers()
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                let mut e = events.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    Event::Disconnected => {
                        e.down_since.get_or_insert_with(SystemTime::now);
                    }
                    Event::Connected => {
                        if let Some(from) = e.down_since.take() {
                            e.outages.push((from, SystemTime::now()));
                        }
                    }
                    _ => {}
                }
            }
        });
    if let Some(tls) = &spec.tls {
        options = options
            .require_tls(true)
            .tls_client_config((*tls.client_config).clone());
    }
    let servers: Vec<async_nats::ServerAddr> =
        spec.servers.iter().filter_map(|s| s.parse().ok()).collect();
    options
        .connect(servers)
        .await
        .map_err(|e| connect_error(spec, e))
}

/// A connection refused, in words that name the key at fault.
fn connect_error(spec: &NatsSpec, e: async_nats::ConnectError) -> SourceError {
    let key = &spec.key;
    let message = match e.kind() {
        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
            match &spec.auth {
                Auth::Password { .. } => format!(
                    "the server refused the credentials of {key}.user / {key}.password: authorization violation"
                ),
                Auth::Token(_) => {
                    format!("the server refused {key}.token: authorization violation")
                }
                Auth::NKey { public, .. } => format!(
                    "authorization failed: the server refused the NKey of {key}.nkey_seed (user {public})"
                ),
                Auth::Credentials { public, .. } => format!(
                    "authorization failed: the server refused the user JWT and NKey of {key}.credentials_file (user {public})"
                ),
                Auth::None => format!(
                    "the server requires credentials: give {key}.user and {key}.password, {key}.token, {key}.nkey_seed or {key}.credentials_file"
                ),
            }
        }
        ConnectErrorKind::Tls | ConnectErrorKind::Io
            if spec.tls.is_some()
                && (e.kind() == ConnectErrorKind::Tls || {
                    let text = e.to_string().to_ascii_lowercase();
                    text.contains("certificate")
                        || text.contains("tls")
                        || text.contains("handshake")
                }) =>
        {
            let at = match &spec.tls {
                Some(t) if t.ca_file => format!("{key}.tls.ca_file"),
                Some(_) => format!("{key}.tls (no ca_file: the Mozilla roots)"),
                None => format!("{key}.tls (not configured)"),
            };
            format!("TLS failed, check {at}: {e}")
        }
        _ => e.to_string(),
    };
    SourceError::Connect {
        dsn: servers_text(spec),
        message,
    }
}

/// A JetStream API error answer.
#[derive(Debug, Deserialize)]
pub struct ApiError {
    pub code: u16,
    #[serde(default)]
    pub err_code: u32,
    #[serde(default)]
    pub description: String,
}

/// `no message found` of a message get.
pub const NO_MESSAGE_FOUND: u32 = 10037;
/// `stream not found`.
pub const STREAM_NOT_FOUND: u32 = 10059;

/// Why a request got no usable answer.
#[derive(Debug)]
pub enum RequestError {
    /// The server answered with an API error.
    Api(ApiError),
    /// No answer, a broken connection, or one that cannot be read.
    Other(String),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Api(e) => write!(f, "{} ({}, {})", e.description, e.code, e.err_code),
            RequestError::Other(e) => f.write_str(e),
        }
    }
}

/// One JetStream API request and its answer as a `T`.
pub async fn request<T: DeserializeOwned>(
    client: &Client,
    subject: String,
    body: String,
) -> Result<T, RequestError> {
    #[derive(Deserialize)]
    struct Answer<T> {
        #[serde(default)]
        error: Option<ApiError>,
        #[serde(flatten)]
        body: Option<T>,
    }
    let reply = client
        .request(subject.clone(), body.into())
        .await
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => RequestError::Other(format!(
                "{subject}: no responders (is JetStream enabled on the server?)"
            )),
            _ => RequestError::Other(format!("{subject}: {e}")),
        })?;
    let answer: Answer<T> = serde_json::from_slice(&reply.payload)
        .map_err(|e| RequestError::Other(format!("{subject}: cannot read the answer: {e}")))?;
    match (answer.error, answer.body) {
        (Some(e), _) => Err(RequestError::Api(e)),
        (None, Some(b)) => Ok(b),
        (None, None) => Err(RequestError::Other(format!("{subject}: an empty answer"))),
    }
}

/// A page of `$JS.API.STREAM.LIST`.
#[derive(Debug, Deserialize)]
pub struct StreamList {
    pub total: usize,
    #[serde(default)]
    pub streams: Option<Vec<StreamInfo>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamInfo {
    pub config: StreamConfig,
    /// When the stream was created: a recreated stream has a new one.
    pub created: String,
    pub state: StreamState,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamConfig {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamState {
    pub messages: u64,
    pub last_seq: u64,
    pub consumer_count: usize,
}

/// A page of `$JS.API.CONSUMER.LIST.<stream>`.
#[derive(Debug, Deserialize)]
pub struct ConsumerList {
    pub total: usize,
    #[serde(default)]
    pub consumers: Option<Vec<ConsumerInfo>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConsumerInfo {
    pub stream_name: String,
    pub name: String,
    pub config: ConsumerConfig,
    pub delivered: SequenceInfo,
    pub ack_floor: SequenceInfo,
    pub num_ack_pending: u64,
    pub num_redelivered: u64,
    #[serde(default)]
    pub num_waiting: u64,
    pub num_pending: u64,
    #[serde(default)]
    pub push_bound: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConsumerConfig {
    #[serde(default)]
    pub durable_name: Option<String>,
    pub ack_policy: String,
    #[serde(default)]
    pub filter_subject: Option<String>,
    #[serde(default)]
    pub deliver_subject: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SequenceInfo {
    pub stream_seq: u64,
}

/// `$JS.API.STREAM.MSG.GET.<stream>`'s answer: the message's sequence and
/// stored time (its body is not read).
#[derive(Debug, Deserialize)]
pub struct MsgGet {
    pub message: StoredMessage,
}

#[derive(Debug, Deserialize)]
pub struct StoredMessage {
    pub seq: u64,
    pub time: String,
}

/// Every stream, page by page (256 to a page).
pub async fn streams(client: &Client) -> Result<Vec<StreamInfo>, RequestError> {
    let mut out = Vec::new();
    loop {
        let page: StreamList = request(
            client,
            "$JS.API.STREAM.LIST".into(),
            format!("{{\"offset\":{}}}", out.len()),
        )
        .await?;
        let got = page.streams.unwrap_or_default();
        let done = got.is_empty() || out.len() + got.len() >= page.total;
        out.extend(got);
        if done {
            return Ok(out);
        }
    }
}

/// Every consumer of `stream`, page by page.
pub async fn consumers(client: &Client, stream: &str) -> Result<Vec<ConsumerInfo>, RequestError> {
    let mut out = Vec::new();
    loop {
        let page: ConsumerList = request(
            client,
            format!("$JS.API.CONSUMER.LIST.{stream}"),
            format!("{{\"offset\":{}}}", out.len()),
        )
        .await?;
        let got = page.consumers.unwrap_or_default();
        let done = got.is_empty() || out.len() + got.len() >= page.total;
        out.extend(got);
        if done {
            return Ok(out);
        }
    }
}

/// The first message of `stream` at or after `seq` on `subject` (`>`: any):
/// its sequence and stored time; `None` when there is none.
pub async fn first_at_or_after(
    client: &Client,
    stream: &str,
    seq: u64,
    subject: &str,
) -> Result<Option<(u64, SystemTime)>, RequestError> {
    let body = serde_json::json!({"seq": seq, "next_by_subj": subject}).to_string();
    match request::<MsgGet>(client, format!("$JS.API.STREAM.MSG.GET.{stream}"), body).await {
        Ok(m) => {
            let time = parse_time(&m.message.time).ok_or_else(|| {
                RequestError::Other(format!(
                    "{stream}: message {} has a time that cannot be read: {}",
                    m.message.seq, m.message.time
                ))
            })?;
            Ok(Some((m.message.seq, time)))
        }
        Err(RequestError::Api(e)) if e.err_code == NO_MESSAGE_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

/// An RFC 3339 time as the server writes it (nanoseconds, `Z`).
pub fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))
        .ok()
        .or_else(|| humantime::parse_rfc3339(text).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_times_are_read_to_the_nanosecond() {
        let t = parse_time("2026-12-04T10:27:14.511672631Z").expect("a time");
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(since.subsec_nanos(), 511_672_631);
        assert!(parse_time("yesterday").is_none());
    }
}
