//! The settings every source has, whatever its kind: its name, owner and
//! service, how often it is polled and how long a poll may take, and its
//! objectives where the kind exports them. Read as one part of every
//! `[[sources]]` entry ([`RawCommon`]) and checked by [`check`], with one rule
//! per setting; a kind passes its own defaults ([`Defaults`]) and embeds the
//! result ([`Common`]) in its settings.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::validation::{Validator, is_owner, owner_problem};

/// The shortest `poll_interval` and `timeout`: below it a source would
/// hammer what it watches, and a poll could not finish.
pub const SHORTEST: Duration = Duration::from_millis(100);

/// The keys every `[[sources]]` entry takes (besides `name` and `kind`).
#[derive(Debug, Default, Deserialize)]
pub struct RawCommon {
    /// The team that owns the source (`owner` label of `inboxwatch_source_info`, and so of its alerts).
    pub owner: Option<String>,
    /// The `service` label of `inboxwatch_source_info` and, for a consumer's
    /// table, the `service.name` of its spans (default: the source name).
    pub service_name: Option<String>,
    /// How often the source is polled (default: the kind's; at least `100ms`).
    pub poll_interval: Option<String>,
    /// Longest time one poll may take (default: the poll interval, at least
    /// the kind's floor; at least `100ms`).
    pub timeout: Option<String>,
    /// Objectives exported as gauges for the alert rules, where the kind has them.
    pub objectives: Option<RawObjectives>,
}

/// `[sources.objectives]`.
#[derive(Debug, Default, Deserialize)]
pub struct RawObjectives {
    /// Objective for the age of the oldest unprocessed message.
    pub oldest_age: Option<String>,
    /// Objective for the 95th percentile of processing time.
    pub p95: Option<String>,
}

/// What differs between kinds in reading [`RawCommon`]: the defaults, and
/// whether the kind exports objectives. The rules do not differ.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// The kind's `kind = "…"`, for messages.
    pub kind: &'static str,
    /// `poll_interval` when the entry does not say.
    pub poll_interval: Duration,
    /// The least default `timeout`: unwritten, it is the poll interval or this,
    /// whichever is longer.
    pub timeout_floor: Duration,
    /// The objectives of `[sources.objectives]` the kind reads (`oldest_age`,
    /// `p95`); none refuses the section, and one it does not read is refused
    /// by its key.
    pub objectives: &'static [&'static str],
}

/// The checked settings every source has; each kind's settings embed them.
#[derive(Debug, Clone)]
pub struct Common {
    /// The configured name: the `source` label.
    pub name: String,
    /// `sources[i]`, for messages that point back at the file.
    pub key: String,
    /// The team that owns the source, checked by [`crate::validation::is_owner`].
    pub owner: Option<String>,
    /// `service_name` as written.
    pub service_name: Option<String>,
    /// How often the source is polled.
    pub poll_interval: Duration,
    /// Longest time one poll may take.
    pub timeout: Duration,
    pub objectives: Objectives,
}

impl Common {
    /// The `service` label: `service_name`, else the source name.
    pub fn service(&self) -> &str {
        self.service_name.as_deref().unwrap_or(&self.name)
    }
}

/// Per-source objectives, exported as `inboxwatch_objective_*` gauges.
#[derive(Debug, Clone, Default)]
pub struct Objectives {
    pub oldest_age: Option<Duration>,
    pub p95: Option<Duration>,
}

/// Checks the settings every source has, each by its one rule, with the
/// kind's `defaults`; `name` was read (and checked by [`check_name`]) with
/// the entry's `kind`. `key` is the entry's, e.g. `sources[2]`.
pub fn check(
    raw: RawCommon,
    key: &str,
    name: String,
    defaults: &Defaults,
    v: &mut Validator<'_>,
) -> Common {
    let owner = raw.owner.filter(|o| {
        let ok = is_owner(o);
        if !ok {
            v.problem(&format!("{key}.owner"), owner_problem(o));
        }
        ok
    });
    let service_name = raw.service_name.filter(|s| {
        let problem = text_problem(s);
        if let Some(p) = &problem {
            v.problem(&format!("{key}.service_name"), p.clone());
        }
        problem.is_none()
    });
    let poll_interval = at_least_shortest(
        v,
        &format!("{key}.poll_interval"),
        raw.poll_interval.as_deref(),
        defaults.poll_interval,
    );
    let timeout = at_least_shortest(
        v,
        &format!("{key}.timeout"),
        raw.timeout.as_deref(),
        poll_interval.max(defaults.timeout_floor),
    );
    let objectives = objectives(v, key, raw.objectives.as_ref(), defaults);
    Common {
        name,
        key: key.to_string(),
        owner,
        service_name,
        poll_interval,
        timeout,
        objectives,
    }
}

/// The rule of `poll_interval` and `timeout`: a duration of at least
/// [`SHORTEST`]; `default` when not written.
fn at_least_shortest(
    v: &mut Validator<'_>,
    key: &str,
    written: Option<&str>,
    default: Duration,
) -> Duration {
    let d = v.duration(key, written, default);
    if d < SHORTEST {
        v.problem(
            key,
            format!("must be at least {}", humantime::format_duration(SHORTEST)),
        );
    }
    d
}

/// `[sources.objectives]`: durations, on a kind that exports objectives.
fn objectives(
    v: &mut Validator<'_>,
    key: &str,
    raw: Option<&RawObjectives>,
    defaults: &Defaults,
) -> Objectives {
    let Some(raw) = raw else {
        return Objectives::default();
    };
    if defaults.objectives.is_empty() {
        v.problem(
            &format!("{key}.objectives"),
            format!(
                "{} sources export no objectives: nothing would read them",
                defaults.kind
            ),
        );
        return Objectives::default();
    }
    let mut duration = |name: &str, text: Option<&str>| {
        let text = text?;
        let at = format!("{key}.objectives.{name}");
        if !defaults.objectives.contains(&name) {
            v.problem(
                &at,
                format!(
                    "{} sources have no {name} objective (they read {})",
                    defaults.kind,
                    defaults.objectives.join(", ")
                ),
            );
            return None;
        }
        Some(v.duration(&at, Some(text), Duration::ZERO))
    };
    Objectives {
        oldest_age: duration("oldest_age", raw.oldest_age.as_deref()),
        p95: duration("p95", raw.p95.as_deref()),
    }
}

/// The source's name: it ends up in log lines, label values and `/readyz`
/// lines. Required, by the same rule as `service_name`.
pub fn check_name(v: &mut Validator<'_>, key: &str, name: Option<&str>) -> String {
    let at = format!("{key}.name");
    match name {
        Some(n) => match text_problem(n) {
            None => n.to_string(),
            Some(p) => {
                v.problem(&at, p);
                String::new()
            }
        },
        None => {
            v.problem(&at, "required".into());
            String::new()
        }
    }
}

/// The rule of a name written into labels and span attributes: not blank,
/// no control character.
fn text_problem(text: &str) -> Option<String> {
    if text.chars().any(char::is_control) {
        Some("must not contain control characters (newline, tab, …)".into())
    } else if text.trim().is_empty() {
        Some("must not be empty".into())
    } else {
        None
    }
}

/// `[sources.tls]` of a kind that reaches its servers over TLS: the CA(s)
/// that sign their certificates and a client certificate (mutual TLS).
#[derive(Debug, Default, Deserialize)]
pub struct RawTls {
    /// PEM file of the CA(s) that sign the servers' certificates (default: the Mozilla roots).
    pub ca_file: Option<String>,
    /// PEM client certificate (mutual TLS), with `key_file`.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
}

/// Builds the rustls client config; errors name the `tls` key at fault.
pub fn tls_config(t: &RawTls) -> Result<rustls::ClientConfig, (&'static str, String)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match &t.ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| {
                    (
                        "ca_file",
                        format!("cannot read CA certificates from \"{path}\": {e}"),
                    )
                })?;
            if certs.is_empty() {
                return Err(("ca_file", format!("\"{path}\" holds no PEM certificate")));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| ("ca_file", format!("\"{path}\": {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ("ca_file", e.to_string()))?
        .with_root_certificates(roots);
    match (&t.cert_file, &t.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(_), None) => Err(("key_file", "required with cert_file".into())),
        (None, Some(_)) => Err(("cert_file", "required with key_file".into())),
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| ("cert_file", format!("cannot read \"{cert}\": {e}")))?;
            if chain.is_empty() {
                return Err(("cert_file", format!("\"{cert}\" holds no PEM certificate")));
            }
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                (
                    "key_file",
                    format!("cannot read a private key from \"{key}\": {e}"),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| ("key_file", format!("does not fit cert_file: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Environment, Problem};

    const TABLE: Defaults = Defaults {
        kind: "inbox",
        poll_interval: Duration::from_secs(5),
        timeout_floor: Duration::from_secs(1),
        objectives: &["oldest_age", "p95"],
    };
    const QUEUE: Defaults = Defaults {
        kind: "nats",
        poll_interval: Duration::from_secs(10),
        timeout_floor: Duration::from_secs(5),
        objectives: &["oldest_age"],
    };
    const BROKER: Defaults = Defaults {
        kind: "kafka",
        poll_interval: Duration::from_secs(10),
        timeout_floor: Duration::from_secs(5),
        objectives: &[],
    };

    fn check_with(raw: RawCommon, defaults: &Defaults) -> (Common, Vec<Problem>) {
        let env = |_: &str| None;
        let mut v = Validator::new("", Environment::Process, &env);
        let common = check(raw, "sources[0]", "orders".into(), defaults, &mut v);
        (common, v.into_problems())
    }

    fn written(poll_interval: Option<&str>, timeout: Option<&str>) -> RawCommon {
        RawCommon {
            poll_interval: poll_interval.map(str::to_string),
            timeout: timeout.map(str::to_string),
            ..RawCommon::default()
        }
    }

    /// Each kind passes its defaults: the poll interval, and the floor of
    /// the timeout that follows it.
    #[test]
    fn defaults_are_the_kinds() {
        let secs = Duration::from_secs;
        for (defaults, poll, timeout) in [(TABLE, 5, 5), (BROKER, 10, 10)] {
            let (c, problems) = check_with(RawCommon::default(), &defaults);
            assert!(problems.is_empty(), "{problems:?}");
            assert_eq!((c.poll_interval, c.timeout), (secs(poll), secs(timeout)));
            assert_eq!(c.service(), "orders");
        }
        let (c, _) = check_with(written(Some("300ms"), None), &TABLE);
        assert_eq!(c.timeout, secs(1));
        let (c, _) = check_with(written(Some("300ms"), None), &BROKER);
        assert_eq!(c.timeout, secs(5));
    }

    /// Guards the one rule of `poll_interval` and `timeout` (issue 30):
    /// before, a table source took any poll interval above zero and Kafka
    /// one of at least 100 ms; now every kind takes the same values.
    #[test]
    fn poll_interval_and_timeout_are_refused_alike_by_every_kind() {
        for defaults in [TABLE, BROKER] {
            for (poll, timeout, refused) in [
                (Some("100ms"), Some("100ms"), vec![]),
                (Some("99ms"), None, vec!["sources[0].poll_interval"]),
                (
                    Some("0s"),
                    Some("0s"),
                    vec!["sources[0].poll_interval", "sources[0].timeout"],
                ),
                (None, Some("50ms"), vec!["sources[0].timeout"]),
            ] {
                let (_, problems) = check_with(written(poll, timeout), &defaults);
                let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, refused, "{} {poll:?} {timeout:?}", defaults.kind);
                assert!(
                    problems
                        .iter()
                        .all(|p| p.message == "must be at least 100ms")
                );
            }
        }
    }

    /// Owner and service name: one rule each, whatever the kind;
    /// objectives only where the kind exports them.
    #[test]
    fn owner_service_and_objectives_are_checked_by_key() {
        let raw = || RawCommon {
            owner: Some("team payments".into()),
            service_name: Some(" ".into()),
            objectives: Some(RawObjectives {
                oldest_age: Some("5m".into()),
                p95: None,
            }),
            ..RawCommon::default()
        };
        let (c, problems) = check_with(raw(), &TABLE);
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["sources[0].owner", "sources[0].service_name"]);
        assert_eq!(c.objectives.oldest_age, Some(Duration::from_secs(300)));
        let (_, problems) = check_with(raw(), &BROKER);
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "sources[0].owner",
                "sources[0].service_name",
                "sources[0].objectives"
            ]
        );
        // A kind that reads only some objectives refuses the others by key.
        let mut both = raw();
        both.owner = None;
        both.service_name = None;
        both.objectives = Some(RawObjectives {
            oldest_age: Some("5m".into()),
            p95: Some("1s".into()),
        });
        let (c, problems) = check_with(both, &QUEUE);
        assert_eq!(c.objectives.oldest_age, Some(Duration::from_secs(300)));
        assert_eq!(c.objectives.p95, None);
        let said: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            said,
            [
                "sources[0].objectives.p95: nats sources have no p95 objective (they read oldest_age)"
            ]
        );
        let (c, problems) = check_with(
            RawCommon {
                owner: Some("team-payments".into()),
                service_name: Some("orders-api".into()),
                ..RawCommon::default()
            },
            &BROKER,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            (c.owner.as_deref(), c.service()),
            (Some("team-payments"), "orders-api")
        );
    }
}
