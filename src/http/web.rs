//! The web config file at work on the listener: basic auth and the configured
//! headers on every response ([`guard`]), and the file re-read when it or a
//! file it names changes ([`Web::watch`]), so a certificate replaced on disk
//! is served to the next connection without a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::web::{self, WebConfig};

/// How often the web config file and the files it names are looked at.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// The client's address, put on each request by the listener.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// The web config the listener serves with now.
pub struct Web {
    /// The file, when there is one.
    path: Option<PathBuf>,
    current: RwLock<Arc<WebConfig>>,
    /// What the files held when last looked at.
    seen: Mutex<[u8; 32]>,
    /// The pages are served because the file asks for TLS and basic auth: a
    /// new file that does not is refused, as it would open them.
    keep_locked: bool,
}

impl Web {
    /// Serves with `config`, read from `path` (none: plain HTTP, no auth).
    pub fn new(path: Option<PathBuf>, config: WebConfig, keep_locked: bool) -> Web {
        let seen = web::fingerprint(&config.files);
        Web {
            path,
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(seen),
            keep_locked,
        }
    }

    /// The configuration a new connection or request is served with.
    pub fn current(&self) -> Arc<WebConfig> {
        self.current
            .read()
            .expect("the web config is not poisoned")
            .clone()
    }

    /// Re-reads the file every [`RECHECK_EVERY`] when it or a file it names
    /// changed, until `stop`. A file that does not load keeps the last good
    /// configuration, and says why once per change.
    pub async fn watch(self: Arc<Web>, stop: CancellationToken) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(RECHECK_EVERY);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let web = self.clone();
            let path = path.clone();
            let _ = tokio::task::spawn_blocking(move || web.recheck(&path)).await;
        }
    }

    fn recheck(&self, path: &std::path::Path) {
        let files = self.current().files.clone();
        let now = web::fingerprint(&files);
        {
            let mut seen = self.seen.lock().expect("the fingerprint is not poisoned");
            if *seen == now {
                return;
            }
            *seen = now;
        }
        match web::load(path) {
            Ok(new) if self.keep_locked && !new.locked() => warn!(
                file = %path.display(),
                "The web config file changed, but no longer asks for both TLS and basic auth, \
                 which the pages are served behind; still serving the previous one."
            ),
            Ok(new) => {
                let files = new.files.clone();
                *self
                    .current
                    .write()
                    .expect("the web config is not poisoned") = Arc::new(new);
                // The new file may name other files: what they hold now is what was read.
                *self.seen.lock().expect("the fingerprint is not poisoned") =
                    web::fingerprint(&files);
                info!(file = %path.display(), "Re-read the web config file; new connections use it.");
            }
            Err(problems) => {
                let why: Vec<String> = problems.iter().map(ToString::to_string).collect();
                warn!(
                    file = %path.display(),
                    problems = %why.join("; "),
                    "The web config file changed but does not load; still serving the previous one."
                );
            }
        }
    }
}

/// Every request: basic auth when the file lists users (401 with
/// `WWW-Authenticate: Basic` without the right credentials, as exporter-toolkit
/// answers), then the file's headers on the response.
pub async fn guard(State(web): State<Arc<Web>>, request: Request, next: Next) -> Response {
    let config = web.current();
    let mut response = if config.users.is_empty() {
        next.run(request).await
    } else {
        match credentials(&request) {
            None => {
                debug!(path = %request.uri().path(), "Asked for credentials (401).");
                unauthorized()
            }
            Some((user, password)) => {
                let checking = config.clone();
                let name = user.clone();
                let ok =
                    tokio::task::spawn_blocking(move || checking.users.check(&name, &password))
                        .await
                        .unwrap_or(false);
                if ok {
                    next.run(request).await
                } else {
                    let client = request.extensions().get::<Peer>().map(|p| p.0.ip());
                    warn!(
                        client = ?client,
                        user = ?user,
                        path = %request.uri().path().escape_debug(),
                        "Refused a request with a wrong user or password (401)."
                    );
                    unauthorized()
                }
            }
        }
    };
    let headers = response.headers_mut();
    for (name, value) in &config.headers {
        headers.insert(name.clone(), value.clone());
    }
    response
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"))],
        "Unauthorized\n",
    )
        .into_response()
}

/// The user and password of an `Authorization: Basic` header.
fn credentials(request: &Request) -> Option<(String, String)> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}
