//! The `kind = "redis_streams"` source's settings, validated: where the
//! Redis server is (a `redis://` or `rediss://` URL, its password from
//! `${VAR}` or a file, never printed), which streams are watched (a list of
//! names, or every stream whose name matches a `SCAN` pattern), their
//! dead-letter streams, and the bounds of the reads that are not constant in
//! cost. The settings every source has are [`crate::sources::common`]'s.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::sources::common::{self, Common, Defaults, RawCommon};
use crate::sources::common::{RawTls, tls_config};
use crate::sources::queue;
use crate::validation::{Validator, expand_env};

/// The default bound of the `XPENDING` scan for redelivered entries, per group.
pub const DEFAULT_REDELIVERY_SCAN_LIMIT: usize = 1000;
/// The default bound of the ids counted when Redis cannot say a group's lag.
pub const DEFAULT_LAG_COUNT_LIMIT: usize = 10_000;

/// A validated Redis Streams source.
#[derive(Debug, Clone)]
pub struct RedisStreamsSpec {
    /// Name, owner, service, poll interval, timeout, objectives.
    pub common: Common,
    /// Where the server is and how to log in.
    pub server: Server,
    /// Which streams are watched.
    pub streams: Streams,
    /// Watched stream → its dead-letter stream.
    pub dead_letter_streams: BTreeMap<String, String>,
    /// Pending entries read per group, at most, to count the redelivered ones.
    pub redelivery_scan_limit: usize,
    /// Entry ids read per group, at most, to count its lag when Redis
    /// cannot say it.
    pub lag_count_limit: usize,
    /// The window a consumer group's status is judged over.
    pub status_window: Duration,
}

impl Deref for RedisStreamsSpec {
    type Target = Common;

    fn deref(&self) -> &Common {
        &self.common
    }
}

/// The streams a source watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Streams {
    /// `streams = [...]`: these names.
    Named(Vec<String>),
    /// `discover = "pattern"`: every stream key `SCAN ... MATCH pattern TYPE
    /// stream` finds.
    Pattern(String),
}

/// The server: address, database, credentials, TLS.
#[derive(Clone)]
pub struct Server {
    pub host: String,
    pub port: u16,
    /// The database number (`/0` in the URL).
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// `rediss://`: the rustls client config (the URL's host is the name checked).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The entry's key (`sources[2]`): errors name the setting at fault.
    pub key: String,
}

impl Server {
    /// `redis://host:port/db` or `rediss://…`, with the user but never the password.
    pub fn shown(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let user = match (&self.username, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            (None, Some(_)) => ":***@".to_string(),
            (None, None) => String::new(),
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{scheme}://{user}{host}:{}/{}", self.port, self.db)
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

/// A password: never printed.
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

/// A `kind = "redis_streams"` entry's own keys as written, besides those
/// every source has ([`RawCommon`]).
#[derive(Debug, Default, Deserialize)]
pub struct RawRedisStreams {
    /// `redis://[user@]host[:port][/db]`, or `rediss://` for TLS; `${VAR}`
    /// is replaced by the environment variable VAR. Required.
    pub url: Option<String>,
    /// The ACL user (instead of the URL's); `${VAR}` is expanded.
    pub username: Option<String>,
    /// The password; `${VAR}` is replaced by the environment variable VAR.
    pub password: Option<String>,
    /// A file whose content is the password; instead of `password`.
    pub password_file: Option<String>,
    /// The stream names to watch (with `discover = "list"`, the default).
    pub streams: Option<Vec<String>>,
    /// `list` (the `streams` names, default) or `pattern` (every stream
    /// whose name matches `pattern`, found by `SCAN … TYPE stream`).
    pub discover: Option<String>,
    /// With `discover = "pattern"`: a glob as `SCAN MATCH` takes it (`orders:*`).
    pub pattern: Option<String>,
    /// Watched stream name → the stream its consumers copy dead letters to.
    pub dead_letter_streams: Option<BTreeMap<String, String>>,
    /// Pending entries read per group and poll, at most, to count those
    /// delivered more than once (default 1000).
    pub redelivery_scan_limit: Option<i64>,
    /// Entry ids read per group and poll, at most, to count its lag when
    /// Redis cannot say it (after `XDEL` in the undelivered range; default 10000).
    pub lag_count_limit: Option<i64>,
    /// The sliding window a group's status is judged over (default `5m`).
    pub status_window: Option<String>,
    /// TLS settings, with a `rediss://` URL.
    pub tls: Option<RawTls>,
}

/// The settings every source has, as a Redis Streams source reads them:
/// read every 10 s, within a timeout of the poll interval, at least 5 s; an
/// `oldest_age` objective.
const COMMON: Defaults = Defaults {
    kind: "redis_streams",
    poll_interval: Duration::from_secs(10),
    timeout_floor: Duration::from_secs(5),
    objectives: &["oldest_age"],
};

/// Validates a `kind = "redis_streams"` entry.
pub(crate) fn validate(
    v: &mut Validator<'_>,
    key: &str,
    name: String,
    (common, s): (RawCommon, RawRedisStreams),
) -> Option<RedisStreamsSpec> {
    let server = server(v, key, &s);
    let streams = streams(v, key, &s);
    let dead_letter_streams = dead_letter_streams(v, key, &s, streams.as_ref());
    let common = common::check(common, key, name, &COMMON, v);
    let status_window =
        queue::status_window(v, key, s.status_window.as_deref(), common.poll_interval);
    let redelivery_scan_limit = v.positive(
        &format!("{key}.redelivery_scan_limit"),
        s.redelivery_scan_limit,
        DEFAULT_REDELIVERY_SCAN_LIMIT,
        1_000_000,
    );
    let lag_count_limit = v.positive(
        &format!("{key}.lag_count_limit"),
        s.lag_count_limit,
        DEFAULT_LAG_COUNT_LIMIT,
        10_000_000,
    );
    Some(RedisStreamsSpec {
        common,
        server: server?,
        streams: streams?,
        dead_letter_streams,
        redelivery_scan_limit,
        lag_count_limit,
        status_window,
    })
}

/// `url`, `username`, `password` / `password_file` and `[sources.tls]`.
fn server(v: &mut Validator<'_>, key: &str, s: &RawRedisStreams) -> Option<Server> {
    let at = format!("{key}.url");
    let Some(written) = s.url.as_deref() else {
        v.problem(
            &at,
            "required (redis://host:port/db or rediss://...)".into(),
        );
        return None;
    };
    // The URL is never printed: a password may be in it.
    let text = match expand_env(written, v.env()) {
        Ok(t) => t,
        Err(var) => {
            v.problem(&at, format!("environment variable {var} is not set"));
            return None;
        }
    };
    let url = match Url::parse(&text) {
        Ok(u) => u,
        Err(e) => {
            v.problem(&at, format!("not a URL: {e}"));
            return None;
        }
    };
    let tls_wanted = match url.scheme() {
        "redis" => false,
        "rediss" => true,
        other => {
            v.problem(
                &at,
                format!("unknown scheme \"{other}\" (expected redis:// or rediss://)"),
            );
            return None;
        }
    };
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        v.problem(&at, "needs a host (redis://host:port/db)".into());
        return None;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let db = match url.path().trim_start_matches('/') {
        "" => 0,
        d => match d.parse::<i64>() {
            Ok(n) if n >= 0 => n,
            _ => {
                v.problem(
                    &at,
                    format!("the path is the database number (/0), not \"/{d}\""),
                );
                return None;
            }
        },
    };
    if url.query().is_some() {
        v.problem(
            &at,
            "takes no query parameters (TLS settings are [sources.tls])".into(),
        );
    }
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .ok()
    };
    let url_user = decode(url.username()).filter(|u| !u.is_empty());
    let url_password = url.password().and_then(decode);
    let username = match &s.username {
        Some(u) => v.expand(&format!("{key}.username"), u),
        None => url_user,
    };
    let password = password(v, key, s, url_password)?;
    let tls = match (&s.tls, tls_wanted) {
        (Some(_), false) => {
            v.problem(
                &format!("{key}.tls"),
                "needs a rediss:// url (redis:// is plain TCP)".into(),
            );
            return None;
        }
        (t, true) => match tls_config(t.as_ref().unwrap_or(&RawTls::default())) {
            Ok(c) => Some(Arc::new(c)),
            Err((k, message)) => {
                v.problem(&format!("{key}.tls.{k}"), message);
                return None;
            }
        },
        (None, false) => None,
    };
    Some(Server {
        host,
        port: url.port().unwrap_or(6379),
        db,
        username,
        password: password.map(Secret),
        tls,
        key: key.to_string(),
    })
}

/// The password: `password`, `password_file` or the URL's, one of them.
fn password(
    v: &mut Validator<'_>,
    key: &str,
    s: &RawRedisStreams,
    from_url: Option<String>,
) -> Option<Option<String>> {
    let given = [
        s.password.is_some(),
        s.password_file.is_some(),
        from_url.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        v.problem(
            &format!("{key}.password"),
            "give one of password, password_file or a password in the url".into(),
        );
        return None;
    }
    if let Some(p) = &s.password {
        return v.expand(&format!("{key}.password"), p).map(Some);
    }
    if let Some(path) = &s.password_file {
        return match std::fs::read_to_string(path) {
            Ok(p) => Some(Some(p.trim_end_matches(['\n', '\r']).to_string())),
            Err(e) => {
                v.problem(
                    &format!("{key}.password_file"),
                    format!("cannot read \"{path}\": {e}"),
                );
                None
            }
        };
    }
    Some(from_url)
}

/// `streams`, or `discover = "pattern"` with `pattern`.
fn streams(v: &mut Validator<'_>, key: &str, s: &RawRedisStreams) -> Option<Streams> {
    match s.discover.as_deref() {
        None | Some("list") => {
            if s.pattern.is_some() {
                v.problem(
                    &format!("{key}.pattern"),
                    "only with discover = \"pattern\"".into(),
                );
            }
            let Some(names) = &s.streams else {
                v.problem(
                    &format!("{key}.streams"),
                    "required (stream names), or discover = \"pattern\" with a pattern".into(),
                );
                return None;
            };
            if names.is_empty() {
                v.problem(
                    &format!("{key}.streams"),
                    "needs at least one stream".into(),
                );
                return None;
            }
            let mut ok = true;
            for (i, n) in names.iter().enumerate() {
                if n.is_empty() {
                    v.problem(&format!("{key}.streams[{i}]"), "must not be empty".into());
                    ok = false;
                } else if names[..i].contains(n) {
                    v.problem(&format!("{key}.streams[{i}]"), format!("\"{n}\" twice"));
                    ok = false;
                }
            }
            ok.then(|| Streams::Named(names.clone()))
        }
        Some("pattern") => {
            if s.streams.is_some() {
                v.problem(
                    &format!("{key}.streams"),
                    "not with discover = \"pattern\" (the pattern finds the streams)".into(),
                );
            }
            match s.pattern.as_deref() {
                Some(p) if !p.is_empty() => Some(Streams::Pattern(p.to_string())),
                _ => {
                    v.problem(
                        &format!("{key}.pattern"),
                        "required with discover = \"pattern\" (a SCAN MATCH glob, e.g. \"orders:*\")"
                            .into(),
                    );
                    None
                }
            }
        }
        Some(other) => {
            v.problem(
                &format!("{key}.discover"),
                format!("unknown discover \"{other}\" (expected list or pattern)"),
            );
            None
        }
    }
}

/// `dead_letter_streams`: watched stream → dead-letter stream; a listed
/// stream must be one of `streams`.
fn dead_letter_streams(
    v: &mut Validator<'_>,
    key: &str,
    s: &RawRedisStreams,
    streams: Option<&Streams>,
) -> BTreeMap<String, String> {
    let written = s.dead_letter_streams.clone().unwrap_or_default();
    for (from, to) in &written {
        let at = format!("{key}.dead_letter_streams.{from}");
        if to.is_empty() {
            v.problem(&at, "must name a stream".into());
        } else if to == from {
            v.problem(&at, "a stream cannot be its own dead-letter stream".into());
        }
        if let Some(Streams::Named(names)) = streams
            && !names.contains(from)
        {
            v.problem(&at, format!("\"{from}\" is not one of the watched streams"));
        }
    }
    written
}

#[cfg(test)]
mod tests {
    /// The problems of one redis_streams entry.
    fn problems(entry: &str) -> Vec<String> {
        let text = format!("[[sources]]\nname = \"r\"\nkind = \"redis_streams\"\n{entry}");
        match crate::config::parse_str(&text) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Guards the keys each problem is reported at, and that no password
    /// appears in any message.
    #[test]
    fn problems_name_their_keys_and_no_secret() {
        assert!(problems("url = \"redis://127.0.0.1:6379/0\"\nstreams = [\"a\"]\n").is_empty());
        let p = problems("streams = [\"a\"]\n");
        assert!(p.iter().any(|p| p.contains("sources[0].url")), "{p:?}");
        let p = problems("url = \"http://h\"\nstreams = [\"a\"]\n");
        assert!(p.iter().any(|p| p.contains("unknown scheme")), "{p:?}");
        let p = problems("url = \"redis://u:hunter22@h/x\"\nstreams = [\"a\"]\n");
        assert!(
            p.iter().any(|p| p.contains("database number"))
                && !p.iter().any(|p| p.contains("hunter22")),
            "{p:?}"
        );
        let p = problems("url = \"redis://h\"\ndiscover = \"pattern\"\n");
        assert!(p.iter().any(|p| p.contains("sources[0].pattern")), "{p:?}");
        let p = problems(
            "url = \"redis://h\"\nstreams = [\"a\"]\ndead_letter_streams = { b = \"b:dead\" }\n",
        );
        assert!(
            p.iter()
                .any(|p| p.contains("sources[0].dead_letter_streams.b")),
            "{p:?}"
        );
        let p =
            problems("url = \"redis://h\"\nstreams = [\"a\"]\n[sources.tls]\nca_file = \"/x\"\n");
        assert!(p.iter().any(|p| p.contains("sources[0].tls")), "{p:?}");
        let p = problems(
            "url = \"redis://h\"\nstreams = [\"a\"]\npassword = \"${INBOXWATCH_UNSET_VAR_X}\"\n",
        );
        assert!(
            p.iter()
                .any(|p| p.contains("sources[0].password") && p.contains("INBOXWATCH_UNSET_VAR_X")),
            "{p:?}"
        );
    }

    #[test]
    fn the_url_shown_has_no_password() {
        let text = "[[sources]]\nname = \"r\"\nkind = \"redis_streams\"\nurl = \"redis://app:s3cret-pw@10.0.0.1:6380/3\"\nstreams = [\"a\"]\n";
        let config = crate::config::parse_str(text).expect("valid");
        let shown = config.sources[0].describe();
        assert!(shown.contains("redis://app:***@10.0.0.1:6380/3"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
