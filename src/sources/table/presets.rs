//! Presets: the table shapes of real inbox, outbox and job-queue libraries,
//! one file each under `presets/`, embedded in the binary, offered by the
//! table kinds ([`of_kind`]); what each measures and cannot, worked out from
//! what it maps (`inboxwatch presets NAME`, docs/presets.md).
//!
//! A `[[sources]]` entry with `preset = "NAME"` gets every key of the
//! preset's `[source]` table that it does not write itself; the
//! configuration merges them (`config::presets`) before the entry is read,
//! so a preset's keys are checked exactly like the user's.

use std::borrow::Cow;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::capabilities::{self, Capability, How};
use super::config::{InboxSpec, OutboxSpec};
use crate::sources::kind::{Kind, Preset};
use crate::telemetry::catalogue as metric;
use crate::text::render_source;
use crate::validation::{Environment, Validator};

/// Every preset: its name and the text of its file. Adding a preset is one
/// file under `presets/` and one line here (and the test that proves it).
const PRESETS: &[(&str, &str)] = &[
    (
        "pg-transactional-outbox-inbox",
        include_str!("../../../presets/pg-transactional-outbox-inbox.toml"),
    ),
    (
        "pg-transactional-outbox-outbox",
        include_str!("../../../presets/pg-transactional-outbox-outbox.toml"),
    ),
    (
        "graphile-worker",
        include_str!("../../../presets/graphile-worker.toml"),
    ),
    ("pg-boss", include_str!("../../../presets/pg-boss.toml")),
    (
        "apalis-postgres",
        include_str!("../../../presets/apalis-postgres.toml"),
    ),
    (
        "apalis-mysql",
        include_str!("../../../presets/apalis-mysql.toml"),
    ),
    (
        "procrastinate",
        include_str!("../../../presets/procrastinate.toml"),
    ),
    ("pgqueuer", include_str!("../../../presets/pgqueuer.toml")),
    ("oban", include_str!("../../../presets/oban.toml")),
    ("river", include_str!("../../../presets/river.toml")),
    ("good-job", include_str!("../../../presets/good-job.toml")),
    (
        "spring-modulith",
        include_str!("../../../presets/spring-modulith.toml"),
    ),
    (
        "solid-queue-jobs",
        include_str!("../../../presets/solid-queue-jobs.toml"),
    ),
    (
        "cap-received",
        include_str!("../../../presets/cap-received.toml"),
    ),
];

/// How a preset was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proof {
    /// The library itself ran here, writing its own tables through its own
    /// API, and the agent's counters equalled the library's counts.
    LibraryTested,
    /// Tables created from the library's published DDL, written the way
    /// its source writes them, by a test's generated ground truth.
    SchemaTested,
}

impl Proof {
    pub fn as_str(self) -> &'static str {
        match self {
            Proof::LibraryTested => "library-tested",
            Proof::SchemaTested => "schema-tested",
        }
    }
}

/// One preset file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetFile {
    /// Its name (from [`PRESETS`], not from the file).
    #[serde(skip)]
    pub name: &'static str,
    /// The library's name as its users know it.
    pub library: String,
    /// Where the library is published (npm, PyPI, crates.io, NuGet, …).
    pub registry: String,
    /// The exact versions it was proven against.
    pub versions: Vec<String>,
    pub proof: Proof,
    /// The test that proves it.
    pub test: String,
    /// One line: the table and what a row is.
    pub summary: String,
    /// How the library writes its tables, where it matters to what the
    /// numbers mean. What the preset measures and cannot is not written
    /// here: it is worked out from what it maps ([`claims`]).
    pub notes: String,
    /// The databases it runs on (`postgres`, `mysql`, `sqlite`; default
    /// `postgres`): the dialect its capabilities are worked out for.
    #[serde(default = "postgres_only")]
    pub databases: Vec<String>,
    /// The keys of one `[[sources]]` entry, without `name` and `dsn`.
    pub source: toml::Table,
}

fn postgres_only() -> Vec<String> {
    vec!["postgres".into()]
}

impl PresetFile {
    /// The source kind the preset watches.
    pub fn kind(&self) -> &str {
        self.source
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
    }

    /// The preset's table.
    pub fn table(&self) -> &str {
        self.source
            .get("table")
            .and_then(|k| k.as_str())
            .unwrap_or("")
    }

    /// The preset's settings as the `[[sources]]` keys a user would write.
    pub fn settings_toml(&self) -> String {
        render_source(&self.source)
    }

    /// The `[source]` table of the file, as parsed values (spans in the
    /// preset's own text).
    fn source_value(&self) -> DeTable<'static> {
        let text = text_of(self.name).expect("a preset's text is in PRESETS");
        let root = DeTable::parse(text)
            .unwrap_or_else(|e| panic!("preset {}: {e}", self.name))
            .into_inner();
        root.into_iter()
            .find(|(k, _)| k.get_ref() == "source")
            .and_then(|(_, v)| match v.into_inner() {
                DeValue::Table(t) => Some(t),
                _ => None,
            })
            .unwrap_or_default()
    }
}

fn text_of(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

impl Preset for PresetFile {
    fn name(&self) -> &'static str {
        self.name
    }

    fn library(&self) -> String {
        format!("{} {}", self.library, self.versions.join(", "))
    }

    fn proof(&self) -> &'static str {
        self.proof.as_str()
    }

    fn summary(&self) -> &str {
        &self.summary
    }

    fn entry(&self) -> DeTable<'static> {
        self.source_value()
    }

    fn detail(&self) -> String {
        detail(self)
    }
}

/// The presets of table kind `kind` (`inbox`, `outbox`), in the order of
/// [`PRESETS`].
pub fn of_kind(kind: &str) -> Vec<Box<dyn Preset>> {
    all()
        .into_iter()
        .filter(|p| p.kind() == kind)
        .map(|p| Box::new(p) as Box<dyn Preset>)
        .collect()
}

/// Every preset, in the order of [`PRESETS`]. A file that does not parse is
/// a build defect (the unit tests read every one).
pub fn all() -> Vec<PresetFile> {
    PRESETS
        .iter()
        .map(|(name, _)| find(name).expect("every listed preset is found"))
        .collect()
}

/// The preset called `name`.
pub fn find(name: &str) -> Option<PresetFile> {
    let (name, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
    let mut preset: PresetFile =
        toml::from_str(text).unwrap_or_else(|e| panic!("presets/{name}.toml: {e}"));
    preset.name = name;
    Some(preset)
}

/// A source on the preset and nothing else, of either table kind. One at a
/// time, briefly: the size of the larger does not matter.
#[allow(clippy::large_enum_variant)]
enum Watched {
    Inbox(InboxSpec),
    Outbox(OutboxSpec),
}

/// A source on the preset and nothing else, read and checked by its kind as
/// an entry naming the preset would be. A preset that is not a valid source
/// is a build defect (the unit tests check every one).
fn spec(p: &PresetFile) -> Watched {
    let dsn = match p.databases.first().map(String::as_str) {
        Some("mysql") => "mysql://u@localhost/db",
        Some("sqlite") => "sqlite:///tmp/db.sqlite",
        _ => "postgres://u@localhost/db",
    };
    let mut entry = p.source_value();
    if let Some(k) = entry.keys().find(|k| k.get_ref() == "kind").cloned() {
        entry.remove(&k);
    }
    entry.insert(
        Spanned::new(0..0, Cow::Borrowed("dsn")),
        Spanned::new(0..0, DeValue::String(Cow::Borrowed(dsn))),
    );
    let entry = Spanned::new(0..0, DeValue::Table(entry));
    let text = text_of(p.name).expect("a preset's text is in PRESETS");
    let env = |_: &str| None;
    let mut v = Validator::new(text, Environment::Process, &env);
    let watched = match p.kind() {
        "inbox" => checked::<InboxSpec>(entry, &mut v).map(Watched::Inbox),
        _ => checked::<OutboxSpec>(entry, &mut v).map(Watched::Outbox),
    };
    let problems: Vec<String> = v.into_problems().iter().map(|e| e.to_string()).collect();
    match watched {
        Some(w) if problems.is_empty() => w,
        _ => panic!("preset {} is not a valid source: {problems:?}", p.name),
    }
}

/// `entry` read and checked as a `K`; `None` when a key is unknown or a
/// setting is wrong.
fn checked<K: Kind>(entry: Spanned<DeValue<'_>>, v: &mut Validator<'_>) -> Option<K> {
    let (raw, unknown) = K::read(v, "preset", entry);
    for u in &unknown {
        v.problem(&u.path.join("."), "unknown key".into());
    }
    K::validate(raw?, "preset", "x".into(), v)
}

/// What each metric of a source on the preset (and nothing else) will be:
/// exact, bounded, not exported, as `doctor` prints it.
pub fn capabilities(p: &PresetFile) -> Vec<Capability> {
    match &spec(p) {
        Watched::Inbox(s) => capabilities::inbox(s),
        Watched::Outbox(s) => capabilities::outbox(s),
    }
}

/// Each metric in the words of a preset's claims; metrics of one meaning
/// share their words (and are claimed once).
const WORDS: &[(&str, &str)] = &[
    (metric::INBOX_RECEIVED, "arrivals"),
    (metric::INBOX_COMPLETED, "successes and dead letters"),
    (metric::INBOX_ATTEMPT_FAILURES, "failed attempts"),
    (
        metric::INBOX_DELIVERIES,
        "deliveries and duplicate deliveries",
    ),
    (
        metric::INBOX_DUPLICATES,
        "deliveries and duplicate deliveries",
    ),
    (metric::INBOX_PROCESSING_DURATION, "processing time"),
    (metric::INBOX_DURATION_QUANTILE, "processing time"),
    (metric::INBOX_END_TO_END, "end-to-end latency"),
    (metric::INBOX_ATTEMPTS, "attempts per completed event"),
    (metric::INBOX_BACKLOG, "backlog by status"),
    (metric::INBOX_OLDEST_AGE, "oldest unprocessed age"),
    (metric::INBOX_STUCK, "stuck rows"),
    (metric::INBOX_OUT_OF_ORDER_ARRIVALS, "out-of-order arrivals"),
    (
        metric::INBOX_OUT_OF_ORDER_COMPLETIONS,
        "out-of-order completions",
    ),
    (metric::INBOX_VERSION_GAPS, "version gaps"),
    (metric::INBOX_OLDEST_GAP_AGE, "version gaps"),
    (metric::ORDERING_KEYS_EVICTED, "ordering keys evicted"),
    (metric::INBOX_PARKED, "parked events"),
    (metric::INBOX_OLDEST_PARKED_AGE, "parked events"),
    (metric::INBOX_PARKED_KEYS, "parked ordering keys"),
    (metric::OUTBOX_PUBLISHED, "messages published"),
    (metric::OUTBOX_PUBLISH_DELAY, "publish delay"),
    (metric::OUTBOX_BACKLOG, "backlog"),
    (metric::OUTBOX_OLDEST_AGE, "oldest unpublished age"),
];

fn words(metric: &str) -> &str {
    WORDS
        .iter()
        .find(|(m, _)| *m == metric)
        .map_or(metric, |(_, w)| w)
}

/// What a preset measures and what it cannot (each with why), worked out
/// from what it maps: its metrics' capabilities, and the columns that give
/// event types, error classes and trace links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub measures: Vec<String>,
    pub cannot: Vec<String>,
}

pub fn claims(p: &PresetFile) -> Claims {
    let mut measures: Vec<String> = Vec::new();
    let mut cannot: Vec<String> = Vec::new();
    let mut said: Vec<&str> = Vec::new();
    for c in capabilities(p) {
        let w = words(c.metric);
        if said.contains(&w) {
            continue;
        }
        said.push(w);
        match &c.how {
            How::Exact => measures.push(w.to_string()),
            How::Bounded(_) => measures.push(format!("{w} (bounded)")),
            How::Absent(why) => cannot.push(format!("{w} ({why})")),
            How::Zero(why) => cannot.push(format!("{w} (always 0: {why})")),
        }
    }
    let (event_type, last_error, traceparent) = match spec(p) {
        Watched::Inbox(s) => (
            s.columns.event_type,
            Some(s.columns.last_error),
            s.columns.traceparent,
        ),
        Watched::Outbox(s) => (s.columns.event_type, None, s.columns.traceparent),
    };
    let mut by = |column: Option<String>, what: &str, without: &str| match column {
        Some(c) => measures.push(format!("{what} (column {c})")),
        None => cannot.push(format!("{what} ({without})")),
    };
    by(
        event_type,
        "by event type",
        "no event_type column: every event is of type unknown",
    );
    if let Some(last_error) = last_error {
        by(
            last_error,
            "error classes",
            "no last_error column: every failure is of class unknown",
        );
    }
    by(traceparent, "trace links", "no traceparent column");
    Claims { measures, cannot }
}

/// The capability tables of every preset, as docs/presets.md holds them.
pub fn capability_markdown() -> String {
    let mut out = String::new();
    for p in all() {
        let claims = claims(&p);
        out.push_str(&format!(
            "### `{}`\n\n{} ({}, {} against {} {}, proven by `{}`).\n\n\
             **Measures:** {}\n\n**Cannot:** {}\n\n**Notes:** {}\n\n| metric | what it will be |\n|---|---|\n",
            p.name,
            p.summary,
            p.kind(),
            p.proof.as_str(),
            p.library,
            p.versions.join(", "),
            p.test,
            listed(&claims.measures),
            listed(&claims.cannot),
            one_line(&p.notes),
        ));
        for c in capabilities(&p) {
            let how = match &c.how {
                How::Exact => "exact".to_string(),
                How::Bounded(why) => format!("bounded: {why}"),
                How::Absent(why) => format!("not exported: {why}"),
                How::Zero(why) => format!("always 0: {why}"),
            };
            out.push_str(&format!(
                "| `{}` | {} |\n",
                c.metric,
                how.replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
    out
}

/// `inboxwatch presets NAME`: what it measures, what it cannot, its settings.
pub fn detail(p: &PresetFile) -> String {
    let claims = claims(p);
    format!(
        "# {name}: {summary}\n# {proof} against {library} {versions} ({registry}); proven by {test}\n#\n\
         # {measures}\n#\n# {cannot}\n#\n# {notes}\n#\n\
         # What each metric will be:\n{capabilities}#\n\
         # Use: `preset = \"{name}\"`, with a `name` and a `dsn`.\n\
         # Any key below that the entry also writes overrides the preset's.\n{settings}",
        name = p.name,
        summary = p.summary,
        proof = p.proof.as_str(),
        library = p.library,
        versions = p.versions.join(", "),
        registry = p.registry,
        test = p.test,
        measures = wrap_comment("Measures:", &listed(&claims.measures)),
        cannot = wrap_comment("Cannot:", &listed(&claims.cannot)),
        notes = wrap_comment("Notes:", &p.notes),
        settings = p.settings_toml(),
        capabilities = capabilities(p)
            .iter()
            .map(|c| format!("#   {}\n", c.line()))
            .collect::<String>(),
    )
}

/// Claims as one sentence: `a, b, c.`, or `nothing.`
fn listed(claims: &[String]) -> String {
    if claims.is_empty() {
        "nothing.".to_string()
    } else {
        format!("{}.", claims.join(", "))
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Prose re-flowed as `# ` comment lines of at most 88 characters.
fn wrap_comment(head: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in std::iter::once(head).chain(text.split_whitespace()) {
        if !line.is_empty() && line.len() + 1 + word.len() > 86 {
            out.push_str(&line);
            out.push_str("\n# ");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_file_reads_and_says_how_it_was_proven() {
        let presets = all();
        assert_eq!(presets.len(), PRESETS.len());
        for p in &presets {
            assert!(
                matches!(p.kind(), "inbox" | "outbox"),
                "{}: kind {:?}",
                p.name,
                p.kind()
            );
            assert!(!p.table().is_empty(), "{}: no table", p.name);
            assert!(!p.versions.is_empty(), "{}: no versions", p.name);
            for key in ["name", "dsn", "dsn_file", "preset"] {
                assert!(
                    !p.source.contains_key(key),
                    "{}: a preset never sets `{key}`",
                    p.name
                );
            }
            let test_file = p.test.split("::").next().unwrap_or_default();
            assert!(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(test_file)
                    .is_file(),
                "{}: its test {test_file} does not exist",
                p.name
            );
        }
    }

    /// docs/presets.md carries every preset's capability table as the code
    /// works it out (`INBOXWATCH_WRITE_DOCS=1 cargo test --lib presets`
    /// rewrites it).
    #[test]
    fn docs_hold_the_capability_table_of_every_preset() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/presets.md");
        let doc = std::fs::read_to_string(&path).expect("docs/presets.md");
        let (begin, end) = (
            "<!-- BEGIN capability tables: generated from the presets, checked by a unit test -->\n",
            "<!-- END capability tables -->",
        );
        let at = doc
            .find(begin)
            .expect("docs/presets.md has the BEGIN marker")
            + begin.len();
        let to = doc.find(end).expect("docs/presets.md has the END marker");
        let expected = capability_markdown();
        if std::env::var_os("INBOXWATCH_WRITE_DOCS").is_some() {
            let updated = format!("{}{expected}{}", &doc[..at], &doc[to..]);
            std::fs::write(&path, updated).expect("write docs/presets.md");
            return;
        }
        assert!(
            doc[at..to] == expected,
            "docs/presets.md's capability tables are out of date; they should read:\n{expected}"
        );
    }
}
