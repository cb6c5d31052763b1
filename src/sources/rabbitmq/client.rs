//! The agent's client of the RabbitMQ management API: GETs with basic
//! authentication over hyper (HTTP/1) and rustls, each answer read whole
//! (a vhost's queues, with only the columns asked) and parsed from JSON. Errors name
//! the URL asked and the status or cause; never the password.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use super::config::RabbitSpec;

/// The largest answer read: a vhost's queues with the columns asked take
/// about 600 bytes each (6 MB for 10,000).
const MAX_BODY: usize = 512 * 1024 * 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: 401 Unauthorized: the management API refused the username and password")]
    Unauthorized { url: String },
    #[error("{url}: HTTP {status}{hint}")]
    Status {
        url: String,
        status: StatusCode,
        hint: &'static str,
    },
    #[error("{url}: unreadable answer: {cause}")]
    Body { url: String, cause: String },
}

impl ApiError {
    /// The object asked for does not exist (404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::Status { status, .. } if *status == StatusCode::NOT_FOUND)
    }
}

/// One management API.
#[derive(Clone)]
pub struct Api {
    base: String,
    authorization: String,
    timeout: Duration,
    http: Hyper<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl Api {
    pub fn new(spec: &RabbitSpec, timeout: Duration) -> Api {
        let tls = match &spec.tls {
            Some(c) => (**c).clone(),
            None => {
                let mut roots = rustls::RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("ring offers the default protocol versions")
                    .with_root_certificates(roots)
                    .with_no_client_auth()
            }
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let http = Hyper::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .build(connector);
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            spec.username,
            spec.password.expose()
        ));
        Api {
            base: spec.management_url.clone(),
            authorization: format!("Basic {credentials}"),
            timeout,
            http,
        }
    }

    /// The base URL (for messages).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// GETs `path` (from `/api/…`, already encoded) and parses its JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        Ok(self.get_dated(path).await?.0)
    }

    /// [`Api::get`], with the broker's clock when it answered (its `Date`
    /// header, whole seconds since the epoch).
    pub async fn get_dated<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<(T, Option<f64>), ApiError> {
        let url = format!("{}{path}", self.base);
        let (body, date) = self.get_bytes(&url).await?;
        let value = serde_json::from_slice(&body).map_err(|e| ApiError::Body {
            url,
            cause: e.to_string(),
        })?;
        Ok((value, date))
    }

    async fn get_bytes(&self, url: &str) -> Result<(Bytes, Option<f64>), ApiError> {
        let request = Request::get(url)
            .header(header::AUTHORIZATION, &self.authorization)
            // No `Accept`: the management plugin answers a path that is
            // not its own 406 instead of 404 when it is `application/json`.
            .body(Empty::new())
            .map_err(|e| ApiError::Unreachable {
                url: url.to_string(),
                cause: e.to_string(),
            })?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| ApiError::Unreachable {
                    url: url.to_string(),
                    cause: cause_chain(&e),
                })?;
            let status = response.status();
            let date = response
                .headers()
                .get(header::DATE)
                .and_then(|d| d.to_str().ok())
                .and_then(http_date);
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| ApiError::Body {
                    url: url.to_string(),
                    cause: e.to_string(),
                })?
                .to_bytes();
            match status {
                StatusCode::OK => Ok((body, date)),
                StatusCode::UNAUTHORIZED => Err(ApiError::Unauthorized {
                    url: url.to_string(),
                }),
                status => Err(ApiError::Status {
                    url: url.to_string(),
                    status,
                    hint: match status {
                        StatusCode::NOT_FOUND => {
                            ": not found (is the management plugin enabled, and the URL its root?)"
                        }
                        StatusCode::FORBIDDEN => ": the user may not read this (tag it monitoring)",
                        _ => "",
                    },
                }),
            }
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::Timeout {
                url: url.to_string(),
                timeout: self.timeout,
            }),
        }
    }
}

/// An error and its sources, `a: b: c` (hyper's own message alone says
/// only "client error (Connect)").
fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        next = s.source();
    }
    out
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`) in seconds since the epoch.
fn http_date(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace().skip(1);
    let day: i64 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':').map(|v| v.parse::<i64>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + m * 60 + s) as f64)
}

/// A path segment (vhost, queue or exchange name) percent-encoded for the
/// management API (`/` is `%2F`).
pub fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn http_dates_are_read_as_seconds_since_the_epoch() {
        assert_eq!(
            super::http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784111777.0)
        );
        assert_eq!(
            super::http_date("Fri, 04 Dec 2026 10:45:00 GMT"),
            Some(1796381100.0)
        );
        assert_eq!(super::http_date("yesterday"), None);
    }
}
