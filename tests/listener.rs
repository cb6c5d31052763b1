//! The listener locked and shared fairly (issue 35), through the binary:
//!
//! * the web config file (exporter-toolkit's format): a real Prometheus scrapes
//!   over TLS with basic auth (`up == 1`), and fails with a wrong password
//!   (`up == 0`, a 401 line in the agent's log without the password); Chromium
//!   loads the status page with credentials and gets 401 without; a
//!   certificate replaced on disk is served to the next connection without a
//!   restart, and a broken new file keeps the last good one;
//! * every bad web config file named by its key, by `check-config` and `run`
//!   (exit 2), without printing a secret;
//! * the pages private by default on a listener other hosts reach;
//! * one client address cannot hold the connections another's scrapes need
//!   (`max_http_connections_per_client`).
//!
//! Certificates are made by the `openssl` command; Prometheus and Chromium are
//! the Debian packages (`scripts/test-deps.sh`). Loopback only.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::stack::{Prometheus, yaml_str};
use common::{Agent, READY_TIMEOUT, toml_str, wait_until};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::rustls;

const USER: &str = "prometheus";
const PASSWORD: &str = "s3cret-scrape-pw";

/// A bcrypt hash of `password` (cost 6: the agent's cache makes later checks free).
fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash_with_salt(password, 6, *b"inboxwatch-salt!")
        .expect("bcrypt hashes")
        .to_string()
}

/// `openssl ARGS` in `dir` (the arguments split at spaces: no paths, only names).
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .args(args.split(' '))
        .current_dir(dir)
        .output()
        .expect("the openssl command runs (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new P-256 key, unencrypted, for `openssl req`.
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A test CA and a server certificate it signed for 127.0.0.1 and localhost.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn new(dir: &Path) -> Certs {
        openssl(
            dir,
            &format!(
                "req -x509 {NEW_KEY} -keyout ca.key -out ca.crt -days 2 -subj /CN=inboxwatch-test-CA"
            ),
        );
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write san.ext");
        let certs = Certs {
            dir: dir.to_path_buf(),
        };
        certs.issue("server");
        certs
    }

    /// A new key and certificate in `{name}.key` / `{name}.crt`.
    fn issue(&self, name: &str) {
        openssl(
            &self.dir,
            &format!("req {NEW_KEY} -keyout {name}.key -out {name}.csr -subj /CN=localhost"),
        );
        openssl(
            &self.dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                 -out {name}.crt -days 2 -extfile san.ext"
            ),
        );
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// SHA-256 of the DER of `{name}.crt`'s certificate.
    fn fingerprint(&self, name: &str) -> String {
        let pem = std::fs::read(self.path(&format!("{name}.crt"))).expect("read a certificate");
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(&pem)
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .expect("a PEM certificate");
        hex(&Sha256::digest(der))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The web config file: TLS with the server certificate, one user.
fn web_yml(certs: &Certs, extra: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n\
         basic_auth_users:\n  {USER}: {}\n{extra}",
        yaml_str(&certs.path("server.crt").to_string_lossy()),
        yaml_str(&certs.path("server.key").to_string_lossy()),
        yaml_str(&bcrypt_hash(PASSWORD)),
    )
}

/// A config with one SQLite inbox source (an empty file: the source is down,
/// which does not matter to the listener) and `server` keys.
fn agent_toml(dir: &Path, server: &str) -> String {
    let db = dir.join("listener.db");
    std::fs::write(&db, b"").expect("an empty file");
    format!(
        "[server]\n{server}\n\n[[sources]]\nname = \"locked\"\nkind = \"inbox\"\n\
         dsn = {}\ntable = \"inbox\"\n",
        toml_str(&format!("sqlite://{}", db.display()))
    )
}

/// An HTTPS GET on 127.0.0.1:`port` trusting only `ca`: the status, the
/// `WWW-Authenticate` header, the body, and the served certificate's SHA-256.
struct Answer {
    code: u16,
    head: String,
    www_authenticate: Option<String>,
    body: String,
    certificate: String,
}

async fn https_get(
    port: u16,
    path: &str,
    ca: &Path,
    credentials: Option<(&str, &str)>,
) -> Result<Answer, String> {
    https_get_as(port, path, ca, credentials, None).await
}

/// [`https_get`] presenting a client certificate (`{name}.crt`, `{name}.key` in `certs`).
async fn https_get_as(
    port: u16,
    path: &str,
    ca: &Path,
    credentials: Option<(&str, &str)>,
    client: Option<(&Certs, &str)>,
) -> Result<Answer, String> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).map_err(|e| format!("read {}: {e}", ca.display()))?;
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let cert: rustls::pki_types::CertificateDer<'static> =
            cert.map_err(|e| format!("CA PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("CA: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let config = match client {
        None => config.with_no_client_auth(),
        Some((certs, name)) => {
            let pem = std::fs::read(certs.path(&format!("{name}.crt"))).expect("a client cert");
            let chain = rustls::pki_types::pem::PemObject::pem_slice_iter(&pem)
                .collect::<Result<Vec<rustls::pki_types::CertificateDer<'static>>, _>>()
                .expect("a PEM chain");
            let key = rustls::pki_types::pem::PemObject::from_pem_file(
                certs.path(&format!("{name}.key")),
            )
            .expect("a client key");
            config
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
    };
    let exchange = async {
        let tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let certificate = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| hex(&Sha256::digest(c.as_ref())))
            .ok_or("no server certificate")?;
        let auth = credentials.map_or(String::new(), |(u, p)| {
            use base64::Engine as _;
            format!(
                "Authorization: Basic {}\r\n",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        // A peer that closes without close_notify is fine for a test; a TLS
        // 1.3 server refuses a client certificate after the handshake.
        if let Err(e) = tls.read_to_end(&mut buf).await
            && buf.is_empty()
        {
            return Err(format!("read: {e}"));
        }
        Ok::<_, String>((buf, certificate))
    };
    let (buf, certificate) = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {path} timed out"))??;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let www_authenticate = head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case("www-authenticate")
            .then(|| v.trim().to_string())
    });
    Ok(Answer {
        code,
        head: head.to_string(),
        www_authenticate,
        body: body.to_string(),
        certificate,
    })
}

/// An agent on `web.yml` in `dir` (written there), listening on 127.0.0.1.
async fn locked_agent(dir: &Path, yml: &str, server: &str) -> Agent {
    let web = dir.join("web.yml");
    std::fs::write(&web, yml).expect("write web.yml");
    let server = format!(
        "web_config_file = {}\n{server}",
        toml_str(&web.to_string_lossy())
    );
    // At debug, the listener logs each request it asks for credentials.
    let agent = Agent::run(&agent_toml(dir, &server))
        .env("INBOXWATCH_LOG", "info,inboxwatch::http::web=debug")
        .start();
    let ca = dir.join("ca.crt");
    wait_until(READY_TIMEOUT, || async {
        if let Some(status) = agent.exited() {
            return Ok(Err(format!("the agent exited with {status}")));
        }
        match https_get(agent.port, "/healthz", &ca, Some((USER, PASSWORD))).await {
            Ok(a) if a.code == 200 => Ok(Ok(())),
            Ok(a) => Err(format!("/healthz answered {}", a.code)),
            Err(e) => Err(e),
        }
    })
    .await
    .expect("the agent answers /healthz over TLS")
    .unwrap_or_else(|e| panic!("{e}: {}", agent.stderr()));
    agent
}

/// Guards the web config file against a real Prometheus: scraping over TLS
/// (the test CA) with basic auth makes `up` 1; the same target with a wrong
/// password makes `up` 0 and the target's error a 401, and the agent logs the
/// refusal without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_over_tls_with_basic_auth() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::new(dir.path());
    let agent = locked_agent(dir.path(), &web_yml(&certs, ""), "").await;
    let wrong = "not-the-password-7f3a";
    let job = |name: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    basic_auth:\n      username: {USER}\n      password: {password}\n\
             \x20   tls_config:\n      ca_file: {}\n      server_name: localhost\n\
             \x20   static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            yaml_str(&certs.path("ca.crt").to_string_lossy()),
            agent.port
        )
    };
    let yml = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}",
        job("locked", PASSWORD),
        job("wrong", wrong)
    );
    let prometheus = Prometheus::start(&yml);
    prometheus.wait_ready().await;
    for (expr, what) in [
        ("up{job=\"locked\"} == 1", "up == 1 with the right password"),
        ("up{job=\"wrong\"} == 0", "up == 0 with a wrong password"),
        (
            "inboxwatch_build_info{job=\"locked\"} == 1",
            "the agent's own series, scraped over TLS",
        ),
    ] {
        wait_until(Duration::from_secs(30), || async {
            match prometheus.query(expr).await {
                Ok(1) => Ok(()),
                other => Err(format!("{expr}: {other:?}")),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}; agent log: {}", agent.stderr()));
    }
    let targets = prometheus
        .api("/api/v1/targets")
        .await
        .expect("Prometheus's targets");
    let errors: Vec<(String, String)> = targets["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                t["lastError"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        errors
            .iter()
            .any(|(job, error)| job == "wrong" && error.contains("401")),
        "the wrong password's target fails with 401: {errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(job, error)| job == "locked" && error.is_empty()),
        "the right password's target has no error: {errors:?}"
    );
    let log = agent.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("(401)") && l.contains(&format!("user=\"{USER}\""))),
        "a 401 line naming the user in the agent's log:\n{log}"
    );
    assert!(
        !log.contains(wrong) && !log.contains(PASSWORD),
        "a password in the agent's log:\n{log}"
    );
}

/// Guards basic auth on the pages as a browser meets it: Chromium gets the
/// status page with credentials, and 401 (`WWW-Authenticate: Basic`) without,
/// on every endpoint, an unknown path included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_loads_the_status_page_with_credentials_and_gets_401_without() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::new(dir.path());
    let agent = locked_agent(dir.path(), &web_yml(&certs, ""), "").await;
    let ca = certs.path("ca.crt");
    let with = crate::pages::browser(&[
        "--ignore-certificate-errors",
        "--dump-dom",
        &format!("https://{USER}:{PASSWORD}@localhost:{}/", agent.port),
    ]);
    assert!(
        with.contains("<title>status · inboxwatch</title>"),
        "the status page with credentials: {with}"
    );
    let asked = || {
        agent
            .stderr()
            .lines()
            .filter(|l| l.contains("Asked for credentials (401)") && l.ends_with("path=/"))
            .count()
    };
    let before = asked();
    let without = crate::pages::browser(&[
        "--ignore-certificate-errors",
        "--dump-dom",
        &format!("https://localhost:{}/", agent.port),
    ]);
    // Headless, the browser's credentials prompt shows nothing.
    assert!(
        !without.contains("status · inboxwatch"),
        "the status page without credentials: {without}"
    );
    assert!(
        asked() > before,
        "Chromium's request without credentials was answered 401: {}",
        agent.stderr()
    );
    for path in [
        "/",
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/status",
        "/nowhere",
    ] {
        let a = https_get(agent.port, path, &ca, None)
            .await
            .expect("an answer");
        assert_eq!(
            (a.code, a.www_authenticate.as_deref()),
            (401, Some("Basic")),
            "{path} without credentials"
        );
        let a = https_get(agent.port, path, &ca, Some((USER, "wrong")))
            .await
            .expect("an answer");
        assert_eq!(a.code, 401, "{path} with a wrong password");
    }
    let a = https_get(agent.port, "/nowhere", &ca, Some((USER, PASSWORD)))
        .await
        .expect("an answer");
    assert_eq!(a.code, 404, "an unknown path with credentials");
}

/// Guards certificate rotation: a certificate and key replaced on disk are
/// served to the next connection without a restart; then a web config file
/// that does not load keeps the last good one, and the log says why; and
/// `http_server_config.headers` reach the responses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_is_served_without_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::new(dir.path());
    let headers = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n";
    let agent = locked_agent(dir.path(), &web_yml(&certs, headers), "").await;
    let ca = certs.path("ca.crt");
    let pid = agent.pid();
    let first = https_get(agent.port, "/metrics", &ca, Some((USER, PASSWORD)))
        .await
        .expect("a scrape");
    assert_eq!(first.code, 200, "{}", first.body);
    assert_eq!(first.certificate, certs.fingerprint("server"));

    certs.issue("next");
    // Replaced as a Kubernetes Secret update or cert-manager does: whole files.
    for ext in ["key", "crt"] {
        std::fs::copy(certs.path(&format!("next.{ext}")), certs.path("server.tmp")).expect("copy");
        std::fs::rename(
            certs.path("server.tmp"),
            certs.path(&format!("server.{ext}")),
        )
        .expect("rename");
    }
    let rotated = certs.fingerprint("next");
    assert_ne!(rotated, first.certificate);
    let started = Instant::now();
    wait_until(Duration::from_secs(10), || async {
        match https_get(agent.port, "/metrics", &ca, Some((USER, PASSWORD))).await {
            Ok(a) if a.certificate == rotated && a.code == 200 => Ok(()),
            Ok(a) => Err(format!("served {} ({})", a.certificate, a.code)),
            Err(e) => Err(e),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the new certificate is not served: {e}; {}", agent.stderr()));
    println!(
        "the new certificate was served {:?} after the swap",
        started.elapsed()
    );
    assert_eq!(agent.pid(), pid);
    assert!(agent.exited().is_none(), "the agent still runs");

    std::fs::write(certs.path("server.crt"), "not a certificate\n").expect("break the cert");
    wait_until(Duration::from_secs(10), || async {
        let log = agent.stderr();
        log.contains("does not load")
            .then_some(())
            .ok_or_else(|| "no log line yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("a broken file is logged: {e}: {}", agent.stderr()));
    let log = agent.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("does not load"))
        .expect("the line");
    assert!(
        line.contains("tls_server_config.cert_file"),
        "the log names the key: {line}"
    );
    let a = https_get(agent.port, "/metrics", &ca, Some((USER, PASSWORD)))
        .await
        .expect("a scrape after a broken file");
    assert_eq!(
        (a.code, a.certificate.as_str()),
        (200, rotated.as_str()),
        "the last good certificate is still served"
    );
    assert!(
        a.head
            .to_ascii_lowercase()
            .contains("x-frame-options: deny"),
        "the configured header: {}",
        a.head
    );
}

/// Guards `client_auth_type: RequireAndVerifyClientCert` with `client_ca_file`:
/// a client certificate the CA signed is served (with basic auth still asked),
/// one from another CA and none at all are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_verified() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::new(dir.path());
    certs.issue("client");
    let other = tempfile::tempdir().expect("temp dir");
    let stranger = Certs::new(other.path());
    let verify = format!(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
        yaml_str(&certs.path("ca.crt").to_string_lossy())
    );
    let yml = web_yml(&certs, "").replacen(
        "\nbasic_auth_users:",
        &format!("\n{verify}basic_auth_users:"),
        1,
    );
    let web = dir.path().join("web.yml");
    std::fs::write(&web, &yml).expect("write web.yml");
    let server = format!("web_config_file = {}", toml_str(&web.to_string_lossy()));
    let agent = Agent::run(&agent_toml(dir.path(), &server)).start();
    let ca = certs.path("ca.crt");
    let signed = wait_until(READY_TIMEOUT, || async {
        https_get_as(
            agent.port,
            "/healthz",
            &ca,
            Some((USER, PASSWORD)),
            Some((&certs, "client")),
        )
        .await
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", agent.stderr()));
    assert_eq!(signed.code, 200, "a client certificate the CA signed");
    let unauthenticated = https_get_as(agent.port, "/healthz", &ca, None, Some((&certs, "client")))
        .await
        .expect("an answer");
    assert_eq!(unauthenticated.code, 401, "basic auth is still asked");
    for (what, client) in [
        ("no client certificate", None),
        (
            "a client certificate of another CA",
            Some((&stranger, "server")),
        ),
    ] {
        let refused =
            https_get_as(agent.port, "/healthz", &ca, Some((USER, PASSWORD)), client).await;
        assert!(
            refused.is_err(),
            "{what} was served: {}",
            refused.map(|a| a.code).unwrap_or(0)
        );
    }
}

/// Guards the pages' private default: on a listener other hosts reach (0.0.0.0)
/// with no web config file, `/`, `/dead-letters`, `/events/…` and `/api/v1/…`
/// answer 404 while `/metrics`, `/healthz` and `/readyz` answer, and the log
/// says why; `pages = true` serves them; so does a web config file that asks
/// for TLS and basic auth; on 127.0.0.1 they are served by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_private_by_default_on_a_listener_other_hosts_reach() {
    const PAGES: [&str; 6] = [
        "/",
        "/dead-letters",
        "/events/x",
        "/api/v1/status",
        "/api/v1/dead-letters",
        "/api/v1/events/x",
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let listening = |agent: &Agent| {
        let port = agent.port;
        async move {
            wait_until(READY_TIMEOUT, || async {
                match common::http_get(port, "/healthz").await {
                    Ok((200, _)) => Ok(()),
                    other => Err(format!("/healthz: {other:?}")),
                }
            })
            .await
            .expect("the agent listens");
        }
    };
    for (host, server, served) in [
        ("0.0.0.0", "", false),
        ("0.0.0.0", "pages = true", true),
        ("127.0.0.1", "", true),
    ] {
        let agent = Agent::run(&agent_toml(dir.path(), server))
            .host(host)
            .start();
        listening(&agent).await;
        for path in PAGES {
            let (code, _) = agent.get(path).await.expect("an answer");
            // The event pages answer 404 for an unknown id too: the status page
            // and the API's status tell apart served from not.
            if served && !path.contains("/events/") {
                assert_eq!(code, 200, "{path} on {host} with [{server}]");
            } else if !served {
                assert_eq!(code, 404, "{path} on {host} with [{server}]");
            }
        }
        for path in ["/metrics", "/healthz"] {
            let (code, _) = agent.get(path).await.expect("an answer");
            assert_eq!(code, 200, "{path} on {host} with [{server}]");
        }
        let (code, _) = agent.get("/readyz").await.expect("an answer");
        assert_ne!(code, 404, "/readyz on {host}");
        let log = agent.stderr();
        let why = if served {
            "Serving the pages"
        } else {
            "not the pages"
        };
        assert!(
            log.contains(why),
            "the start line on {host} with [{server}]: {log}"
        );
        if !served {
            assert!(
                log.contains("reachable from other hosts without TLS and basic auth"),
                "the start line says why: {log}"
            );
        }
    }
    // Locked by a web config file: served on 0.0.0.0 by default.
    let certs = Certs::new(dir.path());
    let web = dir.path().join("web.yml");
    std::fs::write(&web, web_yml(&certs, "")).expect("write web.yml");
    let server = format!("web_config_file = {}", toml_str(&web.to_string_lossy()));
    let agent = Agent::run(&agent_toml(dir.path(), &server))
        .host("0.0.0.0")
        .start();
    let ca = certs.path("ca.crt");
    let status = wait_until(READY_TIMEOUT, || async {
        https_get(agent.port, "/api/v1/status", &ca, Some((USER, PASSWORD))).await
    })
    .await
    .expect("an answer over TLS");
    assert_eq!(
        status.code, 200,
        "/api/v1/status behind TLS and basic auth: {}",
        status.body
    );
    let page = https_get(agent.port, "/", &ca, Some((USER, PASSWORD)))
        .await
        .expect("the status page");
    assert_eq!(page.code, 200);
    assert!(
        agent
            .stderr()
            .contains("asks every client for TLS and basic auth")
    );
    // A new file without basic auth would open the pages: it is refused.
    let unlocked = web_yml(&certs, "");
    let unlocked = &unlocked[..unlocked.find("basic_auth_users:").expect("the users")];
    std::fs::write(&web, unlocked).expect("rewrite web.yml");
    wait_until(Duration::from_secs(10), || async {
        agent
            .stderr()
            .contains("no longer asks for both TLS and basic auth")
            .then_some(())
            .ok_or_else(|| "not refused yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", agent.stderr()));
    let page = https_get(agent.port, "/", &ca, None)
        .await
        .expect("the status page without credentials");
    assert_eq!(page.code, 401, "the pages still ask for credentials");
}

/// Guards the web config file's checks: each bad file is refused by
/// `check-config` and by `run` (also given as `--web.config.file`) with exit 2
/// and a line naming the key, and no secret is printed.
#[test]
fn a_bad_web_config_file_is_named_by_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::new(dir.path());
    certs.issue("other");
    let crt = yaml_str(&certs.path("server.crt").to_string_lossy());
    let key = yaml_str(&certs.path("server.key").to_string_lossy());
    let other_key = yaml_str(&certs.path("other.key").to_string_lossy());
    let secret_hash = bcrypt_hash("never-printed");
    let tls = format!("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n");
    let cases: Vec<(String, String)> = vec![
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n".into(),
            "web_config_file tls_server_config.cert_file: cannot read".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {crt}\n"),
            "web_config_file tls_server_config.key_file: required".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {crt}\n  key_file: {other_key}\n"),
            "web_config_file tls_server_config.key_file: does not go with the certificate".into(),
        ),
        (
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            "web_config_file tls_server_config.client_ca_file: required by client_auth_type RequireAndVerifyClientCert".into(),
        ),
        (
            format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
            "web_config_file tls_server_config.client_auth_type: RequireAnyClientCert".into(),
        ),
        (
            format!("{tls}  client_auth_type: Sometimes\n"),
            "web_config_file tls_server_config.client_auth_type: unknown \"Sometimes\"".into(),
        ),
        (
            format!("{tls}  cipher_suites:\n    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n    - TLS_RSA_WITH_RC4_128_SHA\n"),
            "web_config_file tls_server_config.cipher_suites[1]: \"TLS_RSA_WITH_RC4_128_SHA\" is not a TLS 1.2 cipher suite".into(),
        ),
        (
            format!("{tls}  min_version: TLS14\n"),
            "web_config_file tls_server_config.min_version: unknown TLS version \"TLS14\"".into(),
        ),
        (
            format!("basic_auth_users:\n  {USER}: never-printed-plain\n"),
            format!("web_config_file basic_auth_users.{USER}: not a bcrypt hash"),
        ),
        (
            format!("basic_auth_users: {}\n", yaml_str(&secret_hash)),
            "web_config_file: ".into(),
        ),
        (
            "http_server_config:\n  headers:\n    X-Powered-By: inboxwatch\n".into(),
            "web_config_file http_server_config.headers.X-Powered-By: cannot be set".into(),
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n".into(),
            "web_config_file http_server_config.headers.X-Frame-Options: \"allow\" is not one of deny, sameorigin".into(),
        ),
        (
            "tls_server_config:\n  cert_fil: x\n".into(),
            "unknown field `cert_fil`".into(),
        ),
    ];
    for (i, (yml, expected)) in cases.iter().enumerate() {
        let web = dir.path().join(format!("web{i}.yml"));
        std::fs::write(&web, yml).expect("write the web config");
        let config = dir.path().join(format!("config{i}.toml"));
        std::fs::write(
            &config,
            agent_toml(
                dir.path(),
                &format!("web_config_file = {}", toml_str(&web.to_string_lossy())),
            ),
        )
        .expect("write the config");
        let plain = dir.path().join("plain.toml");
        std::fs::write(&plain, agent_toml(dir.path(), "")).expect("write the config");
        let web_arg = web.to_string_lossy().to_string();
        let port = format!("127.0.0.1:{}", common::free_port());
        for args in [
            vec!["check-config", &*config.to_string_lossy()]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>(),
            vec![
                "run",
                "--config",
                &*config.to_string_lossy(),
                "--listen",
                &port,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            vec![
                "run",
                "--config",
                &*plain.to_string_lossy(),
                "--listen",
                &port,
                "--web.config.file",
                &web_arg,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ] {
            let out = common::Cmd::new(&args)
                .timeout(Duration::from_secs(20))
                .output();
            assert_eq!(out.code, Some(2), "{args:?} on\n{yml}\n{}", out.describe());
            assert!(
                out.stderr.contains(expected.as_str()),
                "{args:?} on\n{yml}\nexpected {expected:?} in:\n{}",
                out.stderr
            );
            for secret in ["never-printed", &secret_hash[7..]] {
                assert!(
                    !out.stderr.contains(secret) && !out.stdout.contains(secret),
                    "{args:?} printed a secret:\n{}",
                    out.describe()
                );
            }
        }
    }
}

/// A connection to 127.0.0.1:`port` from `source` (another loopback address).
async fn connect_from(source: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((std::net::Ipv4Addr::from(source), 0).into())?;
    socket.connect(([127, 0, 0, 1], port).into()).await
}

/// Whether the server closed `stream` within `wait` (EOF or reset).
async fn closed(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Guards `max_http_connections_per_client` (issue 35: 10,000 idle connections
/// from one address made scrapes from another time out): 300 idle connections
/// from 127.0.0.2, more than `max_http_connections` (256), leave exactly 8
/// open (the cap set) and the rest closed, and scrapes from 127.0.0.1 answer
/// within a second each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_flooding_idle_connections_does_not_starve_another() {
    const FLOOD: usize = 300;
    const CAP: usize = 8;
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = Agent::run(&agent_toml(
        dir.path(),
        &format!("max_http_connections_per_client = {CAP}\nheader_read_timeout = \"60s\""),
    ))
    .start();
    wait_until(READY_TIMEOUT, || async {
        match agent.get("/healthz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/healthz: {other:?}")),
        }
    })
    .await
    .expect("the agent listens");
    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        match connect_from([127, 0, 0, 2], agent.port).await {
            Ok(s) => flood.push(s),
            Err(e) => panic!("connection {i} from 127.0.0.2: {e}"),
        }
    }
    for i in 0..5 {
        let started = Instant::now();
        let mut stream = common::http::connect(agent.port).await;
        let status =
            tokio::time::timeout(Duration::from_secs(1), common::http::scrape_on(&mut stream))
                .await
                .unwrap_or_else(|_| {
                    panic!("scrape {i} from 127.0.0.1 took over 1 s under the flood")
                });
        assert!(status.contains(" 200 "), "scrape {i}: {status}");
        println!(
            "scrape {i} from 127.0.0.1 under the flood: {:?}",
            started.elapsed()
        );
    }
    // Each connection over the cap is closed as the listener accepts it.
    let mut flood: Vec<Option<TcpStream>> = flood.into_iter().map(Some).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let open = loop {
        let mut open = 0;
        for slot in flood.iter_mut() {
            if let Some(stream) = slot {
                if closed(stream, Duration::from_millis(1)).await {
                    *slot = None;
                } else {
                    open += 1;
                }
            }
        }
        if open == CAP || Instant::now() > deadline {
            break open;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(open, CAP, "connections from 127.0.0.2 left open of {FLOOD}");
    // The ones kept are served.
    let kept = flood
        .iter_mut()
        .flatten()
        .next()
        .expect("a kept connection");
    let status = tokio::time::timeout(Duration::from_secs(1), common::http::scrape_on(kept))
        .await
        .expect("a scrape on a kept connection");
    assert!(status.contains(" 200 "), "{status}");
}
