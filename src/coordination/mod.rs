//! Who owns which source. When several agents watch the same source (a
//! DaemonSet), exactly one polls and exports it; the others stand by with
//! `inboxwatch_source_leader{source} 0` and take over when the owner goes.
//!
//! What decides is a [`Lock`] each kind provides (a lock of the watched
//! database for tables, `sources/table/lock.rs`; membership of a group of
//! the agents' own for Kafka, `sources/kafka/election.rs`); [`elect`] runs
//! any of them the same way.
//!
//! An owner whose polls cannot reach the source gives it up
//! ([`crate::health::Health::request_yield`]), so that an agent that can
//! poll it takes over.
//!
//! The owner renews every [`HEARTBEAT`]; a renewal that fails stops the export
//! at once, well before the lock's lease ([`LEASE`] for the database locks)
//! lets another agent in, so rates are never doubled.
//!
//! A lock that knows the agents present and the sources they share (the
//! database locks: [`Lock::share`]) spreads the sources ([`Share`]): an owner
//! above its share gives one up per heartbeat, and an agent that owns more
//! than another lets that one contest a free source first.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::health::Health;
use crate::telemetry::catalogue as metric;

/// How often the owner renews its lock and a standby agent tries to take it.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a database keeps the lock of an owner that stopped answering.
pub const LEASE: Duration = Duration::from_secs(20);
/// Heartbeats an agent waits before it contests a source it gave up.
const YIELD_PAUSE: u32 = 3;
/// Head start an agent gives the others per source it already owns, where
/// the lock cannot tell the agents' shares ([`Lock::share`] is `None`).
const SPREAD: Duration = Duration::from_secs(1);
/// Head start, in heartbeats, an agent gives the agents that own fewer sources
/// than it before it contests a free source: longer than one contest period
/// (a heartbeat and its 20 % jitter), so each of them tries once first.
const HEAD_START: f64 = 1.5;
/// Longest wait for one lock statement.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(3);

/// The sources this agent exports; read by `/metrics` to hide the others.
#[derive(Debug, Default)]
pub struct Leadership {
    led: Mutex<HashSet<String>>,
    contending: Mutex<HashSet<String>>,
    all: Mutex<HashSet<String>>,
    /// Held (shared) while `/metrics` renders, and (exclusive) while a source
    /// changes hands: see [`Leadership::rendering`].
    gate: RwLock<()>,
}

impl Leadership {
    /// Registers a source as standing by.
    pub fn register(&self, source: &str) {
        let _changing = self.gate.write().unwrap_or_else(|e| e.into_inner());
        lock(&self.all).insert(source.to_string());
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(0.0);
    }

    /// Records whether this agent owns `source` (`false`: another agent does).
    pub fn set(&self, source: &str, leader: bool) {
        let _changing = self.gate.write().unwrap_or_else(|e| e.into_inner());
        if leader {
            lock(&self.led).insert(source.to_string());
            lock(&self.contending).remove(source);
        } else {
            lock(&self.led).remove(source);
            lock(&self.contending).remove(source);
        }
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(if leader {
            1.0
        } else {
            0.0
        });
    }

    /// Records that nobody can be seen to own `source`: its database cannot be
    /// reached. Its `inboxwatch_source_up 0` stays visible.
    pub fn set_contending(&self, source: &str) {
        let _changing = self.gate.write().unwrap_or_else(|e| e.into_inner());
        lock(&self.led).remove(source);
        lock(&self.contending).insert(source.to_string());
        metrics::gauge!(metric::SOURCE_LEADER, "source" => source.to_string()).set(0.0);
    }

    /// Runs `render` with the sources this agent stands by for and those out
    /// of its reach, while none changes hands: the leader gauges it renders
    /// agree with them. (Read apart, a handover between the two reads showed
    /// a source with its gauge at 0 and every series of it.)
    pub fn rendering<T>(&self, render: impl FnOnce() -> T) -> (T, Vec<String>, Vec<String>) {
        let _rendering = self.gate.read().unwrap_or_else(|e| e.into_inner());
        (render(), self.standing_by(), self.contending())
    }

    /// How many sources this agent owns.
    pub fn led_count(&self) -> usize {
        lock(&self.led).len()
    }

    /// The sources nobody can be seen to own from here (their database does not
    /// answer this agent): reported down, their other series stale.
    pub fn contending(&self) -> Vec<String> {
        lock(&self.contending).iter().cloned().collect()
    }

    /// The registered sources another agent owns (or may own: not yet contested).
    pub fn standing_by(&self) -> Vec<String> {
        let led = lock(&self.led).clone();
        let contending = lock(&self.contending).clone();
        lock(&self.all)
            .iter()
            .filter(|s| !led.contains(*s) && !contending.contains(*s))
            .cloned()
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the set itself stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes from a Prometheus text rendering every sample of the sources this
/// agent stands by for, except `inboxwatch_source_leader`, the counting-gap
/// counters (this agent's own record of its takeovers, born at 0 before the
/// first one so that `increase()` sees it) and `inboxwatch_source_info` (the
/// configuration it runs, which the alert rules join `owner` from). The
/// sources it cannot reach to contend for (`contending`) are hidden the same
/// way but keep `inboxwatch_source_up` (0: it says they are down from here):
/// what this agent counted while it owned one is stale once it lost the lock,
/// and another agent may count it now.
pub fn hide_standby(rendered: String, standing_by: &[String], contending: &[String]) -> String {
    if standing_by.is_empty() && contending.is_empty() {
        return rendered;
    }
    let needles = |sources: &[String]| -> Vec<(String, String)> {
        sources
            .iter()
            .map(|s| {
                let v = s
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                (format!("{{source=\"{v}\""), format!(",source=\"{v}\""))
            })
            .collect()
    };
    let (standing_by, contending) = (needles(standing_by), needles(contending));
    let of = |line: &str, needles: &[(String, String)]| {
        needles
            .iter()
            .any(|(a, b)| line.contains(a.as_str()) || line.contains(b.as_str()))
    };
    let mut out = String::with_capacity(rendered.len());
    for line in rendered.lines() {
        let kept_anyway = line.starts_with('#')
            || line.starts_with(metric::SOURCE_LEADER)
            || line.starts_with(metric::SOURCE_INFO)
            || line.starts_with(metric::COUNTING_GAPS)
            || line.starts_with(metric::COUNTING_GAP_SECONDS);
        let is_up = line
            .strip_prefix(metric::SOURCE_UP)
            .is_some_and(|rest| rest.starts_with([' ', '{']));
        let hidden = !kept_anyway && (of(line, &standing_by) || (!is_up && of(line, &contending)));
        if !hidden {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Where an agent stands among the agents that share a group of sources (the
/// sources of one database, with the same configuration: every agent has the
/// same `configured` sources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Sources configured in the group.
    pub configured: usize,
    /// How many of them each present agent owns, in the order of their places
    /// (this agent's own count included at `me`).
    pub owned_by: Vec<usize>,
    /// This agent's index in `owned_by`; `None` when it could not mark itself
    /// present (every place taken): it is not counted.
    pub me: Option<usize>,
    /// How many of them this agent owns.
    pub mine: usize,
}

impl Share {
    /// Agents present (at least this one).
    pub fn present(&self) -> usize {
        self.owned_by.len().max(1)
    }

    /// The fewest and the most sources one agent should own: `configured /
    /// present` rounded down and up.
    pub fn bounds(&self) -> (usize, usize) {
        let n = self.present();
        (self.configured / n, self.configured.div_ceil(n))
    }

    /// Whether an owner should give one of its sources up: it owns more than
    /// the most one agent should; or every source is owned, yet this agent owns
    /// two more than another, so that the spread cannot settle by itself (7
    /// sources owned 3, 3, 1 by three agents), and it is the last by place of
    /// the agents that own the most. An agent that is not counted keeps what
    /// it owns.
    pub fn over(&self) -> bool {
        let Some(me) = self.me else { return false };
        if self.mine > self.bounds().1 {
            return true;
        }
        let owned: Vec<usize> = self.counts();
        let (least, most) = (
            owned.iter().copied().min().unwrap_or(0),
            owned.iter().copied().max().unwrap_or(0),
        );
        let all_owned = owned.iter().sum::<usize>() >= self.configured;
        let last_of_most = owned.iter().rposition(|&n| n == most) == Some(me);
        all_owned && self.mine == most && most >= least + 2 && last_of_most
    }

    /// Whether an agent should let the others contest a free source first:
    /// another present agent owns fewer sources than this one (or this one is
    /// not counted). It still takes the source when nobody else does.
    pub fn head_start(&self) -> bool {
        self.me.is_none() || self.counts().iter().any(|&n| n < self.mine)
    }

    /// `owned_by` with this agent's own count.
    fn counts(&self) -> Vec<usize> {
        let mut owned = self.owned_by.clone();
        if let Some(mine) = self.me.and_then(|me| owned.get_mut(me)) {
            *mine = self.mine;
        }
        owned
    }
}

/// What decides who owns a source: a lock that can be tried, renewed and
/// given up. Errors are messages fit for logs (no secrets).
pub trait Lock: Send + 'static {
    /// The source it decides.
    fn source(&self) -> &str;
    /// Longest wait for one operation before it counts as failed.
    fn patience(&self) -> Duration {
        STATEMENT_TIMEOUT
    }
    /// How often the owner renews and a standby tries.
    fn heartbeat(&self) -> Duration {
        HEARTBEAT
    }
    /// Tries once to take the lock; true when this agent now owns the source.
    fn try_acquire(&mut self) -> impl Future<Output = Result<bool, String>> + Send;
    /// Renews a held lock: `Ok(false)` when another agent now owns the
    /// source, an error when this one cannot tell (it must stop exporting).
    fn renew(&mut self) -> impl Future<Output = Result<bool, String>> + Send;
    /// Gives the lock up.
    fn release(&mut self) -> impl Future<Output = ()> + Send;
    /// Whether the lock, having just said another agent owns the source
    /// (`renew` gave `Ok(false)`), must be tried again at once: a group whose
    /// members stop exporting and rejoin within a deadline (a Kafka source
    /// split into shards, rebalancing).
    fn rejoin_now(&self) -> bool {
        false
    }
    /// Drops what a failed operation left behind, before trying again.
    fn abandon(&mut self) -> impl Future<Output = ()> + Send {
        self.release()
    }
    /// Where this agent stands in the group of sources this one belongs to;
    /// `None` when the lock cannot tell (each source is then contested on its
    /// own, with a head start of [`SPREAD`] per source owned).
    fn share(&mut self) -> impl Future<Output = Option<Share>> + Send {
        std::future::ready(None)
    }
    /// Asks to give this source up to spread the group: true at most once per
    /// `every` for the whole group, so that an owner gives one source up at a
    /// time and sees the others take it before it gives up another.
    fn claim_give_up(&mut self, every: Duration) -> bool {
        let _ = every;
        false
    }
}

/// Keeps `lock` for `source`: takes it when free, renews it while held, and
/// reports ownership on `leader` until `cancel`, then releases it.
pub async fn elect<L: Lock>(
    mut lock: L,
    leadership: std::sync::Arc<Leadership>,
    health: std::sync::Arc<Health>,
    leader: watch::Sender<Option<bool>>,
    cancel: CancellationToken,
) {
    let source = lock.source().to_string();
    let patience = lock.patience();
    let heartbeat = lock.heartbeat();
    // A database this agent cannot reach is reported down here: nobody may
    // own the source then, and someone has to say so.
    let unreachable = |error: String| {
        leadership.set_contending(&source);
        metrics::gauge!(metric::SOURCE_UP, "source" => source.clone()).set(0.0);
        health.set_down(&source, error);
    };
    let mut held = false;
    // A random start spreads the first attempts.
    let mut delay = heartbeat.mul_f64(fastrand::f64() * 0.2);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        if held && health.take_yield(&source) {
            // The source cannot be polled from here (its polls cannot connect
            // or time out): holding it would keep an agent that can from
            // taking over. It is tried again after the others had a chance.
            held = false;
            let _ = leader.send(None);
            leadership.set_contending(&source);
            warn!(source = %source, "Cannot poll the source from here; gave its lock up so that another agent can take it.");
            lock.release().await;
            delay = heartbeat * YIELD_PAUSE;
            continue;
        }
        if held {
            match tokio::time::timeout(patience, lock.renew()).await {
                Ok(Ok(true)) => {
                    let share = tokio::time::timeout(patience, lock.share()).await;
                    if let Ok(Some(share)) = share
                        && share.over()
                        && lock.claim_give_up(heartbeat)
                    {
                        let (least, most) = share.bounds();
                        // More than this agent's share: another agent takes
                        // it (the counting gap of a handover, as always). It
                        // is contested again after the others had a chance.
                        held = false;
                        health.saw_other_owner(&source);
                        leadership.set(&source, false);
                        let _ = leader.send(Some(false));
                        lock.release().await;
                        info!(
                            source = %source,
                            share = %if least == most { format!("{most}") } else { format!("{least} or {most}") },
                            owned = share.mine,
                            agents = share.present(),
                            sources = share.configured,
                            "Gave the source up to spread the sources over the agents."
                        );
                        delay = heartbeat * YIELD_PAUSE;
                        continue;
                    }
                }
                Ok(Ok(false)) => {
                    held = false;
                    health.saw_other_owner(&source);
                    leadership.set(&source, false);
                    let _ = leader.send(Some(false));
                    if lock.rejoin_now() {
                        info!(source = %source, "The source's shards are being given anew (an agent came or went); exporting stopped until this agent has its new ones.");
                        delay = Duration::ZERO;
                        continue;
                    }
                    info!(source = %source, "Another agent owns the source now; standing by.");
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(e)) => e,
                        _ => format!("no answer within {patience:?}"),
                    };
                    held = false;
                    let _ = leader.send(None);
                    warn!(source = %source, error = %error, "Lost the source's lock; exporting stopped.");
                    unreachable(format!("lost the source's lock: {error}"));
                    lock.abandon().await;
                }
            }
            delay = heartbeat;
        } else {
            // An agent gives the agents that own fewer sources a head start
            // (without shares, one that owns sources waits a little per
            // source), then contests the source: a source nobody else takes
            // is still owned.
            let wait = match tokio::time::timeout(patience, lock.share()).await {
                _ if lock.rejoin_now() => Duration::ZERO,
                Ok(Some(share)) if share.head_start() => heartbeat.mul_f64(HEAD_START),
                Ok(Some(_)) => Duration::ZERO,
                _ => SPREAD * leadership.led_count() as u32,
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            match tokio::time::timeout(patience, lock.try_acquire()).await {
                Ok(Ok(true)) => {
                    held = true;
                    // A request to give the source up made before this term is stale.
                    health.take_yield(&source);
                    // Down until a poll of this term succeeds: an earlier term's
                    // last poll says nothing of this one (the first term starts
                    // at 0 too).
                    metrics::gauge!(metric::SOURCE_UP, "source" => source.clone()).set(0.0);
                    leadership.set(&source, true);
                    let _ = leader.send(Some(true));
                    info!(source = %source, "Took the source's lock; exporting it.");
                }
                Ok(Ok(false)) => {
                    health.saw_other_owner(&source);
                    leadership.set(&source, false);
                    leader.send_if_modified(|v| v.replace(false) != Some(false));
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(e)) => e,
                        _ => format!("no answer within {patience:?}"),
                    };
                    warn!(source = %source, error = %error, "Could not contest the source's lock.");
                    leader.send_if_modified(|v| v.take().is_some());
                    // The lock's error says why (out of reach, access denied):
                    // the kind's own words, not guessed here.
                    unreachable(format!("cannot contest the source's lock: {error}"));
                    lock.abandon().await;
                }
            }
            delay = heartbeat.mul_f64(1.0 + 0.2 * fastrand::f64());
        }
    }
    if held {
        let _ = leader.send(Some(false));
        leadership.set(&source, false);
        info!(source = %source, "Released the source's lock.");
    }
    lock.release().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share of the agent at `me` among agents owning `owned_by`.
    fn share(configured: usize, owned_by: &[usize], me: Option<usize>) -> Share {
        Share {
            configured,
            owned_by: owned_by.to_vec(),
            me,
            mine: me.map_or(0, |m| owned_by[m]),
        }
    }

    #[test]
    fn the_bounds_are_the_floor_and_the_ceiling() {
        assert_eq!(share(6, &[6], Some(0)).bounds(), (6, 6));
        assert_eq!(share(6, &[6, 0, 0], Some(0)).bounds(), (2, 2));
        assert_eq!(share(7, &[3, 3, 1], Some(0)).bounds(), (2, 3));
        assert_eq!(share(1, &[1, 0, 0], Some(0)).bounds(), (0, 1));
        // Nobody counted yet (not even this agent): as if alone.
        assert_eq!(share(4, &[], None).bounds(), (4, 4));
    }

    #[test]
    fn an_owner_above_the_ceiling_gives_up_whatever_the_others_own() {
        // Alone with 6: keeps all 6.
        assert!(!share(6, &[6], Some(0)).over());
        // Two more agents arrive: 6 > 2, gives up until it owns 2.
        assert!(share(6, &[6, 0, 0], Some(0)).over());
        assert!(share(6, &[3, 2, 1], Some(0)).over());
        assert!(!share(6, &[2, 2, 2], Some(0)).over());
        // Sources still free: above the ceiling is enough.
        assert!(share(6, &[4, 0, 0], Some(0)).over());
        // Not counted (every place taken): keeps what it owns.
        assert!(!share(6, &[2, 2, 2], None).over());
    }

    #[test]
    fn a_spread_that_cannot_settle_by_itself_moves_one_source_from_the_last_of_the_most() {
        // 7 over 3 after a late arrival: 3, 3, 1. The ceiling is 3, but the
        // third agent would stay at 1: the second (last of those owning 3)
        // gives one up; the first keeps.
        assert!(!share(7, &[3, 3, 1], Some(0)).over());
        assert!(share(7, &[3, 3, 1], Some(1)).over());
        assert!(!share(7, &[3, 3, 1], Some(2)).over());
        // Settled (floor or ceiling everywhere): nothing moves.
        for me in 0..3 {
            assert!(!share(7, &[3, 2, 2], Some(me)).over());
            assert!(!share(7, &[2, 2, 3], Some(me)).over());
        }
        // One source for three agents: whoever owns it keeps it.
        for owner in 0..3 {
            let mut owned = [0, 0, 0];
            owned[owner] = 1;
            for me in 0..3 {
                assert!(!share(1, &owned, Some(me)).over());
            }
        }
        // A source is free: it goes to the agent owning the fewest, no move.
        assert!(!share(7, &[3, 2, 1], Some(0)).over());
        assert!(!share(7, &[3, 3, 0], Some(1)).over());
    }

    #[test]
    fn an_agent_owning_the_fewest_contests_at_once_the_others_wait() {
        assert!(!share(6, &[6, 0, 0], Some(1)).head_start());
        assert!(!share(6, &[6, 0, 0], Some(2)).head_start());
        assert!(share(6, &[5, 1, 0], Some(1)).head_start());
        assert!(!share(6, &[5, 1, 0], Some(2)).head_start());
        assert!(share(6, &[5, 1, 0], Some(0)).head_start());
        // Everybody owns as many: nobody waits.
        assert!(!share(6, &[2, 2, 1], Some(2)).head_start());
        assert!(!share(4, &[1, 1], Some(0)).head_start());
        // Not counted: always waits.
        assert!(share(6, &[2, 2, 2], None).head_start());
    }

    /// Plays the rules round by round on counts alone (each round: every agent
    /// above gives one up, then each free source goes to an agent that owns
    /// the fewest): from any start, the spread ends with the floor or the
    /// ceiling everywhere and then nothing moves.
    #[test]
    fn the_rules_settle_at_the_floor_or_the_ceiling_and_stay() {
        for configured in 0..10usize {
            for present in 1..5usize {
                for first in 0..=configured {
                    // `first` on the first agent, the rest on the second (or free).
                    let mut owned = vec![0; present];
                    owned[0] = first;
                    if present > 1 {
                        owned[1] = configured - first;
                    }
                    let mut moves = 0;
                    for _ in 0..(4 * configured + 4) {
                        let givers: Vec<usize> = (0..present)
                            .filter(|&me| share(configured, &owned, Some(me)).over())
                            .collect();
                        if let Some(&g) = givers.first() {
                            owned[g] -= 1;
                            moves += 1;
                        }
                        while owned.iter().sum::<usize>() < configured {
                            let taker = (0..present)
                                .find(|&me| !share(configured, &owned, Some(me)).head_start())
                                .expect("somebody contests at once");
                            owned[taker] += 1;
                        }
                    }
                    let (floor, ceil) = (configured / present, configured.div_ceil(present));
                    assert!(
                        owned.iter().all(|&n| n == floor || n == ceil),
                        "{configured} sources over {present} agents from {first}: {owned:?}"
                    );
                    assert!(
                        (0..present).all(|me| !share(configured, &owned, Some(me)).over()),
                        "{owned:?} still moves"
                    );
                    assert!(
                        moves <= configured,
                        "{moves} moves for {configured} sources"
                    );
                }
            }
        }
    }

    /// A lock that is always free to take and always renewed, with a fixed
    /// share; it records when it was tried and released.
    struct FakeLock {
        share: Share,
        heartbeat: Duration,
        log: std::sync::Arc<Mutex<Vec<(std::time::Instant, &'static str)>>>,
    }

    impl Lock for FakeLock {
        fn source(&self) -> &str {
            "fake"
        }
        fn heartbeat(&self) -> Duration {
            self.heartbeat
        }
        async fn try_acquire(&mut self) -> Result<bool, String> {
            lock(&self.log).push((std::time::Instant::now(), "try"));
            Ok(true)
        }
        async fn renew(&mut self) -> Result<bool, String> {
            Ok(true)
        }
        async fn release(&mut self) {
            lock(&self.log).push((std::time::Instant::now(), "release"));
        }
        async fn share(&mut self) -> Option<Share> {
            Some(self.share.clone())
        }
        fn claim_give_up(&mut self, _every: Duration) -> bool {
            true
        }
    }

    /// Runs `elect` on a [`FakeLock`] until `done` holds for its log (10 s at
    /// most); returns the start and the log.
    async fn run_fake(
        share: Share,
        heartbeat: Duration,
        done: impl Fn(&[(std::time::Instant, &'static str)]) -> bool,
    ) -> (std::time::Instant, Vec<(std::time::Instant, &'static str)>) {
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let fake = FakeLock {
            share,
            heartbeat,
            log: log.clone(),
        };
        let (tx, _rx) = watch::channel(None);
        let cancel = CancellationToken::new();
        let start = std::time::Instant::now();
        let task = tokio::spawn(elect(
            fake,
            std::sync::Arc::new(Leadership::default()),
            std::sync::Arc::new(Health::default()),
            tx,
            cancel.clone(),
        ));
        while !done(&lock(&log)) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the election did not get there within 10 s: {:?}",
                lock(&log)
                    .iter()
                    .map(|(t, what)| (*what, *t - start))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
        task.await.expect("the election panicked");
        let log = lock(&log).clone();
        (start, log)
    }

    #[tokio::test]
    async fn an_agent_owning_more_than_another_contests_a_free_source_after_a_head_start() {
        let heartbeat = Duration::from_millis(400);
        // This agent owns 1 of the database's sources, the other agent none.
        let share = share(3, &[1, 0], Some(0));
        let (start, log) = run_fake(share, heartbeat, |log| !log.is_empty()).await;
        let first = log[0].0 - start;
        eprintln!("first contest {first:?} after the start (heartbeat {heartbeat:?})");
        assert!(
            first >= heartbeat.mul_f64(HEAD_START),
            "contested {first:?} after the start, before the head start of {:?}",
            heartbeat.mul_f64(HEAD_START)
        );
    }

    #[tokio::test]
    async fn an_owner_above_its_share_gives_the_source_up_and_waits_before_contesting_again() {
        let heartbeat = Duration::from_millis(200);
        // Owns 2 of 2 sources, another agent none: above the ceiling of 1.
        let share = share(2, &[2, 0], Some(0));
        let (_, log) = run_fake(share, heartbeat, |log| {
            log.iter().filter(|(_, what)| *what == "try").count() >= 2
        })
        .await;
        let what: Vec<&str> = log.iter().map(|(_, what)| *what).collect();
        assert_eq!(&what[..3], ["try", "release", "try"], "{what:?}");
        let pause = log[2].0 - log[1].0;
        eprintln!("contested again {pause:?} after giving it up (heartbeat {heartbeat:?})");
        assert!(
            pause >= heartbeat * YIELD_PAUSE,
            "contested again {pause:?} after giving it up, within {YIELD_PAUSE} heartbeats"
        );
    }

    #[test]
    fn standby_sources_are_hidden_except_their_leader_gauge_gap_counters_and_info() {
        let text = "# HELP a x\n\
                    inbox_backlog_messages{source=\"a\",event_type=\"t\",status=\"pending\"} 1\n\
                    inbox_backlog_messages{source=\"ab\",event_type=\"t\",status=\"pending\"} 2\n\
                    inboxwatch_source_info{kind=\"inbox\",owner=\"team-a\",service=\"a\",source=\"a\"} 1\n\
                    inboxwatch_source_leader{source=\"a\"} 0\n\
                    inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 0\n\
                    inboxwatch_poll_errors_total{kind=\"query\",source=\"a\"} 3\n\
                    inboxwatch_build_info{version=\"1\"} 1\n";
        let out = hide_standby(text.to_string(), &["a".to_string()], &[]);
        assert_eq!(
            out,
            "# HELP a x\n\
             inbox_backlog_messages{source=\"ab\",event_type=\"t\",status=\"pending\"} 2\n\
             inboxwatch_source_info{kind=\"inbox\",owner=\"team-a\",service=\"a\",source=\"a\"} 1\n\
             inboxwatch_source_leader{source=\"a\"} 0\n\
             inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 0\n\
             inboxwatch_build_info{version=\"1\"} 1\n"
        );
    }

    #[test]
    fn sources_out_of_reach_keep_only_up_leader_gap_counters_and_info() {
        let text = "inbox_messages_received_total{event_type=\"t\",source=\"a\"} 7\n\
                    inboxwatch_source_up{source=\"a\"} 0\n\
                    inboxwatch_source_up{source=\"b\"} 1\n\
                    inboxwatch_source_leader{source=\"a\"} 0\n\
                    inboxwatch_source_info{kind=\"inbox\",owner=\"\",service=\"a\",source=\"a\"} 1\n\
                    inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 1\n\
                    inboxwatch_poll_errors_total{kind=\"timeout\",source=\"a\"} 3\n";
        let out = hide_standby(text.to_string(), &[], &["a".to_string()]);
        assert_eq!(
            out,
            "inboxwatch_source_up{source=\"a\"} 0\n\
             inboxwatch_source_up{source=\"b\"} 1\n\
             inboxwatch_source_leader{source=\"a\"} 0\n\
             inboxwatch_source_info{kind=\"inbox\",owner=\"\",service=\"a\",source=\"a\"} 1\n\
             inboxwatch_counting_gaps_total{source=\"a\",reason=\"handover\"} 1\n"
        );
    }
}
