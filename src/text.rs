//! How values are shown to people, by the pages and the commands alike:
//! times as RFC 3339, durations in milliseconds, bytes and table texts made
//! safe for a terminal or a tab-separated line, the `since` of a dead-letter
//! listing, and a source's settings as TOML without its secrets. Imports
//! nothing of the product, so every layer may use it.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes as text for a tab-separated line: UTF-8 as it is, a backslash as
/// `\\`, control characters and bytes that are not UTF-8 as `\xNN`; at
/// most `max` bytes of the input, `…` after a cut.
pub fn bytes_text(bytes: &[u8], max: usize) -> String {
    let cut = bytes.len() > max;
    let bytes = &bytes[..bytes.len().min(max)];
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// Table data as text for a terminal or a tab-separated line, whole:
/// [`bytes_text`] without a cut. An event id, status word or error text that
/// holds ESC, BEL, CR, a tab or a newline cannot move the cursor, retitle
/// the terminal or split a row.
pub fn printable(text: &str) -> String {
    bytes_text(text.as_bytes(), usize::MAX)
}

/// Text for a terminal, its lines kept: each control character but the
/// newline as `\xNN` (ESC, BEL, CR, a tab), the rest as it is. For what is
/// printed as lines rather than as tab-separated fields: `trace`, and the
/// error messages of the lookups and actions (a driver's error can echo an id).
pub fn terminal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "\\x{b:02x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The farthest back a dead-letter listing looks (`?since=`, `--since`): 3650
/// days, as [`parse_since`] says. Farther would reach past what the databases' time types hold
/// (MariaDB's `TIMESTAMP` begins in 1970) and fail in the driver.
pub const MAX_SINCE: Duration = Duration::from_secs(3650 * 86_400);

/// A `since` duration: `1h`, `2d`, … up to [`MAX_SINCE`].
pub fn parse_since(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 1h or 2d: {e}"))?;
    if d > MAX_SINCE {
        return Err(format!(
            "{text:?} is longer than 3650d (ten years), the farthest back a listing looks"
        ));
    }
    Ok(d)
}

/// Characters of `last_error` the lookups show.
pub const ERROR_SHOWN: usize = 200;

/// What a kind gives for a time that has no microsecond value that fits in
/// 64 bits (PostgreSQL's `infinity`, a year past 294,000) or that cannot be
/// read as a time: a row holding one is rejected as `time_out_of_range`,
/// and the lookups show it as such.
pub const OUT_OF_RANGE: i64 = i64::MIN + 1;

/// Microseconds since the epoch as a `SystemTime`.
pub fn at(micros: i64) -> SystemTime {
    if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    }
}

/// RFC 3339 UTC with milliseconds, from microseconds since the epoch; a time
/// RFC 3339 cannot show (before 1970 for the formatter, after 9999, or out of
/// range in the database) is shown as what it is.
pub fn timestamp(micros: i64) -> String {
    /// 10000-01-01T00:00:00Z.
    const YEAR_10000: i64 = 253_402_300_800_000_000;
    if micros == OUT_OF_RANGE {
        "(out of range)".to_string()
    } else if !(0..YEAR_10000).contains(&micros) {
        format!("({micros} µs from 1970-01-01T00:00:00Z)")
    } else {
        humantime::format_rfc3339_millis(at(micros)).to_string()
    }
}

/// A duration in milliseconds, as `1.234s` or `56ms`.
pub fn ms(micros: i64) -> String {
    let ms = micros.div_euclid(1000);
    if ms.abs() >= 1000 {
        format!("{:.3}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

/// The settings of a source as `[[sources]]` TOML: the keys of `table`
/// except `name` and any connection string (`dsn`, `dsn_file`, at any
/// depth), so that the text never carries a secret.
pub fn render_source(table: &toml::Table) -> String {
    fn strip(t: &toml::Table) -> toml::Table {
        t.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "name" | "dsn" | "dsn_file"))
            .map(|(k, v)| {
                let v = match v {
                    toml::Value::Table(t) => toml::Value::Table(strip(t)),
                    other => other.clone(),
                };
                (k.clone(), v)
            })
            .collect()
    }
    let mut root = toml::Table::new();
    root.insert(
        "sources".into(),
        toml::Value::Array(vec![toml::Value::Table(strip(table))]),
    );
    toml::to_string(&root).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `trace` and `dead-letters` on rows with times out of range
    /// (`infinity`, before 1970, after 9999): shown as such, never a panic.
    #[test]
    fn timestamps_rfc3339_cannot_show_are_shown_as_they_are() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_500), "1970-01-01T00:00:00.001Z");
        assert_eq!(timestamp(OUT_OF_RANGE), "(out of range)");
        assert_eq!(
            timestamp(-1_000_000),
            "(-1000000 µs from 1970-01-01T00:00:00Z)"
        );
        assert_eq!(
            timestamp(253_402_300_800_000_000),
            "(253402300800000000 µs from 1970-01-01T00:00:00Z)"
        );
    }

    #[test]
    fn bytes_are_shown_as_text_with_the_rest_escaped() {
        assert_eq!(bytes_text(b"order-17", 256), "order-17");
        assert_eq!(bytes_text("prix: 12 €".as_bytes(), 256), "prix: 12 €");
        assert_eq!(
            bytes_text(b"a\tb\nc\\d\x00\xff\x7f", 256),
            "a\\x09b\\x0ac\\\\d\\x00\\xff\\x7f"
        );
        assert_eq!(bytes_text(b"abcdef", 3), "abc…");
        // A character cut by the prefix shows as its bytes.
        assert_eq!(bytes_text("é".as_bytes(), 1), "\\xc3…");
    }

    #[test]
    fn rendering_drops_names_and_connection_strings_at_any_depth() {
        let t: toml::Table = toml::from_str(
            "name = \"a\"\ndsn = \"postgres://u:secret@h/db\"\ntable = \"t\"\n\
             [dead_letter_actions]\ndsn = \"postgres://w:secret@h/db\"\nreplay_status = \"new\"\n",
        )
        .unwrap();
        let s = render_source(&t);
        assert!(!s.contains("secret"), "{s}");
        assert!(s.contains("table = \"t\""), "{s}");
        assert!(s.contains("replay_status = \"new\""), "{s}");
    }
}
