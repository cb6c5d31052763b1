//! The connection to the Redis server: TCP (or TLS with the agent's own
//! rustls config and ring provider) made here, then the `redis` crate's
//! multiplexed connection on it, which logs in (`AUTH`), selects the
//! database and pipelines. And the few helpers that read its replies
//! (`XINFO` answers maps as flat arrays in RESP2).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, Value};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::config::Server;

/// Why the server could not be used; messages carry no secret.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Command(String),
}

/// Connects, logs in and selects the database, each step within `timeout`.
/// Each command afterwards waits at most `timeout` for its answer.
pub async fn connect(
    server: &Server,
    timeout: Duration,
) -> Result<MultiplexedConnection, ClientError> {
    let addr = (server.host.as_str(), server.port);
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| ClientError::Connect(format!("no connection within {timeout:?}")))?
        .map_err(|e| ClientError::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let mut info = RedisConnectionInfo::default()
        .set_db(server.db)
        .set_skip_set_lib_name();
    if let Some(u) = &server.username {
        info = info.set_username(u);
    }
    if let Some(p) = &server.password {
        info = info.set_password(p.expose());
    }
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
    let made = match &server.tls {
        Some(tls) => {
            let name = ServerName::try_from(server.host.clone())
                .map_err(|e| ClientError::Connect(format!("TLS server name: {e}")))?;
            let stream = tokio::time::timeout(
                timeout,
                tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp),
            )
            .await
            .map_err(|_| {
                ClientError::Connect(format!(
                    "no TLS handshake within {timeout:?} (does the server speak TLS on this \
                     port? redis:// in {}.url is plain TCP)",
                    server.key
                ))
            })?
            .map_err(|e| {
                ClientError::Connect(format!(
                    "TLS handshake failed: {e} (check {key}.tls.ca_file and the url's host)",
                    key = server.key
                ))
            })?;
            login(&info, stream, config, timeout).await
        }
        None => login(&info, tcp, config, timeout).await,
    };
    made.map_err(|e| ClientError::Connect(login_error(&e, server)))
}

/// The multiplexed connection on `stream`, its driver spawned (it ends when
/// the connection is dropped).
async fn login<S>(
    info: &RedisConnectionInfo,
    stream: S,
    config: AsyncConnectionConfig,
    timeout: Duration,
) -> Result<MultiplexedConnection, redis::RedisError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let made = tokio::time::timeout(
        timeout,
        MultiplexedConnection::new_with_config(info, stream, config),
    )
    .await
    .map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::Io,
            "no answer to the login within the timeout",
        ))
    })?;
    let (conn, driver) = made?;
    tokio::spawn(driver);
    Ok(conn)
}

/// What a failed login says, in words an operator acts on; never the password.
fn login_error(e: &redis::RedisError, server: &Server) -> String {
    let text = scrub(&e.to_string(), server);
    let lower = text.to_ascii_lowercase();
    let key = &server.key;
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || lower.contains("wrongpass")
        || lower.contains("invalid password")
    {
        format!(
            "authentication failed: wrong user name or password (WRONGPASS; check {key}.password \
             and {key}.username)"
        )
    } else if lower.contains("noauth") || lower.contains("authentication required") {
        no_auth(server)
    } else if lower.contains("without any password configured") {
        format!("a password is configured ({key}.password) but the server has none: AUTH refused")
    } else if lower.contains("protocol error") || lower.contains("invalid first byte") {
        format!("{text} (a TLS server answered plain TCP? use rediss:// in {key}.url)")
    } else {
        text
    }
}

/// What a server that wants a password says to a client that gave none.
pub fn no_auth(server: &Server) -> String {
    format!(
        "authentication required: the server has a password and none is configured \
         (NOAUTH; set {}.password)",
        server.key
    )
}

/// `message` without the server's password.
pub fn scrub(message: &str, server: &Server) -> String {
    match &server.password {
        Some(p) if p.expose().len() >= 3 => message.replace(p.expose(), "***"),
        _ => message.to_string(),
    }
}

/// A reply as text (a bulk or simple string).
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// A reply as a whole number (integers may come as strings).
pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// A map reply (RESP3) or a flat array of field, value (RESP2), by field.
pub fn field<'v>(v: &'v Value, name: &str) -> Option<&'v Value> {
    match v {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && text(&pair[0]).as_deref() == Some(name))
            .map(|pair| &pair[1]),
        _ => None,
    }
}

/// The items of an array reply (none for anything else, nil included).
pub fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => &[],
    }
}

/// The server's error, if the reply is one.
pub fn error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}
