//! SASL OAUTHBEARER (RFC 7628, KIP-255), client side: where the token comes
//! from — a file read at every authentication (so a rotated token is used
//! from the next one), or a command run with a timeout whose answer the
//! connections opened in the same half minute share — the client's initial
//! response with its KIP-342 extensions, and the broker's error challenge.
//!
//! The token is a [`Secret`]: no message made here carries it, nor the
//! command's output.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::{Secret, TokenSettings, TokenSource};

/// How long the token a command printed is reused by other authentications.
const COMMAND_TOKEN_REUSE: Duration = Duration::from_secs(30);
/// The most a token command may print.
const MAX_OUTPUT: u64 = 1024 * 1024;

/// The tokens of one connector: the last answer of its `token_command`.
#[derive(Debug, Default)]
pub struct Tokens {
    /// Shared with the thread that runs the command, which stores its
    /// answer even when the authentication that asked has been given up
    /// (a cycle's timeout): the next one then finds it.
    command: Arc<Mutex<Option<(Instant, Secret)>>>,
}

impl Tokens {
    /// The token to authenticate with now. Errors name the key
    /// (`sources[0].sasl.token_file`), never the token.
    pub async fn token(&self, settings: &TokenSettings) -> Result<Secret, String> {
        let key = settings.source_key();
        match &settings.source {
            TokenSource::File(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{key}: cannot read \"{}\": {e}", path.display()))?;
                bearer(&text).map_err(|why| format!("{key}: \"{}\" {why}", path.display()))
            }
            TokenSource::Command { argv, timeout } => {
                if let Some(token) = self.reusable() {
                    return Ok(token);
                }
                let (argv, timeout) = (argv.clone(), *timeout);
                let program = argv[0].clone();
                let cache = self.command.clone();
                tokio::task::spawn_blocking(move || {
                    let token = run(&argv, timeout)
                        .and_then(|out| bearer(&out).map_err(|why| format!("its output {why}")))?;
                    *cache.lock().expect("token cache lock") =
                        Some((Instant::now(), token.clone()));
                    Ok(token)
                })
                .await
                .map_err(|e| format!("{key}: \"{program}\": {e}"))?
                .map_err(|why: String| format!("{key}: \"{program}\" {why}"))
            }
        }
    }

    /// The broker refused a token: the next authentication asks anew.
    pub fn forget(&self) {
        *self.command.lock().expect("token cache lock") = None;
    }

    fn reusable(&self) -> Option<Secret> {
        let cached = self.command.lock().expect("token cache lock");
        cached
            .as_ref()
            .filter(|(at, _)| at.elapsed() < COMMAND_TOKEN_REUSE)
            .map(|(_, token)| token.clone())
    }
}

/// The token in `text` (surrounding whitespace removed), if it is an RFC
/// 6750 `b64token`: letters, digits, `-._~+/`, then `=` padding. Anything else
/// (a JSON answer, a control character that would end the SASL message) is
/// refused without being repeated.
fn bearer(text: &str) -> Result<Secret, String> {
    let token = text.trim();
    if token.is_empty() {
        return Err("holds no token".into());
    }
    let body = token.trim_end_matches('=');
    let valid = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    if !valid {
        return Err(
            "is not a bearer token (RFC 6750: letters, digits and -._~+/, then = padding)".into(),
        );
    }
    Ok(Secret::new(token.to_string()))
}

/// Runs `argv` (no shell, no stdin) and returns its standard output, or why
/// not: it could not start, did not finish within `timeout` (then it is
/// killed), or exited with an error (with the last line of its standard
/// error). Blocking.
fn run(argv: &[String], timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot be run: {e}"))?;
    // Both pipes are drained by threads of their own, so that a chatty
    // command cannot block on a full pipe while it is waited for.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {timeout:?} (killed)"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    };
    // A process it left running may hold the pipes open: wait no longer
    // than the deadline.
    let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(100);
    let out = stdout.recv_timeout(left).unwrap_or_default();
    if !status.success() {
        let err = stderr
            .recv_timeout(Duration::from_millis(100))
            .unwrap_or_default();
        let last = String::from_utf8_lossy(&err)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().chars().take(200).collect::<String>());
        return Err(match last {
            Some(line) => format!("failed ({status}): {line}"),
            None => format!("failed ({status})"),
        });
    }
    String::from_utf8(out).map_err(|_| "printed something that is not UTF-8".into())
}

/// Reads `pipe` to its end (at most `MAX_OUTPUT` bytes) on a thread.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(MAX_OUTPUT).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
}

/// The client's initial response (RFC 7628 §3.1, as Kafka's client writes
/// it): `n,,` `\x01auth=Bearer <token>`, `\x01name=value` per extension,
/// `\x01\x01`.
pub fn client_first(token: &Secret, extensions: &[(String, String)]) -> Vec<u8> {
    let mut message = b"n,,\x01auth=Bearer ".to_vec();
    message.extend_from_slice(token.expose().as_bytes());
    for (name, value) in extensions {
        message.push(0x01);
        message.extend_from_slice(name.as_bytes());
        message.push(b'=');
        message.extend_from_slice(value.as_bytes());
    }
    message.extend_from_slice(b"\x01\x01");
    message
}

/// What the broker's error challenge (RFC 7628 §3.2.2: a JSON object with
/// `status`, maybe `scope`) says, for a message.
pub fn server_error(challenge: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(challenge).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    match (field("status"), field("scope")) {
        (Some(status), Some(scope)) => format!("status {status}, scope {scope}"),
        (Some(status), None) => format!("status {status}"),
        _ => "an error challenge that is not RFC 7628 JSON".into(),
    }
}

/// A lone `%x01`: the client's answer to an error challenge, after which the
/// broker ends the exchange with its error (RFC 7628 §3.2.3).
pub const ERROR_ACKNOWLEDGEMENT: &[u8] = b"\x01";

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(source: TokenSource) -> TokenSettings {
        TokenSettings {
            source,
            extensions: Vec::new(),
            key: "sources[0].sasl".into(),
        }
    }

    #[test]
    fn the_initial_response_is_kafkas_with_extensions_in_order() {
        let token = Secret::new("eyJhbGciOiJub25lIn0.eyJzdWIiOiJpdyJ9.".into());
        assert_eq!(
            client_first(&token, &[]),
            b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJpdyJ9.\x01\x01"
        );
        let ext = [
            ("logicalCluster".to_string(), "lkc-1".to_string()),
            ("traceId".to_string(), "a b".to_string()),
        ];
        assert_eq!(
            client_first(&token, &ext),
            b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJpdyJ9.\x01logicalCluster=lkc-1\x01traceId=a b\x01\x01"
        );
    }

    #[test]
    fn only_b64tokens_are_tokens_and_a_refusal_does_not_repeat_them() {
        assert_eq!(bearer(" abc-._~+/== \n").unwrap().expose(), "abc-._~+/==");
        for bad in [
            "",
            "  \n",
            "{\"access_token\":\"abc\"}",
            "ab\u{1}c",
            "==",
            "x y",
        ] {
            let why = bearer(bad).expect_err(bad);
            assert!(
                bad.trim().is_empty() || !why.contains(bad.trim()),
                "{bad:?}: {why}"
            );
        }
    }

    #[test]
    fn the_error_challenge_gives_its_status_and_scope() {
        assert_eq!(
            server_error(br#"{"status":"invalid_token","scope":"kafka"}"#),
            "status invalid_token, scope kafka"
        );
        assert_eq!(
            server_error(br#"{"status":"invalid_token"}"#),
            "status invalid_token"
        );
        assert!(server_error(b"garbage").contains("not RFC 7628"));
    }

    #[tokio::test]
    async fn a_token_file_is_read_at_every_authentication() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let s = settings(TokenSource::File(path.clone()));
        let tokens = Tokens::default();
        assert_eq!(tokens.token(&s).await.unwrap().expose(), "first");
        std::fs::write(&path, "second").unwrap();
        assert_eq!(tokens.token(&s).await.unwrap().expose(), "second");
        std::fs::remove_file(&path).unwrap();
        let e = tokens.token(&s).await.unwrap_err();
        assert!(
            e.starts_with("sources[0].sasl.token_file: cannot read"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_token_command_is_run_with_a_timeout_and_its_answer_reused() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let script = format!("echo x >> {}; echo ' tok.en-1 '", count.to_str().unwrap());
        let s = settings(TokenSource::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            timeout: Duration::from_secs(10),
        });
        let tokens = Tokens::default();
        assert_eq!(tokens.token(&s).await.unwrap().expose(), "tok.en-1");
        assert_eq!(tokens.token(&s).await.unwrap().expose(), "tok.en-1");
        let runs = || std::fs::read_to_string(&count).unwrap().lines().count();
        assert_eq!(runs(), 1, "the second authentication reuses the answer");
        tokens.forget();
        tokens.token(&s).await.unwrap();
        assert_eq!(runs(), 2, "a refused token is asked for anew");

        let slow = settings(TokenSource::Command {
            argv: vec!["sleep".into(), "5".into()],
            timeout: Duration::from_millis(200),
        });
        let e = tokens_error(&slow).await;
        assert!(
            e.starts_with("sources[0].sasl.token_command: \"sleep\" did not finish within"),
            "{e}"
        );
        let failing = settings(TokenSource::Command {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo secret-out; echo 'no credentials' >&2; exit 3".into(),
            ],
            timeout: Duration::from_secs(10),
        });
        let e = tokens_error(&failing).await;
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(e.ends_with("no credentials"), "{e}");
        assert!(!e.contains("secret-out"), "stdout is never repeated: {e}");
        let missing = settings(TokenSource::Command {
            argv: vec!["/nonexistent/get-token".into()],
            timeout: Duration::from_secs(10),
        });
        let e = tokens_error(&missing).await;
        assert!(
            e.starts_with(
                "sources[0].sasl.token_command: \"/nonexistent/get-token\" cannot be run"
            ),
            "{e}"
        );
    }

    /// An authentication given up while its command runs (a cycle's
    /// timeout) still leaves the command's answer for the next one.
    #[tokio::test]
    async fn a_slow_commands_answer_outlives_the_authentication_that_gave_up() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let script = format!(
            "echo x >> {}; sleep 0.5; echo late-token",
            count.to_str().unwrap()
        );
        let s = settings(TokenSource::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            timeout: Duration::from_secs(10),
        });
        let tokens = Tokens::default();
        let given_up = tokio::time::timeout(Duration::from_millis(100), tokens.token(&s)).await;
        assert!(given_up.is_err(), "the command takes 0.5 s");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokens.reusable().is_none() {
            assert!(Instant::now() < deadline, "the answer was never kept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(tokens.token(&s).await.unwrap().expose(), "late-token");
        let runs = std::fs::read_to_string(&count).unwrap().lines().count();
        assert_eq!(runs, 1);
    }

    async fn tokens_error(s: &TokenSettings) -> String {
        Tokens::default().token(s).await.unwrap_err()
    }
}
