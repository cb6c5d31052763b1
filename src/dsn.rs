//! Connection strings. A DSN is written with `${VAR}` references and read by
//! sqlx as a URL: this module expands the one into the other so that whatever
//! a variable holds (a base64 password with `/`, `@`, `#`, `+`…) stays in its
//! component, checks what sqlx would refuse or silently ignore, and prints a
//! DSN without its password — and never prints one that does not parse.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use url::Url;

/// Database dialect, chosen by the DSN's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// The dialect a DSN's scheme names.
    pub fn from_dsn(dsn: &str) -> Option<Dialect> {
        let scheme = dsn.split_once(':')?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    /// The name used on the command line (`--dialect`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "mysql" | "mariadb" => Ok(Dialect::MySql),
            "sqlite" => Ok(Dialect::Sqlite),
            other => Err(format!(
                "unknown dialect \"{other}\" (expected postgres, mysql or sqlite)"
            )),
        }
    }
}

/// What a variable's value keeps unencoded in the userinfo or the query: RFC
/// 3986's unreserved characters. Everything else (`+` too: sqlx reads the
/// query form-encoded, where `+` is a space) is percent-encoded.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Shown instead of a connection string that does not parse.
pub const UNPARSABLE: &str = "<unparsable DSN>";

/// What a DSN whose password was not encoded is told.
const ENCODE_HINT: &str = "a password with / ? # or @ must be percent-encoded (%2F %3F %23 %40), \
                           or come from ${VAR}, which is encoded";

/// Why a DSN is refused. The message never carries the DSN or any part of its userinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DsnError {
    /// A `${VAR}` whose variable is not set.
    Unset(String),
    /// The expanded DSN is not one sqlx would connect with as written.
    Invalid(String),
}

impl fmt::Display for DsnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DsnError::Unset(var) => write!(f, "environment variable {var} is not set"),
            DsnError::Invalid(message) => f.write_str(message),
        }
    }
}

/// A checked connection string whose password never reaches a log line.
#[derive(Clone)]
pub struct Dsn {
    url: String,
    dialect: Dialect,
    /// The decoded password, to scrub from driver messages.
    password: Option<String>,
}

impl Dsn {
    /// Expands `${VAR}` in `template` and checks the result (see [`Dsn::parse`]).
    /// A variable's value is percent-encoded where it lands in the userinfo or
    /// the query, so that any password connects as it is; elsewhere (scheme,
    /// host, port, path: a whole DSN or a file name) it is inserted as it is.
    pub fn expand(template: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Dsn, DsnError> {
        let pieces = pieces(template);
        // The template's own structure decides where each variable lands; a
        // variable stands for one neutral character while it is read.
        let mut skeleton = String::new();
        let mut at = Vec::new();
        for piece in &pieces {
            match piece {
                Piece::Text(t) => skeleton.push_str(t),
                Piece::Var(_) => {
                    at.push(skeleton.len());
                    skeleton.push('x');
                }
            }
        }
        let layout = Layout::of(&skeleton);
        let mut out = String::with_capacity(template.len());
        let mut vars = at.into_iter();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(name) => {
                    let value = env(name).ok_or_else(|| DsnError::Unset(name.to_string()))?;
                    let offset = vars.next().expect("one offset per variable");
                    out.push_str(&layout.encode(offset, &value));
                }
            }
        }
        Dsn::parse(&out)
    }

    /// Checks an expanded connection string the way sqlx will read it: the
    /// scheme, a host for the network databases, the port, and the query
    /// parameters with their values.
    pub fn parse(text: &str) -> Result<Dsn, DsnError> {
        let invalid = |m: String| DsnError::Invalid(m);
        let dialect = Dialect::from_dsn(text).ok_or_else(|| {
            let scheme = text.split_once(':').map_or("", |(s, _)| s);
            let shown = if !scheme.is_empty()
                && scheme.len() <= 20
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            {
                format!("unknown dialect \"{scheme}\"")
            } else {
                "no dialect".to_string()
            };
            invalid(format!(
                "{shown} (expected postgres://, mysql:// or sqlite://)"
            ))
        })?;
        let url = Url::parse(text).map_err(|e| {
            // `u:ab/cd@host` parses as host `u` and port `ab`: the parser's
            // "invalid port number" is a password's `/ ? #` not encoded.
            let userinfo = text
                .split_once("://")
                .and_then(|(_, rest)| rest.rsplit_once('@'))
                .map(|(userinfo, _)| userinfo);
            if userinfo.is_some_and(|u| u.contains(['/', '?', '#'])) {
                invalid(format!("{UNPARSABLE}: {e}; {ENCODE_HINT}"))
            } else {
                invalid(format!("{UNPARSABLE}: {e}"))
            }
        })?;
        let decoded = |part: &str, what: &str| {
            percent_decode_str(part)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| invalid(format!("the {what} is not UTF-8 once percent-decoded")))
        };
        decoded(url.username(), "user name")?;
        let password = url.password().map(|p| decoded(p, "password")).transpose()?;
        if dialect != Dialect::Sqlite {
            check_network(&url, dialect)?;
            decoded(url.path(), "database name")?;
        }
        check_parameters(&url, dialect)?;
        Ok(Dsn {
            url: url.as_str().to_string(),
            dialect,
            password,
        })
    }

    /// A stand-in for a DSN that was refused; never connected with.
    pub(crate) fn refused() -> Dsn {
        Dsn {
            url: String::new(),
            dialect: Dialect::Postgres,
            password: None,
        }
    }

    /// The full connection string, secrets included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// Replaces the connection string, and the password alone, wherever a
    /// driver message echoes them, with the redacted form.
    pub fn scrub(&self, message: &str) -> String {
        let mut out = message.replace(&self.url, &self.to_string());
        // Shorter ones would mangle every message and are no secret anyway.
        if let Some(p) = self.password.as_deref().filter(|p| p.len() >= 4) {
            out = out.replace(p, "***");
            let encoded = utf8_percent_encode(p, COMPONENT).to_string();
            out = out.replace(&encoded, "***");
        }
        out
    }

    /// The dialect the scheme names.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }
}

impl fmt::Display for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Url::parse(&self.url) {
            Ok(url) => f.write_str(&redact_url(url)),
            Err(e) => write!(f, "{UNPARSABLE}: {e}"),
        }
    }
}

impl fmt::Debug for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dsn({self})")
    }
}

/// Replaces the password of a URL (`scheme://user:password@host`) and any
/// `password=` query parameter with `***`; a URL that does not parse is not
/// printed at all, only why it does not parse.
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        // Printed as written where there is nothing to hide (no normalising).
        Ok(u)
            if u.password().is_none()
                && !u.query_pairs().any(|(k, _)| is_password(&k))
                && !url.contains('@') =>
        {
            url.to_string()
        }
        Ok(u) => redact_url(u),
        Err(e) => format!("<unparsable URL: {e}>"),
    }
}

fn is_password(key: &str) -> bool {
    key.eq_ignore_ascii_case("password")
}

fn redact_url(mut url: Url) -> String {
    // `u:1/pw@host` parses as host `u`, port 1 and a path holding the password.
    let after_host = [
        url.path(),
        url.query().unwrap_or(""),
        url.fragment().unwrap_or(""),
    ];
    if after_host.iter().any(|part| part.contains('@')) {
        return "<URL not printed: an @ after the host may end a password>".to_string();
    }
    if url.password().is_some() && url.set_password(Some("***")).is_err() {
        return "<URL with a password that cannot be hidden>".to_string();
    }
    if url.query().is_some() {
        let pairs: Vec<String> = url
            .query()
            .unwrap_or_default()
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if is_password(&decode_form(k)) => {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        url.set_query(Some(&pairs.join("&")));
    }
    url.to_string()
}

fn decode_form(s: &str) -> String {
    url::form_urlencoded::parse(s.as_bytes())
        .next()
        .map(|(k, _)| k.into_owned())
        .unwrap_or_default()
}

/// A host, a port in range and no leftovers of a password that was not
/// encoded: `postgres:user:pw@host` (no `//`), or `/ ? #` in a literal
/// password, which move the rest of it into the path, query or fragment.
fn check_network(url: &Url, dialect: Dialect) -> Result<(), DsnError> {
    let form = match dialect {
        Dialect::MySql => "mysql://user:password@host:port/database",
        _ => "postgres://user:password@host:port/database",
    };
    let invalid = |m: String| Err(DsnError::Invalid(m));
    if !url.has_authority() {
        return invalid(format!("not of the form {form} (the // is missing)"));
    }
    if url.fragment().is_some() {
        return invalid(format!("has a # after the host; {ENCODE_HINT}"));
    }
    if url.path().contains('@') || url.query().is_some_and(|q| q.contains('@')) {
        return invalid(format!("has an @ after the host; {ENCODE_HINT}"));
    }
    let host_param = match dialect {
        Dialect::MySql => "socket",
        _ => "host",
    };
    let has_host_param = url.query_pairs().any(|(k, _)| k == host_param);
    if url.host_str().is_none_or(str::is_empty) && !has_host_param {
        return invalid(format!("has no host (expected {form})"));
    }
    if url.port() == Some(0) {
        return invalid("port 0 is not a port (1 to 65535)".into());
    }
    Ok(())
}

/// The query parameters sqlx 0.9 reads for the dialect, with the values it
/// accepts. An unknown one is refused: sqlx ignores it (PostgreSQL logs it,
/// value included) or refuses to connect (SQLite).
fn check_parameters(url: &Url, dialect: Dialect) -> Result<(), DsnError> {
    for (key, value) in url.query_pairs() {
        let one_of = |allowed: &[&str]| {
            if allowed.iter().any(|a| a.eq_ignore_ascii_case(&value)) {
                Ok(())
            } else {
                Err(format!("\"{value}\" is not one of {}", allowed.join(", ")))
            }
        };
        let number = |max: u64| match value.parse::<u64>() {
            Ok(n) if n <= max => Ok(()),
            _ => Err(format!("\"{value}\" is not a number up to {max}")),
        };
        let any = || Ok(());
        let checked: Option<Result<(), String>> = match (dialect, &*key) {
            (Dialect::Postgres, "sslmode" | "ssl-mode") => Some(one_of(&[
                "disable",
                "allow",
                "prefer",
                "require",
                "verify-ca",
                "verify-full",
            ])),
            (Dialect::Postgres, "port") => Some(number(65_535)),
            (Dialect::Postgres, "hostaddr") => Some(
                value
                    .parse::<std::net::IpAddr>()
                    .map(|_| ())
                    .map_err(|_| format!("\"{value}\" is not an IP address")),
            ),
            (
                Dialect::Postgres,
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" | "sslcert" | "ssl-cert" | "sslkey"
                | "ssl-key" | "host" | "dbname" | "user" | "password" | "application_name"
                | "options",
            ) => Some(any()),
            (Dialect::Postgres, k) if k.starts_with("options[") && k.ends_with(']') => Some(any()),
            (Dialect::MySql, "sslmode" | "ssl-mode") => Some(one_of(&[
                "disabled",
                "preferred",
                "required",
                "verify_ca",
                "verify_identity",
            ])),
            (
                Dialect::MySql,
                "sslca" | "ssl-ca" | "sslcert" | "ssl-cert" | "sslkey" | "ssl-key" | "charset"
                | "collation" | "socket" | "timezone" | "time-zone",
            ) => Some(any()),
            (Dialect::Postgres | Dialect::MySql, "statement-cache-capacity") => {
                Some(number(u32::MAX.into()))
            }
            (Dialect::Sqlite, "mode") => Some(one_of(&["ro", "rw", "rwc", "memory"]).and_then(
                // sqlx compares these exactly.
                |()| {
                    ["ro", "rw", "rwc", "memory"]
                        .contains(&&*value)
                        .then_some(())
                        .ok_or_else(|| format!("\"{value}\" must be lower case"))
                },
            )),
            (Dialect::Sqlite, "cache") => Some(one_of(&["private", "shared"])),
            (Dialect::Sqlite, "immutable") => Some(one_of(&["true", "false", "1", "0"])),
            (Dialect::Sqlite, "vfs") => Some(any()),
            _ => None,
        };
        match checked {
            Some(Ok(())) => {}
            Some(Err(why)) if key == "password" => {
                return Err(DsnError::Invalid(format!("parameter password: {why}")));
            }
            Some(Err(why)) => {
                return Err(DsnError::Invalid(format!("parameter {key}: {why}")));
            }
            None => {
                return Err(DsnError::Invalid(format!(
                    "unknown parameter \"{}\" for {} (see docs/configuration.md, \"DSN parameters\")",
                    key.chars().take(40).collect::<String>(),
                    dialect.as_str()
                )));
            }
        }
    }
    Ok(())
}

enum Piece<'a> {
    Text(&'a str),
    Var(&'a str),
}

/// `text ${VAR} text`; an unterminated `${` is text.
fn pieces(template: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            break;
        };
        out.push(Piece::Text(&rest[..start]));
        out.push(Piece::Var(&after[..end]));
        rest = &after[end + 1..];
    }
    out.push(Piece::Text(rest));
    out
}

/// Where the userinfo and the query of a URL-shaped template are (byte ranges).
struct Layout {
    userinfo: Option<std::ops::Range<usize>>,
    /// Whether the userinfo has its own `:` (then a variable in it is one part).
    userinfo_colon: bool,
    query: Option<std::ops::Range<usize>>,
}

impl Layout {
    fn of(skeleton: &str) -> Layout {
        let mut layout = Layout {
            userinfo: None,
            userinfo_colon: false,
            query: None,
        };
        let Some(colon) = skeleton.find(':') else {
            return layout;
        };
        let Some(after_slashes) = skeleton[colon + 1..].strip_prefix("//") else {
            return layout;
        };
        let auth_start = colon + 3;
        let auth_end = after_slashes
            .find(['/', '?', '#'])
            .map_or(skeleton.len(), |i| auth_start + i);
        if let Some(at) = skeleton[auth_start..auth_end].rfind('@') {
            let userinfo = auth_start..auth_start + at;
            layout.userinfo_colon = skeleton[userinfo.clone()].contains(':');
            layout.userinfo = Some(userinfo);
        }
        if let Some(q) = skeleton[auth_end..].find(['?', '#'])
            && skeleton[auth_end + q..].starts_with('?')
        {
            let start = auth_end + q + 1;
            let end = skeleton[start..]
                .find('#')
                .map_or(skeleton.len(), |i| start + i);
            layout.query = Some(start..end);
        }
        layout
    }

    /// A variable's value as it goes in at `offset` of the skeleton.
    fn encode(&self, offset: usize, value: &str) -> String {
        let enc = |s: &str| utf8_percent_encode(s, COMPONENT).to_string();
        match (&self.userinfo, &self.query) {
            (Some(u), _) if u.contains(&offset) => match value.split_once(':') {
                // `${CREDENTIALS}@host`: the variable holds user:password.
                Some((user, password)) if !self.userinfo_colon => {
                    format!("{}:{}", enc(user), enc(password))
                }
                _ => enc(value),
            },
            (_, Some(q)) if q.contains(&offset) => enc(value),
            _ => value.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character a generated secret may hold.
    const HOSTILE: &str = "a/b@c:d%e#f?g+h i&j=k";

    fn env(name: &str) -> Option<String> {
        match name {
            "PW" => Some(HOSTILE.to_string()),
            "CREDS" => Some(format!("u:{HOSTILE}")),
            "DSN" => Some("postgres://u:p@db/x".to_string()),
            "DIR" => Some("/var/lib/x".to_string()),
            _ => None,
        }
    }

    fn sqlx_password(url: &str) -> String {
        let url = Url::parse(url).unwrap();
        percent_decode_str(url.password().unwrap())
            .decode_utf8()
            .unwrap()
            .into_owned()
    }

    /// Guards the base64-password leak: a variable's value stays the password,
    /// whatever it holds, and no printed form carries it.
    #[test]
    fn a_variable_in_the_userinfo_is_encoded_and_never_printed() {
        for template in [
            "postgres://u:${PW}@db:5432/orders",
            "mysql://u:${PW}@db/orders?ssl-mode=disabled",
            "postgres://${CREDS}@db/orders",
        ] {
            let dsn = Dsn::expand(template, &env).unwrap();
            assert_eq!(sqlx_password(dsn.expose()), HOSTILE, "{template}");
            assert_eq!(Url::parse(dsn.expose()).unwrap().host_str(), Some("db"));
            let shown = format!("{dsn} {dsn:?}");
            assert!(shown.contains("u:***@db"), "{shown}");
            for fragment in ["a/b", "a%2Fb", "b@c", "g+h", "h i", "h%20i", "j=k", "j%3Dk"] {
                assert!(!shown.contains(fragment), "{fragment} in {shown}");
            }
        }
    }

    #[test]
    fn a_variable_in_the_query_is_encoded_and_elsewhere_kept() {
        let dsn = Dsn::expand("postgres://u@db/x?password=${PW}", &env).unwrap();
        let url = Url::parse(dsn.expose()).unwrap();
        let (_, pw) = url.query_pairs().find(|(k, _)| k == "password").unwrap();
        assert_eq!(pw, HOSTILE);
        assert_eq!(dsn.to_string(), "postgres://u@db/x?password=***");
        let whole = Dsn::expand("${DSN}", &env).unwrap();
        assert_eq!(whole.to_string(), "postgres://u:***@db/x");
        let file = Dsn::expand("sqlite://${DIR}/inbox.db", &env).unwrap();
        assert_eq!(file.expose(), "sqlite:///var/lib/x/inbox.db");
        assert_eq!(
            Dsn::expand("postgres://u:${NOPE}@db/x", &env).unwrap_err(),
            DsnError::Unset("NOPE".into())
        );
    }

    /// Guards `postgres:user:pw@host` and literal passwords with `/ ? #`:
    /// refused, and the message carries no part of the password.
    #[test]
    fn a_dsn_sqlx_would_misread_is_refused_without_its_value() {
        for text in [
            "postgres:u:s3cr3tpw@db/x",
            "postgres://u:s3cr3tpw/x@db/x",
            "postgres://u:1s3cr3tpw/x@db/x",
            "postgres://u:1?s3cr3tpw@db/x",
            "postgres://u:1#s3cr3tpw@db/x",
            "mysql://u:9s3cr3tpw#x@db/x",
            "postgres://u:s3cr3tpw@db:99999/x",
            "postgres://u:s3cr3tpw@db:0/x",
            "postgres://u:s3cr3tpw@/x",
        ] {
            let err = Dsn::parse(text).expect_err(text).to_string();
            assert!(!err.contains("s3cr3t"), "{text}: {err}");
        }
        assert!(
            Dsn::parse("postgres://u:p@db:99999/x")
                .unwrap_err()
                .to_string()
                .starts_with(UNPARSABLE)
        );
    }

    #[test]
    fn query_parameters_are_those_sqlx_reads() {
        for ok in [
            "postgres://u@db/x?sslmode=verify-full&application_name=iw&options[statement_timeout]=5s",
            "postgres:///x?host=/var/run/postgresql",
            "mysql://u@db/x?ssl-mode=REQUIRED&charset=utf8mb4",
            "mysql://u@localhost/x?socket=/tmp/mysql.sock",
            "sqlite:///tmp/a.db?mode=ro&cache=shared",
            "sqlite::memory:",
        ] {
            Dsn::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, says) in [
            ("postgres://u@db/x?sslmode=bogus", "parameter sslmode:"),
            ("postgres://u@db/x?ssl-mode=required", "parameter ssl-mode:"),
            (
                "postgres://u@db/x?sslmod=require",
                "unknown parameter \"sslmod\"",
            ),
            ("mysql://u@db/x?sslmode=require", "parameter sslmode:"),
            (
                "mysql://u@db/x?password=x",
                "unknown parameter \"password\"",
            ),
            ("sqlite:///tmp/a.db?mode=readonly", "parameter mode:"),
            ("sqlite:///tmp/a.db?mode=RO", "lower case"),
            ("postgres://u@db/x?port=70000", "parameter port:"),
        ] {
            let err = Dsn::parse(bad).expect_err(bad).to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn redaction_hides_passwords_in_urls_and_queries() {
        assert_eq!(
            redact("mysql://root:pw@h:3306/db"),
            "mysql://root:***@h:3306/db"
        );
        assert_eq!(
            redact("postgres://h/db?user=a&password=x"),
            "postgres://h/db?user=a&password=***"
        );
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("http://otel:4317"), "http://otel:4317");
        // Guards the fallback that printed the raw text.
        let unparsable = redact("postgres://u:1/s3cr3t@h:99999/db");
        assert!(!unparsable.contains("s3cr3t"), "{unparsable}");
    }

    #[test]
    fn scrub_hides_the_url_and_the_password_in_driver_messages() {
        let dsn = Dsn::expand("postgres://u:${PW}@db/x", &env).unwrap();
        let message = format!("error with {} and {HOSTILE}", dsn.expose());
        let scrubbed = dsn.scrub(&message);
        assert_eq!(scrubbed, "error with postgres://u:***@db/x and ***");
    }
}
