//! Checks the Grafana dashboards in `dashboards/` (SPEC §5): every panel query
//! parses as PromQL and selects only metrics of the catalogue (or recording
//! rules defined in `alerts/`) with labels they have, every rate takes
//! `$__rate_interval`, every panel has a unit and a description, uids are stable
//! and unique, the only data source is the `datasource` variable, panels do not
//! overlap, every catalogue metric is shown somewhere, and the flow panels draw
//! production and consumption together and the time to drain without its
//! "not draining" sentinel.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::grafana::{self, dashboards, panels, targets, variables};
use common::{repo_files, repo_read};
use inboxwatch::telemetry::catalogue::{CATALOGUE, Kind};
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr, VectorSelector};
use serde_json::Value;

/// Every dashboard file and the uid it must keep (links and bookmarks use it).
/// A new dashboard is added here.
const EXPECTED: &[(&str, &str, &str)] = &[
    (
        "inboxwatch-overview.json",
        "inboxwatch-overview",
        "inboxwatch / Overview",
    ),
    (
        "inboxwatch-source.json",
        "inboxwatch-source",
        "inboxwatch / Source drill-down",
    ),
    (
        "inboxwatch-agent.json",
        "inboxwatch-agent",
        "inboxwatch / Agent health",
    ),
    (
        "inboxwatch-kafka.json",
        "inboxwatch-kafka",
        "inboxwatch / Kafka",
    ),
    (
        "inboxwatch-queues.json",
        "inboxwatch-queues",
        "inboxwatch / Queues",
    ),
];

/// Catalogue metrics that need not appear on a dashboard, with the reason.
/// Anything else missing from every dashboard fails `every_catalogue_metric_is_shown`.
fn coverage_exemption(name: &str) -> Option<&'static str> {
    if name == "inboxwatch_build_info" {
        return Some("an info metric (value always 1); only useful as a version table");
    }
    if name == "inboxwatch_source_info"
        || name == "kafka_consumer_group_info"
        || name == "queue_consumer_info"
    {
        return Some("an info metric (value always 1): the owner the alert rules join in");
    }
    if name.starts_with("inboxwatch_objective_") {
        return Some("a configured threshold, drawn next to the metric it bounds where useful");
    }
    None
}

/// Grafana unit ids the dashboards may use (a typo would silently show raw numbers).
const UNITS: &[&str] = &[
    "s",
    "ms",
    "dtdurations",
    "percentunit",
    "percent",
    "short",
    "none",
    "cps",
    "ops",
    "reqps",
    "rps",
];

/// Functions whose range must be `$__rate_interval`.
const RATE_FUNCS: &[&str] = &["rate", "irate", "increase"];

/// Labels Prometheus attaches at scrape time, on top of the catalogue's.
const TARGET_LABELS: &[&str] = &["job", "instance"];

const DATASOURCE: &str = "${datasource}";

// Sentinel durations substituted for `$__rate_interval` / `$__interval` when
// checking ranges on the AST, so that a literal `[5m]` cannot pass.
const RATE_SENTINEL: &str = "4321s";
const INTERVAL_SENTINEL: &str = "1234s";

fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

fn title(panel: &Value) -> String {
    panel["title"].as_str().unwrap_or("<untitled>").to_string()
}

/// Replaces Grafana variables in a query: `$__rate_interval` and `$__interval`
/// by the given durations, the other built-ins by plausible values, and every
/// dashboard variable (`$x`, `${x}`, `${x:fmt}`, `[[x]]`) by `.*` (they are only
/// used inside regex matchers).
fn substitute(expr: &str, rate_interval: &str, interval: &str) -> String {
    let builtin = |name: &str| -> Result<String, String> {
        Ok(match name {
            "__rate_interval" => rate_interval.to_string(),
            "__interval" => interval.to_string(),
            "__rate_interval_ms" | "__interval_ms" => "60000".to_string(),
            "__range" => "1h".to_string(),
            "__range_s" => "3600".to_string(),
            "__range_ms" => "3600000".to_string(),
            _ => ".*".to_string(),
        })
    };
    grafana::substitute(expr, builtin).unwrap_or_else(|e| panic!("{e}: {expr}"))
}

/// What a metric name may be selected as: catalogue series (histograms only as
/// `_bucket`, `_sum`, `_count`) or recording rules.
struct Known {
    /// series name → (catalogue metric it belongs to, labels it carries)
    series: BTreeMap<String, (&'static str, BTreeSet<String>)>,
    /// recording rules defined in alerts/*.yml
    rules: BTreeSet<String>,
}

impl Known {
    fn load() -> Known {
        let mut series = BTreeMap::new();
        for def in CATALOGUE {
            let mut labels: BTreeSet<String> = def.labels.iter().map(|l| l.to_string()).collect();
            labels.extend(TARGET_LABELS.iter().map(|l| l.to_string()));
            match def.kind {
                Kind::Histogram => {
                    let mut bucket = labels.clone();
                    bucket.insert("le".into());
                    series.insert(format!("{}_bucket", def.name), (def.name, bucket));
                    series.insert(format!("{}_sum", def.name), (def.name, labels.clone()));
                    series.insert(format!("{}_count", def.name), (def.name, labels));
                }
                Kind::Counter | Kind::Gauge => {
                    series.insert(def.name.to_string(), (def.name, labels));
                }
            }
        }
        Known {
            series,
            rules: recording_rules(),
        }
    }

    fn is_known(&self, name: &str) -> bool {
        self.series.contains_key(name) || self.rules.contains(name)
    }

    fn all_names(&self) -> impl Iterator<Item = &str> {
        self.series
            .keys()
            .map(String::as_str)
            .chain(self.rules.iter().map(String::as_str))
    }
}

/// Names of the recording rules in `alerts/*.yml` / `*.yaml` (`record:` lines).
fn recording_rules() -> BTreeSet<String> {
    let mut rules = BTreeSet::new();
    for file in repo_files("alerts", &[".yml", ".yaml"]) {
        for line in repo_read(&file).lines() {
            let line = line.trim_start().trim_start_matches("- ").trim_start();
            if let Some(name) = line.strip_prefix("record:") {
                let name = name.split('#').next().unwrap().trim();
                rules.insert(name.trim_matches(['"', '\'']).to_string());
            }
        }
    }
    rules
}

/// Labels a recording rule's series keep, read from its name as alerts/inboxwatch.rules.yml
/// names them: `<labels joined by _>:<metric>:<operations>` (`source`, `cluster_group_topic`,
/// `source_error_class`, …), plus `le` for bucket rates and bucket weights and `owner` for
/// the info rules. An error for a name that does not follow the convention.
fn rule_labels(name: &str) -> Result<BTreeSet<String>, String> {
    const LABELS: &[&str] = &["source", "cluster", "group", "topic", "tier", "error_class"];
    let parts: Vec<&str> = name.split(':').collect();
    let [level, metric, ops] = parts[..] else {
        return Err(format!(
            "recording rule `{name}` is not level:metric:operations"
        ));
    };
    let mut labels = BTreeSet::new();
    let mut rest = level;
    while !rest.is_empty() {
        let Some(label) = LABELS
            .iter()
            .find(|l| rest == **l || rest.starts_with(&format!("{l}_")))
        else {
            return Err(format!(
                "recording rule `{name}`: level `{level}` is not made of the labels {LABELS:?}"
            ));
        };
        labels.insert(label.to_string());
        rest = rest[label.len()..].trim_start_matches('_');
    }
    if metric.ends_with("_bucket") || ops == "bucket_weight" {
        labels.insert("le".to_string());
    }
    if metric.ends_with("_info") {
        labels.insert("owner".to_string());
    }
    Ok(labels)
}

/// Every vector selector in an expression (matrix selectors' included, and
/// aggregation parameters, which `promql_parser::util::walk_expr` skips).
fn selectors(expr: &Expr) -> Vec<&VectorSelector> {
    fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a VectorSelector>) {
        match e {
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                if let Some(p) = &a.param {
                    walk(p, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(s) => walk(&s.expr, out),
            Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, out)),
            Expr::VectorSelector(vs) => out.push(vs),
            Expr::MatrixSelector(ms) => out.push(&ms.vs),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    let mut out = Vec::new();
    walk(expr, &mut out);
    out
}

/// Calls of `rate`/`irate`/`increase` and the range each one takes (None when
/// its argument is not a plain matrix selector, e.g. a subquery).
fn rate_ranges(expr: &Expr) -> Vec<(String, Option<Duration>)> {
    fn walk(e: &Expr, out: &mut Vec<(String, Option<Duration>)>) {
        match e {
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                if let Some(p) = &a.param {
                    walk(p, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(s) => walk(&s.expr, out),
            Expr::Call(c) => {
                if RATE_FUNCS.contains(&c.func.name) {
                    let range = match c.args.args.first().map(|a| a.as_ref()) {
                        Some(Expr::MatrixSelector(ms)) => Some(ms.range),
                        _ => None,
                    };
                    out.push((c.func.name.to_string(), range));
                }
                c.args.args.iter().for_each(|a| walk(a, out));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(expr, &mut out);
    out
}

/// Every matcher of a selector, `or` alternatives included.
fn matchers(vs: &VectorSelector) -> impl Iterator<Item = &Matcher> {
    vs.matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten())
}

/// The series names a selector can select; an error for anything unknown or
/// unbounded.
fn selected_names(vs: &VectorSelector, known: &Known) -> Result<BTreeSet<String>, String> {
    let mut names = BTreeSet::new();
    let mut bounded = false;
    if let Some(name) = &vs.name {
        bounded = true;
        if !known.is_known(name) {
            return Err(format!(
                "`{name}` is neither in the catalogue nor a recording rule"
            ));
        }
        names.insert(name.clone());
    }
    for m in matchers(vs).filter(|m| m.name == "__name__") {
        match &m.op {
            MatchOp::Equal => {
                bounded = true;
                if !known.is_known(&m.value) {
                    return Err(format!(
                        "`__name__=\"{}\"` is neither in the catalogue nor a recording rule",
                        m.value
                    ));
                }
                names.insert(m.value.clone());
            }
            MatchOp::Re(re) => {
                bounded = true;
                let hits: Vec<&str> = known.all_names().filter(|n| re.is_match(n)).collect();
                if hits.is_empty() {
                    return Err(format!(
                        "`__name__=~\"{}\"` matches no known metric",
                        m.value
                    ));
                }
                names.extend(hits.into_iter().map(String::from));
            }
            MatchOp::NotEqual | MatchOp::NotRe(_) => {
                return Err(format!(
                    "negative `__name__` matcher `{}` selects unknown metrics",
                    m.value
                ));
            }
        }
    }
    if !bounded {
        return Err(format!("selector `{vs}` has no metric name"));
    }
    // Label names in matchers must exist on the catalogue metric or the recording rule
    // (typos select nothing).
    for name in &names {
        let labels = match known.series.get(name) {
            Some((_, labels)) => labels.clone(),
            None => rule_labels(name)?,
        };
        for m in matchers(vs).filter(|m| m.name != "__name__") {
            if !labels.contains(&m.name) {
                return Err(format!("`{name}` has no label `{}`", m.name));
            }
        }
    }
    Ok(names)
}

/// Checks one query; returns the catalogue metrics it selects.
fn check_query(raw: &str, known: &Known) -> Result<BTreeSet<&'static str>, String> {
    let expr = parser::parse(&substitute(raw, "1m", "1m")).map_err(|e| format!("parse: {e}"))?;
    let mut metrics = BTreeSet::new();
    let sels = selectors(&expr);
    if sels.is_empty() && !raw.contains("vector(") {
        return Err("selects no metric".into());
    }
    for vs in sels {
        for name in selected_names(vs, known)? {
            if let Some((metric, _)) = known.series.get(&name) {
                metrics.insert(*metric);
            }
        }
    }
    // Ranges: parse again with sentinels, so only `$__rate_interval` passes.
    let sentinel = parser::parse(&substitute(raw, RATE_SENTINEL, INTERVAL_SENTINEL))
        .map_err(|e| format!("parse (sentinel ranges): {e}"))?;
    let want = Duration::from_secs(RATE_SENTINEL.trim_end_matches('s').parse().unwrap());
    for (func, range) in rate_ranges(&sentinel) {
        if range != Some(want) {
            return Err(format!("{func}() must take [$__rate_interval]"));
        }
    }
    let calls = RATE_FUNCS
        .iter()
        .map(|f| raw.matches(&format!("{f}(")).count())
        .sum::<usize>()
        // "irate(" also contains "rate("
        - raw.matches("irate(").count();
    let intervals = raw.matches("[$__rate_interval]").count();
    if calls > intervals {
        return Err(format!(
            "{calls} rate/irate/increase call(s) but only {intervals} `[$__rate_interval]`"
        ));
    }
    Ok(metrics)
}

#[test]
fn every_expected_dashboard_exists_with_its_uid_and_title() {
    let dashes = dashboards();
    let files: BTreeSet<&str> = dashes.iter().map(|d| d.file.as_str()).collect();
    for (file, uid, title) in EXPECTED {
        let d = dashes
            .iter()
            .find(|d| d.file == *file)
            .unwrap_or_else(|| panic!("dashboards/{file} is missing"));
        assert_eq!(d.json["uid"], *uid, "{file}: uid");
        assert_eq!(d.json["title"], *title, "{file}: title");
    }
    for file in files {
        assert!(
            EXPECTED.iter().any(|(f, _, _)| *f == file),
            "dashboards/{file} has no expected uid in tests/dashboards.rs EXPECTED; add it"
        );
    }
    let mut uids = BTreeSet::new();
    for d in &dashes {
        let uid = d.json["uid"].as_str().unwrap_or_default();
        assert!(
            uids.insert(uid.to_string()),
            "{}: duplicate uid {uid}",
            d.file
        );
        assert!(
            (39..=41).contains(&d.json["schemaVersion"].as_u64().unwrap_or(0)),
            "{}: schemaVersion should be 39..=41 (Grafana 10/11)",
            d.file
        );
        assert!(
            d.json["id"].is_null(),
            "{}: dashboard id must be null",
            d.file
        );
    }
}

#[test]
fn only_the_datasource_variable_selects_the_data_source() {
    for d in dashboards() {
        let f = &d.file;
        assert!(!d.raw.contains("__inputs"), "{f}: has __inputs");
        assert!(!d.raw.contains("${DS_"), "{f}: uses ${{DS_...}}");
        let vars = variables(&d.json);
        let ds: Vec<&Value> = vars.iter().filter(|v| v["type"] == "datasource").collect();
        assert_eq!(ds.len(), 1, "{f}: exactly one datasource variable");
        assert_eq!(ds[0]["name"], "datasource", "{f}: datasource variable name");
        assert_eq!(
            ds[0]["query"], "prometheus",
            "{f}: datasource variable type"
        );
        let expected = serde_json::json!({"type": "prometheus", "uid": DATASOURCE});
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(v["datasource"], expected, "{f}: variable {}", v["name"]);
        }
        for p in panels(&d.json) {
            let t = title(p);
            if !is_row(p) || p.get("datasource").is_some() {
                assert_eq!(p["datasource"], expected, "{f}: panel {t}: datasource");
            }
            for target in targets(p) {
                assert_eq!(
                    target["datasource"], expected,
                    "{f}: panel {t}: target datasource"
                );
            }
        }
    }
}

#[test]
fn drill_down_has_source_and_event_type_variables() {
    let d = dashboards()
        .into_iter()
        .find(|d| d.json["uid"] == "inboxwatch-source")
        .expect("drill-down dashboard");
    let vars = variables(&d.json);
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` variable"))
    };
    for (name, query) in [
        ("source", "label_values(inboxwatch_source_up, source)"),
        (
            "event_type",
            "label_values(inbox_messages_received_total{source=~\"$source\"}, event_type)",
        ),
    ] {
        let v = var(name);
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["query"], query, "{name}");
        assert_eq!(v["multi"], true, "{name}: multi");
        assert_eq!(v["includeAll"], true, "{name}: include All");
    }
}

#[test]
fn every_query_parses_and_selects_only_catalogue_metrics() {
    let known = Known::load();
    let mut problems = Vec::new();
    let mut queries = 0;
    for d in dashboards() {
        for p in panels(&d.json) {
            for target in targets(p) {
                let Some(expr) = target["expr"].as_str() else {
                    problems.push(format!("{} / {}: target without expr", d.file, title(p)));
                    continue;
                };
                queries += 1;
                if let Err(e) = check_query(expr, &known) {
                    problems.push(format!("{} / {}: {e}\n    {expr}", d.file, title(p)));
                }
            }
        }
        // Variable queries: label_values(<selector>, label) names a metric too.
        for v in variables(&d.json).iter().filter(|v| v["type"] == "query") {
            let q = v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .unwrap_or_default();
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .and_then(|s| s.rsplit_once(','))
                .map(|(sel, _)| sel.trim());
            match inner {
                Some(sel) => {
                    if let Err(e) = check_query(sel, &known) {
                        problems.push(format!("{} / variable {}: {e}", d.file, v["name"]));
                    }
                }
                None => problems.push(format!(
                    "{} / variable {}: expected label_values(<metric>, <label>), got {q}",
                    d.file, v["name"]
                )),
            }
        }
    }
    assert!(queries > 0, "no queries found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_catalogue_metric_is_shown() {
    let known = Known::load();
    let mut shown = BTreeSet::new();
    for d in dashboards() {
        for p in panels(&d.json) {
            for target in targets(p) {
                if let Some(expr) = target["expr"].as_str() {
                    shown.extend(check_query(expr, &known).unwrap_or_default());
                }
            }
        }
    }
    let missing: Vec<&str> = CATALOGUE
        .iter()
        .map(|m| m.name)
        .filter(|n| !shown.contains(n) && coverage_exemption(n).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "catalogue metrics on no dashboard (add a panel, or an exemption with a reason): {missing:?}"
    );
}

/// Panels grouped by what shares the grid: the top level (rows included),
/// and separately the children of each collapsed row (laid out when expanded).
fn layers(dash: &Value) -> Vec<Vec<&Value>> {
    let top: Vec<&Value> = dash["panels"].as_array().into_iter().flatten().collect();
    let mut out = vec![top.clone()];
    for p in top {
        if let Some(children) = p["panels"].as_array().filter(|c| !c.is_empty()) {
            out.push(children.iter().collect());
        }
    }
    out
}

#[test]
fn panels_have_units_descriptions_unique_ids_and_do_not_overlap() {
    let mut problems = Vec::new();
    for d in dashboards() {
        let f = &d.file;
        let mut check = |ok: bool, msg: String| {
            if !ok {
                problems.push(format!("{f}: {msg}"));
            }
        };
        let mut ids = BTreeSet::new();
        for p in panels(&d.json) {
            let t = title(p);
            match p["id"].as_u64() {
                Some(id) => check(ids.insert(id), format!("panel id {id} ({t}) is not unique")),
                None => check(false, format!("panel {t} has no numeric id")),
            }
            if is_row(p) {
                continue;
            }
            let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("");
            check(
                UNITS.contains(&unit),
                format!("panel {t}: fieldConfig.defaults.unit {unit:?} not one of {UNITS:?}"),
            );
            let desc = p["description"].as_str().unwrap_or("");
            check(
                !desc.trim().is_empty(),
                format!("panel {t}: no description"),
            );
            check(!targets(p).is_empty(), format!("panel {t}: no targets"));
            let mut refs = BTreeSet::new();
            for target in targets(p) {
                let r = target["refId"].as_str().unwrap_or_default();
                check(refs.insert(r), format!("panel {t}: refId {r:?} repeated"));
            }
            if p["type"] == "heatmap" {
                check(
                    p["options"]["calculate"] == false,
                    format!("heatmap {t}: must show the buckets (calculate: false)"),
                );
                check(
                    p["options"]["yAxis"]["unit"].is_string(),
                    format!("heatmap {t}: no y-axis unit"),
                );
                for target in targets(p) {
                    let expr = target["expr"].as_str().unwrap_or_default();
                    check(
                        target["format"] == "heatmap" && expr.contains("_bucket"),
                        format!("heatmap {t}: target must be `_bucket` series in heatmap format"),
                    );
                }
            }
        }
        for layer in layers(&d.json) {
            let mut boxes: Vec<(String, [u64; 4])> = Vec::new();
            for p in layer {
                let t = title(p);
                let g = &p["gridPos"];
                let dims = ["x", "y", "w", "h"].map(|k| g[k].as_u64());
                let [Some(x), Some(y), Some(w), Some(h)] = dims else {
                    check(false, format!("panel {t}: gridPos {g} incomplete"));
                    continue;
                };
                check(
                    w > 0 && h > 0 && x + w <= 24,
                    format!("panel {t}: gridPos {g} outside the 24-column grid"),
                );
                for (other, [ox, oy, ow, oh]) in &boxes {
                    let overlap = x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h;
                    check(!overlap, format!("panels {t} and {other} overlap"));
                }
                boxes.push((t, [x, y, w, h]));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn histograms_are_shown_as_heatmaps() {
    let mut heatmapped = BTreeSet::new();
    for d in dashboards() {
        for p in panels(&d.json)
            .into_iter()
            .filter(|p| p["type"] == "heatmap")
        {
            for target in targets(p) {
                let expr = target["expr"].as_str().unwrap_or_default();
                for def in CATALOGUE.iter().filter(|m| m.kind == Kind::Histogram) {
                    if expr.contains(&format!("{}_bucket", def.name)) {
                        heatmapped.insert(def.name);
                    }
                }
            }
        }
    }
    let missing: Vec<&str> = CATALOGUE
        .iter()
        .filter(|m| m.kind == Kind::Histogram && !heatmapped.contains(m.name))
        .map(|m| m.name)
        .collect();
    assert!(
        missing.is_empty(),
        "histograms without a heatmap: {missing:?}"
    );
}

/// The checks themselves: a wrong query must be caught.
#[test]
fn checker_rejects_bad_queries() {
    let known = Known::load();
    let ok = |q: &str| check_query(q, &known);
    assert!(ok("sum(rate(inbox_deliveries_total{source=~\"$source\"}[$__rate_interval]))").is_ok());
    assert!(ok("histogram_quantile(0.95, sum by (le) (rate(inbox_processing_duration_seconds_bucket[$__rate_interval])))").is_ok());
    assert!(ok("{__name__=\"inbox_stuck_messages\"}").is_ok());
    // literal or wrong ranges
    assert!(ok("rate(inbox_deliveries_total[5m])").is_err());
    assert!(ok("increase(inbox_deliveries_total[$__interval])").is_err());
    assert!(ok("irate(inbox_deliveries_total[$__range])").is_err());
    // unknown names, bare histogram names, unknown labels, unbounded selectors
    assert!(ok("inbox_no_such_metric").is_err());
    assert!(ok("inbox_processing_duration_seconds").is_err());
    assert!(ok("{__name__=\"nope\"}").is_err());
    assert!(ok("{__name__=~\"no_such_.*\"}").is_err());
    assert!(ok("inbox_backlog_messages{stauts=\"pending\"}").is_err());
    assert!(ok("{source=\"x\"}").is_err());
    assert!(ok("sum(").is_err());
    // recording rules from alerts/ are accepted by name (labels unchecked)
    let mut with_rule = Known::load();
    with_rule
        .rules
        .insert("source:inbox_deliveries:rate5m".into());
    assert!(
        check_query(
            "max(source:inbox_deliveries:rate5m{source=~\"$source\"})",
            &with_rule
        )
        .is_ok()
    );
    // recording rules' labels come from their level: a label they aggregate away is caught
    with_rule
        .rules
        .insert("cluster_group_topic:kafka_consumed:deriv5m".into());
    assert!(
        check_query(
            "cluster_group_topic:kafka_consumed:deriv5m{cluster=~\"$cluster\", topic=~\"$topic\"}",
            &with_rule
        )
        .is_ok()
    );
    assert!(
        check_query(
            "cluster_group_topic:kafka_consumed:deriv5m{partition=\"0\"}",
            &with_rule
        )
        .is_err()
    );
    assert!(
        check_query(
            "max(source:inbox_deliveries:rate5m{event_type=~\"$event_type\"})",
            &with_rule
        )
        .is_err()
    );
    assert_eq!(
        rule_labels("source_error_class:inbox_dead_letters:rate5m").unwrap(),
        BTreeSet::from(["source".to_string(), "error_class".to_string()])
    );
    assert!(rule_labels("source_eventtype:x:rate5m").is_err());
    assert_eq!(
        substitute(
            "x{a=~\"$source\",b=~\"${event_type:regex}\"}[$__rate_interval]",
            "1m",
            "2m"
        ),
        "x{a=~\".*\",b=~\".*\"}[1m]"
    );
    assert_eq!(substitute("y[$__interval] [1m]", "1m", "2m"), "y[2m] [1m]");
}

/// The "not draining" sentinel of the time-to-drain recording rules (docs/metrics.md,
/// "Derived in PromQL").
const DRAIN_SENTINEL: &str = "31536000";

/// The flow panels: production and consumption on one graph (tables and Kafka), the time to
/// drain drawn without the sentinel next to a "Draining" state panel that maps it, and the
/// rules and the dashboards agreeing on the sentinel.
#[test]
fn flow_panels_show_both_rates_together_and_the_drain_time_without_its_sentinel() {
    let rules: String = repo_files("alerts", &[".yml", ".yaml"])
        .iter()
        .map(|f| repo_read(f))
        .collect();
    for rule in [
        "source:inbox_time_to_drain_seconds:rate5m",
        "cluster_group_topic:kafka_time_to_drain_seconds:deriv5m",
    ] {
        let body = rules
            .split(&format!("- record: {rule}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no recording rule {rule}"));
        let body = body.split("- record:").next().unwrap_or(body);
        assert!(
            body.contains(&format!("* 0 + {DRAIN_SENTINEL}"))
                && body.contains(&format!("{DRAIN_SENTINEL})")),
            "{rule} must hold the sentinel {DRAIN_SENTINEL} where not draining and cut estimates to it:\n{body}"
        );
    }

    let known = Known::load();
    let dashes = dashboards();
    let panel = |uid: &str, title: &str| -> Value {
        let d = dashes
            .iter()
            .find(|d| d.json["uid"] == uid)
            .unwrap_or_else(|| panic!("no dashboard {uid}"));
        panels(&d.json)
            .into_iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("{uid}: no panel {title:?}"))
            .clone()
    };
    let exprs = |p: &Value| -> Vec<String> {
        targets(p)
            .iter()
            .map(|t| t["expr"].as_str().unwrap_or_default().to_string())
            .collect()
    };

    // Both rates on one graph.
    let both = panel("inboxwatch-source", "Arrivals vs completions");
    let selected: BTreeSet<&str> = exprs(&both)
        .iter()
        .flat_map(|e| check_query(e, &known).unwrap_or_default())
        .collect();
    assert_eq!(
        selected,
        BTreeSet::from([
            "inbox_messages_received_total",
            "inbox_messages_completed_total"
        ]),
        "Arrivals vs completions"
    );
    let both = exprs(&panel(
        "inboxwatch-kafka",
        "Production vs consumption by group and topic",
    ));
    for rule in [
        "cluster_group_topic:kafka_produced:deriv5m",
        "cluster_group_topic:kafka_consumed:deriv5m",
    ] {
        assert!(
            both.iter().any(|e| e.starts_with(rule)),
            "Production vs consumption by group and topic does not draw {rule}: {both:?}"
        );
    }

    // The drain time without the sentinel, and "not draining" mapped in a state panel.
    for (uid, time, draining) in [
        (
            "inboxwatch-source",
            "Time to drain vs objective",
            "Draining",
        ),
        (
            "inboxwatch-kafka",
            "Time to drain by group and topic",
            "Draining by group",
        ),
    ] {
        let p = panel(uid, time);
        assert_eq!(p["fieldConfig"]["defaults"]["unit"], "s", "{uid} / {time}");
        assert!(
            exprs(&p).iter().any(|e| e.contains("time_to_drain_seconds")
                && e.ends_with(&format!(" < {DRAIN_SENTINEL}"))),
            "{uid} / {time} must draw the estimates below the sentinel: {:?}",
            exprs(&p)
        );
        let p = panel(uid, draining);
        assert_eq!(p["type"], "state-timeline", "{uid} / {draining}");
        assert!(
            exprs(&p).iter().all(|e| e.contains("time_to_drain_seconds")
                && e.ends_with(&format!(" >= bool {DRAIN_SENTINEL}"))),
            "{uid} / {draining}: {:?}",
            exprs(&p)
        );
        assert_eq!(
            p["fieldConfig"]["defaults"]["mappings"][0]["options"]["1"]["text"], "not draining",
            "{uid} / {draining}: 1 must read \"not draining\""
        );
    }
    // Nowhere else is the sentinel drawn as a duration.
    for d in &dashes {
        for p in panels(&d.json) {
            for e in exprs(p)
                .iter()
                .filter(|e| e.contains("time_to_drain_seconds"))
            {
                assert!(
                    e.contains(&format!("< {DRAIN_SENTINEL}"))
                        || e.contains(&format!(">= bool {DRAIN_SENTINEL}")),
                    "{} / {}: draws the time to drain with its sentinel: {e}",
                    d.file,
                    title(p)
                );
            }
        }
    }
}
