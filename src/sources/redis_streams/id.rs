//! A stream entry id, `ms-seq`, and whether its milliseconds are a time:
//! an id before 2000-01-01 or more than a minute past the broker's clock
//! was written by hand (`XADD s 1-1 …`), and gives no age.

use std::fmt;

/// 2000-01-01T00:00:00Z in ms: an id below it is not a time.
const EARLIEST_TIME_MS: u64 = 946_684_800_000;
/// How far past the broker's clock an id may be and still be a time (an
/// entry written during the poll, a clock stepped back).
const FUTURE_SLACK_MS: u64 = 60_000;

/// A stream entry id, `ms-seq`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id {
    pub ms: u64,
    pub seq: u64,
}

impl Id {
    /// `1700000000000-3` (a bare `ms` is `ms-0`).
    pub fn parse(text: &str) -> Option<Id> {
        let (ms, seq) = text.split_once('-').unwrap_or((text, "0"));
        Some(Id {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// Whether its milliseconds can be a time on a clock reading `now_ms`.
    pub fn is_time(self, now_ms: u64) -> bool {
        self.ms >= EARLIEST_TIME_MS && self.ms <= now_ms.saturating_add(FUTURE_SLACK_MS)
    }

    /// Seconds from the id's time to `now_ms` (0 for an id a little ahead);
    /// `None` when the id is not a time.
    pub fn age(self, now_ms: u64) -> Option<f64> {
        self.is_time(now_ms)
            .then(|| now_ms.saturating_sub(self.ms) as f64 / 1000.0)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_000_000_000;

    fn id(ms: u64, seq: u64) -> Id {
        Id { ms, seq }
    }

    #[test]
    fn ids_parse_and_order() {
        assert_eq!(Id::parse("1700000000000-3"), Some(id(1_700_000_000_000, 3)));
        assert_eq!(Id::parse("5"), Some(id(5, 0)));
        assert_eq!(Id::parse("x-1"), None);
        assert!(id(5, 9) < id(6, 0));
        assert!(id(6, 1) > id(6, 0));
    }

    /// Guards the detection of ids that are not times: before 2000, or
    /// more than a minute past the broker's clock, they have no age.
    #[test]
    fn explicit_ids_have_no_age() {
        assert_eq!(id(1, 1).age(NOW), None);
        assert_eq!(id(NOW + 3_600_000, 0).age(NOW), None);
        assert_eq!(id(NOW - 2500, 0).age(NOW), Some(2.5));
        assert_eq!(id(NOW + 500, 0).age(NOW), Some(0.0));
    }
}
