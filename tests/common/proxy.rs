//! A TCP proxy in front of a database, to take the database away from the agent and
//! give it back: `cut()` closes every open connection and refuses new ones,
//! `blackhole()` keeps every connection open but relays nothing any more (as if the
//! packets were dropped: nothing answers, nothing is refused), `restore()` lets new
//! connections through again, `slow_connects()` holds each new connection back
//! before relaying it (a server slow to answer a login).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct State {
    refusing: AtomicBool,
    /// `true` from `blackhole()` to `restore()`: nothing is relayed.
    dropping: watch::Sender<bool>,
    /// Bumped by every `cut()`; each relayed connection watches it.
    epoch: watch::Sender<u64>,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// How long each new connection waits before it is relayed, in ms.
    connect_delay_ms: AtomicU64,
}

/// A running proxy on 127.0.0.1:`port`.
pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port and relays every connection to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy listener");
        let port = listener.local_addr().expect("proxy local_addr").port();
        let (epoch, _) = watch::channel(0u64);
        let (dropping, _) = watch::channel(false);
        let state = Arc::new(State {
            refusing: AtomicBool::new(false),
            dropping,
            epoch,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            connect_delay_ms: AtomicU64::new(0),
        });
        let upstream = upstream.to_string();
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                // Subscribe before looking at `refusing`, so a cut racing with this
                // accept is either seen here or delivered to the relay below.
                let mut cut = st.epoch.subscribe();
                if st.refusing.load(Ordering::SeqCst) {
                    st.refused.fetch_add(1, Ordering::Relaxed);
                    drop(inbound);
                    continue;
                }
                st.accepted.fetch_add(1, Ordering::Relaxed);
                let upstream = upstream.clone();
                let mut dropping = st.dropping.subscribe();
                let delay = Duration::from_millis(st.connect_delay_ms.load(Ordering::SeqCst));
                tokio::spawn(async move {
                    // Held back, as a loaded server is slow to answer a login;
                    // the client's greeting waits in the socket meanwhile.
                    tokio::time::sleep(delay).await;
                    // Blackholed: held open, never relayed, until a cut.
                    if *dropping.borrow_and_update() {
                        let _ = cut.changed().await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let held = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        _ = cut.changed() => false,
                        _ = dropping.wait_for(|d| *d) => true,
                    };
                    if held {
                        let _ = cut.changed().await;
                    }
                    // Both sockets are dropped here, closing the connection.
                });
            }
        });
        Proxy { port, state, task }
    }

    /// Closes every open connection and refuses new ones until `restore()`.
    pub fn cut(&self) {
        self.state.refusing.store(true, Ordering::SeqCst);
        self.state.epoch.send_modify(|e| *e += 1);
    }

    /// Lets new connections through again (connections held by `blackhole()` stay
    /// silent until the next `cut()`).
    pub fn restore(&self) {
        self.state.refusing.store(false, Ordering::SeqCst);
        self.state.dropping.send_replace(false);
    }

    /// Relays nothing from now on, on open and new connections alike, and closes
    /// nothing: every read on the other side waits (its own timeouts decide).
    pub fn blackhole(&self) {
        self.state.dropping.send_replace(true);
    }

    /// Holds every new connection back `delay` before relaying it (open ones
    /// are not slowed).
    pub fn slow_connects(&self, delay: Duration) {
        self.state
            .connect_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// (connections relayed, connections refused) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.state.accepted.load(Ordering::Relaxed),
            self.state.refused.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
