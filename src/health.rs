//! What `/readyz` reports of each source, written by the poll loops and the
//! elections, read by the HTTP handlers: up or down with the last error,
//! standing by, and the two notes a loop and its election pass each other
//! (another owner was seen; a source asks to be given up).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::SystemTime;

/// The state of one source as `/readyz` reports it.
#[derive(Debug, Clone, Default)]
pub struct SourceHealth {
    /// A poll has finished, successfully or not.
    pub polled: bool,
    /// The last poll succeeded.
    pub up: bool,
    /// The error of the last failed poll, if the last poll failed.
    pub error: Option<String>,
    /// Another agent owns the source; this one stands by.
    pub standby: bool,
    /// What the source's last successful poll said of its setup.
    pub notes: Vec<String>,
}

/// Health of every source, written by the poll loops, read by HTTP handlers.
#[derive(Debug, Default)]
pub struct Health {
    sources: Mutex<BTreeMap<String, SourceHealth>>,
    /// When the election last saw another agent own each source.
    other_owner: Mutex<BTreeMap<String, SystemTime>>,
    /// Sources whose owner asked to give them up (they cannot be polled here).
    yields: Mutex<BTreeSet<String>>,
}

impl Health {
    /// Registers a source before its first poll.
    pub fn register(&self, name: &str) {
        self.lock()
            .insert(name.to_string(), SourceHealth::default());
    }

    /// Marks a source as down before or between polls (its database cannot be
    /// reached to contest the lock).
    pub fn set_down(&self, name: &str, error: String) {
        self.set(
            name,
            SourceHealth {
                polled: true,
                up: false,
                error: Some(error),
                ..SourceHealth::default()
            },
        );
    }

    /// Marks a source as owned by another agent.
    pub fn set_standby(&self, name: &str) {
        self.set(
            name,
            SourceHealth {
                standby: true,
                ..SourceHealth::default()
            },
        );
    }

    /// Records the state of a source.
    pub fn set(&self, name: &str, state: SourceHealth) {
        self.lock().insert(name.to_string(), state);
    }

    /// Records that another agent was seen to own `name` just now.
    pub fn saw_other_owner(&self, name: &str) {
        relock(&self.other_owner).insert(name.to_string(), SystemTime::now());
    }

    /// When another agent was last seen to own `name`, forgetting it.
    pub fn take_other_owner(&self, name: &str) -> Option<SystemTime> {
        relock(&self.other_owner).remove(name)
    }

    /// Asks the election to give `name` up: it cannot be polled from here.
    pub fn request_yield(&self, name: &str) {
        relock(&self.yields).insert(name.to_string());
    }

    /// Whether giving `name` up was asked for, forgetting the request.
    pub fn take_yield(&self, name: &str) -> bool {
        relock(&self.yields).remove(name)
    }

    /// A copy of every source's state.
    pub fn snapshot(&self) -> BTreeMap<String, SourceHealth> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SourceHealth>> {
        relock(&self.sources)
    }
}

fn relock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the value itself stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
