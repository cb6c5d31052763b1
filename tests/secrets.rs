//! Secrets never reach any output: a DSN password holding every character a
//! generated secret may hold (`/ @ : % # ? +` and a space) is given through
//! `${VAR}` to sources on MariaDB (which checks it, so connecting proves it
//! arrived intact), PostgreSQL and an unreachable port, and `run --log trace`
//! (stderr, stdout, `/metrics`, `/readyz`, `/healthz`) and `doctor` are read for
//! any piece of it.

use crate::common;

use std::time::Duration;

use common::scenarios::inbox_source_toml;
use common::{Agent, Cmd, Db, V, url_hostport, url_with_hostport, url_with_user, wait_until};

/// Every piece between two special characters is distinctive, so that a
/// password cut at any of them (a URL misread as host, port and path) shows too.
const PASSWORD: &str = "Lk9qA/Zt8wB@Wm7eC:Vp6rD%2FJn5tE#Hb4yF?Cd3uG+Ef2iH Qs1oJ";

/// The password's pieces, as any output might carry them.
fn pieces() -> Vec<&'static str> {
    PASSWORD
        .split(['/', '@', ':', '%', '#', '?', '+', ' '])
        .filter(|p| p.len() >= 5)
        .collect()
}

fn assert_nothing_leaks(what: &str, text: &str) {
    for piece in pieces() {
        assert!(
            !text.contains(piece),
            "{what} carries `{piece}`, a piece of the DSN password:\n{text}"
        );
    }
}

/// A role that logs in with [`PASSWORD`] and may read `table`, dropped at cleanup.
async fn create_user(db: &Db, user: &str, table: &str) {
    let pw = PASSWORD.replace('\'', "''");
    db.register_role(user);
    let statements = match db.dialect {
        common::Dialect::Postgres => {
            vec![
                format!("CREATE ROLE {user} LOGIN PASSWORD '{pw}'"),
                format!("GRANT SELECT ON {table} TO {user}"),
            ]
        }
        _ => ["%", "localhost", "127.0.0.1"]
            .iter()
            .flat_map(|host| {
                [
                    format!("CREATE USER '{user}'@'{host}' IDENTIFIED BY '{pw}'"),
                    format!("GRANT SELECT ON {table} TO '{user}'@'{host}'"),
                ]
            })
            .collect(),
    };
    for stmt in statements {
        db.exec(&stmt, &[] as &[V]).await;
    }
}

/// Guards issue 16's leak: a password with `/` (any base64 secret) was
/// substituted unencoded, so the URL did not parse as meant, and printed in
/// clear by `run` and `doctor`. Now it connects (MariaDB checks it) and no
/// output at any log level carries any piece of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_characters_connects_and_is_printed_nowhere() {
    let pg = Db::postgres().await;
    let my = Db::mysql().await;
    let pg_tables = pg.fresh_tables("sec").await;
    let my_tables = my.fresh_tables("sec").await;
    let pg_user = common::unique_name("iwsec", "pg");
    let my_user = format!("iwsec{}", std::process::id());
    create_user(&pg, &pg_user, &pg_tables.inbox).await;
    create_user(&my, &my_user, &my_tables.inbox).await;

    let secret_dsn = |url: &str, user: &str| url_with_user(url, user, "${IW_SECRET_PW}");
    let unreachable = url_with_hostport(&secret_dsn(&pg.dsn, &pg_user), "127.0.0.1:1");
    let config = format!(
        "{}{}{}",
        inbox_source_toml("pg", &secret_dsn(&pg.dsn, &pg_user), &pg_tables.inbox),
        inbox_source_toml("maria", &secret_dsn(&my.dsn, &my_user), &my_tables.inbox),
        inbox_source_toml("down", &unreachable, &pg_tables.inbox),
    );
    assert_ne!(url_hostport(&unreachable), url_hostport(&pg.dsn));
    let env = [("IW_SECRET_PW", PASSWORD), ("INBOXWATCH_LOG", "trace")];
    let agent = Agent::start_with_env(&config, &env);

    // Both databases up (MariaDB took the password), the unreachable one down.
    let up = wait_until(Duration::from_secs(30), || async {
        let m = agent.try_scrape().await?;
        let state =
            ["pg", "maria", "down"].map(|s| m.get("inboxwatch_source_up", &[("source", s)]));
        match state {
            [Some(1.0), Some(1.0), Some(0.0)] => Ok(()),
            other => Err(format!("inboxwatch_source_up pg, maria, down: {other:?}")),
        }
    })
    .await;
    if let Err(e) = up {
        panic!("{e}\n--- stderr ---\n{}", agent.stderr());
    }
    let (_, metrics) = agent.get("/metrics").await.expect("GET /metrics");
    let (_, readyz) = agent.get("/readyz").await.expect("GET /readyz");
    let (_, healthz) = agent.get("/healthz").await.expect("GET /healthz");
    agent.terminate(Duration::from_secs(20));
    let stderr = agent.stderr();
    assert!(
        stderr.contains("DEBUG") && stderr.contains(&format!("{pg_user}:***@")),
        "a log below INFO (nothing logs at TRACE yet) naming the redacted DSN:\n{stderr}"
    );
    assert_nothing_leaks("run's stderr (--log trace)", &stderr);
    assert_nothing_leaks("run's stdout", &agent.stdout());
    assert_nothing_leaks("/metrics", &metrics);
    assert_nothing_leaks("/readyz", &readyz);
    assert_nothing_leaks("/healthz", &healthz);

    // doctor on the same file: it connects, checks and prints each header once.
    let out = Cmd::new(["doctor", "--config"])
        .arg(agent.dir().join("inboxwatch.toml"))
        .envs(env)
        .timeout(Duration::from_secs(60))
        .output();
    let printed = format!("{}\n{}", out.stdout, out.stderr);
    assert!(
        printed.contains(&format!("{my_user}:***@")),
        "doctor names the redacted DSN:\n{printed}"
    );
    assert_nothing_leaks("doctor", &printed);

    pg.cleanup().await;
    my.cleanup().await;
}

/// Issue 35: a login the database refuses was logged and shown as "cannot
/// reach the database to contest the source's lock". It says access denied, in
/// the driver's words naming the user, on MariaDB (a wrong password) and
/// PostgreSQL (a user that does not exist), and the password stays out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_says_access_denied_for_which_user() {
    let pg = Db::postgres().await;
    let my = Db::mysql().await;
    let pg_tables = pg.fresh_tables("denied").await;
    let my_tables = my.fresh_tables("denied").await;
    let pg_user = common::unique_name("iwnobody", "pg");
    let config = format!(
        "{}{}",
        inbox_source_toml(
            "pg-denied",
            &url_with_user(&pg.dsn, &pg_user, "${IW_SECRET_PW}"),
            &pg_tables.inbox
        ),
        inbox_source_toml(
            "maria-denied",
            &url_with_user(&my.dsn, "root", "${IW_SECRET_PW}"),
            &my_tables.inbox
        ),
    );
    let env = [("IW_SECRET_PW", PASSWORD)];
    let agent = Agent::start_with_env(&config, &env);
    let said = wait_until(Duration::from_secs(60), || async {
        let (_, readyz) = agent.get("/readyz").await?;
        let stderr = agent.stderr();
        // Trust authentication (this suite's server) refuses the unknown role;
        // password authentication refuses its password.
        let pg_said = [
            format!("access denied: error returned from database: role \"{pg_user}\""),
            format!(
                "access denied: error returned from database: password authentication failed \
                 for user \"{pg_user}\""
            ),
        ];
        let my_said = "access denied: error returned from database: 1045 (28000): Access denied \
                       for user 'root'";
        if [&readyz, &stderr]
            .iter()
            .all(|t| pg_said.iter().any(|p| t.contains(p)) && t.contains(my_said))
        {
            Ok((readyz, stderr))
        } else {
            Err(format!(
                "not yet both access denied in /readyz and the log:\n{readyz}\n--- stderr ---\n{stderr}"
            ))
        }
    })
    .await;
    let (readyz, stderr) = said.unwrap_or_else(|e| panic!("{e}"));
    agent.terminate(Duration::from_secs(20));
    for (what, text) in [("/readyz", &readyz), ("stderr", &stderr)] {
        assert!(
            !text.contains("cannot reach the database"),
            "{what} says a refused login is a database out of reach:\n{text}"
        );
        assert_nothing_leaks(what, text);
    }
    pg.cleanup().await;
    my.cleanup().await;
}
