//! Failure groups: dead letters gathered by what failed them, so that an
//! incident's thousand dead letters read as the two or three causes they
//! are (as ServicePulse's failed-message groups). A group is a source, an
//! event type, an error class and the *fingerprint* of the error text: the
//! text with its variable parts taken out.
//!
//! The fingerprint of an error text (docs/lookups.md, "Failure groups"):
//! 1. a JSON object's `message` (or `error`) field stands for the whole
//!    text (pg-boss and graphile-worker keep errors as JSON);
//! 2. its first line only (a stack trace's frames follow it);
//! 3. in order, these parts become placeholders: quoted values (`"…"`,
//!    `'…'`, `` `…` ``) `<value>`; UUIDs `<uuid>`; timestamps (RFC 3339 or
//!    `YYYY-MM-DD hh:mm:ss`, fractions and zones included) `<time>`; IPv4
//!    addresses with their port `<address>`; hex
//!    numbers (`0x…`, or 8 or more hex digits with a digit and a letter
//!    among them) `<hex>`; numbers with a unit (`3000ms`, `12MiB`) `<n>` and
//!    the unit; words that mix letters and digits (`ord_8f3a2c`, `user42`)
//!    `<id>`; numbers (signs, decimals, exponents) `<n>`;
//! 4. runs of white space become one space; at most 300 characters.
//!
//! A group's id is a stable hash of its four parts (FNV-1a, 64 bits, as 16
//! hex digits): the same on every agent and every version.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

static QUOTED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""[^"]*"|'[^']*'|`[^`]*`"#).expect("valid"));
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
        .expect("valid")
});
static TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}(:?\d{2})?)?")
        .expect("valid")
});
static ADDRESS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b").expect("valid"));
static HEX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b0x[0-9a-f]+\b|\b[0-9a-f]*\d[0-9a-f]*\b").expect("valid"));
static UNIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|[kKMGT]i?B|B)\b").expect("valid")
});
static MIXED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b[A-Za-z_][A-Za-z0-9_-]*\d[A-Za-z0-9_-]*\b|\b\d+[A-Za-z_][A-Za-z0-9_-]*\b")
        .expect("valid")
});
static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[-+]?\b\d+(\.\d+)?([eE][-+]?\d+)?\b").expect("valid"));
static SPACE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\s+").expect("valid"));

/// Characters a fingerprint keeps at most.
const LONGEST: usize = 300;

/// The error text with its variable parts taken out (the module's rules).
pub fn fingerprint(text: &str) -> String {
    let message = json_message(text);
    let text = message.as_deref().unwrap_or(text);
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let s = QUOTED.replace_all(first, |c: &regex::Captures<'_>| {
        let q = &c[0][..1];
        format!("{q}<value>{q}")
    });
    let s = UUID.replace_all(&s, "<uuid>");
    let s = TIME.replace_all(&s, "<time>");
    let s = ADDRESS.replace_all(&s, "<address>");
    let s = HEX.replace_all(&s, |c: &regex::Captures<'_>| {
        let m = &c[0];
        // 8 or more hex digits, or 0x…; shorter runs of plain digits are numbers.
        let digits = m.bytes().all(|b| b.is_ascii_digit());
        if !digits && (m.len() >= 8 || m.to_ascii_lowercase().starts_with("0x")) {
            "<hex>".to_string()
        } else {
            m.to_string()
        }
    });
    let s = UNIT.replace_all(&s, "<n>$2");
    let s = MIXED.replace_all(&s, "<id>");
    let s = NUMBER.replace_all(&s, "<n>");
    let s = SPACE.replace_all(s.trim(), " ");
    s.chars().take(LONGEST).collect()
}

/// A JSON object's `message` or `error` text, when `text` is one.
fn json_message(text: &str) -> Option<String> {
    let t = text.trim_start();
    if !t.starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(t).ok()?;
    ["message", "error"].iter().find_map(|k| match v.get(*k)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("message")?.as_str().map(str::to_string),
        _ => None,
    })
}

/// What makes two dead letters one group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub source: String,
    pub event_type: String,
    pub error_class: String,
    pub fingerprint: String,
}

impl Key {
    /// The group of dead letter `d`.
    pub fn of(d: &Letter<'_>) -> Key {
        Key {
            source: d.source.to_string(),
            event_type: d.event_type.unwrap_or("unknown").to_string(),
            error_class: d.error_class.unwrap_or("unclassified").to_string(),
            fingerprint: d.error.map(fingerprint).unwrap_or_default(),
        }
    }

    /// The group's id: 16 hex digits of FNV-1a over its four parts.
    pub fn id(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [
            &self.source,
            &self.event_type,
            &self.error_class,
            &self.fingerprint,
        ] {
            for b in part.bytes().chain(std::iter::once(0)) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

/// One failure group.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub key: Key,
    pub owner: String,
    /// Dead letters.
    pub count: u64,
    /// Events failing now: in a failed status, waiting for their next
    /// attempt.
    pub failing: u64,
    /// Microseconds since the epoch: the earliest and latest failure of
    /// the group, dead letters and failing events alike.
    pub first_seen: Option<i64>,
    pub last_seen: Option<i64>,
    /// The latest failure of the group: its event id and error text.
    pub sample_event_id: String,
    pub sample_error: Option<String>,
}

/// One dead letter, as grouping sees it.
#[derive(Debug, Clone, Copy)]
pub struct Letter<'a> {
    pub source: &'a str,
    pub owner: &'a str,
    pub event_type: Option<&'a str>,
    pub error_class: Option<&'a str>,
    /// Its error text as shown (masked).
    pub error: Option<&'a str>,
    /// Microseconds since the epoch.
    pub at: Option<i64>,
    pub event_id: &'a str,
}

/// Dead letters gathered into groups.
#[derive(Debug, Default)]
pub struct Groups {
    by_key: BTreeMap<Key, Group>,
}

impl Groups {
    /// Adds one dead letter.
    pub fn add(&mut self, d: Letter<'_>) {
        self.entry(d).count += 1;
    }

    /// Adds one event failing now (`at`: its last failure).
    pub fn add_failing(&mut self, d: Letter<'_>) {
        self.entry(d).failing += 1;
    }

    /// The group of `d`, its times and sample updated by it.
    fn entry(&mut self, d: Letter<'_>) -> &mut Group {
        let key = Key::of(&d);
        let g = self.by_key.entry(key.clone()).or_insert_with(|| Group {
            key,
            owner: d.owner.to_string(),
            count: 0,
            failing: 0,
            first_seen: d.at,
            last_seen: d.at,
            sample_event_id: d.event_id.to_string(),
            sample_error: d.error.map(str::to_string),
        });
        g.first_seen = min_some(g.first_seen, d.at);
        if d.at.is_some() && d.at >= g.last_seen {
            g.last_seen = d.at;
            g.sample_event_id = d.event_id.to_string();
            g.sample_error = d.error.map(str::to_string);
        }
        g
    }

    /// The groups, the latest last seen first (then by id, for a stable order).
    pub fn into_sorted(self) -> Vec<Group> {
        let mut out: Vec<Group> = self.by_key.into_values().collect();
        out.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then_with(|| a.key.id().cmp(&b.key.id()))
        });
        out
    }
}

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error texts of the libraries the presets watch (as they write them)
    /// and of common consumers: two of one cause share a fingerprint, the
    /// expected one.
    #[test]
    fn variable_parts_of_real_error_texts_are_taken_out() {
        let cases = [
            // PostgreSQL through any driver.
            (
                "duplicate key value violates unique constraint \"orders_pkey\"",
                "duplicate key value violates unique constraint \"<value>\"",
            ),
            (
                "insert or update on table \"payments\" violates foreign key constraint \"payments_order_id_fkey\"\nDETAIL: Key (order_id)=(48213) is not present in table \"orders\".",
                "insert or update on table \"<value>\" violates foreign key constraint \"<value>\"",
            ),
            // graphile-worker / pg-boss (Node): errno texts with addresses.
            (
                "Error: connect ECONNREFUSED 10.0.3.17:5432\n    at TCPConnectWrap.afterConnect [as oncomplete] (node:net:1555:16)",
                "Error: connect ECONNREFUSED <address>",
            ),
            (
                "{\"name\":\"Error\",\"message\":\"Request failed with status code 503\",\"stack\":\"Error: Request failed with status code 503\\n    at createError (/app/node_modules/axios/lib/core/createError.js:16:15)\"}",
                "Request failed with status code <n>",
            ),
            // procrastinate / pgqueuer (Python).
            (
                "Traceback (most recent call last): ValueError: invalid amount -12.50 for order ord_8f3a2c",
                "Traceback (most recent call last): ValueError: invalid amount <n> for order <id>",
            ),
            ("KeyError: 'customer_id'", "KeyError: '<value>'"),
            // Java / .NET consumers (CAP, Spring).
            (
                "System.TimeoutException: The operation has timed out after 00:00:30 (request 7f3c2a9e-51d4-4a2b-9c6e-0e8d1f2a3b4c)",
                "System.TimeoutException: The operation has timed out after <n>:<n>:<n> (request <uuid>)",
            ),
            (
                "org.springframework.web.client.HttpServerErrorException$ServiceUnavailable: 503 at 2026-12-04T10:15:02.123Z from inventory-7d9f8",
                "org.springframework.web.client.HttpServerErrorException$ServiceUnavailable: <n> at <time> from <id>",
            ),
            (
                "lock 0x7f3a2c1b held by pid 4411 since 2026-12-04 10:15:02",
                "lock <hex> held by pid <n> since <time>",
            ),
            (
                "checksum deadbeef42 does not match cafe1234",
                "checksum <hex> does not match <hex>",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(fingerprint(text), expected, "{text}");
        }
    }

    #[test]
    fn one_cause_with_different_values_is_one_group_and_different_causes_are_not() {
        let mut g = Groups::default();
        for i in 0..50i64 {
            let letter = |class, error, at, id| Letter {
                source: "orders",
                owner: "team-orders",
                event_type: Some("OrderPlaced"),
                error_class: Some(class),
                error: Some(error),
                at: Some(at),
                event_id: id,
            };
            let timeout = format!(
                "timeout after {}ms calling inventory for order {i} at 2026-12-04T10:{:02}:00Z",
                3000 + i,
                i % 60
            );
            let (e, v) = (format!("e-{i}"), format!("v-{i}"));
            g.add(letter("timeout", &timeout, 1_000_000 * i, &e));
            let invalid = format!("amount '{i}.99' is not valid for currency 'EUR'");
            g.add(letter("validation", &invalid, 1_000_000 * i + 7, &v));
        }
        g.add(Letter {
            source: "orders",
            owner: "team-orders",
            event_type: None,
            error_class: None,
            error: None,
            at: None,
            event_id: "x",
        });
        let groups = g.into_sorted();
        assert_eq!(groups.len(), 3, "{groups:#?}");
        assert_eq!(groups[0].key.error_class, "validation");
        assert_eq!(groups[0].count, 50);
        assert_eq!(groups[0].first_seen, Some(7));
        assert_eq!(groups[0].last_seen, Some(49_000_007));
        assert_eq!(groups[0].sample_event_id, "v-49");
        assert_eq!(
            groups[0].key.fingerprint,
            "amount '<value>' is not valid for currency '<value>'"
        );
        assert_eq!(groups[1].key.error_class, "timeout");
        assert_eq!(
            groups[1].key.fingerprint,
            "timeout after <n>ms calling inventory for order <n> at <time>"
        );
        assert_eq!(groups[2].key.event_type, "unknown");
        assert_eq!(groups[2].key.error_class, "unclassified");
        assert_eq!(groups[2].count, 1);
        // Ids are stable and distinct.
        assert_eq!(groups[2].key.id(), groups[2].key.clone().id());
        assert_ne!(groups[0].key.id(), groups[1].key.id());
        assert_eq!(groups[0].key.id().len(), 16);
    }
}
