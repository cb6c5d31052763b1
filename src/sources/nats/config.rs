//! The `kind = "nats"` source's settings, validated. The settings every
//! source has (name, owner, service, poll interval, timeout, objectives) are
//! read and checked by [`crate::sources::common`]; a NATS source embeds them.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use crate::sources::common::{self, Common, Defaults, RawCommon};
use crate::sources::common::{RawTls, tls_config};
use crate::sources::queue;
use crate::validation::Validator;

/// The KV bucket of the election's leases, unless `election_bucket` says.
pub const DEFAULT_ELECTION_BUCKET: &str = "inboxwatch_election";

/// A validated NATS source.
#[derive(Debug, Clone)]
pub struct NatsSpec {
    /// Name, owner, service, poll interval, timeout, objectives.
    pub common: Common,
    /// The servers, as written (`nats://host:port`, `tls://host:port`), no
    /// credentials in them.
    pub servers: Vec<String>,
    /// Stream names, anchored.
    pub streams: Regex,
    /// Durable consumer names, anchored.
    pub consumers: Regex,
    /// Count max-delivery and terminated advisories as dead letters.
    pub dead_letter_advisories: bool,
    /// The window a consumer's status is judged over.
    pub status_window: Duration,
    /// The KV bucket the agents keep their lease of the source in.
    pub election_bucket: String,
    pub auth: Auth,
    pub tls: Option<Tls>,
}

impl Deref for NatsSpec {
    type Target = Common;

    fn deref(&self) -> &Common {
        &self.common
    }
}

/// How the agent authenticates.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    #[default]
    None,
    /// `user` with `password` / `password_file`.
    Password { user: String, password: Secret },
    /// `token` / `token_file`.
    Token(Secret),
}

/// `[sources.tls]`: the client config, and the keys written (for errors).
#[derive(Clone)]
pub struct Tls {
    pub client_config: Arc<rustls::ClientConfig>,
    /// `ca_file` was written (else the Mozilla roots).
    pub ca_file: bool,
    /// A client certificate is presented.
    pub client_cert: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

/// A secret: never printed.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// A `kind = "nats"` entry's own keys as written, besides those every
/// source has ([`RawCommon`]; `timeout` bounds connecting and one poll).
#[derive(Debug, Default, Deserialize)]
pub struct RawNats {
    /// `nats://host:port` (or `tls://`); several separated by commas.
    pub url: Option<String>,
    /// Regex over stream names (default every stream).
    pub streams: Option<String>,
    /// Regex over durable consumer names (default every durable consumer).
    pub consumers: Option<String>,
    /// Count max-delivery and terminated advisories (default true).
    pub dead_letter_advisories: Option<bool>,
    /// The sliding window a consumer's status is judged over (default `5m`).
    pub status_window: Option<String>,
    /// The KV bucket of the election's leases (default `inboxwatch_election`).
    pub election_bucket: Option<String>,
    /// The user; `${VAR}` is replaced by the environment variable VAR.
    pub user: Option<String>,
    /// The user's password; `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
    /// A token; `${VAR}` is replaced by the environment variable VAR.
    pub token: Option<String>,
    /// A file whose content is the token; instead of `token`.
    pub token_file: Option<String>,
    /// TLS to the servers.
    pub tls: Option<RawTls>,
}

/// The settings every source has, as a NATS source reads them: the server
/// read every 10 s, within a timeout of the poll interval, at least 5 s;
/// the objective of the oldest age is the consumers' lag in seconds.
const COMMON: Defaults = Defaults {
    kind: "nats",
    poll_interval: Duration::from_secs(10),
    timeout_floor: Duration::from_secs(5),
    objectives: &["oldest_age"],
};

/// Validates a `kind = "nats"` entry.
pub(crate) fn validate(
    v: &mut Validator<'_>,
    key: &str,
    name: String,
    (common, s): (RawCommon, RawNats),
) -> Option<NatsSpec> {
    let servers = servers(v, key, s.url.as_deref());
    let streams = regex(v, &format!("{key}.streams"), s.streams.as_deref());
    let consumers = regex(v, &format!("{key}.consumers"), s.consumers.as_deref());
    let common = common::check(common, key, name, &COMMON, v);
    let status_window =
        queue::status_window(v, key, s.status_window.as_deref(), common.poll_interval);
    let election_bucket = s
        .election_bucket
        .clone()
        .unwrap_or_else(|| DEFAULT_ELECTION_BUCKET.into());
    if election_bucket.is_empty()
        || !election_bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        v.problem(
            &format!("{key}.election_bucket"),
            format!("\"{election_bucket}\" is not a bucket name (letters, digits, _ and - only)"),
        );
    }
    let auth = auth(v, key, &s);
    let tls = s.tls.as_ref().and_then(|t| match tls_config(t) {
        Ok(c) => Some(Tls {
            client_config: Arc::new(c),
            ca_file: t.ca_file.is_some(),
            client_cert: t.cert_file.is_some(),
        }),
        Err((k, message)) => {
            v.problem(&format!("{key}.tls.{k}"), message);
            None
        }
    });
    let (Some(streams), Some(consumers), Some(auth)) = (streams, consumers, auth) else {
        return None;
    };
    if s.tls.is_some() && tls.is_none() {
        return None;
    }
    Some(NatsSpec {
        common,
        servers,
        streams,
        consumers,
        dead_letter_advisories: s.dead_letter_advisories.unwrap_or(true),
        status_window,
        election_bucket,
        auth,
        tls,
    })
}

/// `url`: required; each of its comma-separated servers `nats://host:port`
/// or `tls://host:port` (a bare `host:port` is taken as `nats://`), with no
/// credentials in it.
fn servers(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Vec<String> {
    let at = format!("{key}.url");
    let Some(text) = written else {
        v.problem(&at, "required (nats://host:4222)".into());
        return Vec::new();
    };
    let text = match v.expand(&at, text) {
        Some(t) => t,
        None => return Vec::new(),
    };
    let mut out = Vec::new();
    for server in text.split(',').map(str::trim) {
        let with_scheme = if server.contains("://") {
            server.to_string()
        } else {
            format!("nats://{server}")
        };
        match url::Url::parse(&with_scheme) {
            Ok(u) if !matches!(u.scheme(), "nats" | "tls") => v.problem(
                &at,
                format!(
                    "\"{}://…\": the scheme is nats:// or tls://",
                    u.scheme()
                ),
            ),
            Ok(u) if !u.username().is_empty() || u.password().is_some() => v.problem(
                &at,
                "credentials do not belong in the url: give user and password (or token) as keys of their own".into(),
            ),
            Ok(u) if u.host_str().is_none_or(str::is_empty) => {
                v.problem(&at, format!("\"{server}\" names no host"))
            }
            Ok(u) => out.push(format!(
                "{}://{}:{}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.port().unwrap_or(4222)
            )),
            Err(e) => v.problem(&at, format!("\"{server}\" is not a url: {e}")),
        }
    }
    out
}

fn regex(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Option<Regex> {
    let text = written.unwrap_or(".*");
    match Regex::new(&format!("^(?:{text})$")) {
        Ok(r) => Some(r),
        Err(e) => {
            let first = e
                .to_string()
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string();
            v.problem(
                key,
                format!("invalid regular expression \"{text}\": {first}"),
            );
            None
        }
    }
}

/// A secret written inline (with `${VAR}`) or in a file, not both.
fn secret(
    v: &mut Validator<'_>,
    key: &str,
    (name, inline): (&str, Option<&str>),
    (file_name, file): (&str, Option<&str>),
) -> Option<Option<Secret>> {
    match (inline, file) {
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{key}.{file_name}"),
                format!("give either {name} or {file_name}, not both"),
            );
            None
        }
        (Some(text), None) => v
            .expand(&format!("{key}.{name}"), text)
            .map(|s| Some(Secret(s))),
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(s) => Some(Some(Secret(s.trim_end_matches(['\n', '\r']).to_string()))),
            Err(e) => {
                v.problem(
                    &format!("{key}.{file_name}"),
                    format!("cannot read \"{path}\": {e}"),
                );
                None
            }
        },
        (None, None) => Some(None),
    }
}

/// `user` + `password`/`password_file`, or `token`/`token_file`, or none.
fn auth(v: &mut Validator<'_>, key: &str, s: &RawNats) -> Option<Auth> {
    let password = secret(
        v,
        key,
        ("password", s.password.as_deref()),
        ("password_file", s.password_file.as_deref()),
    );
    let token = secret(
        v,
        key,
        ("token", s.token.as_deref()),
        ("token_file", s.token_file.as_deref()),
    );
    let user = match s.user.as_deref() {
        Some(u) => Some(v.expand(&format!("{key}.user"), u)?),
        None => None,
    };
    match (user, password?, token?) {
        (_, _, Some(_))
            if s.user.is_some() || s.password.is_some() || s.password_file.is_some() =>
        {
            v.problem(
                &format!("{key}.token"),
                "give either a token or user and password, not both".into(),
            );
            None
        }
        (None, None, Some(t)) => Some(Auth::Token(t)),
        (Some(user), Some(password), None) if !user.is_empty() => {
            Some(Auth::Password { user, password })
        }
        (Some(_), Some(_), None) => {
            v.problem(&format!("{key}.user"), "must not be empty".into());
            None
        }
        (Some(_), None, None) => {
            v.problem(
                &format!("{key}.password"),
                "required with user (or password_file)".into(),
            );
            None
        }
        (None, Some(_), None) => {
            v.problem(&format!("{key}.user"), "required with a password".into());
            None
        }
        (None, None, None) => Some(Auth::None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    fn problems(entry: &str) -> Vec<String> {
        match crate::config::parse_str(&format!(
            "[[sources]]\nname = \"js\"\nkind = \"nats\"\n{entry}"
        )) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Guards the keys of the entry: each problem by its full key, no
    /// secret in a url.
    #[test]
    fn problems_are_named_by_key() {
        assert!(problems("url = \"nats://127.0.0.1:4222\"\n").is_empty());
        let p = problems("url = \"nats://u:secret@h:4222\"\n");
        assert!(p.len() == 1 && p[0].contains("sources[0].url"), "{p:?}");
        assert!(!p[0].contains("secret"), "{p:?}");
        let p = problems("url = \"http://h\"\nstreams = \"(\"\n");
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("sources[0].url") && p[1].contains("sources[0].streams"));
        let p = problems("url = \"h:4222\"\nuser = \"u\"\n");
        assert!(
            p.len() == 1 && p[0].contains("sources[0].password"),
            "{p:?}"
        );
        let p = problems("url = \"h:4222\"\ntoken = \"t\"\npassword = \"p\"\nuser = \"u\"\n");
        assert!(p.len() == 1 && p[0].contains("sources[0].token"), "{p:?}");
        let p = problems("url = \"h:4222\"\n[sources.tls]\nca_file = \"/nonexistent.pem\"\n");
        assert!(
            p.len() == 1 && p[0].contains("sources[0].tls.ca_file"),
            "{p:?}"
        );
        let p = problems("url = \"h:4222\"\n[sources.objectives]\np95 = \"1s\"\n");
        assert!(
            p.len() == 1 && p[0].contains("sources[0].objectives.p95"),
            "{p:?}"
        );
    }
}
