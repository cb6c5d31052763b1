//! The web config file (`[server] web_config_file`, `run --web.config.file`):
//! the Prometheus exporter-toolkit's YAML format, which every official exporter
//! takes, so operators lock the agent's listener as they lock the others: TLS
//! (`tls_server_config`), basic auth (`basic_auth_users`, bcrypt hashes) and
//! response headers (`http_server_config.headers`).
//!
//! Read into a [`WebConfig`] the listener serves with; each problem names its
//! key (`web_config_file tls_server_config.cert_file: …`) and never prints a
//! secret: no key, no password hash, no quoted value of a YAML error.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http::{HeaderName, HeaderValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};
use serde::Deserialize;
use serde::de::IgnoredAny;
use sha2::{Digest, Sha256};

use crate::validation::Problem;

/// The key every problem of the file starts with.
const KEY: &str = "web_config_file";

/// The file as written (exporter-toolkit's `docs/web-configuration.md`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebConfig {
    tls_server_config: Option<RawTls>,
    http_server_config: Option<RawHttp>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    /// exporter-toolkit's rate limiter: not taken (named as unsupported).
    rate_limit: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    client_ca: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Option<IgnoredAny>,
    client_allowed_sans: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    /// Taken and ignored: the listener speaks HTTP/1.1 only.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// What the listener serves with, read from the web config file.
pub struct WebConfig {
    /// TLS, when `tls_server_config` is set.
    pub tls: Option<Arc<ServerConfig>>,
    /// `basic_auth_users`: empty when no authentication is asked.
    pub users: Users,
    /// `http_server_config.headers`, added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Every file it was read from (the file, and the certificates and keys it
    /// names): a change to any of them is a new configuration.
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.hashes.len())
            .field("headers", &self.headers.len())
            .finish()
    }
}

impl WebConfig {
    /// No web config file: plain HTTP, no authentication, no headers.
    pub fn none() -> WebConfig {
        WebConfig {
            tls: None,
            users: Users::new(BTreeMap::new(), &mut |_, _| {}),
            headers: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Both TLS and basic auth are required of every client: the rule that
    /// lets the pages be served on a listener other hosts reach.
    pub fn locked(&self) -> bool {
        self.tls.is_some() && !self.users.is_empty()
    }
}

/// Reads and checks the web config file; every problem names its key.
pub fn load(path: &Path) -> Result<WebConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let problem = |key: &str, message: String| Problem {
        key: if key.is_empty() {
            KEY.to_string()
        } else {
            format!("{KEY} {key}")
        },
        message,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![problem("", format!("cannot read {}: {e}", path.display()))])?;
    let raw: RawWebConfig = if text.trim().is_empty() {
        RawWebConfig::default()
    } else {
        let options = serde_saphyr::options! { with_snippet: false };
        serde_saphyr::from_str_with_options(&text, options).map_err(|e| {
            vec![problem(
                "",
                format!("{}: {}", path.display(), without_quoted(&e.to_string())),
            )]
        })?
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files = vec![path.to_path_buf()];
    let mut report = |key: &str, message: String| problems.push(problem(key, message));
    if raw.rate_limit.is_some() {
        report("rate_limit", "not supported by inboxwatch".into());
    }
    let tls = raw
        .tls_server_config
        .as_ref()
        .and_then(|t| tls(t, dir, &mut files, &mut report));
    let users = Users::new(raw.basic_auth_users.unwrap_or_default(), &mut report);
    let headers = headers(
        raw.http_server_config
            .and_then(|h| h.headers)
            .unwrap_or_default(),
        &mut report,
    );
    if problems.is_empty() {
        Ok(WebConfig {
            tls,
            users,
            headers,
            files,
        })
    } else {
        Err(problems)
    }
}

/// A digest of what `files` hold now (a missing file counts as empty): the
/// listener re-reads the web config when it changes.
pub fn fingerprint(files: &[PathBuf]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for file in files {
        let bytes = std::fs::read(file).unwrap_or_default();
        digest.update((bytes.len() as u64).to_le_bytes());
        digest.update(&bytes);
    }
    digest.finalize().into()
}

/// A YAML error's text with every double-quoted value elided: serde quotes the
/// value it could not take, which may be a password hash or a key.
fn without_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        if c == '"' {
            if !quoted {
                out.push_str("\"…\"");
            }
            quoted = !quoted;
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

type Report<'a> = dyn FnMut(&str, String) + 'a;

/// `tls_server_config` into a rustls server configuration.
fn tls(
    raw: &RawTls,
    dir: &Path,
    files: &mut Vec<PathBuf>,
    report: &mut Report<'_>,
) -> Option<Arc<ServerConfig>> {
    for (present, key) in [
        (raw.curve_preferences.is_some(), "curve_preferences"),
        (raw.client_allowed_sans.is_some(), "client_allowed_sans"),
    ] {
        if present {
            report(
                &format!("tls_server_config.{key}"),
                "not supported by inboxwatch".into(),
            );
        }
    }
    let mut pem = |file_key: &str,
                   file: &Option<String>,
                   inline_key: &str,
                   inline: &Option<String>| match (file, inline) {
        (Some(_), Some(_)) => {
            report(
                &format!("tls_server_config.{file_key}"),
                format!("give either {file_key} or {inline_key}, not both"),
            );
            None
        }
        (Some(f), None) => {
            let path = dir.join(f);
            files.push(path.clone());
            match std::fs::read(&path) {
                Ok(bytes) => Some((bytes, format!("tls_server_config.{file_key}"))),
                Err(e) => {
                    report(
                        &format!("tls_server_config.{file_key}"),
                        format!("cannot read {}: {e}", path.display()),
                    );
                    None
                }
            }
        }
        (None, Some(text)) => Some((
            text.clone().into_bytes(),
            format!("tls_server_config.{inline_key}"),
        )),
        (None, None) => None,
    };
    let cert = pem("cert_file", &raw.cert_file, "cert", &raw.cert);
    let key = pem("key_file", &raw.key_file, "key", &raw.key);
    let client_ca = pem(
        "client_ca_file",
        &raw.client_ca_file,
        "client_ca",
        &raw.client_ca,
    );
    if raw.cert_file.is_none() && raw.cert.is_none() {
        report("tls_server_config.cert_file", "required (or cert)".into());
    }
    if raw.key_file.is_none() && raw.key.is_none() {
        report("tls_server_config.key_file", "required (or key)".into());
    }
    let certs = cert.and_then(|(bytes, key)| {
        let certs: Result<Vec<CertificateDer<'static>>, _> =
            CertificateDer::pem_slice_iter(&bytes).collect();
        match certs {
            Ok(c) if !c.is_empty() => Some(c),
            Ok(_) => {
                report(&key, "no PEM certificate in it".into());
                None
            }
            Err(e) => {
                report(&key, format!("not a PEM certificate chain: {e}"));
                None
            }
        }
    });
    let private_key = key.and_then(|(bytes, key)| match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(k) => Some(k),
        // The error names the PEM section, never its contents.
        Err(e) => {
            report(&key, format!("not a PEM private key: {e}"));
            None
        }
    });
    let versions = versions(raw, report);
    let provider = provider(raw, report);
    let verifier = client_verifier(raw, client_ca, &provider, report);
    let (certs, private_key, versions, verifier) = (certs?, private_key?, versions?, verifier?);
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| report("tls_server_config.cipher_suites", format!("{e}")))
        .ok()?;
    let mut config = builder
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, private_key)
        .map_err(|e| {
            report(
                "tls_server_config.key_file",
                format!("does not go with the certificate: {e}"),
            )
        })
        .ok()?;
    config.ignore_client_order = raw.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(Arc::new(config))
}

/// `min_version` and `max_version` (`TLS10` … `TLS13`) into the versions rustls
/// offers: 1.2 and 1.3, so a minimum below 1.2 means 1.2.
fn versions(
    raw: &RawTls,
    report: &mut Report<'_>,
) -> Option<Vec<&'static rustls::SupportedProtocolVersion>> {
    let rank = |key: &str, value: &Option<String>, default: u8, report: &mut Report<'_>| match value
        .as_deref()
    {
        None => Some(default),
        Some("TLS10") => Some(10),
        Some("TLS11") => Some(11),
        Some("TLS12") => Some(12),
        Some("TLS13") => Some(13),
        Some(other) => {
            report(
                &format!("tls_server_config.{key}"),
                format!("unknown TLS version {other:?} (expected TLS10, TLS11, TLS12 or TLS13)"),
            );
            None
        }
    };
    let min = rank("min_version", &raw.min_version, 12, report)?;
    let max = rank("max_version", &raw.max_version, 13, report)?;
    let versions: Vec<_> = [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, version)| version)
        .collect();
    if versions.is_empty() {
        report(
            "tls_server_config.max_version",
            "leaves no TLS version inboxwatch speaks (TLS12 and TLS13)".into(),
        );
        return None;
    }
    Some(versions)
}

/// The ring provider, its TLS 1.2 suites cut to `cipher_suites` (Go's names) in
/// their order; TLS 1.3's are not configurable, as in Go.
fn provider(raw: &RawTls, report: &mut Report<'_>) -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let Some(names) = &raw.cipher_suites else {
        return Arc::new(provider);
    };
    let tls12: Vec<SupportedCipherSuite> = provider
        .cipher_suites
        .iter()
        .copied()
        .filter(|s| s.tls13().is_none())
        .collect();
    let mut chosen: Vec<SupportedCipherSuite> = provider
        .cipher_suites
        .iter()
        .copied()
        .filter(|s| s.tls13().is_some())
        .collect();
    for (i, name) in names.iter().enumerate() {
        let found = tls12.iter().find(|s| {
            let ours = format!("{:?}", s.suite());
            // Go names the ChaCha20 suites without their hash.
            ours == *name || ours.strip_suffix("_SHA256") == Some(name.as_str())
        });
        match found {
            Some(s) => chosen.push(*s),
            None => report(
                &format!("tls_server_config.cipher_suites[{i}]"),
                format!(
                    "{name:?} is not a TLS 1.2 cipher suite inboxwatch supports (rustls); supported: {}",
                    tls12
                        .iter()
                        .map(|s| format!("{:?}", s.suite()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        }
    }
    // The server's order: TLS 1.2 suites as listed, after TLS 1.3's.
    provider.cipher_suites = chosen;
    Arc::new(provider)
}

/// `client_auth_type` with `client_ca_file`.
fn client_verifier(
    raw: &RawTls,
    client_ca: Option<(Vec<u8>, String)>,
    provider: &Arc<rustls::crypto::CryptoProvider>,
    report: &mut Report<'_>,
) -> Option<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    const KEY_TYPE: &str = "tls_server_config.client_auth_type";
    let verify = match raw.client_auth_type.as_deref().unwrap_or("NoClientCert") {
        "NoClientCert" => None,
        "VerifyClientCertIfGiven" => Some(false),
        "RequireAndVerifyClientCert" => Some(true),
        kind @ ("RequestClientCert" | "RequireAnyClientCert") => {
            report(
                KEY_TYPE,
                format!(
                    "{kind} (client certificates taken without verifying them) is not supported; \
                     use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
                ),
            );
            return None;
        }
        other => {
            report(
                KEY_TYPE,
                format!(
                    "unknown {other:?} (expected NoClientCert, VerifyClientCertIfGiven or \
                     RequireAndVerifyClientCert)"
                ),
            );
            return None;
        }
    };
    let configured_ca = raw.client_ca_file.is_some() || raw.client_ca.is_some();
    let Some(required) = verify else {
        if configured_ca {
            report(
                "tls_server_config.client_ca_file",
                "given without a client_auth_type that verifies client certificates".into(),
            );
            return None;
        }
        return Some(WebPkiClientVerifier::no_client_auth());
    };
    if !configured_ca {
        report(
            "tls_server_config.client_ca_file",
            format!(
                "required by client_auth_type {}",
                raw.client_auth_type.as_deref().unwrap_or("")
            ),
        );
        return None;
    }
    let (bytes, key) = client_ca?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        match cert.map(|c| roots.add(c)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => report(&key, format!("not a CA certificate: {e}")),
            Err(e) => report(&key, format!("not a PEM certificate: {e}")),
        }
    }
    if roots.is_empty() {
        report(&key, "no CA certificate in it".into());
        return None;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = if required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| report(&key, format!("{e}")))
        .ok()
}

/// The response headers exporter-toolkit lets a file set, with the values it
/// accepts for the two that have a fixed set (an empty value leaves a header unset).
fn headers(
    raw: BTreeMap<String, String>,
    report: &mut Report<'_>,
) -> Vec<(HeaderName, HeaderValue)> {
    const ALLOWED: [&str; 5] = [
        "Strict-Transport-Security",
        "X-Content-Type-Options",
        "X-Frame-Options",
        "X-XSS-Protection",
        "Content-Security-Policy",
    ];
    let mut out = Vec::new();
    for (name, value) in raw {
        let key = format!("http_server_config.headers.{name}");
        if !ALLOWED.contains(&name.as_str()) {
            report(
                &key,
                format!("cannot be set (allowed: {})", ALLOWED.join(", ")),
            );
            continue;
        }
        if value.is_empty() {
            continue;
        }
        let fixed = match name.as_str() {
            "X-Frame-Options" => Some(&["deny", "sameorigin"][..]),
            "X-Content-Type-Options" => Some(&["nosniff"][..]),
            _ => None,
        };
        if let Some(allowed) = fixed
            && !allowed.contains(&value.to_ascii_lowercase().as_str())
        {
            report(
                &key,
                format!("{value:?} is not one of {}", allowed.join(", ")),
            );
            continue;
        }
        match (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            (Ok(n), Ok(v)) => out.push((n, v)),
            _ => report(&key, "not a valid header value".into()),
        }
    }
    out
}

/// `basic_auth_users`: each user's bcrypt hash, and the answers of recent
/// checks, so a scrape every 15 s costs one bcrypt, not one each.
pub struct Users {
    hashes: BTreeMap<String, String>,
    /// SHA-256 of (user, hash, password) → whether they matched; bounded.
    checked: Mutex<HashMap<[u8; 32], bool>>,
    /// One bcrypt at a time: a flood of wrong passwords costs one core, not all.
    bcrypt: Mutex<()>,
}

/// Checked credentials kept at most ([`Users`]); exporter-toolkit keeps 100.
const CHECKED_KEPT: usize = 100;

/// What an unknown user's password is checked against, so that a wrong user
/// name takes as long as a wrong password (cost 10, like the documented hashes).
const NOBODY: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DSSK6uHrfQW3wm3WK8koK";

impl Users {
    fn new(hashes: BTreeMap<String, String>, report: &mut Report<'_>) -> Users {
        for (user, hash) in &hashes {
            if hash.parse::<bcrypt::HashParts>().is_err() {
                report(
                    &format!("basic_auth_users.{user}"),
                    "not a bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)"
                        .into(),
                );
            }
        }
        Users {
            hashes,
            checked: Mutex::new(HashMap::new()),
            bcrypt: Mutex::new(()),
        }
    }

    /// No user: no authentication asked.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Whether `user` with `password` may in. Blocking (bcrypt): call it off
    /// the runtime's workers.
    pub fn check(&self, user: &str, password: &str) -> bool {
        let known = self.hashes.get(user);
        let hash = known.map_or(NOBODY, String::as_str);
        let mut digest = Sha256::new();
        for part in [user, hash, password] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part.as_bytes());
        }
        let id: [u8; 32] = digest.finalize().into();
        let cached = self
            .checked
            .lock()
            .expect("the credential cache is not poisoned")
            .get(&id)
            .copied();
        if let Some(ok) = cached {
            return ok;
        }
        let matched = {
            let _one = self.bcrypt.lock().expect("the bcrypt turn is not poisoned");
            bcrypt::verify(password, hash).unwrap_or(false)
        };
        let ok = known.is_some() && matched;
        let mut checked = self
            .checked
            .lock()
            .expect("the credential cache is not poisoned");
        if checked.len() >= CHECKED_KEPT {
            checked.clear();
        }
        checked.insert(id, ok);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_elided_from_yaml_errors() {
        assert_eq!(
            without_quoted("invalid type: string \"$2y$10$abc\", expected a map"),
            "invalid type: string \"…\", expected a map"
        );
    }

    #[test]
    fn the_nobody_hash_is_a_bcrypt_hash() {
        assert!(NOBODY.parse::<bcrypt::HashParts>().is_ok());
    }

    #[test]
    fn a_checked_password_is_answered_from_the_cache() {
        let hash = bcrypt::hash_with_salt("right", 4, [7u8; 16])
            .expect("hash")
            .to_string();
        let users = Users::new(BTreeMap::from([("prom".to_string(), hash)]), &mut |k, m| {
            panic!("{k}: {m}")
        });
        assert!(users.check("prom", "right"));
        assert!(!users.check("prom", "wrong"));
        assert!(!users.check("nobody", "right"));
        assert_eq!(users.checked.lock().expect("lock").len(), 3);
        assert!(users.check("prom", "right"));
    }
}
