//! The `kind = "rabbitmq"` source's settings, validated. The settings every
//! source has (name, owner, service, poll interval, timeout, the objective
//! of the oldest age) are read and checked by [`crate::sources::common`]; a
//! RabbitMQ source embeds them.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use crate::sources::common::{self, Common, Defaults, RawCommon};
use crate::sources::common::{RawTls, tls_config};
use crate::sources::queue;
use crate::validation::{Validator, expand_env};

/// A validated RabbitMQ source.
#[derive(Debug, Clone)]
pub struct RabbitSpec {
    /// Name, owner, service, poll interval, timeout, objectives.
    pub common: Common,
    /// The management API's base URL, without a trailing `/` (never with
    /// credentials: they are `username` and `password`).
    pub management_url: String,
    pub username: String,
    pub password: Secret,
    /// Virtual hosts watched, a regex matched against whole names.
    pub vhosts: Regex,
    /// Queues watched, a regex matched against whole names.
    pub queues: Regex,
    /// The window a queue's status is judged over.
    pub status_window: Duration,
    /// TLS to the management API (an `https` URL): roots and client certificate.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `[sources.election]`: the AMQP connection whose exclusive queue
    /// decides which agent owns the source; none: owned outright.
    pub election: Option<ElectionUrl>,
    /// `streams_url`: the stream protocol's host and port, where stream
    /// queues' last offsets, chunk times and stored offsets are read.
    pub streams: Option<StreamsUrl>,
    /// `stream_consumers`: the names stream consumers store their offsets
    /// under (RabbitMQ 3.10 lists no such names: they are given).
    pub stream_consumers: Vec<String>,
}

/// Where the stream protocol is read (plain TCP).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamsUrl {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for StreamsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "rabbitmq-stream://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "rabbitmq-stream://{}:{}", self.host, self.port)
        }
    }
}

/// Where and as whom the election's lock is taken.
#[derive(Debug, Clone)]
pub struct ElectionUrl {
    pub host: String,
    pub port: u16,
    pub vhost: String,
    pub username: String,
    pub password: Secret,
}

impl Deref for RabbitSpec {
    type Target = Common;

    fn deref(&self) -> &Common {
        &self.common
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

/// A `kind = "rabbitmq"` entry's own keys as written, besides those every
/// source has ([`RawCommon`]).
#[derive(Debug, Default, Deserialize)]
pub struct RawRabbit {
    /// The management plugin's base URL, `http://host:15672` or `https://…`.
    pub management_url: Option<String>,
    /// A user of the management API; the `monitoring` tag suffices.
    pub username: Option<String>,
    /// Its password; `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
    /// Virtual hosts to watch, a regex of whole names (default every one).
    pub vhosts: Option<String>,
    /// Queues to watch, a regex of whole names (default every one).
    pub queues: Option<String>,
    /// The sliding window a queue's status is judged over (default `5m`).
    pub status_window: Option<String>,
    /// TLS to the management API.
    pub tls: Option<RawTls>,
    /// One owner per source across agents: an AMQP user that may declare
    /// the lock queue.
    pub election: Option<RawElection>,
    /// `rabbitmq-stream://host:5552`: stream consumers' offsets and chunk
    /// times, over the stream protocol, as `username`.
    pub streams_url: Option<String>,
    /// The names stream consumers store offsets under.
    pub stream_consumers: Option<Vec<String>>,
}

/// `[sources.election]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawElection {
    /// `amqp://host:5672/vhost` (the vhost percent-encoded, `%2F` for `/`;
    /// no credentials).
    pub url: Option<String>,
    /// A user with configure rights on `inboxwatch.election.<source>`.
    pub username: Option<String>,
    /// Its password; `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
}

/// The settings every source has, as a RabbitMQ source reads them: the
/// broker read every 15 s, within a timeout of the poll interval, at least
/// 10 s; the objective of the oldest age is exported.
const COMMON: Defaults = Defaults {
    kind: "rabbitmq",
    poll_interval: Duration::from_secs(15),
    timeout_floor: Duration::from_secs(10),
    objectives: &["oldest_age"],
};

/// Validates a `kind = "rabbitmq"` entry.
pub(crate) fn validate(
    v: &mut Validator<'_>,
    key: &str,
    name: String,
    (common, s): (RawCommon, RawRabbit),
) -> Option<RabbitSpec> {
    let management_url = management_url(v, key, s.management_url.as_deref());
    let username = username(v, key, s.username.as_deref());
    let password = password(v, key, s.password.as_deref(), s.password_file.as_deref());
    let election = s
        .election
        .as_ref()
        .map(|e| election(v, &format!("{key}.election"), e));
    let vhosts = regex(
        v,
        &format!("{key}.vhosts"),
        s.vhosts.as_deref().unwrap_or(".*"),
    );
    let queues = regex(
        v,
        &format!("{key}.queues"),
        s.queues.as_deref().unwrap_or(".*"),
    );
    let streams = s
        .streams_url
        .as_deref()
        .map(|u| streams_url(v, &format!("{key}.streams_url"), u));
    let stream_consumers = s.stream_consumers.unwrap_or_default();
    for (i, c) in stream_consumers.iter().enumerate() {
        if c.is_empty() || c.len() > 255 {
            v.problem(
                &format!("{key}.stream_consumers[{i}]"),
                "a name of 1 to 255 bytes (the stream protocol's limit)".into(),
            );
        }
    }
    if !stream_consumers.is_empty() && streams.is_none() {
        v.problem(
            &format!("{key}.stream_consumers"),
            "needs streams_url (rabbitmq-stream://host:5552): stored offsets are read over the stream protocol".into(),
        );
    }
    let common = common::check(common, key, name, &COMMON, v);
    let status_window =
        queue::status_window(v, key, s.status_window.as_deref(), common.poll_interval);
    let tls = match (&s.tls, management_url.as_deref()) {
        (Some(t), url) => {
            if url.is_some_and(|u| u.starts_with("http://")) {
                v.problem(
                    &format!("{key}.tls"),
                    "only with an https:// management_url".into(),
                );
            }
            match tls_config(t) {
                Ok(c) => Some(Arc::new(c)),
                Err((k, message)) => {
                    v.problem(&format!("{key}.tls.{k}"), message);
                    None
                }
            }
        }
        (None, _) => None,
    };
    Some(RabbitSpec {
        common,
        management_url: management_url?,
        username: username?,
        password: password?,
        vhosts: vhosts?,
        queues: queues?,
        status_window,
        tls,
        election: match election {
            Some(e) => Some(e?),
            None => None,
        },
        streams: match streams {
            Some(u) => Some(u?),
            None => None,
        },
        stream_consumers,
    })
}

/// `streams_url`: `rabbitmq-stream://host[:5552]`, no credentials (the
/// source's `username` and `password` are used), no vhost (each watched
/// vhost is opened in turn).
fn streams_url(v: &mut Validator<'_>, at: &str, written: &str) -> Option<StreamsUrl> {
    let text = v.expand(at, written)?;
    let (u, host) = broker_url(
        v,
        at,
        &text,
        ("rabbitmq-stream", "rabbitmq-stream+tls"),
        "the source's username and password are used",
    )?;
    if !matches!(u.path(), "" | "/") {
        v.problem(
            at,
            "must not name a vhost: every watched vhost is read".into(),
        );
        return None;
    }
    Some(StreamsUrl {
        host,
        port: u.port().unwrap_or(5552),
    })
}

/// A broker's URL of `scheme` (`.0`; `.1`, its TLS form, is named as not
/// supported) with a host and no credentials (`credentials` says whose are
/// used): the URL and its host (without an IPv6 address's brackets).
fn broker_url(
    v: &mut Validator<'_>,
    at: &str,
    text: &str,
    (scheme, tls): (&str, &str),
    credentials: &str,
) -> Option<(url::Url, String)> {
    let problem = match url::Url::parse(text) {
        Err(e) => format!("not a URL: {e}"),
        Ok(u) if u.scheme() != scheme => format!(
            "scheme \"{}\": expected {scheme} ({tls} is not supported)",
            u.scheme()
        ),
        Ok(u) if !u.username().is_empty() || u.password().is_some() => {
            format!("must not hold credentials: {credentials}")
        }
        Ok(u) => match u.host_str().filter(|h| !h.is_empty()) {
            None => "needs a host".into(),
            Some(host) => {
                let host = host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                return Some((u, host));
            }
        },
    };
    v.problem(at, problem);
    None
}

/// `[sources.election]`: `url` (amqp://host:port/vhost), `username`, and
/// `password` or `password_file`.
fn election(v: &mut Validator<'_>, key: &str, e: &RawElection) -> Option<ElectionUrl> {
    let at = format!("{key}.url");
    let url = match e.url.as_deref() {
        None => {
            v.problem(&at, "required (amqp://host:5672/vhost)".into());
            None
        }
        Some(text) => v.expand(&at, text).and_then(|text| {
            let (u, host) = broker_url(
                v,
                &at,
                &text,
                ("amqp", "amqps"),
                "give username and password",
            )?;
            let path = u.path().trim_start_matches('/');
            let vhost = if path.is_empty() {
                "/".to_string()
            } else {
                percent_encoding::percent_decode_str(path)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            Some((host, u.port().unwrap_or(5672), vhost))
        }),
    };
    let username = username(v, key, e.username.as_deref());
    let password = password(v, key, e.password.as_deref(), e.password_file.as_deref());
    let (host, port, vhost) = url?;
    Some(ElectionUrl {
        host,
        port,
        vhost,
        username: username?,
        password: password?,
    })
}

/// `management_url`: required, `http://` or `https://` with a host, no
/// credentials, no query; kept without a trailing `/`.
fn management_url(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Option<String> {
    let at = format!("{key}.management_url");
    let Some(text) = written else {
        v.problem(
            &at,
            "required (the management plugin's URL, e.g. http://127.0.0.1:15672)".into(),
        );
        return None;
    };
    let text = v.expand(&at, text)?;
    let url = match url::Url::parse(&text) {
        Ok(u) => u,
        Err(e) => {
            v.problem(&at, format!("not a URL: {e}"));
            return None;
        }
    };
    let problem = if !matches!(url.scheme(), "http" | "https") {
        Some(format!(
            "scheme \"{}\": expected http or https",
            url.scheme()
        ))
    } else if url.host_str().is_none_or(str::is_empty) {
        Some("needs a host".into())
    } else if !url.username().is_empty() || url.password().is_some() {
        Some("must not hold credentials: give username and password".into())
    } else if url.query().is_some() || url.fragment().is_some() {
        Some("must not have a query or fragment".into())
    } else {
        None
    };
    if let Some(p) = problem {
        v.problem(&at, p);
        return None;
    }
    Some(url.as_str().trim_end_matches('/').to_string())
}

fn username(v: &mut Validator<'_>, key: &str, written: Option<&str>) -> Option<String> {
    let at = format!("{key}.username");
    match written {
        Some(u) if !u.is_empty() => v.expand(&at, u),
        _ => {
            v.problem(&at, "required (a user tagged monitoring suffices)".into());
            None
        }
    }
}

/// `password` (with `${VAR}`) or `password_file`, exactly one.
fn password(
    v: &mut Validator<'_>,
    key: &str,
    password: Option<&str>,
    password_file: Option<&str>,
) -> Option<Secret> {
    let env = v.env();
    let text = match (password, password_file) {
        (Some(_), Some(_)) => {
            v.problem(
                &format!("{key}.password_file"),
                "give either password or password_file, not both".into(),
            );
            None
        }
        (Some(p), None) => match expand_env(p, env) {
            Ok(p) => Some(p),
            Err(var) => {
                v.problem(
                    &format!("{key}.password"),
                    format!("environment variable {var} is not set"),
                );
                None
            }
        },
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(p) => Some(p.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) => {
                v.problem(
                    &format!("{key}.password_file"),
                    format!("cannot read \"{path}\": {e}"),
                );
                None
            }
        },
        (None, None) => {
            v.problem(
                &format!("{key}.password"),
                "required (or password_file)".into(),
            );
            None
        }
    };
    text.map(Secret)
}

fn regex(v: &mut Validator<'_>, key: &str, text: &str) -> Option<Regex> {
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

#[cfg(test)]
mod tests {
    fn problems(entry: &str) -> Vec<String> {
        match crate::config::parse_str(&format!(
            "[[sources]]\nname = \"r\"\nkind = \"rabbitmq\"\n{entry}"
        )) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Guards the checks of the kind's own keys, each by its full key.
    #[test]
    fn settings_are_checked_by_full_key() {
        let ok =
            "management_url = \"http://127.0.0.1:15672/\"\nusername = \"m\"\npassword = \"p\"\n";
        assert!(problems(ok).is_empty(), "{:?}", problems(ok));
        for (entry, key) in [
            (
                "username = \"m\"\npassword = \"p\"\n",
                "sources[0].management_url",
            ),
            (
                "management_url = \"amqp://h:5672\"\nusername = \"m\"\npassword = \"p\"\n",
                "sources[0].management_url",
            ),
            (
                "management_url = \"http://u:secret@h:15672\"\nusername = \"m\"\npassword = \"p\"\n",
                "sources[0].management_url",
            ),
            (
                "management_url = \"http://h:15672\"\npassword = \"p\"\n",
                "sources[0].username",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\n",
                "sources[0].password",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\nqueues = \"(\"\n",
                "sources[0].queues",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"${INBOXWATCH_TEST_UNSET_RABBIT}\"\n",
                "sources[0].password",
            ),
            (
                "management_url = \"https://h:15671\"\nusername = \"m\"\npassword = \"p\"\n[sources.tls]\nca_file = \"/nonexistent.pem\"\n",
                "sources[0].tls",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\n[sources.election]\nurl = \"amqp://u:secret@h:5672/\"\nusername = \"e\"\npassword = \"p\"\n",
                "sources[0].election.url",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\n[sources.election]\nurl = \"amqp://h:5672/%2F\"\nusername = \"e\"\n",
                "sources[0].election.password",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\nstreams_url = \"amqp://h:5552\"\n",
                "sources[0].streams_url",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\nstreams_url = \"rabbitmq-stream://u:secret@h:5552\"\n",
                "sources[0].streams_url",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\nstream_consumers = [\"billing\"]\n",
                "sources[0].stream_consumers",
            ),
            (
                "management_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\nstreams_url = \"rabbitmq-stream://h\"\nstream_consumers = [\"\"]\n",
                "sources[0].stream_consumers[0]",
            ),
        ] {
            let got = problems(entry);
            assert!(
                got.len() == 1 && got[0].contains(key),
                "{entry}: {got:?} (want one problem at {key})"
            );
            assert!(!got[0].contains("secret"), "{got:?}");
        }
    }
}
