//! `[[sources.status_rules]]`: a row's status worked out from its columns,
//! for tables without a status column (or with one that is not enough).
//!
//! A rule's `when` is a small grammar, parsed and checked here and compiled
//! into SQL per dialect — never passed through:
//!
//! ```text
//! when      = "true" | condition { "AND" condition }
//! condition = column "IS" [ "NOT" ] "NULL"
//!           | column op operand
//! op        = "=" | "<>" | "<" | "<=" | ">" | ">="
//! operand   = column | integer | 'quoted word' | "now()"
//! ```
//!
//! The rules are tried in order, first match wins, before the status words
//! of `[sources.statuses]` (which then only apply to rows no rule matched).

use super::meaning::{Status, StatusMap};
use super::sql::Sql;
use crate::dsn::Dialect;
use crate::validation::is_identifier;

/// One rule: rows matching `when` have status `meaning`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub meaning: Status,
    pub when: Condition,
}

/// A parsed `when`: every condition must hold (an empty list is `true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub all: Vec<Atom>,
}

/// One condition of a `when`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Atom {
    IsNull {
        column: String,
        negated: bool,
    },
    Compare {
        column: String,
        op: Op,
        operand: Operand,
    },
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn sql(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// The right-hand side of a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    Column(String),
    Int(i64),
    Word(String),
    Now,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Int(i64),
    Word(String),
    Op(Op),
    Now,
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' {
            let mut word = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err("a quoted word is not closed (missing ')".into()),
                    Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                        word.push('\'');
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(ch) => {
                        word.push(*ch);
                        i += 1;
                    }
                }
            }
            out.push(Token::Word(word));
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            i += 1;
            while chars.get(i).is_some_and(|d| d.is_ascii_digit()) {
                i += 1;
            }
            let lit: String = chars[start..i].iter().collect();
            let n = lit
                .parse::<i64>()
                .map_err(|_| format!("{lit} is not a 64-bit integer"))?;
            out.push(Token::Int(n));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while chars
                .get(i)
                .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '_' || *d == '$')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.eq_ignore_ascii_case("now") && chars.get(i) == Some(&'(') {
                if chars.get(i + 1) != Some(&')') {
                    return Err("now takes no arguments: write now()".into());
                }
                i += 2;
                out.push(Token::Now);
            } else {
                out.push(Token::Ident(word));
            }
        } else {
            let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let (op, len) = match (two.as_str(), c) {
                ("<>", _) | ("!=", _) => (Op::Ne, 2),
                ("<=", _) => (Op::Le, 2),
                (">=", _) => (Op::Ge, 2),
                (_, '=') => (Op::Eq, 1),
                (_, '<') => (Op::Lt, 1),
                (_, '>') => (Op::Gt, 1),
                _ => {
                    return Err(format!(
                        "unexpected \"{c}\": a condition is `column IS [NOT] NULL` or `column OP operand`"
                    ));
                }
            };
            i += len;
            out.push(Token::Op(op));
        }
    }
    Ok(out)
}

fn keyword(t: Option<&Token>, word: &str) -> bool {
    matches!(t, Some(Token::Ident(w)) if w.eq_ignore_ascii_case(word))
}

/// Parses a rule's `when`.
pub fn parse(text: &str) -> Result<Condition, String> {
    let toks = tokens(text)?;
    if toks.is_empty() {
        return Err("empty: write a condition, or `true` for every row".into());
    }
    if toks.len() == 1 && keyword(toks.first(), "true") {
        return Ok(Condition { all: vec![] });
    }
    let mut all = Vec::new();
    let mut i = 0;
    loop {
        let column = match toks.get(i) {
            Some(Token::Ident(c)) if !is_reserved(c) => c.clone(),
            Some(Token::Ident(c)) if c.eq_ignore_ascii_case("true") => {
                return Err("`true` stands alone: it matches every row".into());
            }
            other => {
                return Err(format!("expected a column name, found {}", describe(other)));
            }
        };
        if !is_identifier(&column) {
            return Err(format!("\"{column}\" is not a column name"));
        }
        i += 1;
        if keyword(toks.get(i), "is") {
            i += 1;
            let negated = keyword(toks.get(i), "not");
            if negated {
                i += 1;
            }
            if !keyword(toks.get(i), "null") {
                return Err(format!(
                    "expected NULL after IS{}, found {}",
                    if negated { " NOT" } else { "" },
                    describe(toks.get(i))
                ));
            }
            i += 1;
            all.push(Atom::IsNull { column, negated });
        } else {
            let op = match toks.get(i) {
                Some(Token::Op(op)) => *op,
                other => {
                    return Err(format!(
                        "expected IS [NOT] NULL or one of = <> < <= > >= after \"{column}\", found {}",
                        describe(other)
                    ));
                }
            };
            i += 1;
            let operand = match toks.get(i) {
                Some(Token::Ident(c)) if !is_reserved(c) => Operand::Column(c.clone()),
                Some(Token::Int(n)) => Operand::Int(*n),
                Some(Token::Word(w)) => Operand::Word(w.clone()),
                Some(Token::Now) => Operand::Now,
                other => {
                    return Err(format!(
                        "expected a column, an integer, a 'quoted word' or now() after {}, found {}",
                        op.sql(),
                        describe(other)
                    ));
                }
            };
            i += 1;
            all.push(Atom::Compare {
                column,
                op,
                operand,
            });
        }
        match toks.get(i) {
            None => break,
            Some(t) if keyword(Some(t), "and") => i += 1,
            Some(t) if keyword(Some(t), "or") => {
                return Err(
                    "OR is not supported: write one rule per alternative (first match wins)".into(),
                );
            }
            other => {
                return Err(format!(
                    "expected AND or the end, found {}",
                    describe(other)
                ));
            }
        }
    }
    Ok(Condition { all })
}

fn is_reserved(word: &str) -> bool {
    ["and", "or", "is", "not", "null", "true", "false"]
        .iter()
        .any(|k| word.eq_ignore_ascii_case(k))
}

fn describe(t: Option<&Token>) -> String {
    match t {
        None => "the end".into(),
        Some(Token::Ident(w)) => format!("\"{w}\""),
        Some(Token::Int(n)) => n.to_string(),
        Some(Token::Word(w)) => format!("'{w}'"),
        Some(Token::Op(op)) => format!("\"{}\"", op.sql()),
        Some(Token::Now) => "now()".into(),
    }
}

impl Condition {
    /// Whether the condition holds for every row.
    pub fn is_true(&self) -> bool {
        self.all.is_empty()
    }

    /// The columns the condition reads.
    pub fn columns(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for atom in &self.all {
            match atom {
                Atom::IsNull { column, .. } => out.push(column.as_str()),
                Atom::Compare {
                    column, operand, ..
                } => {
                    out.push(column.as_str());
                    if let Operand::Column(c) = operand {
                        out.push(c.as_str());
                    }
                }
            }
        }
        out
    }

    /// The condition as a user reads it, in `sql`'s dialect.
    pub fn describe(&self, sql: &Sql) -> String {
        if self.all.is_empty() {
            "true".into()
        } else {
            self.sql(sql)
        }
    }

    /// The condition in `sql`'s dialect.
    pub fn sql(&self, sql: &Sql) -> String {
        if self.all.is_empty() {
            return "1 = 1".into();
        }
        let parts: Vec<String> = self.all.iter().map(|a| atom_sql(a, sql)).collect();
        parts.join(" AND ")
    }
}

fn atom_sql(atom: &Atom, sql: &Sql) -> String {
    match atom {
        Atom::IsNull { column, negated } => format!(
            "{} IS {}NULL",
            sql.ident(column),
            if *negated { "NOT " } else { "" }
        ),
        Atom::Compare {
            column,
            op,
            operand,
        } => {
            let col = sql.ident(column);
            let (left, right) = match operand {
                Operand::Column(c) => (col, sql.ident(c)),
                Operand::Int(n) => (col, n.to_string()),
                Operand::Word(w) => (col, sql.literal(w)),
                Operand::Now => match sql.dialect {
                    Dialect::Postgres => (col, "now()".to_string()),
                    Dialect::MySql => (col, "UTC_TIMESTAMP(6)".to_string()),
                    // SQLite keeps times as text: compare them as times.
                    Dialect::Sqlite => {
                        (format!("julianday({col})"), "julianday('now')".to_string())
                    }
                },
            };
            format!("{left} {} {right}", op.sql())
        }
    }
}

/// A table's statuses: rules first, then the status column's words.
#[derive(Debug, Clone, Default)]
pub struct Statuses<'a> {
    pub rules: &'a [Rule],
    pub words: Option<(&'a str, &'a StatusMap)>,
}

/// The meanings a row can have, as the SQL of [`meaning_sql`] spells them.
pub const UNFINISHED: [Status; 3] = [Status::Pending, Status::Processing, Status::Failed];

impl Statuses<'_> {
    /// An expression giving each row's meaning (`'pending'`, … `'dead'`),
    /// NULL for a row no rule and no word matches.
    pub fn meaning_sql(&self, sql: &Sql) -> String {
        let mut arms: Vec<String> = self
            .rules
            .iter()
            .map(|r| {
                format!(
                    "WHEN {} THEN {}",
                    r.when.sql(sql),
                    sql.literal(r.meaning.as_str())
                )
            })
            .collect();
        if let Some((column, words)) = self.words {
            for status in Status::ALL {
                let w = words.words_for(status);
                if !w.is_empty() {
                    arms.push(format!(
                        "WHEN {} THEN {}",
                        sql.is_in(&sql.ident(column), &w),
                        sql.literal(status.as_str())
                    ));
                }
            }
        }
        format!("CASE {} END", arms.join(" "))
    }

    /// The condition that selects the unfinished rows: the meaning among
    /// pending, processing and failed, preceded by what the rules before the
    /// first unfinished one exclude (`abandoned_at IS NULL AND processed_at
    /// IS NULL`), which a partial index can be built on.
    pub fn unfinished_sql(&self, sql: &Sql) -> String {
        let names: Vec<&str> = UNFINISHED.iter().map(|s| s.as_str()).collect();
        let mut parts: Vec<String> = self.guard().iter().map(|a| atom_sql(a, sql)).collect();
        parts.push(sql.is_in(&self.meaning_sql(sql), &names));
        parts.join(" AND ")
    }

    /// The part of [`Statuses::unfinished_sql`] that does not change with
    /// time, for the partial index; `None` if the rules give none.
    pub fn index_filter(&self, sql: &Sql) -> Option<String> {
        let guard = self.guard();
        (!guard.is_empty()).then(|| {
            guard
                .iter()
                .map(|a| atom_sql(a, sql))
                .collect::<Vec<_>>()
                .join(" AND ")
        })
    }

    /// Conditions every unfinished row meets: the negation of each
    /// single-condition `IS [NOT] NULL` rule with a finished meaning that
    /// comes before every rule with an unfinished one. (Other negations are
    /// not safe: `NOT (a > 0)` is not `a <= 0` when `a` is NULL.)
    fn guard(&self) -> Vec<Atom> {
        let mut out = Vec::new();
        for rule in self.rules {
            if !rule.meaning.is_terminal() {
                break;
            }
            if let [Atom::IsNull { column, negated }] = rule.when.all.as_slice() {
                out.push(Atom::IsNull {
                    column: column.clone(),
                    negated: !negated,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg() -> Sql {
        Sql {
            dialect: Dialect::Postgres,
        }
    }

    #[test]
    fn the_issues_rules_parse_and_compile() {
        let c = parse("locked_until > now() AND started_attempts > finished_attempts").unwrap();
        assert_eq!(
            c.sql(&pg()),
            "\"locked_until\" > now() AND \"started_attempts\" > \"finished_attempts\""
        );
        assert_eq!(
            c.columns(),
            vec!["locked_until", "started_attempts", "finished_attempts"]
        );
        assert!(parse("true").unwrap().is_true());
        assert!(parse("TRUE").unwrap().is_true());
        let c = parse("abandoned_at is not null").unwrap();
        assert_eq!(c.sql(&pg()), "\"abandoned_at\" IS NOT NULL");
        let c = parse("state = 'it''s' AND attempts >= -1").unwrap();
        assert_eq!(c.sql(&pg()), "\"state\" = 'it''s' AND \"attempts\" >= -1");
        let my = Sql {
            dialect: Dialect::MySql,
        };
        assert_eq!(
            parse("run_at <= now()").unwrap().sql(&my),
            "`run_at` <= UTC_TIMESTAMP(6)"
        );
        let lite = Sql {
            dialect: Dialect::Sqlite,
        };
        assert_eq!(
            parse("run_at != now()").unwrap().sql(&lite),
            "julianday(\"run_at\") <> julianday('now')"
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (text, says) in [
            ("", "empty"),
            ("a > 0 OR b > 0", "OR is not supported"),
            ("a IS NOT", "expected NULL after IS NOT, found the end"),
            ("a >", "expected a column, an integer"),
            ("a ~ 1", "unexpected \"~\""),
            ("a = 'x", "not closed"),
            ("a = 1 b = 2", "expected AND or the end, found \"b\""),
            ("1 = a", "expected a column name, found 1"),
            ("a = 1; DROP TABLE t", "unexpected \";\""),
            ("true AND a IS NULL", "`true` stands alone"),
            ("a = now(1)", "now takes no arguments"),
            ("a = 99999999999999999999", "not a 64-bit integer"),
            ("a = NULL", "expected a column, an integer"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_unfinished_filter_starts_with_what_a_partial_index_can_hold() {
        let rules = vec![
            Rule {
                meaning: Status::Dead,
                when: parse("abandoned_at IS NOT NULL").unwrap(),
            },
            Rule {
                meaning: Status::Succeeded,
                when: parse("processed_at IS NOT NULL").unwrap(),
            },
            Rule {
                meaning: Status::Failed,
                when: parse("finished_attempts > 0").unwrap(),
            },
            Rule {
                meaning: Status::Dead,
                when: parse("gave_up IS NOT NULL").unwrap(),
            },
            Rule {
                meaning: Status::Pending,
                when: parse("true").unwrap(),
            },
        ];
        let s = Statuses {
            rules: &rules,
            words: None,
        };
        assert_eq!(
            s.index_filter(&pg()).unwrap(),
            "\"abandoned_at\" IS NULL AND \"processed_at\" IS NULL"
        );
        let f = s.unfinished_sql(&pg());
        assert!(
            f.starts_with("\"abandoned_at\" IS NULL AND \"processed_at\" IS NULL AND CASE WHEN"),
            "{f}"
        );
        assert!(
            f.ends_with("END IN ('pending', 'processing', 'failed')"),
            "{f}"
        );
        // A rule with an unfinished meaning first: nothing can be excluded.
        let first = [rules[2].clone(), rules[0].clone()];
        let s = Statuses {
            rules: &first,
            words: None,
        };
        assert_eq!(s.index_filter(&pg()), None);
    }

    #[test]
    fn words_follow_the_rules() {
        let rules = vec![Rule {
            meaning: Status::Dead,
            when: parse("attempts >= max_attempts").unwrap(),
        }];
        let words = StatusMap::default();
        let s = Statuses {
            rules: &rules,
            words: Some(("state", &words)),
        };
        assert_eq!(
            s.meaning_sql(&pg()),
            "CASE WHEN \"attempts\" >= \"max_attempts\" THEN 'dead' \
             WHEN \"state\" IN ('pending') THEN 'pending' \
             WHEN \"state\" IN ('processing') THEN 'processing' \
             WHEN \"state\" IN ('succeeded') THEN 'succeeded' \
             WHEN \"state\" IN ('failed') THEN 'failed' \
             WHEN \"state\" IN ('dead') THEN 'dead' END"
        );
    }
}
