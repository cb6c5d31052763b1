//! `cursor = "events"`: the counters of an inbox source from an append-only
//! log of status changes (procrastinate's `procrastinate_events`, pgqueuer's
//! `pgqueuer_log`), tailed by the log's increasing id, for job tables that
//! keep no times of their own or delete their finished rows.
//!
//! Each event is read as one version of its job's row and counted by the
//! inbox's rules: the status its kind means, the job's first arrival in the
//! log, its last start up to this event, and the starts up to it as the
//! attempts. Ids are handed out before their transactions commit, so a lower
//! id can become visible after a higher one: every poll re-reads the ids
//! above the highest one read a look-back ago and skips those already taken
//! ([`IdWindow`]) — nothing lost within the overlap window, nothing counted
//! twice. The gauges still come from re-reading the jobs table's unfinished
//! rows, whose arrival and start times may come from the log too.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use serde::Deserialize;
use sqlx::AnyConnection;

use super::meaning::Status;
use super::sql::Sql;
use super::{TableKind, TableSource, Window, get, query_error};
use crate::sources::poll_loop::SourceError;
use crate::validation::{Validator, is_identifier, is_table_name};

/// `[sources.events]` as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawEvents {
    /// The log table; without a schema, in the schema of the source's `table`.
    pub table: Option<String>,
    /// The log's increasing id (bigserial / identity).
    pub id: Option<String>,
    /// The column holding the job's id (the jobs table's `columns.event_id`).
    pub event_id: Option<String>,
    /// The column naming what happened.
    pub kind: Option<String>,
    /// When it happened.
    pub at: Option<String>,
    /// The event type, when the log carries it (else the jobs table's, joined).
    pub event_type: Option<String>,
    /// Kinds that mean: the job arrived (again, after a failed attempt).
    pub received: Option<Vec<String>>,
    /// An attempt started.
    pub started: Option<Vec<String>>,
    /// An attempt failed and will be retried.
    pub failed: Option<Vec<String>>,
    /// The job succeeded.
    pub succeeded: Option<Vec<String>>,
    /// The job failed for good.
    pub dead: Option<Vec<String>>,
}

/// A checked `[sources.events]`.
#[derive(Debug, Clone)]
pub struct EventsSpec {
    /// The log table, schema-qualified like the source's table.
    pub table: String,
    pub id: String,
    pub event_id: String,
    pub kind: String,
    pub at: String,
    pub event_type: Option<String>,
    /// The kinds of each meaning (received = pending, started = processing).
    pub kinds: Vec<(Status, Vec<String>)>,
    /// The jobs table's `columns.event_id` and `columns.event_type`.
    pub jobs_event_id: String,
    pub jobs_event_type: Option<String>,
}

/// Checks `[sources.events]` against `cursor`; `jobs_table` gives the log
/// its schema when it names none.
pub(crate) fn events_spec(
    v: &mut Validator<'_>,
    key: &str,
    raw: Option<&RawEvents>,
    with_events: bool,
    jobs_table: &str,
) -> Option<EventsSpec> {
    let at = format!("{key}.events");
    let raw = match (raw, with_events) {
        (Some(r), true) => r,
        (None, false) => return None,
        (Some(_), false) => {
            v.problem(&at, "applies only with cursor = \"events\"".into());
            return None;
        }
        (None, true) => {
            v.problem(
                &at,
                "required with cursor = \"events\": the log table the counters come from".into(),
            );
            return None;
        }
    };
    let before = v.count();
    let table = match raw.table.as_deref() {
        Some(t) if is_table_name(t) && t.contains('.') => t.to_string(),
        Some(t) if is_table_name(t) => match jobs_table.rsplit_once('.') {
            Some((schema, _)) => format!("{schema}.{t}"),
            None => t.to_string(),
        },
        Some(t) => {
            v.problem(
                &format!("{at}.table"),
                format!("\"{t}\" is not a table name (letters, digits, _ and $, optionally schema.table)"),
            );
            String::new()
        }
        None => {
            v.problem(&format!("{at}.table"), "required".into());
            String::new()
        }
    };
    let mut column = |name: &str, value: &Option<String>, required: bool| match value.as_deref() {
        Some(c) if is_identifier(c) => Some(c.to_string()),
        Some(c) => {
            v.problem(
                &format!("{at}.{name}"),
                format!("\"{c}\" is not a column name (letters, digits, _ and $)"),
            );
            None
        }
        None if required => {
            v.problem(&format!("{at}.{name}"), "required".into());
            None
        }
        None => None,
    };
    let id = column("id", &raw.id, true);
    let event_id = column("event_id", &raw.event_id, true);
    let kind = column("kind", &raw.kind, true);
    let when = column("at", &raw.at, true);
    let event_type = column("event_type", &raw.event_type, false);
    let lists = [
        ("received", Status::Pending, &raw.received, true),
        ("started", Status::Processing, &raw.started, true),
        ("failed", Status::Failed, &raw.failed, false),
        ("succeeded", Status::Succeeded, &raw.succeeded, true),
        ("dead", Status::Dead, &raw.dead, false),
    ];
    let mut kinds = Vec::new();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (name, meaning, words, required) in lists {
        let words = words.as_deref().unwrap_or_default();
        if required && words.is_empty() {
            v.problem(
                &format!("{at}.{name}"),
                "required: at least one kind of event".into(),
            );
        }
        for w in words {
            if let Some((other, _)) = seen.iter().find(|(_, s)| *s == w.as_str()) {
                v.problem(
                    &format!("{at}.{name}"),
                    format!("\"{w}\" is also listed under {at}.{other}: a kind has one meaning"),
                );
            }
            seen.push((name, w));
        }
        kinds.push((meaning, words.to_vec()));
    }
    if v.count() > before {
        return None;
    }
    Some(EventsSpec {
        table,
        id: id?,
        event_id: event_id?,
        kind: kind?,
        at: when?,
        event_type,
        kinds,
        jobs_event_id: String::new(),
        jobs_event_type: None,
    })
}

impl EventsSpec {
    fn words(&self, meaning: Status) -> Vec<&str> {
        self.kinds
            .iter()
            .filter(|(m, _)| *m == meaning)
            .flat_map(|(_, w)| w.iter().map(String::as_str))
            .collect()
    }

    /// `alias.kind` is one of the kinds of `meaning`.
    fn is(&self, sql: &Sql, alias: &str, meaning: Status) -> String {
        let words = self.words(meaning);
        if words.is_empty() {
            return "1 = 0".into();
        }
        sql.is_in(
            &sql.text(&format!("{alias}.{}", sql.ident(&self.kind))),
            &words,
        )
    }

    /// `aggregate` over the log's events of `meaning` of the job `job`
    /// (an expression), up to the event `upto` if given: a scalar subquery
    /// that the index on the log's job column answers.
    fn of_job(
        &self,
        sql: &Sql,
        aggregate: &str,
        meaning: Status,
        job: &str,
        upto: Option<&str>,
    ) -> String {
        let upto = upto.map_or(String::new(), |e| {
            format!(" AND l.{id} <= {e}.{id}", id = sql.ident(&self.id))
        });
        format!(
            "(SELECT {aggregate} FROM {} l WHERE l.{} = {job} AND {}{upto})",
            sql.table(&self.table),
            sql.ident(&self.event_id),
            self.is(sql, "l", meaning),
        )
    }

    /// The first arrival of the jobs table's row in the log (a time).
    pub fn first_sql(&self, sql: &Sql, jobs_table: &str) -> String {
        let job = format!(
            "{}.{}",
            sql.table(jobs_table),
            sql.ident(&self.jobs_event_id)
        );
        let at = format!("MIN(l.{})", sql.ident(&self.at));
        self.of_job(sql, &at, Status::Pending, &job, None)
    }

    /// The last start of the jobs table's row in the log (a time).
    pub fn last_start_sql(&self, sql: &Sql, jobs_table: &str) -> String {
        let job = format!(
            "{}.{}",
            sql.table(jobs_table),
            sql.ident(&self.jobs_event_id)
        );
        let at = format!("MAX(l.{})", sql.ident(&self.at));
        self.of_job(sql, &at, Status::Processing, &job, None)
    }

    /// The tail: the events after the id `$1`, in id order, a page of
    /// `batch` — each as a row version in the inbox's select list (see
    /// [`super::inbox`]), with the log's id last.
    pub fn tail_query(&self, sql: &Sql, jobs_table: &str, batch: usize) -> String {
        let id = format!("e.{}", sql.ident(&self.id));
        let job = format!("e.{}", sql.ident(&self.event_id));
        let at = format!("e.{}", sql.ident(&self.at));
        let (event_type, join) = match (&self.event_type, &self.jobs_event_type) {
            (Some(t), _) => (sql.text(&format!("e.{}", sql.ident(t))), String::new()),
            (None, Some(t)) => (
                sql.text(&format!("j.{}", sql.ident(t))),
                format!(
                    " LEFT JOIN {} j ON j.{} = {job}",
                    sql.table(jobs_table),
                    sql.ident(&self.jobs_event_id)
                ),
            ),
            (None, None) => ("NULL".into(), String::new()),
        };
        let mut status = String::from("CASE");
        for meaning in [
            Status::Pending,
            Status::Processing,
            Status::Failed,
            Status::Succeeded,
            Status::Dead,
        ] {
            status.push_str(&format!(
                " WHEN {} THEN '{}'",
                self.is(sql, "e", meaning),
                meaning.as_str()
            ));
        }
        status.push_str(" END");
        let terminal = format!(
            "({} OR {})",
            self.is(sql, "e", Status::Succeeded),
            self.is(sql, "e", Status::Dead)
        );
        let all: Vec<&str> = self
            .kinds
            .iter()
            .flat_map(|(_, w)| w.iter().map(String::as_str))
            .collect();
        let l_at = format!("l.{}", sql.ident(&self.at));
        let list = [
            sql.text(&job),
            event_type,
            status,
            sql.micros(&self.of_job(sql, &format!("MIN({l_at})"), Status::Pending, &job, None)),
            sql.micros(&self.of_job(
                sql,
                &format!("MAX({l_at})"),
                Status::Processing,
                &job,
                Some("e"),
            )),
            format!("CASE WHEN {terminal} THEN {} END", sql.micros(&at)),
            sql.int(&self.of_job(sql, "COUNT(*)", Status::Processing, &job, Some("e"))),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            sql.micros(&at),
            sql.int(&id),
        ];
        format!(
            "SELECT {} FROM {} e{join} WHERE {id} > {} AND {} IN {} ORDER BY {id} {}",
            list.join(", "),
            sql.table(&self.table),
            sql.placeholder(1),
            sql.text(&format!("e.{}", sql.ident(&self.kind))),
            sql.in_list(&all),
            sql.limit(batch),
        )
    }

    /// The highest id in the log now: where the agent starts.
    pub fn high_query(&self, sql: &Sql) -> String {
        format!(
            "SELECT {} FROM {}",
            sql.int(&format!("MAX({})", sql.ident(&self.id))),
            sql.table(&self.table)
        )
    }
}

/// Which ids of the log were taken, for re-reading a window of them: a poll
/// reads the ids above the highest one read by the latest poll at least its
/// look-back ago, and takes only those not taken before. A lower id that
/// commits after a higher one was read is found by the next poll looking
/// back past that read. Memory: one mark per poll and one id per event
/// within the overlap window.
#[derive(Debug, Default)]
pub struct IdWindow {
    /// (database time of a poll, highest id read by then), oldest first.
    marks: VecDeque<(i64, i64)>,
    /// Ids above the oldest mark that were taken.
    taken: BTreeSet<i64>,
    /// The highest id read so far.
    high: i64,
}

impl IdWindow {
    /// The first poll, at `now`: ids up to `high` predate the agent.
    pub fn start(&mut self, now: i64, high: i64) {
        self.high = high;
        self.marks.clear();
        self.marks.push_back((now, high));
        self.taken.clear();
    }

    pub fn started(&self) -> bool {
        !self.marks.is_empty()
    }

    /// The id after which a poll at `now` looking back `lookback`
    /// microseconds reads: the highest id read by the latest poll at least
    /// that long ago (the first poll's, while the agent is younger).
    pub fn after(&self, now: i64, lookback: i64) -> i64 {
        let before = now.saturating_sub(lookback);
        self.marks
            .iter()
            .rev()
            .find(|(t, _)| *t <= before)
            .or(self.marks.front())
            .map_or(i64::MIN, |(_, h)| *h)
    }

    /// Whether `id` was not taken before; it is taken from now on.
    pub fn take(&mut self, id: i64) -> bool {
        self.high = self.high.max(id);
        self.taken.insert(id)
    }

    /// Ends a poll at `now`: notes the highest id read, and forgets the marks
    /// and ids that no poll looking back at most `overlap` reads again.
    pub fn end(&mut self, now: i64, overlap: i64) {
        self.marks.push_back((now, self.high));
        let before = now.saturating_sub(overlap);
        while self.marks.len() > 1 && self.marks[1].0 <= before {
            self.marks.pop_front();
        }
        let floor = self.after(now, overlap);
        self.taken = self.taken.split_off(&floor.saturating_add(1));
    }

    /// Ids kept as taken (for tests and `doctor`).
    pub fn kept(&self) -> usize {
        self.taken.len()
    }
}

/// The tail of a source's events log.
pub(crate) struct EventsTail {
    pub spec: Arc<EventsSpec>,
    pub window: IdWindow,
}

impl<K: TableKind> TableSource<K> {
    /// Reads the events log from the window's look-back, page by page, and
    /// counts each event not taken before; the first poll only notes where
    /// the log ends.
    pub(super) async fn tail_events(
        &mut self,
        tx: &mut AnyConnection,
        w: &Window,
    ) -> Result<u64, SourceError> {
        let Some(tail) = self.events.as_mut() else {
            return Ok(0);
        };
        let spec = tail.spec.clone();
        let overlap = i64::try_from(self.spec.overlap.as_micros()).unwrap_or(i64::MAX);
        if !tail.window.started() {
            let high: Option<i64> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(spec.high_query(&self.sql)))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(query_error)?;
            tail.window.start(w.db_now, high.unwrap_or(i64::MIN));
            return Ok(1);
        }
        let query = spec.tail_query(&self.sql, &self.spec.table, self.spec.batch_size);
        let mut after = tail.window.after(w.db_now, w.lookback);
        let mut rows_read = 0u64;
        loop {
            let rows = sqlx::query(sqlx::AssertSqlSafe(query.clone()))
                .bind(after)
                .fetch_all(&mut *tx)
                .await
                .map_err(query_error)?;
            rows_read += rows.len() as u64;
            for row in &rows {
                let id: Option<i64> = get(row, 12, "events.id").map_err(SourceError::Schema)?;
                let Some(id) = id else { continue };
                after = after.max(id);
                let tail = self.events.as_mut().expect("checked above");
                if tail.window.take(id) {
                    self.kind.observe_event(row).map_err(SourceError::Schema)?;
                }
            }
            if rows.len() < self.spec.batch_size {
                break;
            }
        }
        if let Some(tail) = self.events.as_mut() {
            tail.window.end(w.db_now, overlap);
        }
        Ok(rows_read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    /// Takes the visible ids after the window's look-back; returns the new ones.
    fn poll(w: &mut IdWindow, now: i64, lookback: i64, visible: &[i64]) -> Vec<i64> {
        let after = w.after(now, lookback);
        let new = visible
            .iter()
            .copied()
            .filter(|id| *id > after)
            .filter(|id| w.take(*id))
            .collect();
        w.end(now, 10 * S);
        new
    }

    #[test]
    fn a_lower_id_committing_late_is_taken_once_by_a_poll_looking_back_past_it() {
        let mut w = IdWindow::default();
        w.start(0, 10);
        // Id 11 is handed out first but commits after 12 and 13.
        assert_eq!(poll(&mut w, S, 2 * S, &[12, 13]), vec![12, 13]);
        assert_eq!(poll(&mut w, 2 * S, 2 * S, &[12, 13]), Vec::<i64>::new());
        // Four seconds later: a short look-back starts after 13 and misses 11 ...
        assert_eq!(poll(&mut w, 6 * S, 2 * S, &[11, 12, 13]), Vec::<i64>::new());
        // ... the sweep looking back the whole overlap takes it, and only it.
        assert_eq!(poll(&mut w, 7 * S, 10 * S, &[11, 12, 13, 14]), vec![11, 14]);
        assert_eq!(
            poll(&mut w, 8 * S, 10 * S, &[11, 12, 13, 14]),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn ids_up_to_the_start_predate_the_agent() {
        let mut w = IdWindow::default();
        w.start(0, 10);
        assert_eq!(poll(&mut w, S, 10 * S, &[9, 10, 11]), vec![11]);
    }

    #[test]
    fn ids_older_than_the_overlap_are_forgotten_and_never_read_again() {
        let mut w = IdWindow::default();
        w.start(0, 0);
        for t in 1..=30 {
            poll(&mut w, t * S, 10 * S, &[t]);
        }
        // Only the ids read within the last overlap window are kept.
        assert!(w.kept() <= 11, "kept {}", w.kept());
        assert_eq!(w.after(30 * S, 10 * S), 20);
        // A late id below the floor is beyond the overlap window: not read.
        assert_eq!(poll(&mut w, 31 * S, 10 * S, &[5, 31]), vec![31]);
    }

    #[test]
    fn an_unqualified_log_takes_the_schema_of_the_jobs_table() {
        let raw = RawEvents {
            table: Some("procrastinate_events".into()),
            id: Some("id".into()),
            event_id: Some("job_id".into()),
            kind: Some("type".into()),
            at: Some("at".into()),
            received: Some(vec!["deferred".into()]),
            started: Some(vec!["started".into()]),
            succeeded: Some(vec!["succeeded".into()]),
            dead: Some(vec!["failed".into()]),
            ..RawEvents::default()
        };
        let env = |_: &str| None;
        let mut v = Validator::new("", crate::validation::Environment::Process, &env);
        let spec = events_spec(
            &mut v,
            "sources[0]",
            Some(&raw),
            true,
            "app.procrastinate_jobs",
        )
        .expect("valid");
        assert_eq!(spec.table, "app.procrastinate_events");
        let spec = events_spec(&mut v, "sources[0]", Some(&raw), true, "procrastinate_jobs")
            .expect("valid");
        assert_eq!(spec.table, "procrastinate_events");
    }

    #[test]
    fn mistakes_are_named_by_their_key() {
        let problems = |raw: Option<&RawEvents>, with_events: bool| {
            let env = |_: &str| None;
            let mut v = Validator::new("", crate::validation::Environment::Process, &env);
            events_spec(&mut v, "sources[0]", raw, with_events, "jobs");
            v.into_problems()
                .into_iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            problems(None, true),
            [
                "sources[0].events: required with cursor = \"events\": the log table the counters come from"
            ]
        );
        let raw = RawEvents {
            table: Some("log".into()),
            id: Some("id".into()),
            event_id: Some("job id".into()),
            at: Some("at".into()),
            received: Some(vec!["queued".into()]),
            started: Some(vec!["queued".into()]),
            succeeded: Some(vec!["done".into()]),
            ..RawEvents::default()
        };
        assert_eq!(
            problems(Some(&raw), false),
            ["sources[0].events: applies only with cursor = \"events\""]
        );
        assert_eq!(
            problems(Some(&raw), true),
            [
                "sources[0].events.event_id: \"job id\" is not a column name (letters, digits, _ and $)",
                "sources[0].events.kind: required",
                "sources[0].events.started: \"queued\" is also listed under sources[0].events.received: a kind has one meaning",
            ]
        );
    }
}
