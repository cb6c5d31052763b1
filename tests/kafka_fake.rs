//! The Kafka source against the fake broker of `tests/common/fake_kafka.rs`,
//! for what no broker here does (issue 15): SASL sessions that run out
//! (KIP-368; tansu does not enforce `connections.max.reauth.ms`), OAUTHBEARER
//! (KIP-255) with KIP-342 extensions, token files that rotate and token
//! commands, and records stamped in the future. The fake records every
//! request and SASL step, which are the ground truth here.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fake_kafka::{
    Cluster, FakeConfig, FakeGroup, FakeKafka, Outcome, SaslVerdict, scram_sha256,
};
use common::{Agent, Cmd, Metrics, stays, toml_str, unique_name, wait_until};

const UP: &str = "inboxwatch_source_up";
const LAG: &str = "kafka_consumer_group_lag_messages";
const LAG_S: &str = "kafka_consumer_group_lag_seconds";
const FUTURE: &str = "inboxwatch_kafka_future_timestamps_total";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// A `[[sources]]` entry of kind kafka polling every 300 ms; `sasl` is the
/// body of its `[sources.sasl]` (none if empty).
fn source(name: &str, broker: &str, sasl: &str) -> String {
    let mut s = format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"kafka\"\nbrokers = [\"{broker}\"]\n\
         poll_interval = \"300ms\"\nstatus_window = \"4s\"\n"
    );
    if !sasl.is_empty() {
        s.push_str("[sources.sasl]\n");
        s.push_str(sasl);
    }
    s
}

/// One topic of two partitions (records 60 s and 30 s old, 3 each) and one
/// group committed at offset 1 on both: lag 2 per partition.
fn lagging_cluster(topic: &str) -> Cluster {
    let now = now_ms();
    let mut cluster = Cluster::default();
    cluster.topics.insert(
        topic.into(),
        vec![
            vec![now - 60_000, now - 59_000, now - 58_000],
            vec![now - 30_000, now - 29_000, now - 28_000],
        ],
    );
    cluster.groups.insert(
        "billing".into(),
        FakeGroup {
            members: 1,
            committed: BTreeMap::from([((topic.into(), 0), 1), ((topic.into(), 1), 1)]),
            ..FakeGroup::default()
        },
    );
    cluster
}

/// The source is up and reports the lag of [`lagging_cluster`].
fn lag_is_exact(m: &Metrics, name: &str, topic: &str) -> Result<(), String> {
    if m.get(UP, &[("source", name)]) != Some(1.0) {
        return Err(format!("{name} is not up"));
    }
    for p in ["0", "1"] {
        let labels = [
            ("cluster", name),
            ("group", "billing"),
            ("topic", topic),
            ("partition", p),
        ];
        let lag = m.get(LAG, &labels);
        if lag != Some(2.0) {
            return Err(format!("{name} partition {p}: lag {lag:?}, want 2"));
        }
    }
    Ok(())
}

/// The bearer token of an OAUTHBEARER initial response.
fn bearer_of(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let rest = text.split("\u{1}auth=Bearer ").nth(1)?;
    Some(rest.split('\u{1}').next()?.to_string())
}

/// The verdict of a Kafka broker on an OAUTHBEARER step: accepted if the
/// token is one of `valid`; else, as Kafka's server does (RFC 7628 §3.2.2),
/// an error challenge first, and the failure once the client acknowledged it.
fn oauth_verdict(step: &common::fake_kafka::SaslStep<'_>, valid: &HashSet<String>) -> SaslVerdict {
    if step.step > 0 {
        return SaslVerdict::Reject("Authentication failed: the token is not valid".into());
    }
    match bearer_of(step.auth_bytes) {
        Some(token) if valid.contains(&token) => SaslVerdict::Accept,
        _ => SaslVerdict::Challenge(br#"{"status":"invalid_token"}"#.to_vec()),
    }
}

/// Writes `text` to `path` as a token rotator does: a new file renamed over
/// the old one.
fn rotate(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).expect("write the new token");
    std::fs::rename(&tmp, path).expect("rename the new token into place");
}

/// Connections of the fake re-authenticated at least `times` times each.
fn reauthenticated(fake: &FakeKafka, times: usize) -> Vec<u64> {
    let mut per_conn: BTreeMap<u64, usize> = BTreeMap::new();
    for s in fake.sasl_steps() {
        if s.reauthentication && s.step == 0 {
            *per_conn.entry(s.conn).or_default() += 1;
        }
    }
    per_conn
        .into_iter()
        .filter(|&(_, n)| n >= times)
        .map(|(c, _)| c)
        .collect()
}

/// Requests the fake did not answer because of the client's authentication.
fn refused(fake: &FakeKafka) -> Vec<String> {
    fake.requests()
        .iter()
        .filter(|r| r.outcome != Outcome::Answered)
        .map(|r| format!("{r:?}"))
        .collect()
}

/// Guards KIP-368 re-authentication (issue 15, item 4) with PLAIN: a broker
/// that grants 2.5 s SASL sessions and closes a connection on its first
/// request after its session ran out (as `connections.max.reauth.ms` does).
/// The agent, polling every 300 ms, re-authenticates each connection in place
/// before its session ends: three renewals on each of the cycle's
/// connections with no new connection meanwhile, two on the election's
/// heartbeat connection (every second 2 s heartbeat comes after the session
/// ran out: it renews first, which a broker accepts), not one request
/// refused, and the
/// lag exact throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sessions_are_renewed_in_place_before_they_run_out() {
    sessions_are_renewed_in_place(
        "PLAIN",
        "mechanism = \"PLAIN\"\nusername = \"iw\"\npassword = \"pw-Reauth\"\n",
        |step| {
            if step.auth_bytes == b"\0iw\0pw-Reauth" {
                SaslVerdict::Accept
            } else {
                SaslVerdict::Reject("bad credentials".into())
            }
        },
    )
    .await;
}

/// The same as [`plain_sessions_are_renewed_in_place_before_they_run_out`]
/// with SCRAM-SHA-256 (two steps per renewal, the broker's signature checked
/// each time), against the fake's own SCRAM server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sessions_are_renewed_in_place_before_they_run_out() {
    sessions_are_renewed_in_place(
        "SCRAM-SHA-256",
        "mechanism = \"SCRAM-SHA-256\"\nusername = \"iw\"\npassword = \"pw,Re=auth\"\n",
        scram_sha256("iw", "pw,Re=auth"),
    )
    .await;
}

async fn sessions_are_renewed_in_place(
    mechanism: &str,
    sasl: &str,
    check: impl Fn(&common::fake_kafka::SaslStep<'_>) -> SaslVerdict + Send + Sync + 'static,
) {
    let topic = unique_name("reauth", "r");
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    // 2.5 s: a request the client sends just before 85 % of the session
    // still reaches a busy machine's fake before the session ends.
    let config = FakeConfig::default().with_sasl(&[mechanism], 2_500, check);
    let fake = FakeKafka::start(config, Cluster::handler(cluster)).await;
    let agent = Agent::start(&source("ra", &fake.addr(), sasl));
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "ra", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // Every connection that sends requests is renewed once, then counted.
    wait_until(Duration::from_secs(30), || async {
        let renewed = reauthenticated(&fake, 1);
        (renewed.len() >= 2)
            .then_some(())
            .ok_or(format!("renewed once so far: {renewed:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let connections = fake.connections();
    wait_until(Duration::from_secs(30), || async {
        let renewed = reauthenticated(&fake, 3);
        (renewed.len() >= 2)
            .then_some(())
            .ok_or(format!("renewed three times so far: {renewed:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let m = agent.scrape().await;
    lag_is_exact(&m, "ra", &topic).unwrap();
    assert_eq!(
        fake.connections(),
        connections,
        "sessions were renewed on the open connections, not by reconnecting"
    );
    assert_eq!(refused(&fake), Vec::<String>::new());
    // The election's heartbeats come every 2 s, every second one after the
    // 2.5 s session ran out: that connection renews first, then heartbeats.
    wait_until(Duration::from_secs(30), || async {
        let heartbeat_conns: HashSet<u64> = fake
            .requests_of(kafka_protocol::messages::ApiKey::Heartbeat)
            .iter()
            .map(|r| r.conn)
            .collect();
        reauthenticated(&fake, 2)
            .iter()
            .any(|c| heartbeat_conns.contains(c))
            .then_some(())
            .ok_or_else(|| "the heartbeat connection has not renewed twice yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(refused(&fake), Vec::<String>::new());
    lag_is_exact(&agent.scrape().await, "ra", &topic).unwrap();
    // What renewing costs, for the record (`--no-capture`).
    let requests = fake.requests();
    let sasl = requests
        .iter()
        .filter(|r| r.api_key == 17 || r.api_key == 36)
        .count();
    let renewals = fake
        .sasl_steps()
        .iter()
        .filter(|s| s.reauthentication && s.step == 0)
        .count();
    eprintln!(
        "{mechanism}: {} requests on {} connections, {sasl} of them SASL, {renewals} renewals",
        requests.len(),
        fake.connections()
    );
}

/// Guards OAUTHBEARER with a token file (issue 15, item 5): the initial
/// client response is exactly `n,,\x01auth=Bearer <token>\x01<ext>=<v>…\x01\x01`
/// with the configured extensions (one from `${VAR}`); after the file is
/// replaced, the next authentication — a KIP-368 renewal on an open
/// connection — carries the new token, and the old one is never sent again;
/// the source stays up with exact lag. Neither token appears in the agent's
/// log (at debug level), nor in `check-config` or `doctor` output; the agent
/// warns that SASL runs without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_sends_the_token_and_extensions_and_follows_a_rotated_token_file() {
    let topic = unique_name("oauth", "o");
    let first = format!("iw-first.{:08x}", fastrand::u32(..));
    let second = format!("iw-second.{:08x}", fastrand::u32(..));
    let valid = Arc::new(Mutex::new(HashSet::from([first.clone()])));
    let v = valid.clone();
    let config = FakeConfig::default().with_sasl(&["OAUTHBEARER"], 2_500, move |step| {
        oauth_verdict(step, &v.lock().unwrap())
    });
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let fake = FakeKafka::start(config, Cluster::handler(cluster)).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{first}\n")).unwrap();
    let toml = source(
        "ob",
        &fake.addr(),
        &format!(
            "mechanism = \"OAUTHBEARER\"\ntoken_file = {}\n\
             [sources.sasl.extensions]\nlogicalCluster = \"lkc-42\"\nidentityPoolId = \"${{IW_TEST_POOL}}\"\n",
            toml_str(token_file.to_str().unwrap())
        ),
    );
    let agent = Agent::run(&toml)
        .env("IW_TEST_POOL", "pool-7")
        .env("INBOXWATCH_LOG", "debug")
        .start();
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "ob", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let steps = fake.sasl_steps();
    assert_eq!(steps[0].mechanism, "OAUTHBEARER");
    let expected = format!(
        "n,,\u{1}auth=Bearer {first}\u{1}identityPoolId=pool-7\u{1}logicalCluster=lkc-42\u{1}\u{1}"
    );
    assert_eq!(
        String::from_utf8_lossy(&steps[0].auth_bytes),
        expected,
        "the initial client response"
    );
    assert!(
        steps.iter().all(|s| s.auth_bytes == expected.as_bytes()),
        "every authentication before the rotation sends the same response"
    );

    // Rotate: both tokens valid while the file changes, then only the new one.
    valid.lock().unwrap().insert(second.clone());
    let before = fake.sasl_steps().len();
    rotate(&token_file, &second);
    let renewed_with_second = wait_until(Duration::from_secs(30), || async {
        fake.sasl_steps()[before..]
            .iter()
            .find(|s| s.reauthentication && bearer_of(&s.auth_bytes).as_ref() == Some(&second))
            .map(|s| s.at)
            .ok_or_else(|| "no renewal with the new token yet".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    valid.lock().unwrap().remove(&first);
    stays(Duration::from_secs(4), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "ob", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let stale: Vec<_> = fake
        .sasl_steps()
        .into_iter()
        .filter(|s| {
            s.at > renewed_with_second && bearer_of(&s.auth_bytes).as_ref() != Some(&second)
        })
        .collect();
    assert!(stale.is_empty(), "sent after the rotation: {stale:?}");
    assert_eq!(refused(&fake), Vec::<String>::new());

    let log = agent.stderr();
    assert!(log.contains("DEBUG"), "the agent logs at debug level");
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("SASL_PLAINTEXT") && l.contains("ob")),
        "a warning that the token crosses the network readable:\n{log}"
    );
    for token in [&first, &second] {
        assert!(!log.contains(token.as_str()), "a token in the log:\n{log}");
    }
    let config_path = dir.path().join("c.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let checked = Cmd::new(["check-config"])
        .arg(&config_path)
        .env("IW_TEST_POOL", "pool-7")
        .output();
    assert_eq!(checked.code, Some(0), "{}", checked.describe());
    let doctor = Cmd::new(["doctor", "--config"])
        .arg(&config_path)
        .env("IW_TEST_POOL", "pool-7")
        .timeout(Duration::from_secs(60))
        .output();
    assert_eq!(doctor.code, Some(0), "{}", doctor.describe());
    assert!(
        doctor.stdout.contains(
            "ok:      SASL OAUTHBEARER without TLS: authenticated; the broker's session lasts 2s 500ms, renewed in place after 85 %"
        ),
        "{}",
        doctor.stdout
    );
    for out in [&checked, &doctor] {
        let all = format!("{}{}", out.stdout, out.stderr);
        for token in [&first, &second] {
            assert!(!all.contains(token.as_str()), "a token printed: {all}");
        }
    }
}

/// Guards OAUTHBEARER over TLS (issue 15, item 5): against a broker that
/// speaks only TLS (a test CA's certificate for 127.0.0.1) with
/// `[sources.tls] ca_file`, the token goes in the same initial response, the
/// source is up with exact lag, and no SASL_PLAINTEXT warning is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_over_tls_authenticates_without_a_plaintext_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = common::otlp::test_pki(dir.path());
    let topic = unique_name("oauthtls", "t");
    let token = format!("iw-tls.{:08x}", fastrand::u32(..));
    let valid = HashSet::from([token.clone()]);
    let config =
        FakeConfig::default()
            .with_tls(cert, key)
            .with_sasl(&["OAUTHBEARER"], 0, move |step| oauth_verdict(step, &valid));
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let fake = FakeKafka::start(config, Cluster::handler(cluster)).await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let toml = format!(
        "{}[sources.tls]\nca_file = {}\n",
        source(
            "tl",
            &fake.addr(),
            &format!(
                "mechanism = \"OAUTHBEARER\"\ntoken_file = {}\n",
                toml_str(token_file.to_str().unwrap())
            ),
        ),
        toml_str(ca.to_str().unwrap())
    );
    let agent = Agent::start(&toml);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "tl", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let steps = fake.sasl_steps();
    assert_eq!(
        String::from_utf8_lossy(&steps[0].auth_bytes),
        format!("n,,\u{1}auth=Bearer {token}\u{1}\u{1}")
    );
    assert_eq!(refused(&fake), Vec::<String>::new());
    let log = agent.stderr();
    assert!(!log.contains("SASL_PLAINTEXT"), "{log}");
    assert!(!log.contains(token.as_str()), "{log}");
}

/// Guards OAUTHBEARER's failures (issue 15, item 5), one source each on one
/// agent against one broker: a token from `token_command` is accepted (the
/// source is up with exact lag); a token the broker refuses, a command that
/// fails, a command that does not finish within `token_command_timeout` and
/// a missing token file each leave their source down with an error that
/// names the source and the key — never the token or the command's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_token_commands_and_refusals_are_reported_at_their_key() {
    let topic = unique_name("oauthfail", "f");
    let good = format!("cmd-token.{:08x}", fastrand::u32(..));
    let revoked = format!("revoked-token.{:08x}", fastrand::u32(..));
    let valid = HashSet::from([good.clone()]);
    let config = FakeConfig::default()
        .with_sasl(&["OAUTHBEARER"], 0, move |step| oauth_verdict(step, &valid));
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let fake = FakeKafka::start(config, Cluster::handler(cluster)).await;
    let dir = tempfile::tempdir().unwrap();
    let revoked_file = dir.path().join("revoked");
    std::fs::write(&revoked_file, &revoked).unwrap();
    let missing = dir.path().join("missing-token");
    let addr = fake.addr();
    let toml = [
        source(
            "cmd",
            &addr,
            &format!("mechanism = \"OAUTHBEARER\"\ntoken_command = [\"sh\", \"-c\", \"echo {good}\"]\n"),
        ),
        source(
            "refused",
            &addr,
            &format!(
                "mechanism = \"OAUTHBEARER\"\ntoken_file = {}\n",
                toml_str(revoked_file.to_str().unwrap())
            ),
        ),
        source(
            "failing",
            &addr,
            "mechanism = \"OAUTHBEARER\"\ntoken_command = [\"sh\", \"-c\", \"echo leaked-stdout-9; echo 'no credentials for kafka' >&2; exit 3\"]\n",
        ),
        source(
            "slow",
            &addr,
            "mechanism = \"OAUTHBEARER\"\ntoken_command = [\"sleep\", \"30\"]\ntoken_command_timeout = \"300ms\"\n",
        ),
        source(
            "nofile",
            &addr,
            &format!(
                "mechanism = \"OAUTHBEARER\"\ntoken_file = {}\n",
                toml_str(missing.to_str().unwrap())
            ),
        ),
    ]
    .concat();
    let agent = Agent::start(&toml);
    let expected: [(&str, &str, &[&str]); 4] = [
        (
            "refused",
            "sources[1].sasl.token_file",
            &[
                "the broker refused the OAUTHBEARER token",
                "the token is not valid",
                "status invalid_token",
            ],
        ),
        (
            "failing",
            "sources[2].sasl.token_command",
            &["\"sh\" failed (exit status: 3): no credentials for kafka"],
        ),
        (
            "slow",
            "sources[3].sasl.token_command",
            &["\"sleep\" did not finish within 300ms (killed)"],
        ),
        (
            "nofile",
            "sources[4].sasl.token_file",
            &["cannot read", "missing-token"],
        ),
    ];
    wait_until(Duration::from_secs(40), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "cmd", &topic)?;
        let log = agent.stderr();
        for (name, key, words) in expected {
            if m.get(UP, &[("source", name)]) != Some(0.0) {
                return Err(format!("{name} is not reported down"));
            }
            let said = log.lines().any(|l| {
                l.contains(&format!("source={name}"))
                    && l.contains(key)
                    && words.iter().all(|w| l.contains(w))
            });
            if !said {
                return Err(format!("no error for {name} naming {key} and {words:?}"));
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let log = agent.stderr();
    for secret in [good.as_str(), revoked.as_str(), "leaked-stdout-9"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    let cmd_steps: Vec<_> = fake
        .sasl_steps()
        .into_iter()
        .filter(|s| bearer_of(&s.auth_bytes).as_ref() == Some(&good))
        .collect();
    assert!(!cmd_steps.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&cmd_steps[0].auth_bytes),
        format!("n,,\u{1}auth=Bearer {good}\u{1}\u{1}"),
        "no extensions configured: none sent"
    );
    // The refused token: the error challenge was acknowledged with a lone %x01.
    assert!(
        fake.sasl_steps()
            .iter()
            .any(|s| s.step == 1 && s.auth_bytes == b"\x01"),
        "the client acknowledges the error challenge"
    );
}

/// Guards the OAUTHBEARER settings (issue 15, item 5): every mistake is a
/// config error naming its key; a token file that does not exist yet is not
/// one (it is read at each authentication); OAUTHBEARER over TLS is valid.
#[test]
fn oauthbearer_settings_are_checked_at_their_keys() {
    let base = "[[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"127.0.0.1:9092\"]\n";
    let check = |sasl: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, format!("{base}{sasl}")).unwrap();
        let out = Cmd::new(["check-config"]).arg(&path).output();
        (out.code.unwrap_or(-1), out.stderr + &out.stdout)
    };
    let cases: &[(&str, &[&str])] = &[
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_file = \"/t\"\ntoken_command = [\"x\"]\n",
            &[
                "sources[0].sasl.token_command",
                "either token_file or token_command",
            ],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\n",
            &["sources[0].sasl.token_file", "required with OAUTHBEARER"],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_command = []\n",
            &["sources[0].sasl.token_command", "needs a program"],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_file = \"/t\"\nusername = \"u\"\npassword = \"hunter2-secret\"\n",
            &[
                "sources[0].sasl.username",
                "sources[0].sasl.password",
                "not used with OAUTHBEARER",
            ],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_file = \"/t\"\ntoken_command_timeout = \"5s\"\n",
            &[
                "sources[0].sasl.token_command_timeout",
                "only with token_command",
            ],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_command = [\"x\"]\ntoken_command_timeout = \"soon\"\n",
            &["sources[0].sasl.token_command_timeout", "invalid duration"],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_file = \"/t\"\n[sources.sasl.extensions]\nlogical_cluster = \"x\"\nauth = \"y\"\nempty = \"\"\nteam = \"${IW_TEST_UNSET_EXTENSION}\"\n",
            &[
                "sources[0].sasl.extensions.logical_cluster",
                "letters only",
                "sources[0].sasl.extensions.auth",
                "reserved",
                "sources[0].sasl.extensions.empty",
                "sources[0].sasl.extensions.team",
                "IW_TEST_UNSET_EXTENSION",
            ],
        ),
        (
            "[sources.sasl]\nmechanism = \"PLAIN\"\nusername = \"u\"\npassword = \"hunter2-secret\"\ntoken_file = \"/t\"\n[sources.sasl.extensions]\na = \"b\"\n",
            &[
                "sources[0].sasl.token_file",
                "sources[0].sasl.extensions",
                "only with mechanism = \"OAUTHBEARER\"",
            ],
        ),
        (
            "[sources.sasl]\nmechanism = \"OAUTH\"\n",
            &["sources[0].sasl.mechanism", "OAUTHBEARER"],
        ),
    ];
    for (sasl, words) in cases {
        let (code, out) = check(sasl);
        assert_eq!(code, 2, "{sasl}\n{out}");
        for w in *words {
            assert!(out.contains(w), "{sasl}: no {w:?} in\n{out}");
        }
        assert!(!out.contains("hunter2-secret"), "a password printed: {out}");
    }
    for valid in [
        "[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_file = \"/nonexistent/yet\"\n",
        "[sources.tls]\n[sources.sasl]\nmechanism = \"OAUTHBEARER\"\ntoken_command = [\"/usr/bin/get-token\", \"--audience\", \"kafka\"]\ntoken_command_timeout = \"3s\"\n[sources.sasl.extensions]\nlogicalCluster = \"lkc-1\"\n",
    ] {
        let (code, out) = check(valid);
        assert_eq!(code, 0, "{valid}\n{out}");
    }
}

/// Guards clock sanity end to end (issue 15, item 6): records whose
/// CreateTime is an hour ahead of the agent's clock (a producer's clock
/// skew) sit at a group's committed offsets. Their lag seconds are 0, never
/// negative; `inboxwatch_kafka_future_timestamps_total` counts each such
/// record once however many cycles read its age (it stays 1 for seconds),
/// then 2 when the group commits onto a second one; a record in the past
/// next to it keeps its exact age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_stamped_in_the_future_are_zero_seconds_old_and_counted_once() {
    let topic = unique_name("skew", "s");
    let now = now_ms();
    let hour = 3_600_000;
    let mut cluster = Cluster::default();
    cluster.topics.insert(
        topic.clone(),
        vec![
            vec![now - 90_000, now + hour, now + hour + 1_000, now - 5_000],
            vec![now - 45_000, now - 44_000, now + 2 * hour],
        ],
    );
    cluster.groups.insert(
        "billing".into(),
        FakeGroup {
            members: 1,
            committed: BTreeMap::from([((topic.clone(), 0), 1), ((topic.clone(), 1), 0)]),
            ..FakeGroup::default()
        },
    );
    let cluster = Arc::new(Mutex::new(cluster));
    let fake = FakeKafka::start(FakeConfig::default(), Cluster::handler(cluster.clone())).await;
    let started = Instant::now();
    let agent = Agent::start(&source("sk", &fake.addr(), ""));
    let lag_s = |m: &Metrics, p: &str| {
        m.get(
            LAG_S,
            &[
                ("cluster", "sk"),
                ("group", "billing"),
                ("topic", &topic),
                ("partition", p),
            ],
        )
    };
    let m = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        match (
            m.get(FUTURE, &[("source", "sk")]),
            lag_s(&m, "0"),
            lag_s(&m, "1"),
        ) {
            (Some(_), Some(_), Some(_)) => Ok(m),
            other => Err(format!("future, p0, p1: {other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert_eq!(
        lag_s(&m, "0"),
        Some(0.0),
        "a record from the future is 0 s old"
    );
    let p1 = lag_s(&m, "1").unwrap();
    let bound = 45.0 + started.elapsed().as_secs_f64() + 1.0;
    assert!(
        (45.0..=bound).contains(&p1),
        "p1's record is 45 s old when the agent started: {p1} (at most {bound})"
    );
    assert_eq!(m.get(FUTURE, &[("source", "sk")]), Some(1.0));
    // More cycles read nothing new: the count stays.
    stays(Duration::from_secs(3), || async {
        let m = agent.try_scrape().await?;
        let n = m.get(FUTURE, &[("source", "sk")]);
        let p0 = lag_s(&m, "0");
        (n == Some(1.0) && p0 == Some(0.0))
            .then_some(())
            .ok_or(format!("future {n:?}, p0 lag seconds {p0:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // The group moves onto p1's future record, and p0's next one (also in
    // the future): two more.
    {
        let mut c = cluster.lock().unwrap();
        let g = c.groups.get_mut("billing").unwrap();
        g.committed.insert((topic.clone(), 0), 2);
        g.committed.insert((topic.clone(), 1), 2);
    }
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let n = m.get(FUTURE, &[("source", "sk")]);
        let lags = (lag_s(&m, "0"), lag_s(&m, "1"));
        (n == Some(3.0) && lags == (Some(0.0), Some(0.0)))
            .then_some(())
            .ok_or(format!("future {n:?}, lag seconds {lags:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // Back to a record in the past on p0: its exact age, the count unchanged.
    cluster
        .lock()
        .unwrap()
        .groups
        .get_mut("billing")
        .unwrap()
        .committed
        .insert((topic.clone(), 0), 3);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let n = m.get(FUTURE, &[("source", "sk")]);
        let p0 = lag_s(&m, "0");
        let ok = n == Some(3.0)
            && p0.is_some_and(|s| s >= 5.0 && s <= 5.0 + 1.0 + started.elapsed().as_secs_f64());
        ok.then_some(())
            .ok_or(format!("future {n:?}, p0 lag seconds {p0:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let lags: Vec<f64> = agent
        .scrape()
        .await
        .series(LAG_S, &[("cluster", "sk")])
        .map(|s| s.value)
        .collect();
    assert!(lags.iter().all(|&s| s >= 0.0), "{lags:?}");
}

/// Guards an election given up halfway (issue 34, item 3): the coordinator
/// answers the first SyncGroup only after 16 s, past the join's request
/// timeout (9 s) and the election's patience (13 s), when JoinGroup had
/// already given this lone agent its member id, its generation and the
/// leadership. Heartbeats of that generation answer "ok", so an agent that
/// kept the generation but not the leadership stood by for ever ("standby
/// (another agent owns it)", no `kafka_*` series). The next attempt must
/// start clean: the agent owns the source and exports exact lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_given_up_halfway_starts_clean() {
    let topic = unique_name("slowsync", "s");
    let mut cluster = lagging_cluster(&topic);
    cluster.sync_delays.push_back(Duration::from_secs(16));
    let cluster = Arc::new(Mutex::new(cluster));
    let fake = FakeKafka::start(FakeConfig::default(), Cluster::handler(cluster)).await;
    let agent = Agent::start(&source("ss", &fake.addr(), ""));
    // The first attempt gives up after 13 s; the next one starts 2 s later.
    let exported = wait_until(Duration::from_secs(45), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "ss", &topic)
    })
    .await;
    if let Err(e) = exported {
        let ready = agent.get("/readyz").await;
        panic!("{e}\n/readyz: {ready:?}\n{}", agent.stderr());
    }
    let syncs = fake.requests_of(kafka_protocol::messages::ApiKey::SyncGroup);
    assert!(
        syncs.len() >= 2,
        "the agent completed a second round after giving the first up: {} SyncGroup",
        syncs.len()
    );
}

/// The `/readyz` line of `source`, and whether the agent answered 200.
async fn readyz_line(agent: &Agent, source: &str) -> Result<String, String> {
    let (_, body) = agent.get("/readyz").await?;
    body.lines()
        .find(|l| l.starts_with(&format!("{source}: ")))
        .map(str::to_string)
        .ok_or(format!("no line for {source} in /readyz: {body}"))
}

/// How a broker goes away under the agent.
#[derive(Debug, Clone, Copy)]
enum Gone {
    /// The process is killed: connections closed, new ones refused.
    Killed,
    /// The host is gone or the broker froze: connections stay open, nothing
    /// is answered (each request fails at its timeout).
    Silent,
}

/// Guards a broker killed under the agent (issue 34, item 3): the source
/// stayed up with its last values for about 5 s. See [`broker_gone`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_under_the_agent_marks_the_source_down_at_once() {
    broker_gone(Gone::Killed).await;
}

/// The same with a broker that stops answering: the heartbeat that timed out
/// (2 s) was tried again on a new connection, which timed out too, so the
/// source was marked down 4 s after the first unanswered request, up to 6 s
/// after the broker went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_answering_marks_the_source_down_at_once() {
    broker_gone(Gone::Silent).await;
}

/// With 10 s polls, the election's heartbeat (every 2 s) is the first request
/// to fail after the broker goes: within a second of its failure (refused at
/// once, or its 2 s timeout) `inboxwatch_source_up` is 0 and the lag series
/// are gone, and `/readyz` and the log name the broker's address, not a
/// database.
async fn broker_gone(how: Gone) {
    let topic = unique_name("gone", "g");
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let fake = FakeKafka::start(FakeConfig::default(), Cluster::handler(cluster)).await;
    let addr = fake.addr();
    let toml = source("bk", &addr, "")
        .replace("poll_interval = \"300ms\"", "poll_interval = \"10s\"")
        .replace("status_window = \"4s\"", "status_window = \"20s\"");
    let agent = Agent::start(&toml);
    let heartbeats = || fake.requests_of(kafka_protocol::messages::ApiKey::Heartbeat);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "bk", &topic)?;
        let n = heartbeats().len();
        (n >= 2)
            .then_some(())
            .ok_or(format!("{n} heartbeats so far"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    let last_heartbeat = heartbeats().last().map(|r| r.at).expect("heartbeats");
    let gone = Instant::now();
    let mut fake = Some(fake);
    match how {
        Gone::Killed => drop(fake.take()),
        Gone::Silent => fake.as_ref().expect("running").set_silent(true),
    }
    let down = wait_until(Duration::from_secs(15), || async {
        let m = agent.try_scrape().await?;
        let up = m.get(UP, &[("source", "bk")]);
        let lag = m.series(LAG, &[("cluster", "bk")]).count();
        (up == Some(0.0) && lag == 0)
            .then(Instant::now)
            .ok_or(format!("up {up:?}, {lag} lag series"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // When the first request after the broker went failed: refused, the next
    // heartbeat (at most 2.4 s, the heartbeat and its jitter, after the last
    // answered one); unanswered, 2 s (its timeout) after the fake got it.
    let failed = match &fake {
        None => (last_heartbeat + Duration::from_millis(2_400)).max(gone),
        Some(fake) => {
            let first = fake
                .requests()
                .into_iter()
                .find(|r| r.outcome == Outcome::Unanswered)
                .expect("a request reached the silent broker");
            first.at + Duration::from_secs(2)
        }
    };
    eprintln!(
        "{how:?}: down {:?} after the broker went, {:?} after the last answered heartbeat",
        down - gone,
        down - last_heartbeat
    );
    assert!(
        down <= failed + Duration::from_secs(1),
        "{how:?}: down {:?} after the broker went, {:?} after the first request failed\n{}",
        down - gone,
        down.saturating_duration_since(failed),
        agent.stderr()
    );
    let line = wait_until(Duration::from_secs(10), || async {
        let line = readyz_line(&agent, "bk").await?;
        line.contains(&addr).then_some(line.clone()).ok_or(line)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    eprintln!("{how:?}: /readyz: {line}");
    assert!(line.starts_with("bk: down: "), "{line}");
    assert!(!line.contains("database"), "{line}");
    let log = agent.stderr();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("source=bk"))
        .collect();
    assert!(said.iter().any(|l| l.contains(&addr)), "{log}");
    assert!(said.iter().all(|l| !l.contains("database")), "{log}");
}

/// Guards the words of an unreachable Kafka source (issue 34, item 3):
/// `/readyz` said "cannot reach the database to contest the source's lock".
/// A broker nobody listens on is named, with its address, in `/readyz` and
/// the log; no database is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_named_not_a_database() {
    let addr = format!("127.0.0.1:{}", common::free_port());
    let agent = Agent::start(&source("ub", &addr, ""));
    let line = wait_until(Duration::from_secs(20), || async {
        let line = readyz_line(&agent, "ub").await?;
        line.contains(&addr).then_some(line.clone()).ok_or(line)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    assert!(line.starts_with("ub: down: "), "{line}");
    assert!(line.contains("cannot connect"), "{line}");
    assert!(!line.contains("database"), "{line}");
    let m = agent.scrape().await;
    assert_eq!(m.get(UP, &[("source", "ub")]), Some(0.0));
    let log = agent.stderr();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("source=ub"))
        .collect();
    assert!(said.iter().any(|l| l.contains(&addr)), "{log}");
    assert!(said.iter().all(|l| !l.contains("database")), "{log}");
}

/// Guards a cycle that ends after the owner lost the source's lock (issue
/// 34, item 3): the election's heartbeat failed (the coordinator closes it)
/// and marked the source down while a cycle was waiting for its metadata;
/// when that cycle ended it set `inboxwatch_source_up` back to 1 and
/// `/readyz` to "up", until the next failed attempt to contest the lock.
/// Once down, the source stays down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_ending_after_the_lock_was_lost_does_not_mark_the_source_up() {
    use kafka_protocol::messages::ApiKey;
    use std::sync::atomic::{AtomicBool, Ordering};
    let topic = unique_name("lostlock", "l");
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let lost = Arc::new(AtomicBool::new(false));
    let l = lost.clone();
    let handler = move |req: &common::fake_kafka::Req| {
        if l.load(Ordering::SeqCst) && matches!(req.api_key, ApiKey::Heartbeat | ApiKey::JoinGroup)
        {
            return common::fake_kafka::Reply::Close;
        }
        // Every cycle waits 3 s for its metadata: a heartbeat that fails
        // within 3 s of a cycle's start fails while that cycle runs.
        match cluster.lock().unwrap().answer(req) {
            common::fake_kafka::Reply::Answer(frame) if req.api_key == ApiKey::Metadata => {
                common::fake_kafka::Reply::Delayed(Duration::from_secs(3), frame)
            }
            reply => reply,
        }
    };
    let fake = FakeKafka::start(FakeConfig::default(), handler).await;
    let agent = Agent::start(&source("lk", &fake.addr(), ""));
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "lk", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    // Right after a cycle asked for its metadata, the coordinator turns
    // the agent's heartbeats away (the next one comes within 2 s).
    let asked = fake.requests_of(ApiKey::Metadata).len();
    wait_until(Duration::from_secs(10), || async {
        (fake.requests_of(ApiKey::Metadata).len() > asked)
            .then_some(())
            .ok_or_else(|| "no new cycle".to_string())
    })
    .await
    .unwrap();
    lost.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(10), || async {
        let up = agent.try_scrape().await?.get(UP, &[("source", "lk")]);
        (up == Some(0.0)).then_some(()).ok_or(format!("up {up:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    stays(Duration::from_secs(4), || async {
        let up = agent.try_scrape().await?.get(UP, &[("source", "lk")]);
        let line = readyz_line(&agent, "lk").await?;
        (up == Some(0.0) && line.starts_with("lk: down: "))
            .then_some(())
            .ok_or(format!("up {up:?}, /readyz {line}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
}

/// Guards the Kafka dead-letter replay's write user (issue 36, item 4): a
/// source with `[sources.dead_letter_actions.sasl]` is watched by `run` with
/// its own read user only. The fake broker would accept either user; every
/// SASL step the agent makes, over a dozen polls and the election's
/// heartbeats, carries the read user's credentials, never the write user's.
/// (tansu keeps no ACLs, so a broker refusing the read user's produce
/// cannot be shown here; this shows the agent never holds the other user's
/// session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_never_authenticates_as_the_replay_write_user() {
    const READ: &[u8] = b"\0reader\0pw-read";
    const WRITE: &[u8] = b"\0replayer\0pw-write";
    let topic = unique_name("rowrite", "w");
    let cluster = Arc::new(Mutex::new(lagging_cluster(&topic)));
    let config = FakeConfig::default().with_sasl(&["PLAIN"], 60_000, |step| {
        if step.auth_bytes == READ || step.auth_bytes == WRITE {
            SaslVerdict::Accept
        } else {
            SaslVerdict::Reject("bad credentials".into())
        }
    });
    let fake = FakeKafka::start(config, Cluster::handler(cluster)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.db");
    let toml = source(
        "ro",
        &fake.addr(),
        "mechanism = \"PLAIN\"\nusername = \"reader\"\npassword = \"pw-read\"\n",
    ) + &format!(
        "[sources.dead_letter_actions]\naudit_dsn = {}\n\
         [sources.dead_letter_actions.sasl]\nmechanism = \"PLAIN\"\nusername = \"replayer\"\n\
         password = \"pw-write\"\n",
        toml_str(&format!("sqlite://{}?mode=rwc", audit.display())),
    );
    let agent = Agent::start(&toml);
    wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        lag_is_exact(&m, "ro", &topic)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.stderr()));
    agent.wait_polls("ro", 12, Duration::from_secs(3)).await;
    let steps = fake.sasl_steps();
    let users: BTreeMap<String, usize> = steps.iter().fold(BTreeMap::new(), |mut m, s| {
        let user = String::from_utf8_lossy(&s.auth_bytes)
            .split('\0')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        *m.entry(user).or_default() += 1;
        m
    });
    assert_eq!(
        users.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["reader"],
        "the users the agent authenticated as: {users:?}"
    );
    assert!(
        users["reader"] >= 2,
        "each connection of the agent authenticates: {users:?}"
    );
}
