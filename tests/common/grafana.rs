//! The Grafana dashboards of the checkout (`dashboards/*.json`): their panels,
//! panel queries and variables, and Grafana's variable syntax in a query.

use serde_json::Value;

/// One dashboard file.
pub struct Dashboard {
    /// The file name (`inboxwatch-source.json`).
    pub file: String,
    pub raw: String,
    pub json: Value,
}

/// Every `dashboards/*.json`, parsed, sorted by file name; panics if there is none
/// or one is not JSON.
pub fn dashboards() -> Vec<Dashboard> {
    super::repo_files("dashboards", &[".json"])
        .into_iter()
        .map(|path| {
            let raw = super::repo_read(&path);
            let json: Value = serde_json::from_str(&raw)
                .unwrap_or_else(|e| panic!("{path}: not valid JSON: {e}"));
            let file = path.trim_start_matches("dashboards/").to_string();
            Dashboard { file, raw, json }
        })
        .collect()
}

/// Every panel, rows' nested panels included, in order.
pub fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// A panel's targets.
pub fn targets(panel: &Value) -> &[Value] {
    panel["targets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The dashboard's variables (`templating.list`).
pub fn variables(dash: &Value) -> &[Value] {
    dash["templating"]["list"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// One panel query.
#[derive(Clone, Debug)]
pub struct Query {
    pub file: String,
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// Every panel query (`targets[].expr`) of every dashboard given.
pub fn queries(dashboards: &[Dashboard]) -> Vec<Query> {
    let mut out = Vec::new();
    for d in dashboards {
        for p in panels(&d.json) {
            for t in targets(p) {
                if let Some(expr) = t["expr"].as_str() {
                    out.push(Query {
                        file: d.file.clone(),
                        panel: p["title"].as_str().unwrap_or_default().to_string(),
                        ref_id: t["refId"].as_str().unwrap_or_default().to_string(),
                        expr: expr.to_string(),
                    });
                }
            }
        }
    }
    out
}

/// The query variables of the dashboards: (file, variable name, query).
pub fn query_variables(dashboards: &[Dashboard]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for d in dashboards {
        for var in variables(&d.json) {
            if var["type"] != "query" {
                continue;
            }
            let q = var["query"]
                .as_str()
                .or_else(|| var["query"]["query"].as_str())
                .unwrap_or_default();
            out.push((
                d.file.clone(),
                var["name"].as_str().unwrap_or_default().to_string(),
                q.to_string(),
            ));
        }
    }
    out
}

/// Replaces Grafana variables (`$name`, `${name}`, `${name:format}`, `[[name]]`)
/// in `expr` by what `value` says each stands for; an error of `value`, a lone
/// `$` or an unclosed `${`/`[[` is an error.
pub fn substitute(
    expr: &str,
    value: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(i) = rest.find(['$', '[']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(inner) = tail.strip_prefix("${") {
            let end = inner.find('}').ok_or("unterminated ${")?;
            let name = inner[..end].split(':').next().unwrap_or_default();
            out.push_str(&value(name)?);
            rest = &inner[end + 1..];
        } else if let Some(inner) = tail.strip_prefix("[[") {
            let end = inner.find("]]").ok_or("unterminated [[")?;
            let name = inner[..end].split(':').next().unwrap_or_default();
            out.push_str(&value(name)?);
            rest = &inner[end + 2..];
        } else if let Some(inner) = tail.strip_prefix('$') {
            let end = inner
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(inner.len());
            if end == 0 {
                return Err(format!("a lone `$` in {expr}"));
            }
            out.push_str(&value(&inner[..end])?);
            rest = &inner[end..];
        } else {
            out.push('[');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}
