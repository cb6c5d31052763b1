//! The election of a table source: a lock the watched database provides,
//! held on one session per database that all its sources share
//! ([`LockSession`]), so no extra infrastructure or write permission is needed:
//! * PostgreSQL: session-level `pg_try_advisory_lock` on a session that keeps
//!   a transaction open with `idle_in_transaction_session_timeout` (the
//!   lease), so the server drops the locks of an owner that stops answering
//!   (killed, or cut off the network);
//! * MySQL/MariaDB: `GET_LOCK` on a session with a short `wait_timeout`, for
//!   the same reason.
//!
//! SQLite files are local to one agent: it owns them without a lock.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::{AnyConnection, Connection};

use super::config::TableSpec;
use crate::coordination::Lock;
use crate::dsn::{Dialect, Dsn};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the map itself stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lock for SourceLock {
    fn source(&self) -> &str {
        &self.spec.name
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        self.try_acquire_db()
            .await
            .map_err(|e| self.spec.dsn.scrub(&e.to_string()))
    }

    async fn renew(&mut self) -> Result<bool, String> {
        self.renew_db()
            .await
            .map(|()| true)
            .map_err(|e| self.spec.dsn.scrub(&e.to_string()))
    }

    async fn release(&mut self) {
        self.release_db().await
    }

    async fn abandon(&mut self) {
        // The shared session may be mid-statement: nobody can use it now.
        self.held_on = None;
        self.session.state.lock().await.drop_session();
    }
}

/// The one session that holds the locks of every source on a database: an
/// agent watching 50 sources of one database keeps one lock session there,
/// not 50. PostgreSQL keeps a transaction open on it (so that
/// `idle_in_transaction_session_timeout` ends the session of an agent that
/// stops answering) and takes session-level advisory locks, which a source can
/// release alone; MySQL/MariaDB hold several `GET_LOCK`s on one session.
pub struct LockSession {
    dsn: Dsn,
    /// How long the database keeps the locks of an agent that stopped answering.
    lease: Duration,
    state: tokio::sync::Mutex<SessionState>,
}

#[derive(Default)]
struct SessionState {
    conn: Option<AnyConnection>,
    /// Bumped on every new session: a lock taken on an older one is gone.
    generation: u64,
}

impl SessionState {
    fn drop_session(&mut self) {
        // Dropping the connection closes the socket: the server ends the
        // session and every lock on it.
        self.conn = None;
        self.generation += 1;
    }
}

/// The lock sessions of an agent, one per database (DSN).
pub struct LockSessions {
    lease: Duration,
    by_dsn: Mutex<std::collections::HashMap<String, std::sync::Arc<LockSession>>>,
}

impl LockSessions {
    /// Sessions whose locks the database drops `lease` after the agent stops answering.
    pub fn new(lease: Duration) -> LockSessions {
        LockSessions {
            lease,
            by_dsn: Mutex::default(),
        }
    }

    /// The session for the database of `spec`.
    pub fn session(&self, spec: &TableSpec) -> std::sync::Arc<LockSession> {
        lock(&self.by_dsn)
            .entry(spec.dsn.expose().to_string())
            .or_insert_with(|| {
                std::sync::Arc::new(LockSession {
                    dsn: spec.dsn.clone(),
                    lease: self.lease,
                    state: tokio::sync::Mutex::new(SessionState::default()),
                })
            })
            .clone()
    }
}

/// The database lock of one source, on its database's shared [`LockSession`].
pub struct SourceLock {
    spec: TableSpec,
    key: i64,
    session: std::sync::Arc<LockSession>,
    /// The session generation the lock was taken on, while held.
    held_on: Option<u64>,
}

impl SourceLock {
    /// The lock for a source; `None` where the dialect has none to share (SQLite).
    pub fn for_source(spec: &TableSpec, sessions: &LockSessions) -> Option<SourceLock> {
        match spec.dsn.dialect() {
            Dialect::Postgres | Dialect::MySql => Some(SourceLock {
                spec: spec.clone(),
                key: lock_key(spec),
                session: sessions.session(spec),
                held_on: None,
            }),
            Dialect::Sqlite => None,
        }
    }

    /// Tries once to take the lock; true when this agent now owns the source.
    async fn try_acquire_db(&mut self) -> Result<bool, sqlx::Error> {
        let mut state = self.session.state.lock().await;
        if state.conn.is_none() {
            let conn = connect(self.session.dsn.clone(), self.session.lease).await?;
            state.conn = Some(conn);
            state.generation += 1;
        }
        let generation = state.generation;
        let conn = state.conn.as_mut().expect("connected above");
        let key = self.key;
        let got = match self.spec.dsn.dialect() {
            Dialect::Postgres => {
                sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
                    "SELECT pg_try_advisory_lock({key})"
                )))
                .fetch_one(&mut *conn)
                .await
            }
            _ => sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(format!(
                "SELECT CAST(GET_LOCK('inboxwatch:{key:x}', 0) AS SIGNED)"
            )))
            .fetch_one(&mut *conn)
            .await
            .map(|got| got == Some(1)),
        };
        match got {
            Ok(got) => {
                self.held_on = got.then_some(generation);
                Ok(got)
            }
            Err(e) => {
                state.drop_session();
                Err(e)
            }
        }
    }

    /// Renews the lock; an error means it may be lost.
    async fn renew_db(&mut self) -> Result<(), sqlx::Error> {
        let key = self.key;
        let dialect = self.spec.dsn.dialect();
        let mut state = self.session.state.lock().await;
        if self.held_on != Some(state.generation) || state.conn.is_none() {
            self.held_on = None;
            return Err(sqlx::Error::Protocol(
                "the session that held the lock ended".into(),
            ));
        }
        let conn = state.conn.as_mut().expect("checked above");
        let held: Result<Option<i64>, sqlx::Error> =
            match dialect {
                // Inside the session's transaction: resets the idle timeout; the
                // lock lives as long as the session.
                Dialect::Postgres => {
                    sqlx::query_scalar("SELECT CAST(1 AS BIGINT)")
                        .fetch_one(&mut *conn)
                        .await
                }
                _ => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT CAST(IS_USED_LOCK('inboxwatch:{key:x}') = CONNECTION_ID() AS SIGNED)"
                )))
                .fetch_one(&mut *conn)
                .await,
            };
        match held {
            Ok(Some(1)) => Ok(()),
            Ok(_) => {
                self.held_on = None;
                Err(sqlx::Error::Protocol(
                    "the lock is held by another session".into(),
                ))
            }
            Err(e) => {
                self.held_on = None;
                state.drop_session();
                Err(e)
            }
        }
    }

    /// Gives this source's lock up; the session stays for the others.
    async fn release_db(&mut self) {
        let Some(generation) = self.held_on.take() else {
            return;
        };
        let key = self.key;
        let mut state = self.session.state.lock().await;
        if state.generation != generation {
            return;
        }
        let Some(conn) = state.conn.as_mut() else {
            return;
        };
        let sql = match self.spec.dsn.dialect() {
            Dialect::Postgres => format!("SELECT pg_advisory_unlock({key})"),
            _ => format!("SELECT RELEASE_LOCK('inboxwatch:{key:x}')"),
        };
        if sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .is_err()
        {
            state.drop_session();
        }
    }
}

/// Agents with the same source configuration contend for the same key.
fn lock_key(spec: &TableSpec) -> i64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6c65_6164_6572);
    ("inboxwatch-source", &spec.name, &spec.table).hash(&mut h);
    h.finish() as i64
}

/// A session for the locks: it ends, and so releases them, when the agent
/// stops answering for `lease`.
async fn connect(dsn: Dsn, lease: Duration) -> Result<AnyConnection, sqlx::Error> {
    let mut conn = AnyConnection::connect(dsn.expose()).await?;
    let lease = lease.as_secs();
    let setup = match dsn.dialect() {
        Dialect::Postgres => vec![
            "SET application_name = 'inboxwatch-leader'".to_string(),
            format!("SET idle_in_transaction_session_timeout = '{lease}s'"),
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY".to_string(),
            // Kept open for the session's life (READ ONLY, so no xid: it
            // holds back no vacuum); the locks themselves are session-level.
            "BEGIN".to_string(),
        ],
        _ => vec![format!("SET SESSION wait_timeout = {lease}")],
    };
    for stmt in setup {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&mut conn)
            .await?;
    }
    Ok(conn)
}
