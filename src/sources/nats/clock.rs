//! The server's clock, as far as the agent can tell it. A NATS 2.9 server
//! sends no time of its own in any answer a client may ask for (the
//! JetStream API's `ts` fields came with 2.10; `$SYS` needs the system
//! account). What it does keep is the stored time of every message, on its
//! own clock. The election writes its lease into a KV bucket every
//! heartbeat and reads the entry back: its stored time, against the agent's
//! clock halfway between sending the write and its acknowledgement, is the
//! offset of the server's clock, within half that round trip. Lag seconds
//! are `now + offset − stored time`, so both times are the server's.
//!
//! The offset kept is the one of the closest-bracketed write among the
//! recent ones ([`KEEP`]): a slow round trip does not spoil it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How many recent measurements are kept.
const KEEP: usize = 12;

/// One measurement.
#[derive(Debug, Clone, Copy)]
struct Measure {
    /// Server minus agent, in seconds.
    offset: f64,
    /// Half the round trip: the most the offset can be wrong by.
    error: f64,
}

/// The server's clock against the agent's, shared by the election (which
/// measures it) and the poll (which reads it).
#[derive(Debug, Clone, Default)]
pub struct ServerClock {
    measures: Arc<Mutex<VecDeque<Measure>>>,
}

impl ServerClock {
    /// Records that a write sent at `sent` and acknowledged at `acked`
    /// (agent's clock) was stored at `stored` (server's clock).
    pub fn record(&self, sent: SystemTime, acked: SystemTime, stored: SystemTime) {
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64()
        };
        let (s, a) = (secs(sent), secs(acked));
        let m = Measure {
            offset: secs(stored) - (s + a) / 2.0,
            error: ((a - s) / 2.0).max(0.0),
        };
        let mut q = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(m);
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// The server's offset (seconds, server minus agent) and its error
    /// bound; `None` before the first measurement.
    pub fn offset(&self) -> Option<(f64, f64)> {
        let q = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        q.iter()
            .min_by(|a, b| a.error.total_cmp(&b.error))
            .map(|m| (m.offset, m.error))
    }

    /// Now on the server's clock; `None` before the first measurement.
    pub fn now(&self) -> Option<SystemTime> {
        let (offset, _) = self.offset()?;
        let now = SystemTime::now();
        Some(if offset >= 0.0 {
            now + Duration::from_secs_f64(offset)
        } else {
            now - Duration::from_secs_f64(-offset)
        })
    }
}

/// Seconds from `then` to `now`, both on the server's clock; 0 when `then`
/// is later (a message stored after the moment the poll took as now).
pub fn age(now: SystemTime, then: SystemTime) -> f64 {
    now.duration_since(then).unwrap_or_default().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_bracket_gives_the_offset() {
        let clock = ServerClock::default();
        assert!(clock.now().is_none());
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let ms = Duration::from_millis;
        // A slow round trip: 400 ms, stored 3 s ahead of its middle.
        clock.record(t, t + ms(400), t + ms(3_200));
        // A quick one: 10 ms, the server 3 s ahead.
        clock.record(t + ms(1_000), t + ms(1_010), t + ms(4_005));
        let (offset, error) = clock.offset().unwrap();
        assert!((offset - 3.0).abs() < 1e-6, "{offset}");
        assert!((error - 0.005).abs() < 1e-6, "{error}");
        assert_eq!(age(t, t + ms(5)), 0.0);
        assert!((age(t + ms(1_500), t) - 1.5).abs() < 1e-9);
    }
}
