//! `inboxwatch schema`: the recommended tables for a dialect (`--dialect`,
//! from the registry), or the indexes each source of a config needs
//! (`--config`, from each source's kind).

use crate::config::{Config, is_table_name};
use crate::dsn::Dialect;
use crate::sources;

/// `schema --dialect`: the recommended tables, named by the flags; `Err` is
/// the usage error (no dialect, or a flag's value that is not a table name).
pub fn recommended(
    dialect: Option<Dialect>,
    table: &str,
    outbox_table: Option<&str>,
    audit_table: Option<&str>,
) -> Result<String, String> {
    let dialect = dialect.ok_or("--dialect: required (or --config)")?;
    for (flag, name) in [
        ("--table", Some(table)),
        ("--outbox-table", outbox_table),
        ("--audit-table", audit_table),
    ] {
        if let Some(name) = name.filter(|n| !is_table_name(n)) {
            return Err(format!("{flag}: \"{name}\" is not a table name"));
        }
    }
    Ok(sources::recommended_schema(
        dialect,
        table,
        outbox_table,
        audit_table,
    ))
}

/// `schema --config`: for each source, the indexes its queries need and the
/// audit table of its dead-letter actions, each under a comment naming it.
pub fn indexes(config: &Config) -> String {
    let mut out = String::new();
    for source in &config.sources {
        if let Some(schema) = source.schema() {
            out.push_str(&format!(
                "-- source \"{}\" ({})\n{}",
                source.name(),
                source.describe(),
                schema.indexes()
            ));
        }
        if let Some(ddl) = source.dead_letter_actions().and_then(|a| a.audit_ddl()) {
            out.push_str(&format!(
                "-- source \"{}\": the audit table of dead-letters replay / ignore\n{ddl}",
                source.name()
            ));
        }
        if let Some((dialect, table)) = source.topic_replay().and_then(|r| r.audit_table()) {
            out.push_str(&format!(
                "-- source \"{}\": the audit table of dead-letters replay --topic\n{}",
                source.name(),
                crate::sources::audit_ddl(dialect, table)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_that_is_no_table_name_is_a_usage_error() {
        let e = recommended(Some(Dialect::Postgres), "inbox", None, Some("a;b"));
        assert_eq!(e, Err("--audit-table: \"a;b\" is not a table name".into()));
        let e = recommended(None, "inbox", None, None);
        assert_eq!(e, Err("--dialect: required (or --config)".into()));
    }

    #[test]
    fn the_audit_table_follows_the_tables_after_an_empty_line() {
        let text = recommended(
            Some(Dialect::Sqlite),
            "inbox",
            Some("outbox"),
            Some("audit"),
        )
        .expect("table names");
        let audit = text
            .find("\n\n-- Dead-letter actions")
            .expect("the audit table");
        let outbox = text.find("-- Outbox table").expect("the outbox");
        assert!(outbox < audit, "{text}");
    }
}
