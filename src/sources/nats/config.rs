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
    /// `nkey_seed` / `nkey_seed_file`: a user seed (`SU…`) that signs the
    /// server's nonce; `public` is its public key (`U…`), for messages.
    NKey { seed: Secret, public: String },
    /// `credentials_file`: a user JWT, and the seed that signs the nonce.
    Credentials {
        jwt: String,
        seed: Secret,
        public: String,
    },
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
    /// An NKey user seed (`SU…`); `${VAR}` is replaced by the environment
    /// variable VAR.
    pub nkey_seed: Option<String>,
    /// A file whose content is the NKey user seed; instead of `nkey_seed`.
    pub nkey_seed_file: Option<String>,
    /// A `.creds` file: a user JWT and its NKey seed.
    pub credentials_file: Option<String>,
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

/// `user` + `password`/`password_file`, `token`/`token_file`,
/// `nkey_seed`/`nkey_seed_file`, `credentials_file`, or none.
fn auth(v: &mut Validator<'_>, key: &str, s: &RawNats) -> Option<Auth> {
    let written = |keys: &[(&'static str, bool)]| {
        keys.iter()
            .filter(|(_, is)| *is)
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
    };
    let password_keys = written(&[
        ("user", s.user.is_some()),
        ("password", s.password.is_some()),
        ("password_file", s.password_file.is_some()),
        ("token", s.token.is_some()),
        ("token_file", s.token_file.is_some()),
    ]);
    let nkey_keys = written(&[
        ("nkey_seed", s.nkey_seed.is_some()),
        ("nkey_seed_file", s.nkey_seed_file.is_some()),
    ]);
    let creds_keys = written(&[("credentials_file", s.credentials_file.is_some())]);
    let ways = [&password_keys, &nkey_keys, &creds_keys];
    if ways.iter().filter(|k| !k.is_empty()).count() > 1 {
        // Named by the key of the later way: an NKey seed, then a .creds file.
        let at = if creds_keys.is_empty() {
            nkey_keys[0]
        } else {
            creds_keys[0]
        };
        let others: Vec<&str> = ways
            .iter()
            .flat_map(|k| k.iter().copied())
            .filter(|k| *k != at)
            .collect();
        v.problem(
            &format!("{key}.{at}"),
            format!(
                "give one way to log in: {at} cannot go with {}",
                others.join(", ")
            ),
        );
        return None;
    }
    if !nkey_keys.is_empty() {
        let seed = secret(
            v,
            key,
            ("nkey_seed", s.nkey_seed.as_deref()),
            ("nkey_seed_file", s.nkey_seed_file.as_deref()),
        )??;
        let at = format!("{key}.{}", nkey_keys[0]);
        let public = user_seed(v, &at, seed.expose())?;
        return Some(Auth::NKey { seed, public });
    }
    if !creds_keys.is_empty() {
        let contents = secret(
            v,
            key,
            ("credentials", None),
            ("credentials_file", s.credentials_file.as_deref()),
        )??;
        let at = format!("{key}.credentials_file");
        let Some((jwt, seed)) = creds_blocks(contents.expose()) else {
            v.problem(
                &at,
                "not a .creds file: it needs a user JWT block and a user NKey seed block, \
                 each between -----BEGIN …----- and ------END …------ lines"
                    .into(),
            );
            return None;
        };
        let public = user_seed(v, &at, seed)?;
        return Some(Auth::Credentials {
            jwt: jwt.to_string(),
            seed: Secret(seed.to_string()),
            public,
        });
    }
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

/// The public key (`U…`) of a user seed; a malformed seed is a problem at
/// `at`, told without the seed.
fn user_seed(v: &mut Validator<'_>, at: &str, seed: &str) -> Option<String> {
    match nkeys::KeyPair::from_seed(seed) {
        Ok(pair) if pair.key_pair_type() == nkeys::KeyPairType::User => Some(pair.public_key()),
        Ok(pair) => {
            v.problem(
                at,
                format!(
                    "a {:?} seed, not a user seed (a user seed starts with SU)",
                    pair.key_pair_type()
                ),
            );
            None
        }
        Err(_) => {
            v.problem(
                at,
                "not an NKey seed (a user seed: SU and 56 base32 characters, with a valid checksum)"
                    .into(),
            );
            None
        }
    }
}

/// The user JWT and the seed of a `.creds` file: its first two blocks, each
/// one line between `---…---` lines (`nsc`'s layout).
fn creds_blocks(text: &str) -> Option<(&str, &str)> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let fence = |l: &str| l.len() >= 6 && l.starts_with("---") && l.ends_with("---");
    let mut blocks = lines.windows(3).filter_map(|w| {
        (fence(w[0])
            && fence(w[2])
            && !w[1].is_empty()
            && w[1]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.=".contains(c)))
        .then_some(w[1])
    });
    Some((blocks.next()?, blocks.next()?))
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

    /// Guards the NKey keys: a seed and a .creds file accepted, each
    /// refused by its key when malformed or combined with another way to
    /// log in, the secret never in the message.
    #[test]
    fn nkey_seeds_and_creds_files_are_checked_by_key() {
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let seed_file = file("seed", &format!("{seed}\n"));
        assert!(problems(&format!("url = \"h:4222\"\nnkey_seed = \"{seed}\"\n")).is_empty());
        assert!(
            problems(&format!(
                "url = \"h:4222\"\nnkey_seed_file = \"{seed_file}\"\n"
            ))
            .is_empty()
        );
        let creds = format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.eyJzdWIiOiJVIn0.c2ln\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        let creds_file = file("user.creds", &creds);
        assert!(
            problems(&format!(
                "url = \"h:4222\"\ncredentials_file = \"{creds_file}\"\n"
            ))
            .is_empty()
        );
        // Malformed: one character changed (the checksum fails), an account
        // seed, a .creds file without its seed block.
        let mut broken = seed.clone().into_bytes();
        broken[10] = if broken[10] == b'A' { b'B' } else { b'A' };
        let broken = String::from_utf8(broken).unwrap();
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let no_seed = file("half.creds", creds.split("\n\n").next().unwrap());
        let bad_creds = file("bad.creds", &creds.replace(&seed, &broken));
        for (entry, at, hidden) in [
            (
                format!("nkey_seed = \"{broken}\""),
                "sources[0].nkey_seed",
                broken.as_str(),
            ),
            (
                format!("nkey_seed = \"{account}\""),
                "sources[0].nkey_seed",
                account.as_str(),
            ),
            (
                format!("nkey_seed_file = \"{}\"", file("bad", &broken)),
                "sources[0].nkey_seed_file",
                broken.as_str(),
            ),
            (
                format!("credentials_file = \"{no_seed}\""),
                "sources[0].credentials_file",
                seed.as_str(),
            ),
            (
                format!("credentials_file = \"{bad_creds}\""),
                "sources[0].credentials_file",
                broken.as_str(),
            ),
            (
                format!("nkey_seed = \"{seed}\"\nnkey_seed_file = \"{seed_file}\""),
                "sources[0].nkey_seed_file",
                seed.as_str(),
            ),
            (
                format!("nkey_seed = \"{seed}\"\nuser = \"u\"\npassword = \"p\""),
                "sources[0].nkey_seed",
                seed.as_str(),
            ),
            (
                format!("nkey_seed = \"{seed}\"\ntoken = \"t\""),
                "sources[0].nkey_seed",
                seed.as_str(),
            ),
            (
                format!("credentials_file = \"{creds_file}\"\nnkey_seed = \"{seed}\""),
                "sources[0].credentials_file",
                seed.as_str(),
            ),
            (
                format!("credentials_file = \"{creds_file}\"\ntoken_file = \"{seed_file}\""),
                "sources[0].credentials_file",
                seed.as_str(),
            ),
        ] {
            let p = problems(&format!("url = \"h:4222\"\n{entry}\n"));
            assert!(p.len() == 1 && p[0].contains(at), "{entry}: {p:?}");
            assert!(!p[0].contains(hidden), "{entry}: {p:?}");
        }
    }
}
