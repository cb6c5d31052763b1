//! The machine's RabbitMQ (127.0.0.1:5672, management on 15672, guest/guest)
//! for the RabbitMQ suite: a vhost of the test's own ([`Vhost`], deleted on
//! drop, so that tests run side by side), a `monitoring`-tagged user of its
//! own ([`Monitor`]), the management API over a blocking HTTP/1.1 request
//! ([`mgmt`]) and AMQP clients (lapin) for the workload.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine as _;
use lapin::{Channel, Connection, ConnectionProperties};

use super::unique_name;

pub const MANAGEMENT: &str = "http://127.0.0.1:15672";
const MANAGEMENT_PORT: u16 = 15672;

/// One request to the management API as guest: status and body. Panics
/// when the API cannot be reached (the suite needs it: it does not skip).
pub fn mgmt(method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let auth = base64::engine::general_purpose::STANDARD.encode("guest:guest");
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(("127.0.0.1", MANAGEMENT_PORT)).unwrap_or_else(|e| {
        panic!("the RabbitMQ management API on 127.0.0.1:{MANAGEMENT_PORT}: {e} (rabbitmq-plugins enable rabbitmq_management)")
    });
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    s.write_all(request.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let rest = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (code, rest)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A management API request that must succeed (2xx).
pub fn mgmt_ok(method: &str, path: &str, body: Option<&str>) -> String {
    let (code, text) = mgmt(method, path, body);
    assert!((200..300).contains(&code), "{method} {path}: {code} {text}");
    text
}

/// A path segment, percent-encoded.
pub fn enc(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A vhost of the test's own, guest allowed everything in it; deleted on drop.
pub struct Vhost {
    pub name: String,
}

impl Vhost {
    pub fn create(short: &str) -> Vhost {
        let name = unique_name("iw", short);
        mgmt_ok("PUT", &format!("/api/vhosts/{}", enc(&name)), Some("{}"));
        mgmt_ok(
            "PUT",
            &format!("/api/permissions/{}/guest", enc(&name)),
            Some(r#"{"configure":".*","write":".*","read":".*"}"#),
        );
        Vhost { name }
    }

    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", enc(&self.name))
    }

    /// An AMQP connection into the vhost and a channel on it.
    pub async fn connect(&self) -> (Connection, Channel) {
        let conn = Connection::connect(&self.amqp_url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("AMQP to {}: {e}", self.amqp_url()));
        let ch = conn.create_channel().await.expect("a channel");
        (conn, ch)
    }

    /// The management API's row of a queue of the vhost.
    pub fn queue(&self, queue: &str) -> serde_json::Value {
        let text = mgmt_ok(
            "GET",
            &format!("/api/queues/{}/{}", enc(&self.name), enc(queue)),
            None,
        );
        serde_json::from_str(&text).expect("json")
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = mgmt("DELETE", &format!("/api/vhosts/{}", enc(&self.name)), None);
    }
}

/// A user tagged `monitoring` (read-only) with a password of its own and
/// empty permissions (nothing to configure, write or read) on the test's
/// vhost, which is what the management API needs to list its queues;
/// deleted on drop.
pub struct Monitor {
    pub name: String,
    pub password: String,
}

impl Monitor {
    pub fn create(vhost: &Vhost) -> Monitor {
        let name = unique_name("iw_mon", "m");
        let password = format!("pw-{:016x}", fastrand::u64(..));
        mgmt_ok(
            "PUT",
            &format!("/api/users/{}", enc(&name)),
            Some(&format!(
                r#"{{"password":"{password}","tags":"monitoring"}}"#
            )),
        );
        mgmt_ok(
            "PUT",
            &format!("/api/permissions/{}/{}", enc(&vhost.name), enc(&name)),
            Some(r#"{"configure":"","write":"","read":""}"#),
        );
        Monitor { name, password }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = mgmt("DELETE", &format!("/api/users/{}", enc(&self.name)), None);
    }
}

/// A `kind = "rabbitmq"` entry reading `vhost` as `user`, its password from
/// `${password_env}`.
pub fn source_toml(name: &str, vhost: &str, user: &str, password_env: &str, extra: &str) -> String {
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"rabbitmq\"\nmanagement_url = \"{MANAGEMENT}\"\n\
         username = \"{user}\"\npassword = \"${{{password_env}}}\"\nvhosts = \"{}\"\n{extra}\n",
        regex_escape(vhost)
    )
}

/// `s` as a regex matching only itself (TOML-escaped backslashes).
pub fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// Seconds since the epoch.
pub fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
