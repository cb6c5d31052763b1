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
//! The same session marks the agent present in the database, so that the
//! sources of one database spread over the agents watching it
//! ([`crate::coordination::Share`]): it holds one of [`PRESENCE_SLOTS`] locks
//! of a key space of its own, named after the database's configured sources
//! (agents of another configuration are not counted), and reads which present
//! agent holds which source lock:
//! * PostgreSQL: `pg_try_advisory_lock(<group>, slot)` (the two-key form:
//!   `objsubid` 2 in `pg_locks`, where the sources' one-key locks show 1),
//!   read from `pg_locks`, which any role can read;
//! * MySQL/MariaDB: `GET_LOCK('inboxwatch.<group>.agent.<slot>')` (the
//!   sources' locks are `inboxwatch:<hex>:<database>` — the key, then 16 hex digits of
//!   the database name's SHA-1, as lock names are server-wide), read with `IS_USED_LOCK`.
//!
//! SQLite files are local to one agent: it owns them without a lock.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection};
use tracing::warn;

use super::config::TableSpec;
use crate::coordination::{Lock, Share};
use crate::dsn::{Dialect, Dsn};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the map itself stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SourceLock {
    /// A driver error as the agent says it: a login the database refused
    /// (SQLSTATE class 28: a wrong password, an unknown user) says "access
    /// denied" with the driver's text, which names the user, rather than
    /// passing for a database out of reach.
    fn lock_error(&self, e: &sqlx::Error) -> String {
        let text = self.spec.dsn.scrub(&e.to_string());
        match e {
            sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("28")) => {
                format!("access denied: {text}")
            }
            _ => text,
        }
    }
}

impl Lock for SourceLock {
    fn source(&self) -> &str {
        &self.spec.name
    }

    async fn try_acquire(&mut self) -> Result<bool, String> {
        self.try_acquire_db().await.map_err(|e| self.lock_error(&e))
    }

    async fn renew(&mut self) -> Result<bool, String> {
        self.renew_db()
            .await
            .map(|()| true)
            .map_err(|e| self.lock_error(&e))
    }

    async fn release(&mut self) {
        self.release_db().await
    }

    async fn abandon(&mut self) {
        // The shared session may be mid-statement: nobody can use it now.
        self.held_on = None;
        self.session.state.lock().await.drop_session();
    }

    async fn share(&mut self) -> Option<Share> {
        self.session.share().await
    }

    fn claim_give_up(&mut self, every: Duration) -> bool {
        let mut last = lock(&self.session.last_give_up);
        if last.is_some_and(|at| at.elapsed() < every) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// Places an agent can take to be counted present on a database: the agents
/// beyond them are not counted (they keep what they own and take free
/// sources only after a head start).
pub const PRESENCE_SLOTS: u32 = 64;
/// How long a reading of the agents present is reused.
const PRESENCE_FRESH: Duration = Duration::from_secs(2);

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
    /// The lock keys of the sources configured on the database.
    keys: Mutex<Vec<i64>>,
    /// When a source of the database was last given up to spread.
    last_give_up: Mutex<Option<Instant>>,
}

#[derive(Default)]
struct SessionState {
    conn: Option<AnyConnection>,
    /// Bumped on every new session: a lock taken on an older one is gone.
    generation: u64,
    /// The keys of the sources' locks held on this session.
    held: HashSet<i64>,
    /// The presence key space: the configured sources, hashed.
    group: i32,
    /// This agent's presence slot on the session, if it got one.
    slot: Option<u32>,
    /// MySQL/MariaDB: the names of the presence locks, before the slot.
    presence_prefix: String,
    /// The last reading of the agents present (by slot: the configured
    /// sources each one owns), and when.
    presence: Option<(Instant, Vec<(u32, usize)>)>,
    /// A reading of the agents present was under way and given up (its
    /// caller timed out): what the session answers next is not known.
    reading: bool,
}

impl SessionState {
    fn drop_session(&mut self) {
        // Dropping the connection closes the socket: the server ends the
        // session and every lock on it.
        self.conn = None;
        self.generation += 1;
        self.held.clear();
        self.slot = None;
        self.presence = None;
        self.reading = false;
    }

    /// The session, unless a statement on it was given up halfway.
    fn usable(&mut self) -> &mut Self {
        if self.reading {
            self.drop_session();
        }
        self
    }
}

impl LockSession {
    /// Where this agent stands among the agents present on the database;
    /// `None` before the session is open or when it fails.
    async fn share(&self) -> Option<Share> {
        let keys = lock(&self.keys).clone();
        let mut state = self.state.lock().await;
        let state = state.usable();
        let present = match &state.presence {
            Some((at, present)) if at.elapsed() < PRESENCE_FRESH => present.clone(),
            _ => {
                let dialect = self.dsn.dialect();
                let (group, prefix) = (state.group, state.presence_prefix.clone());
                let conn = state.conn.as_mut()?;
                state.reading = true;
                let read = presence(conn, dialect, group, &prefix, &keys).await;
                state.reading = false;
                match read {
                    Ok(present) => {
                        state.presence = Some((Instant::now(), present.clone()));
                        present
                    }
                    Err(_) => {
                        // Renewing the locks on the session reports the failure.
                        state.drop_session();
                        return None;
                    }
                }
            }
        };
        let mine = state.held.len();
        let mut by_slot: std::collections::BTreeMap<u32, usize> = present.into_iter().collect();
        if let Some(slot) = state.slot {
            by_slot.insert(slot, mine);
        }
        Some(Share {
            configured: keys.len(),
            me: state
                .slot
                .and_then(|slot| by_slot.keys().position(|&s| s == slot)),
            owned_by: by_slot.into_values().collect(),
            mine,
        })
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
                    keys: Mutex::default(),
                    last_give_up: Mutex::new(None),
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
            Dialect::Postgres | Dialect::MySql => {
                let session = sessions.session(spec);
                let key = lock_key(spec);
                lock(&session.keys).push(key);
                Some(SourceLock {
                    spec: spec.clone(),
                    key,
                    session,
                    held_on: None,
                })
            }
            Dialect::Sqlite => None,
        }
    }

    /// Tries once to take the lock; true when this agent now owns the source.
    async fn try_acquire_db(&mut self) -> Result<bool, sqlx::Error> {
        let mut state = self.session.state.lock().await;
        let state = state.usable();
        if state.conn.is_none() {
            let mut conn = connect(self.session.dsn.clone(), self.session.lease).await?;
            let group = presence_group(&lock(&self.session.keys));
            let (slot, prefix) = take_presence(&mut conn, self.spec.dsn.dialect(), group).await?;
            if slot.is_none() {
                warn!(
                    dsn = %self.spec.dsn,
                    slots = PRESENCE_SLOTS,
                    "Every presence slot of the database is taken: this agent is not counted when the sources spread, it keeps what it owns and takes a free source only when nobody else does."
                );
            }
            state.conn = Some(conn);
            state.generation += 1;
            state.group = group;
            state.slot = slot;
            state.presence_prefix = prefix;
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
                "SELECT CAST(GET_LOCK({}, 0) AS SIGNED)",
                mysql_lock(key)
            )))
            .fetch_one(&mut *conn)
            .await
            .map(|got| got == Some(1)),
        };
        match got {
            Ok(got) => {
                self.held_on = got.then_some(generation);
                if got {
                    state.held.insert(key);
                }
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
        let state = state.usable();
        if self.held_on != Some(state.generation) || state.conn.is_none() {
            self.held_on = None;
            return Err(sqlx::Error::Protocol(
                "the session that held the lock ended".into(),
            ));
        }
        let conn = state.conn.as_mut().expect("checked above");
        let held: Result<Option<i64>, sqlx::Error> = match dialect {
            // Inside the session's transaction: resets the idle timeout; the
            // lock lives as long as the session.
            Dialect::Postgres => {
                sqlx::query_scalar("SELECT CAST(1 AS BIGINT)")
                    .fetch_one(&mut *conn)
                    .await
            }
            _ => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT CAST(IS_USED_LOCK({}) = CONNECTION_ID() AS SIGNED)",
                    mysql_lock(key)
                )))
                .fetch_one(&mut *conn)
                .await
            }
        };
        match held {
            Ok(Some(1)) => Ok(()),
            Ok(_) => {
                self.held_on = None;
                state.held.remove(&key);
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
        let state = state.usable();
        if state.generation != generation {
            return;
        }
        state.held.remove(&key);
        let Some(conn) = state.conn.as_mut() else {
            return;
        };
        let sql = match self.spec.dsn.dialect() {
            Dialect::Postgres => format!("SELECT pg_advisory_unlock({key})"),
            _ => format!("SELECT RELEASE_LOCK({})", mysql_lock(key)),
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

/// The name of a source's lock on MySQL/MariaDB, as an SQL expression: the
/// key and the database. `GET_LOCK` names are server-wide, so without the
/// database two sources of the same name and table in two databases of one
/// server (two demos, two environments) contended for one lock, and one of
/// them stood by. 44 characters, within MySQL's 64.
fn mysql_lock(key: i64) -> String {
    format!("CONCAT('inboxwatch:{key:x}:', LEFT(SHA1(IFNULL(DATABASE(), '')), 16))")
}

/// Agents with the same source configuration contend for the same key.
fn lock_key(spec: &TableSpec) -> i64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6c65_6164_6572);
    ("inboxwatch-source", &spec.name, &spec.table).hash(&mut h);
    h.finish() as i64
}

/// Marks this agent present on a new session: takes the first free presence
/// slot of `group`. Returns the slot (`None`: every one is taken) and, for
/// MySQL/MariaDB, the presence locks' name prefix (they are server-wide: the
/// database's name is part of it).
async fn take_presence(
    conn: &mut AnyConnection,
    dialect: Dialect,
    group: i32,
) -> Result<(Option<u32>, String), sqlx::Error> {
    let prefix = match dialect {
        Dialect::Postgres => String::new(),
        _ => {
            let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
                .fetch_one(&mut *conn)
                .await?;
            presence_prefix(database.as_deref().unwrap_or(""), group)
        }
    };
    for slot in 0..PRESENCE_SLOTS {
        let got = match dialect {
            Dialect::Postgres => {
                sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
                    "SELECT pg_try_advisory_lock({group}, {slot})"
                )))
                .fetch_one(&mut *conn)
                .await?
            }
            _ => {
                sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(format!(
                    "SELECT CAST(GET_LOCK('{prefix}{slot}', 0) AS SIGNED)"
                )))
                .fetch_one(&mut *conn)
                .await?
                    == Some(1)
            }
        };
        if got {
            return Ok((Some(slot), prefix));
        }
    }
    Ok((None, prefix))
}

/// The agents present on the database, by slot, and how many of the sources
/// `keys` each one holds the lock of.
async fn presence(
    conn: &mut AnyConnection,
    dialect: Dialect,
    group: i32,
    prefix: &str,
    keys: &[i64],
) -> Result<Vec<(u32, usize)>, sqlx::Error> {
    let keys_sql = if keys.is_empty() {
        "NULL".to_string()
    } else {
        keys.iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match dialect {
        Dialect::Postgres => {
            let sql = format!(
                "WITH l AS MATERIALIZED (SELECT pid, classid, objid, objsubid FROM pg_locks \
                   WHERE locktype = 'advisory' AND granted \
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) \
                 SELECT CAST(CAST(p.objid AS TEXT) AS BIGINT), \
                   (SELECT count(*) FROM l s WHERE s.pid = p.pid AND s.objsubid = 1 \
                     AND ((CAST(CAST(s.classid AS TEXT) AS BIGINT) << 32) \
                       | CAST(CAST(s.objid AS TEXT) AS BIGINT)) IN ({keys_sql})) \
                 FROM l p WHERE p.objsubid = 2 AND p.classid = CAST({group} AS oid) \
                   AND CAST(CAST(p.objid AS TEXT) AS BIGINT) < {PRESENCE_SLOTS}"
            );
            let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows
                .into_iter()
                .map(|(slot, held)| (slot as u32, held as usize))
                .collect())
        }
        _ => {
            // One row: the session holding each slot, then each source's lock.
            let slots = (0..PRESENCE_SLOTS).map(|slot| format!("'{prefix}{slot}'"));
            let sources = keys.iter().map(|key| mysql_lock(*key));
            let used: Vec<String> = slots
                .chain(sources)
                .map(|name| format!("IFNULL(IS_USED_LOCK({name}), 0)"))
                .collect();
            let sql = format!("SELECT CAST(CONCAT_WS(',', {}) AS CHAR)", used.join(", "));
            let row: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut *conn)
                .await?;
            let ids: Vec<u64> = row
                .unwrap_or_default()
                .split(',')
                .map(|id| id.trim().parse().unwrap_or(0))
                .collect();
            let (slots, sources) = ids.split_at((PRESENCE_SLOTS as usize).min(ids.len()));
            Ok(slots
                .iter()
                .enumerate()
                .filter(|(_, id)| **id != 0)
                .map(|(slot, id)| (slot as u32, sources.iter().filter(|s| *s == id).count()))
                .collect())
        }
    }
}

/// The presence key space of the agents with these sources configured on a
/// database: a positive 32-bit hash of their lock keys (PostgreSQL takes it
/// as the first key of a two-key advisory lock).
fn presence_group(keys: &[i64]) -> i32 {
    use std::hash::{Hash, Hasher};
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6167_656e_7473);
    ("inboxwatch-presence", keys).hash(&mut h);
    (h.finish() & 0x7fff_ffff) as i32
}

/// `inboxwatch.<group>.agent.`: the database's name and the group hashed
/// (short, and nothing to quote).
fn presence_prefix(database: &str, group: i32) -> String {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x696e_626f_7877_6174, 0x6167_656e_7473);
    ("inboxwatch-presence", database, group).hash(&mut h);
    format!("inboxwatch.{:08x}.agent.", h.finish() as u32)
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
