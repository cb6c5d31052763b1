//! The alerting configuration, checked with the real tools (SPEC §5):
//!
//! * `promtool check rules` accepts every rule file in `alerts/`, and
//!   `promtool test rules` passes every unit test in `alerts/tests/` (each alert shown
//!   firing at its boundary and silent before it and on a quiet source);
//! * `amtool check-config` accepts `config/alertmanager.yml`, and
//!   `amtool config routes test --verify.receivers` proves the routing: dead-letter
//!   spikes (inbox and Kafka) and every critical alert (a stalled Kafka consumer group
//!   among them) to `oncall`, warnings (Kafka lag growing among them) to `chat`, info
//!   to `null`; and, in a real Alertmanager, a critical alert inhibits the warning and
//!   info alerts of its source and family, for Kafka of its own group or topic only;
//! * a scan of the rule files' text: every alert has `severity`, `summary`, a templated
//!   `description` and a `runbook_url` whose anchor is a heading of `docs/runbooks.md`;
//!   the fixed alert names exist with their severities; every metric named is in the
//!   catalogue (`inboxwatch metrics`) and every recording rule used is defined;
//! * the dashboard panels the runbooks send people to exist in `dashboards/`;
//! * every Kafka dashboard query returns data, evaluated by promtool on series shaped
//!   as the Kafka source exports them (the end-to-end test has no Kafka source), and so
//!   does every ordering, ack-failure and drain-time query on series shaped as a table
//!   source with ordering columns exports them (the end-to-end table has none).
//!
//! Needs `promtool`, `amtool` and `prometheus-alertmanager` (Debian packages
//! `prometheus` and `prometheus-alertmanager`, which `.ci/run` installs). Without them the tests fail,
//! saying so; they never skip.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::grafana;
use common::stack::{Alertmanager, assert_success, run_tool};
use common::{Cmd, repo_files, repo_path, repo_read};

const ALERTMANAGER_CONFIG: &str = "config/alertmanager.yml";
const RUNBOOKS: &str = "docs/runbooks.md";
const RUNBOOK_BASE: &str = "https://github.com/inboxwatch/inboxwatch/blob/main/docs/runbooks.md#";

/// Alert names fixed by SPEC §5, with the severities each must have.
const FIXED_ALERTS: &[(&str, &[&str])] = &[
    ("InboxDeadLetterSpike", &["critical"]),
    ("KafkaDeadLetterSpike", &["critical"]),
    ("KafkaConsumerGroupStalled", &["critical"]),
    ("InboxOldestMessageTooOld", &["critical", "warning"]),
    ("InboxDuplicateRatioHigh", &["warning"]),
    ("InboxwatchSourceDown", &["warning"]),
    ("InboxwatchAbsent", &["critical"]),
];

/// Where each severity must be routed.
const RECEIVER_BY_SEVERITY: &[(&str, &str)] = &[
    ("critical", "oncall"),
    ("warning", "chat"),
    ("info", "null"),
];

/// Prefixes of the metric names the catalogue declares.
const METRIC_PREFIXES: &[&str] = &["inbox_", "outbox_", "inboxwatch_", "kafka_"];

fn rule_files() -> Vec<String> {
    repo_files("alerts", &[".yml", ".yaml"])
}

// ---------------------------------------------------------------------------
// A line-based reading of the rule files (they are written one key per line)

#[derive(Debug, Default)]
struct AlertRule {
    file: String,
    name: String,
    /// Keys of the rule (`expr`, `for`, `labels`, …) and of its labels and annotations,
    /// with the text that follows them up to the next key (folded blocks included).
    keys: BTreeMap<String, String>,
}

impl AlertRule {
    fn get(&self, key: &str) -> Option<&str> {
        self.keys.get(key).map(|v| v.trim())
    }
}

/// The alerting rules of a rule file. A rule starts at `- alert:` and ends at the next
/// `- alert:`, `- record:` or `- name:`; inside it, `key: value` lines start keys and
/// other lines continue the current key's value.
fn alert_rules(file: &str) -> Vec<AlertRule> {
    let mut rules = Vec::new();
    let mut current: Option<AlertRule> = None;
    let mut key = String::new();
    for line in repo_read(file).lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        if let Some(name) = t.strip_prefix("- alert:") {
            rules.extend(current.take());
            current = Some(AlertRule {
                file: file.to_string(),
                name: name.trim().to_string(),
                ..AlertRule::default()
            });
            key.clear();
            continue;
        }
        if t.starts_with("- record:") || t.starts_with("- name:") {
            rules.extend(current.take());
            continue;
        }
        let Some(rule) = current.as_mut() else {
            continue;
        };
        match t.split_once(':') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && (v.is_empty() || v.starts_with(' ')) =>
            {
                key = k.to_string();
                rule.keys.insert(key.clone(), v.to_string());
            }
            _ => {
                if let Some(v) = rule.keys.get_mut(&key) {
                    v.push('\n');
                    v.push_str(t);
                }
            }
        }
    }
    rules.extend(current);
    rules
}

fn all_alert_rules() -> Vec<AlertRule> {
    rule_files().iter().flat_map(|f| alert_rules(f)).collect()
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn runbook_anchors() -> BTreeSet<String> {
    repo_read(RUNBOOKS)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// Tokens of PromQL-ish text: runs of letters, digits, `_` and `:`.
fn tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// A recording rule name: `level:metric:operations`.
fn is_recorded_name(t: &str) -> bool {
    let parts: Vec<&str> = t.split(':').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

// ---------------------------------------------------------------------------
// promtool

#[test]
fn promtool_check_rules_accepts_every_rule_file() {
    let files = rule_files();
    let mut args = vec!["check", "rules", "--lint=all", "--lint-fatal"];
    args.extend(files.iter().map(String::as_str));
    let out = run_tool("promtool", &args);
    assert_success("promtool check rules", &out);
    let stdout = out.stdout.as_str();
    assert_eq!(
        stdout.matches("SUCCESS").count(),
        files.len(),
        "every rule file is checked:\n{}",
        out.describe()
    );
}

/// `promtool test rules` over each file of `alerts/tests/`, one test per file so that
/// they run side by side (one call over all of them took about three minutes).
mod promtool_unit_tests_pass {
    use super::*;

    /// The unit-test files, each the name of a test below.
    const FILES: &[&str] = &[
        "age_backlog",
        "agent",
        "dead_letters",
        "duplicates_retries",
        "error_classes_owners",
        "flow",
        "kafka",
        "latency",
        "ordering",
        "owner_joins",
        "queues",
        "quiet",
    ];

    fn passes(name: &str) {
        let file = format!("alerts/tests/{name}.test.yml");
        let out = run_tool("promtool", &["test", "rules", &file]);
        assert_success(&format!("promtool test rules {file}"), &out);
        assert_eq!(
            out.stdout.as_str().matches("SUCCESS").count(),
            1,
            "{file} passes:\n{}",
            out.describe()
        );
    }

    /// Guards the split: the tests below are exactly the files of `alerts/tests/`, so a
    /// new unit-test file cannot go unrun.
    #[test]
    fn one_test_per_file() {
        let found: Vec<String> = repo_files("alerts/tests", &[".test.yml", ".test.yaml"])
            .iter()
            .map(|f| {
                let name = f.rsplit('/').next().unwrap_or(f);
                name.trim_end_matches(".yml")
                    .trim_end_matches(".yaml")
                    .trim_end_matches(".test")
                    .to_string()
            })
            .collect();
        let mut want: Vec<String> = FILES.iter().map(|f| f.to_string()).collect();
        want.sort();
        let mut found = found;
        found.sort();
        assert_eq!(
            found, want,
            "alerts/tests/ and promtool_unit_tests_pass::FILES differ: add a test per new file"
        );
        for name in FILES {
            assert!(
                repo_path(&format!("alerts/tests/{name}.test.yml")).is_file(),
                "{name}: expected alerts/tests/{name}.test.yml"
            );
        }
    }

    #[test]
    fn age_backlog() {
        passes("age_backlog");
    }
    #[test]
    fn agent() {
        passes("agent");
    }
    #[test]
    fn dead_letters() {
        passes("dead_letters");
    }
    #[test]
    fn duplicates_retries() {
        passes("duplicates_retries");
    }
    #[test]
    fn error_classes_owners() {
        passes("error_classes_owners");
    }
    #[test]
    fn flow() {
        passes("flow");
    }
    #[test]
    fn kafka() {
        passes("kafka");
    }
    #[test]
    fn latency() {
        passes("latency");
    }
    #[test]
    fn ordering() {
        passes("ordering");
    }
    #[test]
    fn owner_joins() {
        passes("owner_joins");
    }
    #[test]
    fn queues() {
        passes("queues");
    }
    #[test]
    fn quiet() {
        passes("quiet");
    }
}

/// Guards the unit tests' coverage: every alert is shown firing (an `exp_alerts` entry
/// with labels) and silent (an empty `exp_alerts`) somewhere in `alerts/tests/`.
#[test]
fn every_alert_is_unit_tested_firing_and_silent() {
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for file in repo_files("alerts/tests", &[".test.yml", ".test.yaml"]) {
        let mut name: Option<String> = None;
        let mut fired = false;
        let mut finish = |name: &mut Option<String>, fired: &mut bool| {
            if let Some(n) = name.take() {
                if *fired {
                    firing.insert(n);
                } else {
                    silent.insert(n);
                }
            }
            *fired = false;
        };
        for line in repo_read(&file).lines() {
            let t = line.trim();
            if t.starts_with("- eval_time:") || t.starts_with("- interval:") || t == "tests:" {
                finish(&mut name, &mut fired);
            } else if let Some(n) = t.strip_prefix("alertname:") {
                name = Some(n.trim().to_string());
            } else if t.starts_with("- exp_labels:") && name.is_some() {
                fired = true;
            } else if t.starts_with("promql_expr_test:") {
                finish(&mut name, &mut fired);
            }
        }
        finish(&mut name, &mut fired);
    }
    let names: BTreeSet<String> = all_alert_rules().into_iter().map(|r| r.name).collect();
    let missing: Vec<String> = names
        .iter()
        .flat_map(|n| {
            let mut m = Vec::new();
            if !firing.contains(n) {
                m.push(format!("{n}: no test where it fires"));
            }
            if !silent.contains(n) {
                m.push(format!("{n}: no test where it stays silent"));
            }
            m
        })
        .collect();
    assert!(
        missing.is_empty(),
        "alerts/tests/ lacks:\n{}",
        missing.join("\n")
    );
}

/// The owners a unit-test block's input gives each source (`inboxwatch_source_info`) and
/// each Kafka consumer group (`kafka_consumer_group_info`) and each queue consumer
/// (`queue_consumer_info`), keyed `source=…` / `group=…` / `consumer=SOURCE/QUEUE/CONSUMER`.
fn block_owners(block: &str) -> BTreeMap<String, BTreeSet<String>> {
    let label = |series: &str, name: &str| -> Option<String> {
        let at = series.find(&format!("{name}=\""))? + name.len() + 2;
        let rest = &series[at..];
        Some(rest[..rest.find('"')?].to_string())
    };
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in block.lines() {
        let Some(series) = line.trim().strip_prefix("- series:") else {
            continue;
        };
        let key = if series.contains("inboxwatch_source_info{") {
            label(series, "source").map(|s| format!("source={s}"))
        } else if series.contains("kafka_consumer_group_info{") {
            label(series, "group").map(|g| format!("group={g}"))
        } else if series.contains("queue_consumer_info{") {
            match (
                label(series, "source"),
                label(series, "queue"),
                label(series, "consumer"),
            ) {
                (Some(s), Some(q), Some(c)) => Some(format!("consumer={s}/{q}/{c}")),
                _ => None,
            }
        } else {
            None
        };
        if let (Some(key), Some(owner)) = (key, label(series, "owner")) {
            owners.entry(key).or_default().insert(owner);
        }
    }
    owners
}

/// Every alert carries `owner`, proven by promtool: in `alerts/tests/` (which
/// `promtool_unit_tests_pass` runs, and where promtool compares the labels exactly) every
/// alert fires at least once with an `owner` label, and every expected alert has one, except
/// where its test gives its source (or, for a group alert, its group) no owner to join: an
/// owner of "" (a source without one), no info series at all, or two owners at once.
/// And every critical alert that joins an owner is shown firing without one in both of the
/// last two cases (`alerts/tests/owner_joins.test.yml`): the join never loses a page.
#[test]
fn every_alert_carries_owner_in_the_unit_tests() {
    let mut owned = BTreeSet::new();
    let mut without_info = BTreeSet::new();
    let mut two_owners = BTreeSet::new();
    let mut problems = Vec::new();
    for file in repo_files("alerts/tests", &[".test.yml", ".test.yaml"]) {
        let text = repo_read(&file);
        for (i, block) in text.split("\n  - interval:").enumerate().skip(1) {
            let owners = block_owners(block);
            let lines: Vec<&str> = block.lines().collect();
            let mut name = String::new();
            for (j, line) in lines.iter().enumerate() {
                let t = line.trim();
                if let Some(n) = t.strip_prefix("alertname:") {
                    name = n.trim().to_string();
                }
                if t != "- exp_labels:" {
                    continue;
                }
                let labels: BTreeMap<&str, &str> = lines[j + 1..]
                    .iter()
                    .map(|l| l.trim())
                    .take_while(|l| !l.starts_with("exp_annotations:") && !l.starts_with('-'))
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .collect();
                if labels.get("owner").is_some_and(|o| !o.is_empty()) {
                    owned.insert(name.clone());
                    continue;
                }
                let key = match (
                    labels.get("group"),
                    labels.get("source"),
                    labels.get("queue").zip(labels.get("consumer")),
                ) {
                    (Some(g), _, _) => format!("group={g}"),
                    (None, Some(s), Some((q, c))) => format!("consumer={s}/{q}/{c}"),
                    (None, Some(s), None) => format!("source={s}"),
                    (None, None, _) => String::new(),
                };
                match owners.get(&key) {
                    None => {
                        without_info.insert(name.clone());
                    }
                    Some(o) if o.len() > 1 => {
                        two_owners.insert(name.clone());
                    }
                    Some(o) if o.contains("") => {}
                    Some(_) => problems.push(format!(
                        "{file}, test {i}: {name} is expected without an owner label, though \
                         its {key} has one"
                    )),
                }
            }
        }
    }
    for rule in all_alert_rules() {
        if !owned.contains(&rule.name) {
            problems.push(format!(
                "{}: no unit test shows it firing with an owner label",
                rule.name
            ));
        }
        let joins = rule
            .get("expr")
            .is_some_and(|e| e.contains("group_left(owner)"));
        if joins && rule.get("severity") == Some("critical") {
            if !without_info.contains(&rule.name) {
                problems.push(format!(
                    "{}: no unit test shows it firing when its source has no info series",
                    rule.name
                ));
            }
            if !two_owners.contains(&rule.name) {
                problems.push(format!(
                    "{}: no unit test shows it firing when two agents give its source two owners",
                    rule.name
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// amtool

#[test]
fn amtool_check_config_accepts_the_routing() {
    let out = run_tool("amtool", &["check-config", ALERTMANAGER_CONFIG]);
    assert_success("amtool check-config", &out);
    assert!(
        out.stdout.as_str().contains("SUCCESS"),
        "{}",
        out.describe()
    );
}

/// Routes `labels` with `amtool config routes test --verify.receivers=<expected>`.
fn route(labels: &[&str], expected: &str) -> Result<(), String> {
    let config = format!("--config.file={ALERTMANAGER_CONFIG}");
    let verify = format!("--verify.receivers={expected}");
    let mut args = vec!["config", "routes", "test", config.as_str(), verify.as_str()];
    args.extend(labels);
    let out = run_tool("amtool", &args);
    let got = out.stdout.as_str().trim().to_string();
    if out.success() && got == expected {
        Ok(())
    } else {
        Err(format!(
            "{labels:?} should route to {expected}, got {got:?}:\n{}",
            out.describe()
        ))
    }
}

#[test]
fn routes_page_dead_letter_spikes_and_criticals_chat_warnings_drop_info() {
    let mut cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "alertname=InboxDeadLetterSpike",
                "severity=critical",
                "source=orders",
            ],
            "oncall",
        ),
        // A dead-letter spike pages whatever its severity says.
        (
            vec![
                "alertname=InboxDeadLetterSpike",
                "severity=warning",
                "source=orders",
            ],
            "oncall",
        ),
        (
            vec![
                "alertname=KafkaDeadLetterSpike",
                "severity=critical",
                "topic=orders.DLQ",
            ],
            "oncall",
        ),
        // Kafka alerts as the rules label them: `source` copied from `cluster`, and the
        // consumer group or topic.
        (
            vec![
                "alertname=KafkaDeadLetterSpike",
                "severity=critical",
                "family=dead_letters",
                "cluster=prod-eu",
                "source=prod-eu",
                "topic=orders.DLQ",
            ],
            "oncall",
        ),
        (
            vec![
                "alertname=KafkaConsumerGroupStalled",
                "severity=critical",
                "family=consumer_group",
                "cluster=prod-eu",
                "source=prod-eu",
                "group=billing",
            ],
            "oncall",
        ),
        (
            vec![
                "alertname=KafkaConsumerLagGrowing",
                "severity=warning",
                "family=consumer_group",
                "cluster=prod-eu",
                "source=prod-eu",
                "group=billing",
            ],
            "chat",
        ),
        (
            vec![
                "alertname=KafkaDeadLetter",
                "severity=info",
                "family=dead_letters",
                "cluster=prod-eu",
                "source=prod-eu",
                "topic=orders.DLQ",
            ],
            "null",
        ),
        (
            vec!["alertname=SomethingElse", "severity=critical"],
            "oncall",
        ),
        (
            vec![
                "alertname=SomethingElse",
                "severity=warning",
                "source=orders",
            ],
            "chat",
        ),
        (
            vec!["alertname=SomethingElse", "severity=info", "source=orders"],
            "null",
        ),
        // No severity: someone still sees it.
        (vec!["alertname=SomethingElse"], "chat"),
    ]
    .into_iter()
    .map(|(l, r)| (l.into_iter().map(str::to_string).collect(), r))
    .collect();
    // Every alert of the rule files, with its own severity and family.
    for rule in all_alert_rules() {
        let severity = rule.get("severity").unwrap_or_default().to_string();
        let Some((_, receiver)) = RECEIVER_BY_SEVERITY.iter().find(|(s, _)| *s == severity) else {
            continue; // reported by rules_have_severity_summary_description_and_runbook
        };
        let mut labels = vec![
            format!("alertname={}", rule.name),
            format!("severity={severity}"),
            "source=orders".to_string(),
        ];
        if let Some(family) = rule.get("family") {
            labels.push(format!("family={family}"));
        }
        let receiver = if rule.name.ends_with("DeadLetterSpike") {
            "oncall"
        } else {
            receiver
        };
        cases.push((labels, receiver));
    }
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(labels, receiver)| {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            route(&labels, receiver).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The verification itself bites: a wrong expectation fails.
    assert!(
        route(
            &["alertname=InboxDeadLetterSpike", "severity=critical"],
            "chat"
        )
        .is_err(),
        "amtool --verify.receivers accepted a wrong receiver"
    );
    assert!(
        route(&["alertname=SomethingElse", "severity=info"], "oncall").is_err(),
        "amtool --verify.receivers accepted a wrong receiver"
    );
}

/// Alerts of a source owned by team-payments go to its own receivers: every alert of the
/// rule files by its severity (dead-letter spikes always page its on-call); a source without
/// an owner, a team without a route and the agent's own alerts take the default receivers.
#[test]
fn routes_send_each_owners_alerts_to_its_receivers() {
    let mut cases: Vec<(Vec<String>, &str)> = Vec::new();
    for rule in all_alert_rules() {
        let severity = rule.get("severity").unwrap_or_default().to_string();
        let Some((_, default)) = RECEIVER_BY_SEVERITY.iter().find(|(s, _)| *s == severity) else {
            continue;
        };
        let team = match severity.as_str() {
            _ if rule.name.ends_with("DeadLetterSpike") => "team-payments-oncall",
            "critical" => "team-payments-oncall",
            "warning" => "team-payments-chat",
            _ => "null",
        };
        let default = if rule.name.ends_with("DeadLetterSpike") {
            "oncall"
        } else {
            default
        };
        let mut labels = vec![
            format!("alertname={}", rule.name),
            format!("severity={severity}"),
            "source=payments".to_string(),
        ];
        if let Some(family) = rule.get("family") {
            labels.push(format!("family={family}"));
        }
        cases.push((labels.clone(), default));
        for (owner, receiver) in [
            ("team-payments", team),
            ("team-without-a-route", default),
            ("inboxwatch-operators", default),
        ] {
            let mut l = labels.clone();
            l.push(format!("owner={owner}"));
            cases.push((l, receiver));
        }
    }
    assert!(cases.len() > 40, "too few alerts: {}", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(labels, receiver)| {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            route(&labels, receiver).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        route(
            &[
                "alertname=InboxDeadLetterSpike",
                "severity=critical",
                "owner=team-payments"
            ],
            "oncall"
        )
        .is_err(),
        "a team-payments dead-letter spike reached the default on-call"
    );
}

#[test]
fn alertmanager_config_has_the_receivers_and_inhibitions_of_the_contract() {
    let config = repo_read(ALERTMANAGER_CONFIG);
    for needle in [
        "- name: oncall",
        "- name: chat",
        "- name: \"null\"",
        "url: http://alert-bridge.monitoring.svc:9095/oncall",
        "url: http://alert-bridge.monitoring.svc:9095/chat",
        "# pagerduty_configs:",
        "# slack_configs:",
        "group_by: [alertname, source]",
    ] {
        assert!(
            config.contains(needle),
            "{ALERTMANAGER_CONFIG} lacks `{needle}`"
        );
    }
    // Every inhibition names the labels that must be equal.
    let inhibit = config
        .split("\ninhibit_rules:")
        .nth(1)
        .expect("an inhibit_rules section");
    let inhibit = inhibit.split("\nreceivers:").next().unwrap_or(inhibit);
    let rules: Vec<&str> = inhibit.split("\n  - ").skip(1).collect();
    assert!(!rules.is_empty(), "no inhibit rules");
    for rule in rules {
        let equal = rule
            .lines()
            .find_map(|l| l.trim().strip_prefix("equal:"))
            .unwrap_or_else(|| panic!("inhibit rule without `equal`:\n{rule}"));
        assert!(
            equal.contains('[') && equal.trim() != "[]",
            "inhibit rule with an empty `equal`:\n{rule}"
        );
    }
}

// ---------------------------------------------------------------------------
// The rules' text

#[test]
fn rules_have_severity_summary_description_and_runbook() {
    let rules = all_alert_rules();
    assert!(!rules.is_empty(), "no alerting rules found");
    let anchors = runbook_anchors();
    let mut problems = Vec::new();
    for r in &rules {
        let at = format!("{} ({})", r.name, r.file);
        if !r
            .name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_uppercase())
            || !r.name.chars().all(|c| c.is_ascii_alphanumeric())
        {
            problems.push(format!("{at}: the name is not CamelCase"));
        }
        match r.get("severity") {
            Some("critical" | "warning" | "info") => {}
            other => problems.push(format!("{at}: severity {other:?}")),
        }
        if r.get("summary").is_none_or(str::is_empty) {
            problems.push(format!("{at}: no summary"));
        }
        match r.get("description") {
            Some(d) if d.contains("{{") => {}
            other => problems.push(format!("{at}: description not templated: {other:?}")),
        }
        match r.get("runbook_url") {
            Some(url) => {
                let want = format!("{RUNBOOK_BASE}{}", r.name.to_lowercase());
                if url != want {
                    problems.push(format!("{at}: runbook_url {url}, expected {want}"));
                }
                if !anchors.contains(&r.name.to_lowercase()) {
                    problems.push(format!("{at}: no heading `## {}` in {RUNBOOKS}", r.name));
                }
            }
            None => problems.push(format!("{at}: no runbook_url")),
        }
        if r.get("family").is_none_or(str::is_empty) {
            problems.push(format!("{at}: no family label (inhibition uses it)"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn fixed_alert_names_exist_with_their_severities() {
    let mut severities: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in all_alert_rules() {
        let severity = r.get("severity").unwrap_or_default().to_string();
        severities.entry(r.name).or_default().insert(severity);
    }
    for (name, want) in FIXED_ALERTS {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            severities.get(*name),
            Some(&want),
            "alert {name} must exist with severities {want:?}"
        );
    }
}

/// The rules name only metrics of the catalogue (histograms with their `_bucket`,
/// `_sum` and `_count` series) and only recording rules that are defined.
#[test]
fn rules_name_only_catalogue_metrics_and_defined_recording_rules() {
    let out = Cmd::new(["metrics"]).output();
    assert_success("inboxwatch metrics", &out);
    let mut known = BTreeSet::new();
    for line in out.stdout.as_str().lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let (name, kind) = (cells[1].trim_matches('`'), cells[2]);
        if !METRIC_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        known.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                known.insert(format!("{name}{suffix}"));
            }
        }
    }
    assert!(
        known.len() > 20,
        "catalogue not parsed:\n{}",
        out.describe()
    );

    let mut recorded = BTreeSet::new();
    let mut used = BTreeMap::new();
    let mut problems = Vec::new();
    for file in rule_files() {
        let body = repo_read(&file);
        for line in body.lines() {
            if let Some(name) = line.trim().strip_prefix("- record:") {
                recorded.insert(name.trim().to_string());
            }
        }
        for t in tokens(&body) {
            if is_recorded_name(&t) {
                used.insert(t, file.clone());
            } else if METRIC_PREFIXES.iter().any(|p| t.starts_with(p)) && !known.contains(&t) {
                problems.push(format!("{file}: {t} is not in the catalogue"));
            }
        }
    }
    for (name, file) in used {
        if !recorded.contains(&name) {
            problems.push(format!(
                "{file}: recording rule {name} is used but not defined"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// Runbooks → dashboards

/// Every string value of a `"title"` key in a JSON document.
fn json_titles(json: &serde_json::Value) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(o) => {
                for (k, child) in o {
                    if let (true, Some(title)) = (k == "title", child.as_str()) {
                        out.insert(title.to_string());
                    }
                    walk(child, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|child| walk(child, out)),
            _ => {}
        }
    }
    let mut titles = BTreeSet::new();
    walk(json, &mut titles);
    titles
}

/// Every `**Open:** *dashboard* → "panel", …; *dashboard* → …` of the runbooks names a
/// dashboard of `dashboards/` and panels of that dashboard.
#[test]
fn runbooks_name_existing_dashboard_panels() {
    let dashboards: Vec<(String, BTreeSet<String>)> = grafana::dashboards()
        .iter()
        .map(|d| (d.file.clone(), json_titles(&d.json)))
        .collect();
    let runbooks = repo_read(RUNBOOKS);
    let mut references = 0;
    let mut problems = Vec::new();
    for paragraph in runbooks.split("\n\n") {
        let Some(open) = paragraph.trim().strip_prefix("**Open:**") else {
            continue;
        };
        let open = open.split_whitespace().collect::<Vec<_>>().join(" ");
        for part in open.split(';') {
            let mut pieces = part.split('*');
            let (Some(_), Some(dashboard), Some(panels)) =
                (pieces.next(), pieces.next(), pieces.next())
            else {
                continue; // e.g. "Prometheus' Targets page"
            };
            let Some((_, titles)) = dashboards.iter().find(|(_, t)| t.contains(dashboard)) else {
                problems.push(format!("no dashboard titled {dashboard:?}"));
                continue;
            };
            for panel in panels.split('"').skip(1).step_by(2) {
                references += 1;
                if !titles.contains(panel) {
                    problems.push(format!("{dashboard:?} has no panel {panel:?}"));
                }
            }
        }
    }
    assert!(
        references > 20,
        "too few panel references found ({references}) in {RUNBOOKS}"
    );
    assert!(problems.is_empty(), "{RUNBOOKS}:\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// Kafka dashboard queries on Kafka series

/// Input series for promtool, shaped as the Kafka source exports them (catalogue labels,
/// one group stalled, one draining its lag on another topic, a dead-letter and a retry
/// topic), ten minutes long.
const KAFKA_SERIES: &[(&str, &str)] = &[
    (
        r#"kafka_consumer_group_status{cluster="prod",group="billing",status="stall"}"#,
        "1x10",
    ),
    (
        r#"kafka_consumer_group_status{cluster="prod",group="billing",status="ok"}"#,
        "0x10",
    ),
    (
        r#"kafka_consumer_group_status{cluster="prod",group="orders",status="stall"}"#,
        "0x10",
    ),
    (
        r#"kafka_consumer_group_status{cluster="prod",group="orders",status="ok"}"#,
        "1x10",
    ),
    (
        r#"kafka_consumer_group_lag_messages{cluster="prod",group="billing",topic="billing",partition="0"}"#,
        "40x10",
    ),
    (
        r#"kafka_consumer_group_lag_seconds{cluster="prod",group="billing",topic="billing",partition="0"}"#,
        "400+60x10",
    ),
    (
        r#"kafka_consumer_group_committed_offset{cluster="prod",group="billing",topic="billing",partition="0"}"#,
        "0+10x10",
    ),
    (
        r#"kafka_consumer_group_uncommitted_partitions{cluster="prod",group="billing",topic="billing"}"#,
        "1x10",
    ),
    (
        r#"kafka_topic_partition_high_watermark{cluster="prod",topic="billing",partition="0"}"#,
        "0+60x10",
    ),
    (
        r#"kafka_consumer_group_last_commit_age_seconds{cluster="prod",group="billing"}"#,
        "0+60x10",
    ),
    // "orders" consumes 2 records/s of a topic written at 1/s: its lag drains (time to drain).
    (
        r#"kafka_topic_partition_high_watermark{cluster="prod",topic="orders",partition="0"}"#,
        "5000+60x10",
    ),
    (
        r#"kafka_consumer_group_committed_offset{cluster="prod",group="orders",topic="orders",partition="0"}"#,
        "4000+120x10",
    ),
    (
        r#"kafka_consumer_group_lag_messages{cluster="prod",group="orders",topic="orders",partition="0"}"#,
        "1000-60x10",
    ),
    (
        r#"kafka_consumer_group_lag_seconds{cluster="prod",group="orders",topic="orders",partition="0"}"#,
        "300-20x10",
    ),
    (
        r#"kafka_consumer_group_members{cluster="prod",group="billing"}"#,
        "2x10",
    ),
    (
        r#"kafka_dead_letter_messages_total{cluster="prod",topic="billing.DLQ"}"#,
        "0+6x10",
    ),
    (
        r#"kafka_retry_messages_total{cluster="prod",topic="billing.retry.1m",tier="1m"}"#,
        "0+12x10",
    ),
    (
        r#"inboxwatch_kafka_record_reads_total{source="prod"}"#,
        "0+30x10",
    ),
    (
        r#"inboxwatch_kafka_future_timestamps_total{source="prod"}"#,
        "0+1x10",
    ),
    (
        r#"inboxwatch_kafka_partitions_unavailable{source="prod"}"#,
        "2x10",
    ),
    (r#"inboxwatch_kafka_shards{source="prod"}"#, "2x10"),
    (
        r#"inboxwatch_kafka_retries_total{source="prod",reason="coordinator"}"#,
        "0+1x10",
    ),
    (r#"inboxwatch_source_up{source="prod"}"#, "1x10"),
    (
        r#"inboxwatch_poll_duration_seconds_bucket{source="prod",le="0.1"}"#,
        "0+1x10",
    ),
    (
        r#"inboxwatch_poll_duration_seconds_bucket{source="prod",le="+Inf"}"#,
        "0+1x10",
    ),
];

/// Input series for promtool, shaped as the queue kinds export them (catalogue labels): a
/// NATS consumer holding unacknowledged work, a Redis group with a scan cut short and dead
/// letters, a RabbitMQ queue with redeliveries, ten minutes long.
const QUEUE_SERIES: &[(&str, &str)] = &[
    (
        r#"queue_messages{source="js",broker="nats",queue="ORDERS"}"#,
        "100+10x10",
    ),
    (
        r#"queue_messages_published_total{source="js",broker="nats",queue="ORDERS"}"#,
        "0+60x10",
    ),
    (
        r#"queue_redeliveries_total{source="rq",broker="rabbitmq",queue="orders"}"#,
        "0+3x10",
    ),
    (
        r#"queue_consumer_lag_messages{source="js",broker="nats",queue="ORDERS",consumer="billing"}"#,
        "5+1x10",
    ),
    (
        r#"queue_consumer_lag_seconds{source="js",broker="nats",queue="ORDERS",consumer="billing"}"#,
        "30+60x10",
    ),
    (
        r#"queue_consumer_unacked_messages{source="js",broker="nats",queue="ORDERS",consumer="billing"}"#,
        "3x10",
    ),
    (
        r#"queue_consumer_oldest_unacked_age_seconds{source="js",broker="nats",queue="ORDERS",consumer="billing"}"#,
        "40+60x10",
    ),
    (
        r#"queue_consumer_redelivered_messages{source="rs",broker="redis",queue="orders",consumer="workers"}"#,
        "2x10",
    ),
    (
        r#"queue_consumer_redelivered_scan_cut{source="rs",broker="redis",queue="orders",consumer="workers"}"#,
        "1x10",
    ),
    (
        r#"queue_consumer_consumers{source="js",broker="nats",queue="ORDERS",consumer="billing"}"#,
        "1x10",
    ),
    (
        r#"queue_consumer_status{source="js",broker="nats",queue="ORDERS",consumer="billing",status="stall"}"#,
        "1x10",
    ),
    (
        r#"queue_consumer_status{source="js",broker="nats",queue="ORDERS",consumer="billing",status="ok"}"#,
        "0x10",
    ),
    (
        r#"queue_consumer_info{source="js",broker="nats",queue="ORDERS",consumer="billing",owner="team-orders"}"#,
        "1x10",
    ),
    (
        r#"queue_dead_letters_total{source="rs",broker="redis",queue="orders",consumer="workers",reason="dead_letter_stream"}"#,
        "0+2x10",
    ),
    (r#"inboxwatch_source_up{source="js"}"#, "1x10"),
    (
        r#"inboxwatch_poll_duration_seconds_bucket{source="js",le="0.1"}"#,
        "0+1x10",
    ),
    (
        r#"inboxwatch_poll_duration_seconds_bucket{source="js",le="+Inf"}"#,
        "0+1x10",
    ),
];

/// As for Kafka: promtool evaluates every query of the Queues dashboard (and the
/// overview's queue stat) on series shaped as the queue kinds export them: every one
/// returns data.
#[test]
fn queues_dashboard_queries_return_data_on_queue_series() {
    let dashboards = grafana::dashboards();
    let exprs: Vec<(String, String)> = grafana::queries(&dashboards)
        .into_iter()
        .filter(|q| {
            let queues_dashboard = dashboards
                .iter()
                .any(|d| d.file == q.file && d.json["uid"] == "inboxwatch-queues");
            queues_dashboard || q.expr.contains("queue_consumer")
        })
        .map(|q| (format!("dashboards/{} / {}", q.file, q.panel), q.expr))
        .collect();
    assert!(
        exprs.len() > 15,
        "too few queue queries found ({})",
        exprs.len()
    );
    assert_queries_return_data(
        "Queues dashboard queries on queue series",
        &exprs,
        QUEUE_SERIES,
    );
}

/// Grafana variables as "All": `$__rate_interval` becomes 2m, any other variable
/// matches everything (they are only used in regex matchers).
fn all_variables(expr: &str) -> String {
    grafana::substitute(expr, |name| {
        Ok(if name == "__rate_interval" {
            "2m"
        } else {
            ".*"
        }
        .to_string())
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The end-to-end test has no Kafka source, so it only proves the Kafka panels'
/// queries evaluate. Here promtool evaluates each of them (and the overview's Kafka
/// stat) on series shaped as the Kafka source exports them, with the rule files loaded
/// (the flow panels read recording rules): every one returns data.
#[test]
fn kafka_dashboard_queries_return_data_on_kafka_series() {
    let dashboards = grafana::dashboards();
    let exprs: Vec<(String, String)> = grafana::queries(&dashboards)
        .into_iter()
        .filter(|q| {
            let kafka_dashboard = dashboards
                .iter()
                .any(|d| d.file == q.file && d.json["uid"] == "inboxwatch-kafka");
            kafka_dashboard || q.expr.contains("kafka_")
        })
        .map(|q| (format!("dashboards/{} / {}", q.file, q.panel), q.expr))
        .collect();
    assert!(
        exprs.len() > 20,
        "too few Kafka queries found ({})",
        exprs.len()
    );
    assert_queries_return_data(
        "Kafka dashboard queries on Kafka series",
        &exprs,
        KAFKA_SERIES,
    );
}

/// Evaluates each query (Grafana variables as "All") with promtool at minute 10 of
/// `series`, the rule files loaded (panels may read recording rules): every one must return
/// at least one sample.
fn assert_queries_return_data(what: &str, exprs: &[(String, String)], series: &[(&str, &str)]) {
    let mut test = String::from("rule_files:\n");
    for file in rule_files() {
        let path = repo_path(&file);
        test.push_str(&format!("  - '{}'\n", path.display()));
    }
    test.push_str("evaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n");
    for (series, values) in series {
        test.push_str(&format!(
            "      - series: '{series}'\n        values: '{values}'\n"
        ));
    }
    test.push_str("    promql_expr_test:\n");
    for (_, expr) in exprs {
        // One sample {} 1 when the query returns anything, none when it returns nothing.
        let probe = format!("count({}) * 0 + 1", all_variables(expr));
        let probe = serde_json::to_string(&probe).expect("a JSON string");
        test.push_str(&format!(
            "      - expr: {probe}\n        eval_time: 10m\n        exp_samples:\n          - labels: '{{}}'\n            value: 1\n"
        ));
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("dashboard.test.yml");
    std::fs::write(&path, &test).expect("write the promtool test");
    let out = run_tool(
        "promtool",
        &["test", "rules", path.to_str().expect("UTF-8 path")],
    );
    let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
    assert_success(&format!("{what} ({names:#?})"), &out);
}

// ---------------------------------------------------------------------------
// Ordering, acknowledgement and drain-time panels on ordering series

/// Input series for promtool, shaped as a table source with `ordering_key`, `version`,
/// `deliveries` and a parked status exports them: "orders" with version gaps, out-of-order
/// arrivals and completions, parked keys, duplicates in both phases, evictions, and a backlog
/// that drains (2 completions/s against 1 arrival/s), ten minutes long.
const ORDERING_SERIES: &[(&str, &str)] = &[
    (
        r#"inboxwatch_source_info{source="orders",kind="inbox",owner="team-orders",service="orders"}"#,
        "1x10",
    ),
    (r#"inboxwatch_source_up{source="orders"}"#, "1x10"),
    (
        r#"inboxwatch_objective_oldest_age_seconds{source="orders"}"#,
        "300x10",
    ),
    (
        r#"inbox_messages_received_total{source="orders",event_type="order.paid"}"#,
        "0+60x10",
    ),
    (
        r#"inbox_messages_completed_total{source="orders",event_type="order.paid",outcome="succeeded"}"#,
        "0+120x10",
    ),
    (
        r#"inbox_backlog_messages{source="orders",event_type="order.paid",status="pending"}"#,
        "1200-60x10",
    ),
    (
        r#"inbox_oldest_unprocessed_age_seconds{source="orders",event_type="order.paid"}"#,
        "100x10",
    ),
    (
        r#"inbox_duplicate_deliveries_total{source="orders",event_type="order.paid",phase="in_flight"}"#,
        "0+3x10",
    ),
    (
        r#"inbox_duplicate_deliveries_total{source="orders",event_type="order.paid",phase="after_completion"}"#,
        "0+2x10",
    ),
    (r#"inbox_version_gaps{source="orders"}"#, "2x10"),
    (
        r#"inbox_oldest_version_gap_age_seconds{source="orders"}"#,
        "30+60x10",
    ),
    (
        r#"inbox_out_of_order_arrivals_total{source="orders"}"#,
        "0+4x10",
    ),
    (
        r#"inbox_out_of_order_completions_total{source="orders"}"#,
        "0+1x10",
    ),
    (r#"inbox_parked_keys{source="orders"}"#, "1x10"),
    (r#"inbox_parked_messages{source="orders"}"#, "3x10"),
    (
        r#"inbox_oldest_parked_age_seconds{source="orders"}"#,
        "60+60x10",
    ),
    (
        r#"inboxwatch_ordering_keys_evicted_total{source="orders"}"#,
        "0+5x10",
    ),
];

/// The end-to-end test's table maps no ordering columns and may see no delivery after
/// completion, so it allows these panels no data. Here promtool evaluates each query of
/// the drill-down's flow and ordering rows (and the agent's evictions) on series shaped as
/// such a source exports them: every one returns data.
#[test]
fn ordering_ack_and_drain_queries_return_data_on_ordering_series() {
    const NEEDLES: &[&str] = &[
        "inbox_version_gaps",
        "inbox_oldest_version_gap_age_seconds",
        "inbox_out_of_order_",
        "inbox_parked_",
        "inbox_oldest_parked_age_seconds",
        "inboxwatch_ordering_keys_evicted_total",
        "inbox_ack_failures",
        "phase",
        "inbox_time_to_drain_seconds",
    ];
    let dashboards = grafana::dashboards();
    let exprs: Vec<(String, String)> = grafana::queries(&dashboards)
        .into_iter()
        .filter(|q| NEEDLES.iter().any(|n| q.expr.contains(n)))
        .map(|q| (format!("dashboards/{} / {}", q.file, q.panel), q.expr))
        .collect();
    for needle in NEEDLES {
        assert!(
            exprs.iter().any(|(_, e)| e.contains(needle)),
            "no dashboard query reads {needle}"
        );
    }
    assert_queries_return_data(
        "ordering, ack-failure and drain-time queries on ordering series",
        &exprs,
        ORDERING_SERIES,
    );
}

// ---------------------------------------------------------------------------
// Inhibition, in a real Alertmanager

/// `config/alertmanager.yml` in a real Alertmanager: a critical alert inhibits the
/// warning and info alerts of its source and family and, for Kafka, of its own consumer
/// group or topic only (a stalled group does not hide another group's growing lag).
/// Alerts are added and read back with amtool.
#[test]
fn a_critical_inhibits_its_source_and_family_and_for_kafka_and_queues_its_group_topic_or_consumer_only()
 {
    // (labels, inhibited)
    let alerts: &[(&str, bool)] = &[
        (
            "alertname=KafkaConsumerGroupStalled severity=critical family=consumer_group source=prod cluster=prod group=g1",
            false,
        ),
        (
            "alertname=KafkaConsumerLagGrowing severity=warning family=consumer_group source=prod cluster=prod group=g1",
            true,
        ),
        (
            "alertname=KafkaConsumerGroupRewind severity=info family=consumer_group source=prod cluster=prod group=g1",
            true,
        ),
        (
            "alertname=KafkaConsumerLagGrowing severity=warning family=consumer_group source=prod cluster=prod group=g2",
            false,
        ),
        // A stalled group hides its own drain warning, not another group's.
        (
            "alertname=KafkaConsumerGroupNotDraining severity=warning family=consumer_group source=prod cluster=prod group=g1",
            true,
        ),
        (
            "alertname=KafkaConsumerGroupNotDraining severity=warning family=consumer_group source=prod cluster=prod group=g2",
            false,
        ),
        (
            "alertname=KafkaConsumerLagGrowing severity=warning family=consumer_group source=staging cluster=staging group=g1",
            false,
        ),
        (
            "alertname=KafkaDeadLetterSpike severity=critical family=dead_letters source=prod cluster=prod topic=a.DLQ",
            false,
        ),
        (
            "alertname=KafkaDeadLetter severity=info family=dead_letters source=prod cluster=prod topic=a.DLQ",
            true,
        ),
        (
            "alertname=KafkaDeadLetter severity=info family=dead_letters source=prod cluster=prod topic=b.DLQ",
            false,
        ),
        // A stalled queue consumer hides its own lag warnings, not another consumer's.
        (
            "alertname=QueueConsumerStalled severity=critical family=queue_consumer source=js broker=nats queue=ORDERS consumer=billing",
            false,
        ),
        (
            "alertname=QueueLagOverObjective severity=warning family=queue_consumer source=js broker=nats queue=ORDERS consumer=billing",
            true,
        ),
        (
            "alertname=QueueConsumerLagGrowing severity=warning family=queue_consumer source=js broker=nats queue=ORDERS consumer=billing",
            true,
        ),
        (
            "alertname=QueueLagOverObjective severity=warning family=queue_consumer source=js broker=nats queue=ORDERS consumer=audit",
            false,
        ),
        (
            "alertname=QueueLagOverObjective severity=warning family=queue_consumer source=js broker=nats queue=PAYMENTS consumer=billing",
            false,
        ),
        (
            "alertname=QueueDeadLetterSpike severity=critical family=dead_letters source=rs broker=redis queue=orders consumer=workers",
            false,
        ),
        (
            "alertname=QueueDeadLetter severity=info family=dead_letters source=rs broker=redis queue=orders consumer=workers",
            true,
        ),
        (
            "alertname=QueueDeadLetter severity=info family=dead_letters source=rs broker=redis queue=payments consumer=workers",
            false,
        ),
        (
            "alertname=InboxDeadLetterSpike severity=critical family=dead_letters source=orders",
            false,
        ),
        (
            "alertname=InboxDeadLetter severity=info family=dead_letters source=orders",
            true,
        ),
        (
            "alertname=InboxDeadLetter severity=info family=dead_letters source=billing",
            false,
        ),
        // Out-of-order completions page; the ordering warnings of the same source are
        // other families (the guard working, or the agent's memory) and stay visible.
        (
            "alertname=InboxOutOfOrderCompletions severity=critical family=out_of_order source=orders",
            false,
        ),
        (
            "alertname=InboxParkedKeys severity=warning family=parked source=orders",
            false,
        ),
        (
            "alertname=InboxVersionGapTooOld severity=warning family=version_gaps source=orders",
            false,
        ),
    ];
    let alertmanager = Alertmanager::start(&repo_path(ALERTMANAGER_CONFIG));
    let url = alertmanager.amtool_url();
    wait_for("Alertmanager to start", || {
        let out = run_tool("amtool", &["alert", "query", &url]);
        out.success().then_some(()).ok_or_else(|| out.describe())
    });
    for (labels, _) in alerts {
        let mut args = vec!["alert", "add", url.as_str()];
        args.extend(labels.split_whitespace());
        assert_success("amtool alert add", &run_tool("amtool", &args));
    }
    wait_for("the inhibitions in Alertmanager", || {
        let out = run_tool(
            "amtool",
            &[
                "alert",
                "query",
                &url,
                "--active",
                "--inhibited",
                "-o",
                "json",
            ],
        );
        if !out.success() {
            return Err(out.describe());
        }
        let got: serde_json::Value =
            serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.describe()))?;
        let mut wrong = Vec::new();
        for (labels, inhibited) in alerts {
            let found = got.as_array().into_iter().flatten().find(|a| {
                labels.split_whitespace().all(|l| {
                    let (k, v) = l.split_once('=').expect("name=value");
                    a["labels"][k] == v
                })
            });
            let state = found.map(|a| a["status"]["state"].as_str().unwrap_or_default());
            let want = if *inhibited { "suppressed" } else { "active" };
            if state != Some(want) {
                wrong.push(format!("{labels}: {state:?}, expected {want}"));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("\n"))
        }
    });
}

/// Calls `done` every 200 ms until it succeeds; panics with its last error after 30 s.
fn wait_for(what: &str, mut done: impl FnMut() -> Result<(), String>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match done() {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("waiting for {what}: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
}
