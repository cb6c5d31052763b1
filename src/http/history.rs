//! The last hour of every source's trends — the values of its status card's
//! sparklines, whatever the card declares ([`crate::card::Card::trends`]) —
//! for the status page and `/api/v1/status`, and what a card asks of them
//! ([`Past`]: how much a running total grew lately).
//!
//! The history holds one sample per source every [`SAMPLE_EVERY`], at most
//! an hour of them ([`SAMPLES`]), each a few numbers: about 20 KB per source.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::card::{Past, Trend};

/// How often the history takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(30);
/// Samples kept per source: one hour.
pub const SAMPLES: usize = 120;

/// One sample of one source: its trends, in the order of [`Ring::keys`].
#[derive(Debug, Clone)]
struct Point {
    /// Seconds since the epoch.
    at: u64,
    trends: Box<[Trend]>,
}

/// One source's samples, oldest first.
#[derive(Debug, Default)]
struct Ring {
    /// The keys of the source's trends (its card declares the same ones at
    /// every sample).
    keys: Vec<&'static str>,
    points: VecDeque<Point>,
}

impl Ring {
    /// The value of running total `key` at the latest sample taken at or
    /// before `cutoff`; 0 (its value when the agent started) when there is
    /// none or it was absent.
    fn total_at(&self, key: &str, cutoff: u64) -> f64 {
        let Some(i) = self.keys.iter().position(|k| *k == key) else {
            return 0.0;
        };
        let v = self
            .points
            .iter()
            .rev()
            .find(|p| p.at <= cutoff)
            .map_or(0.0, |p| match p.trends[i] {
                Trend::Level(v) | Trend::Total(v) => v,
                Trend::Share { .. } => f64::NAN,
            });
        if v.is_nan() { 0.0 } else { v }
    }
}

/// The last hour of every source's trends; shared by the sampler and the pages.
#[derive(Debug, Default, Clone)]
pub struct History {
    inner: Arc<Mutex<HashMap<String, Ring>>>,
    /// When the agent started (seconds since the epoch; 0: long ago).
    started: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl History {
    /// An empty history of an agent starting now.
    pub fn started_now() -> History {
        History {
            started: now_secs(),
            ..History::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Ring>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `longest`, or the agent's age if it is younger (its counters start at 0).
    pub fn window(&self, longest: Duration) -> Duration {
        Duration::from_secs(now_secs().saturating_sub(self.started)).min(longest)
    }

    /// Adds one sample of `source`: its card's trends, or, when this agent
    /// does not export it (`None`), a sample of none.
    pub fn record(&self, source: &str, trends: Option<&[(&'static str, Trend)]>) {
        self.record_at(now_secs(), source, trends);
    }

    fn record_at(&self, at: u64, source: &str, trends: Option<&[(&'static str, Trend)]>) {
        let mut g = self.lock();
        let ring = g.entry(source.to_string()).or_default();
        let trends: Box<[Trend]> = match trends {
            Some(trends) => {
                let keys: Vec<&'static str> = trends.iter().map(|(k, _)| *k).collect();
                if keys != ring.keys {
                    // Another card than before: its old samples mean other things.
                    *ring = Ring {
                        keys,
                        points: VecDeque::new(),
                    };
                }
                trends.iter().map(|(_, t)| *t).collect()
            }
            None => match ring.points.back() {
                Some(last) => last.trends.iter().map(|t| t.absent()).collect(),
                None => return,
            },
        };
        if ring.points.len() >= SAMPLES {
            ring.points.pop_front();
        }
        ring.points.push_back(Point { at, trends });
    }

    /// The past of one source, for its card.
    pub fn of<'a>(&'a self, source: &'a str) -> SourcePast<'a> {
        SourcePast {
            history: self,
            source,
        }
    }

    /// The sparkline values of one source by trend key, oldest first and
    /// ending with `now` (the card's trends of this moment): levels as they
    /// were, running totals as their growth between samples, shares as one
    /// total's growth over the other's; NaN where a value was absent.
    pub fn drawn(
        &self,
        source: &str,
        now: &[(&'static str, Trend)],
    ) -> BTreeMap<&'static str, Vec<f64>> {
        let g = self.lock();
        let mut points: Vec<&[Trend]> = match g.get(source) {
            Some(ring) if ring.keys.iter().eq(now.iter().map(|(k, _)| k)) => {
                ring.points.iter().map(|p| &*p.trends).collect()
            }
            _ => Vec::new(),
        };
        let current: Vec<Trend> = now.iter().map(|(_, t)| *t).collect();
        points.push(&current);
        let growth = |a: f64, b: f64| (b - a).max(0.0);
        let mut out = BTreeMap::new();
        for (i, (key, kind)) in now.iter().enumerate() {
            let level = |p: &[Trend]| match p[i] {
                Trend::Level(v) | Trend::Total(v) => v,
                Trend::Share { part, .. } => part,
            };
            let drawn: Vec<f64> = match kind {
                Trend::Level(_) => points.iter().map(|p| level(p)).collect(),
                Trend::Total(_) => points
                    .windows(2)
                    .map(|w| growth(level(w[0]), level(w[1])))
                    .collect(),
                Trend::Share { .. } => points
                    .windows(2)
                    .map(|w| match (w[0][i], w[1][i]) {
                        (
                            Trend::Share {
                                part: p0,
                                whole: w0,
                            },
                            Trend::Share {
                                part: p1,
                                whole: w1,
                            },
                        ) => {
                            let whole = growth(w0, w1);
                            if whole > 0.0 {
                                growth(p0, p1) / whole
                            } else {
                                f64::NAN
                            }
                        }
                        _ => f64::NAN,
                    })
                    .collect(),
            };
            out.insert(*key, drawn);
        }
        out
    }
}

/// One source's history, as its card sees it.
pub struct SourcePast<'a> {
    history: &'a History,
    source: &'a str,
}

impl Past for SourcePast<'_> {
    fn growth(&self, key: &str, now: f64, window: Duration) -> f64 {
        let cutoff = now_secs().saturating_sub(window.as_secs());
        let before = self
            .history
            .lock()
            .get(self.source)
            .map_or(0.0, |ring| ring.total_at(key, cutoff));
        (now - before).max(0.0)
    }

    fn window(&self, longest: Duration) -> Duration {
        self.history.window(longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECENT: Duration = Duration::from_secs(15 * 60);
    const BURST: Duration = Duration::from_secs(5 * 60);

    fn dead(total: f64) -> Vec<(&'static str, Trend)> {
        vec![
            ("backlog", Trend::Level(1.0)),
            ("dead_letters", Trend::Total(total)),
        ]
    }

    #[test]
    fn growth_subtracts_the_sample_a_window_old_and_the_ring_is_bounded() {
        let h = History::default();
        let now = now_secs();
        let past = h.of("s");
        // Younger than 15 minutes: everything since the start.
        h.record_at(now - 60, "s", Some(&dead(4.0)));
        assert_eq!(past.growth("dead_letters", 9.0, RECENT), 9.0);
        h.record_at(now - 20 * 60, "s", Some(&dead(1.0)));
        h.record_at(now - 16 * 60, "s", Some(&dead(3.0)));
        assert_eq!(past.growth("dead_letters", 9.0, RECENT), 6.0);
        // A burst: the last 5 minutes subtract the sample 5 minutes old.
        h.record_at(now - 6 * 60, "s", Some(&dead(4.0)));
        h.record_at(now - 4 * 60, "s", Some(&dead(8.0)));
        assert_eq!(past.growth("dead_letters", 9.0, BURST), 5.0);
        // A trend the card does not declare grew from 0.
        assert_eq!(past.growth("other", 9.0, BURST), 9.0);
        for i in 0..500 {
            h.record_at(now + i, "s", Some(&dead(5.0)));
        }
        let drawn = h.drawn("s", &dead(5.0));
        assert_eq!(drawn["backlog"].len(), SAMPLES + 1);
        assert_eq!(drawn["dead_letters"].len(), SAMPLES);
    }

    #[test]
    fn levels_are_drawn_as_they_were_totals_as_growth_and_shares_as_a_ratio_of_growths() {
        let h = History::default();
        let at = |level: f64, total: f64, part: f64, whole: f64| {
            vec![
                ("level", Trend::Level(level)),
                ("total", Trend::Total(total)),
                ("share", Trend::Share { part, whole }),
            ]
        };
        h.record_at(10, "s", Some(&at(1.0, 10.0, 0.0, 0.0)));
        h.record_at(40, "s", Some(&at(f64::NAN, 15.0, 1.0, 4.0)));
        // Another agent exports it for a sample: nothing is known then.
        h.record_at(70, "s", None);
        let drawn = h.drawn("s", &at(3.0, 18.0, 1.0, 4.0));
        let level = &drawn["level"];
        assert_eq!(level.len(), 4);
        assert_eq!((level[0], level[3]), (1.0, 3.0));
        assert!(level[1].is_nan() && level[2].is_nan());
        assert_eq!(drawn["total"], vec![5.0, 0.0, 0.0]);
        let share = &drawn["share"];
        assert_eq!(share[0], 0.25);
        assert!(share[1].is_nan() && share[2].is_nan());
        // Other trends than before: the old samples are not theirs.
        h.record_at(100, "s", Some(&dead(1.0)));
        assert_eq!(h.drawn("s", &dead(2.0))["backlog"].len(), 2);
        assert_eq!(h.drawn("s", &at(0.0, 0.0, 0.0, 0.0))["level"].len(), 1);
    }
}
