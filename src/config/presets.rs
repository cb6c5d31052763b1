//! Presets in the configuration: an entry with `preset = "NAME"` gets every
//! key of the preset that it does not write itself (tables merge key by key:
//! one column of `columns`, one meaning of `statuses`; anything else the
//! entry writes — a string, a number, an array such as `status_rules` —
//! replaces the preset's whole). The merge happens before the entry is read,
//! so a preset's keys are checked exactly like the user's. Which presets
//! exist is each kind's to say (`Kind::presets`, through the registry).

use std::borrow::Cow;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::sources::SourceSpec;
use crate::sources::kind::Preset;
use crate::text::render_source;
use crate::validation::Validator;

/// The preset called `name`, with the kind it makes.
pub fn find(name: &str) -> Option<(&'static str, Box<dyn Preset>)> {
    SourceSpec::presets()
        .into_iter()
        .find(|(_, p)| p.name() == name)
}

/// The names of every preset, for error messages.
pub fn names() -> Vec<&'static str> {
    SourceSpec::presets()
        .iter()
        .map(|(_, p)| p.name())
        .collect()
}

/// A preset merged into an entry, until the entry is read: what
/// `check-config` and `doctor` then say of it.
pub struct Applied {
    /// The kind the preset makes.
    pub kind: &'static str,
    preset: &'static str,
    proven: String,
    overridden: Vec<String>,
    effective: Option<toml::Table>,
}

impl Applied {
    /// How source `source`, once read, uses the preset.
    pub fn used_by(self, source: String) -> PresetUse {
        PresetUse {
            source,
            preset: self.preset,
            proven: self.proven,
            overridden: self.overridden,
            effective: self
                .effective
                .map(|t| render_source(&t))
                .unwrap_or_default(),
        }
    }
}

/// Applies preset `name` to `entry` (the entry at `key`, whose `preset` key
/// is at `span`; `kind` is the entry's own `kind`, if it writes one). `None`,
/// with the problem reported, when no kind has a preset of that name or the
/// entry's kind is not the preset's.
pub fn apply(
    v: &mut Validator<'_>,
    key: &str,
    name: &str,
    kind: Option<&str>,
    entry: &mut DeTable<'_>,
    span: std::ops::Range<usize>,
) -> Option<Applied> {
    let Some((of, preset)) = find(name) else {
        v.problem(
            &format!("{key}.preset"),
            format!(
                "unknown preset \"{name}\" (expected one of {}; `inboxwatch presets` lists them)",
                names().join(", ")
            ),
        );
        return None;
    };
    if let Some(k) = kind.filter(|k| *k != of) {
        v.problem(
            &format!("{key}.kind"),
            format!(
                "\"{k}\" does not fit preset \"{name}\", which makes {of} sources (leave `kind` out)"
            ),
        );
        return None;
    }
    let overridden = merge_into(entry, preset.entry(), span);
    let effective = to_table(entry);
    // The entry's kind is the preset's: the registry reads it as one.
    if let Some(k) = entry.keys().find(|k| k.get_ref() == "kind").cloned() {
        entry.remove(&k);
    }
    Some(Applied {
        kind: of,
        preset: preset.name(),
        proven: format!("{} against {}", preset.proof(), preset.library()),
        overridden,
        effective,
    })
}

/// Fills `entry` with the keys of `preset` it does not write itself (tables
/// merged key by key); every value taken from the preset gets `span` (the
/// entry's `preset` key), so that a problem in it points at that line.
/// Returns the paths of the entry's own keys that override a preset key.
fn merge_into(
    entry: &mut DeTable<'_>,
    preset: DeTable<'static>,
    span: std::ops::Range<usize>,
) -> Vec<String> {
    let mut overridden = Vec::new();
    merge_table(entry, preset, &span, "", &mut overridden);
    overridden
}

fn merge_table<'i>(
    into: &mut DeTable<'i>,
    from: DeTable<'static>,
    span: &std::ops::Range<usize>,
    prefix: &str,
    overridden: &mut Vec<String>,
) {
    for (key, value) in from {
        let name = key.get_ref().to_string();
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let existing = into.iter_mut().find(|(k, _)| k.get_ref() == &name);
        match existing {
            None => {
                into.insert(
                    Spanned::new(span.clone(), Cow::Owned(name)),
                    respan(value.into_inner(), span),
                );
            }
            Some((_, mine)) => match (mine.get_mut(), value.into_inner()) {
                (DeValue::Table(mine), DeValue::Table(theirs)) => {
                    merge_table(mine, theirs, span, &path, overridden);
                }
                _ => overridden.push(path),
            },
        }
    }
}

/// `value` with every span set to `span` (the user's file has no other
/// place for it).
fn respan(value: DeValue<'static>, span: &std::ops::Range<usize>) -> Spanned<DeValue<'static>> {
    let value = match value {
        DeValue::Table(t) => DeValue::Table(
            t.into_iter()
                .map(|(k, v)| {
                    (
                        Spanned::new(span.clone(), k.into_inner()),
                        respan(v.into_inner(), span),
                    )
                })
                .collect(),
        ),
        DeValue::Array(a) => DeValue::Array(
            a.into_iter()
                .map(|v| respan(v.into_inner(), span))
                .collect(),
        ),
        other => other,
    };
    Spanned::new(span.clone(), value)
}

/// The merged entry as a TOML table (for showing the effective settings).
fn to_table(entry: &DeTable<'_>) -> Option<toml::Table> {
    let value = Spanned::new(0..0, DeValue::Table(entry.clone()));
    toml::Table::deserialize(toml::de::ValueDeserializer::from(value)).ok()
}

/// One source that uses a preset, as `check-config` and `doctor` show it.
#[derive(Debug, Clone)]
pub struct PresetUse {
    /// The source's name.
    pub source: String,
    /// The preset's name.
    pub preset: &'static str,
    /// How and against what it was proven (`library-tested against pg-boss 10.4.2`).
    pub proven: String,
    /// The keys the source's own entry overrides (`columns.event_type`, …).
    pub overridden: Vec<String>,
    /// The effective settings, as `[[sources]]` TOML without name or DSN.
    pub effective: String,
}

impl PresetUse {
    /// `preset pg-boss (library-tested against pg-boss 10.4.2); the entry
    /// overrides: table`.
    pub fn headline(&self) -> String {
        let mut s = format!("preset {} ({})", self.preset, self.proven);
        if !self.overridden.is_empty() {
            s.push_str(&format!(
                "; the entry overrides: {}",
                self.overridden.join(", ")
            ));
        }
        s
    }
}

/// `inboxwatch presets`: one line per preset.
pub fn listing() -> String {
    let rows: Vec<[String; 5]> = SourceSpec::presets()
        .iter()
        .map(|(kind, p)| {
            [
                p.name().to_string(),
                kind.to_string(),
                p.library(),
                p.proof().to_string(),
                p.summary().to_string(),
            ]
        })
        .collect();
    let head = [
        "PRESET",
        "KIND",
        "PROVEN AGAINST",
        "PROOF",
        "WHAT IT WATCHES",
    ];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(head);
    for r in &rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    out
}
