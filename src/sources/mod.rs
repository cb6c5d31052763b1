//! Sources poll what the consumers leave behind. Each kind of source is a
//! folder here that owns its settings, its poll, its election, its `doctor`
//! checks and what it offers beyond polling (lookups, dead-letter actions
//! and topics, presets), behind [`kind::Kind`]; the loop they all run in is
//! [`run`]. This file is the registry: the one list of kinds.
//!
//! Adding a kind: a folder with a type implementing [`kind::Kind`], one line
//! in [`kinds!`] below (docs/architecture.md has the recipe).

pub mod common;
pub mod kafka;
pub mod kind;
pub mod lag_status;
pub mod nats;
pub mod poll_loop;
pub mod queue;
pub mod rabbitmq;
pub mod redis_streams;
pub mod table;

use toml::Spanned;
use toml::de::DeValue;

use crate::card::{Card, Past};
use crate::dsn::Dialect;
use crate::telemetry::catalogue as metric;
use crate::telemetry::values::Reading;
use crate::validation::Validator;
use kind::{
    DeadLetterActions, DeadLetterTopics, Finding, Kind, Lookups, Preset, Runtime, Schema,
    TopicReplay,
};

/// Declares [`SourceSpec`], one variant per kind, and its methods, each of
/// which hands over to the kind: nothing outside a kind's folder matches on it.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident($spec:ty),)+) => {
        /// One validated source, of whichever kind. A handful per agent, read
        /// once: the size of the largest kind's settings does not matter.
        #[derive(Debug, Clone)]
        #[allow(clippy::large_enum_variant)]
        pub enum SourceSpec {
            $($(#[$doc])* $variant($spec),)+
        }

        impl SourceSpec {
            /// Every `kind = "…"` the file may say, in the registry's order.
            pub const KINDS: &[&str] = &[$(<$spec as Kind>::KIND),+];

            /// Reads and checks one entry of kind `kind`; `None` when no kind
            /// has that name, `Some(None)` when the entry has problems.
            pub fn check(
                kind: &str,
                key: &str,
                name: String,
                entry: Spanned<DeValue<'_>>,
                v: &mut Validator<'_>,
            ) -> Option<Option<SourceSpec>> {
                $(if kind == <$spec as Kind>::KIND {
                    return Some(check::<$spec>(key, name, entry, v).map(SourceSpec::$variant));
                })+
                None
            }

            /// The kinds other than `kind` that take the key at `path`.
            fn owners(kind: &str, path: &[String]) -> Vec<&'static str> {
                let mut out = Vec::new();
                $(if kind != <$spec as Kind>::KIND && <$spec as Kind>::knows(path) {
                    out.push(<$spec as Kind>::KIND);
                })+
                out
            }

            /// The configured name (the `source` label).
            pub fn name(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.name(),)+ }
            }

            /// The team that owns the source, "" when none is configured.
            pub fn owner(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.owner(),)+ }
            }

            /// The kind's name (`inbox`, `outbox`, `kafka`).
            pub fn kind(&self) -> &'static str {
                match self { $(SourceSpec::$variant(_) => <$spec as Kind>::KIND,)+ }
            }

            /// The `service` label of the source's info series.
            pub fn service(&self) -> &str {
                match self { $(SourceSpec::$variant(s) => s.service(),)+ }
            }

            /// Starts the source's election and poll loop, after exporting
            /// its info series (every agent exports it, leader or not, so
            /// that the rules' `group_left(owner)` joins always find it).
            pub fn start(self, rt: &mut Runtime) -> anyhow::Result<()> {
                metrics::gauge!(
                    metric::SOURCE_INFO,
                    "source" => self.name().to_string(),
                    "kind" => self.kind(),
                    "owner" => self.owner().to_string(),
                    "service" => self.service().to_string()
                )
                .set(1.0);
                match self { $(SourceSpec::$variant(s) => s.start(rt),)+ }
            }

            /// What `doctor` prints after the name.
            pub fn describe(&self) -> String {
                match self { $(SourceSpec::$variant(s) => s.describe(),)+ }
            }

            /// `doctor`'s checks of the source.
            pub async fn doctor(&self) -> Vec<Finding> {
                match self { $(SourceSpec::$variant(s) => s.doctor().await,)+ }
            }

            /// The source's status card.
            pub fn card(&self, values: &Reading<'_>, past: &dyn Past) -> Card {
                match self { $(SourceSpec::$variant(s) => s.card(values, past),)+ }
            }

            /// What each poll reads, in words.
            pub fn reads(&self) -> String {
                match self { $(SourceSpec::$variant(s) => s.reads(),)+ }
            }

            /// The lookups, if `trace` and `dead-letters` can search the source.
            pub fn lookups(&self) -> Option<&dyn Lookups> {
                match self { $(SourceSpec::$variant(s) => s.lookups(),)+ }
            }

            /// `dead-letters replay` / `ignore`, if the source's kind has them.
            pub fn dead_letter_actions(&self) -> Option<&dyn DeadLetterActions> {
                match self { $(SourceSpec::$variant(s) => s.dead_letter_actions(),)+ }
            }

            /// The source's dead-letter topics, if `dead-letters` reads them.
            pub fn dead_letter_topics(&self) -> Option<&dyn DeadLetterTopics> {
                match self { $(SourceSpec::$variant(s) => s.dead_letter_topics(),)+ }
            }

            /// `dead-letters replay --topic`, if the source's kind sends
            /// dead-letter records back.
            pub fn topic_replay(&self) -> Option<&dyn TopicReplay> {
                match self { $(SourceSpec::$variant(s) => s.topic_replay(),)+ }
            }

            /// The indexes of the tables the source reads, if it reads tables.
            pub fn schema(&self) -> Option<&dyn Schema> {
                match self { $(SourceSpec::$variant(s) => s.schema(),)+ }
            }

            /// Every kind's presets, each with the kind it makes, in the
            /// registry's order.
            pub fn presets() -> Vec<(&'static str, Box<dyn Preset>)> {
                let mut out = Vec::new();
                $(out.extend(
                    <$spec as Kind>::presets().into_iter().map(|p| (<$spec as Kind>::KIND, p)),
                );)+
                out
            }
        }
    };
}

kinds! {
    /// An inbox / processing-record table.
    Inbox(table::InboxSpec),
    /// An outbox table.
    Outbox(table::OutboxSpec),
    /// A Kafka cluster's consumer groups and topics.
    Kafka(kafka::KafkaSpec),
    /// A NATS server's JetStream streams and durable consumers.
    Nats(nats::NatsSpec),
    /// A RabbitMQ broker's queues, through its management API.
    RabbitMq(rabbitmq::RabbitSpec),
    /// A Redis server's streams and their consumer groups.
    RedisStreams(redis_streams::RedisStreamsSpec),
}

/// `inboxwatch schema --dialect`: the recommended tables of the table kinds
/// (an inbox table, an outbox table if named) and, if named, the audit table
/// of the dead-letter actions, after an empty line.
pub fn recommended_schema(
    dialect: Dialect,
    inbox: &str,
    outbox: Option<&str>,
    audit: Option<&str>,
) -> String {
    let mut out = table::schema::ddl(dialect, inbox, outbox);
    if let Some(audit) = audit {
        out.push('\n');
        out.push_str(&table::schema::audit_ddl(dialect, audit));
    }
    out
}

/// The DDL of the audit table of the dead-letter actions, in `dialect`:
/// the table kind's, which every kind that audits writes the same rows to.
pub fn audit_ddl(dialect: Dialect, table: &str) -> String {
    table::schema::audit_ddl(dialect, table)
}

/// Reads and validates one entry as a `K`: every key `K` does not take is
/// reported, with the kinds that do take it, and every setting is checked
/// even then, so that one run names every problem.
fn check<K: Kind>(
    key: &str,
    name: String,
    entry: Spanned<DeValue<'_>>,
    v: &mut Validator<'_>,
) -> Option<K> {
    let before = v.count();
    let (raw, unknown) = K::read(v, key, entry);
    for u in &unknown {
        let owners = SourceSpec::owners(K::KIND, &u.path);
        let owner = (!owners.is_empty()).then(|| format!("{} sources", and_list(&owners)));
        let here = format!("{} sources", K::KIND);
        let mut expected = K::keys_at(u.parent());
        if u.path.len() == 1 {
            expected.splice(0..0, ["name", "kind"]);
            if !K::presets().is_empty() {
                expected.insert(2, "preset");
            }
        }
        v.unknown_key(
            u,
            &expected,
            owner
                .as_deref()
                .map(|o| format!("{o}, not of {here}"))
                .as_deref(),
        );
    }
    let spec = K::validate(raw?, key, name, v);
    if v.count() > before { None } else { spec }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    /// The problems of a config with one entry.
    fn problems(entry: &str) -> Vec<String> {
        match crate::config::parse_str(&format!("[[sources]]\nname = \"a\"\n{entry}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Guards where `preset` is offered: among the keys an unknown key of an
    /// entry could have been, for a kind that has presets (inbox), never for
    /// one that has none (kafka).
    #[test]
    fn only_kinds_with_presets_take_the_preset_key() {
        let inbox =
            problems("kind = \"inbox\"\ndsn = \"postgres://u@h/db\"\ntable = \"t\"\nbogus = 1\n");
        assert!(
            inbox.len() == 1 && inbox[0].contains("`name`, `kind`, `preset`, "),
            "{inbox:?}"
        );
        let kafka = problems("kind = \"kafka\"\nbrokers = [\"a:9092\"]\nbogus = 1\n");
        assert!(
            kafka.len() == 1
                && kafka[0].contains("`name`, `kind`, `owner`, ")
                && kafka[0].contains("`brokers`"),
            "{kafka:?}"
        );
        assert!(!kafka[0].contains("`preset`"), "{kafka:?}");
    }

    /// Guards that every kind says what each poll reads (the start line, the
    /// status card and API), not only the table kinds.
    #[test]
    fn every_kind_says_what_each_poll_reads() {
        let config = crate::config::parse_str(
            "[[sources]]\nname = \"i\"\nkind = \"inbox\"\ndsn = \"postgres://u@h/db\"\ntable = \"t\"\n\
             [[sources]]\nname = \"o\"\nkind = \"outbox\"\ndsn = \"postgres://u@h/db\"\ntable = \"t\"\n\
             [[sources]]\nname = \"k\"\nkind = \"kafka\"\nbrokers = [\"a:9092\"]\n\
             [[sources]]\nname = \"n\"\nkind = \"nats\"\nurl = \"nats://a:4222\"\n\
             [[sources]]\nname = \"r\"\nkind = \"rabbitmq\"\nmanagement_url = \"http://h:15672\"\nusername = \"m\"\npassword = \"p\"\n\
             [[sources]]\nname = \"s\"\nkind = \"redis_streams\"\nurl = \"redis://h:6379/0\"\nstreams = [\"orders\"]\n",
        )
        .expect("a valid config");
        let kinds: Vec<&str> = config.sources.iter().map(|s| s.kind()).collect();
        assert_eq!(kinds, super::SourceSpec::KINDS);
        for spec in &config.sources {
            let reads = spec.reads();
            assert!(
                reads.contains("each poll reads"),
                "{}: {reads}",
                spec.name()
            );
        }
    }
}
