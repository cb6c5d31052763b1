//! The status card of a Kafka source: its consumer groups with their lag
//! and status, summed from the very samples each cycle publishes (kept
//! beside the snapshot), and the cluster's total lag.

use std::collections::HashMap;

use serde::Serialize;

use crate::card::{Card, Part, Past, Row, Table, TableRow, Trend, text, value};
use crate::telemetry::catalogue as metric;
use crate::telemetry::snapshot::Labels;
#[cfg(test)]
use crate::telemetry::snapshot::Sample;
use crate::telemetry::values::Reading;

/// What the card says of a Kafka source, as numbers (`/api/v1/status`
/// `numbers`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Numbers {
    /// The groups of the cluster, by name.
    pub groups: Vec<Group>,
}

/// One consumer group.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Group {
    pub group: String,
    /// Summed over partitions.
    pub lag_messages: f64,
    /// The largest over partitions.
    pub lag_seconds: f64,
    pub status: Option<String>,
}

/// The groups of one cycle's samples, as they are published: kept beside
/// the snapshot ([`crate::telemetry::snapshot::Builder::keep`]).
#[derive(Debug, Clone, Default)]
pub struct Groups {
    /// In the order first seen (a group's samples come together).
    list: Vec<Group>,
    at: HashMap<String, usize>,
}

impl Groups {
    /// [`Groups::add_labels`] of an owned sample.
    #[cfg(test)]
    pub fn add(&mut self, s: &Sample) {
        let labels: Vec<(&'static str, &str)> =
            s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.add_labels(s.name, &labels, s.value);
    }

    /// Takes one published sample into account: every sample of a group
    /// names it; its lag and status are summed, maximised and noted.
    pub fn add_labels(&mut self, name: &str, labels: &Labels<'_>, value: f64) {
        let Some((_, group)) = labels.iter().find(|(k, _)| *k == "group") else {
            return;
        };
        let g = match self.list.last_mut() {
            Some(last) if last.group == *group => last,
            _ => match self.at.get(*group) {
                Some(&i) => &mut self.list[i],
                None => {
                    self.at.insert(group.to_string(), self.list.len());
                    self.list.push(Group {
                        group: group.to_string(),
                        ..Group::default()
                    });
                    self.list.last_mut().expect("pushed")
                }
            },
        };
        match name {
            metric::KAFKA_LAG_MESSAGES => g.lag_messages += value,
            metric::KAFKA_LAG_SECONDS => g.lag_seconds = g.lag_seconds.max(value),
            metric::KAFKA_GROUP_STATUS if value == 1.0 => {
                g.status = labels
                    .iter()
                    .find(|(k, _)| *k == "status")
                    .map(|(_, v)| v.to_string());
            }
            _ => {}
        }
    }

    /// The groups by name.
    fn sorted(&self) -> Vec<Group> {
        let mut groups = self.list.clone();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        groups
    }
}

/// The card of a Kafka source.
pub fn card(values: &Reading<'_>, _past: &dyn Past) -> Card {
    let groups: Vec<Group> = values
        .kept::<Groups>()
        .map(|g| g.sorted())
        .unwrap_or_default();
    let total: f64 = groups.iter().map(|g| g.lag_messages).sum();
    let table = Table {
        rows_are: "group",
        columns: vec![
            ("lag_messages", "lag (messages)"),
            ("lag_seconds", "lag (seconds)"),
            ("group_status", "status"),
        ],
        rows: groups
            .iter()
            .map(|g| TableRow {
                key: g.group.clone(),
                cells: vec![
                    vec![value("lag_messages", Some(g.lag_messages))],
                    vec![value("lag_seconds", Some(g.lag_seconds))],
                    vec![g.status.clone().map_or(Part::Missing, Part::Text)],
                ],
            })
            .collect(),
        empty: "no group watched yet",
    };
    Card {
        trends: vec![(
            "kafka_lag_messages",
            Trend::Level(if groups.is_empty() { f64::NAN } else { total }),
        )],
        rows: vec![Row {
            field: "kafka_lag_messages",
            title: vec![text("total lag (messages)")],
            value: vec![value("kafka_lag_messages", Some(total))],
            spark: Some("kafka_lag_messages"),
        }],
        tables: vec![table],
        degraded: None,
        numbers: serde_json::to_value(Numbers { groups }).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::NoPast;
    use crate::telemetry::snapshot::{self, Builder};
    use crate::telemetry::values::Values;

    #[test]
    fn groups_sum_lag_take_the_worst_seconds_and_the_status_at_one() {
        let sample = |name, group: &str, extra: Vec<(&'static str, String)>, value| {
            let mut labels = vec![("cluster", "k".to_string()), ("group", group.to_string())];
            labels.extend(extra);
            Sample {
                name,
                labels,
                value,
            }
        };
        let p = |i: &str| vec![("topic", "t".to_string()), ("partition", i.to_string())];
        let status = |s: &str| vec![("status", s.to_string())];
        let samples = [
            sample(metric::KAFKA_LAG_MESSAGES, "g", p("0"), 5.0),
            sample(metric::KAFKA_LAG_MESSAGES, "g", p("1"), 6.0),
            sample(metric::KAFKA_LAG_SECONDS, "g", p("1"), 9.0),
            sample(metric::KAFKA_LAG_SECONDS, "g", p("0"), 2.0),
            sample(metric::KAFKA_GROUP_STATUS, "g", status("ok"), 0.0),
            sample(metric::KAFKA_GROUP_STATUS, "g", status("stall"), 1.0),
            sample(metric::KAFKA_GROUP_MEMBERS, "idle", Vec::new(), 0.0),
            Sample {
                name: metric::KAFKA_HIGH_WATERMARK,
                labels: vec![("cluster", "k".to_string()), ("topic", "t".to_string())],
                value: 100.0,
            },
        ];
        let mut out = Builder::default();
        let mut groups = Groups::default();
        for s in samples {
            groups.add(&s);
            out.push(s);
        }
        out.keep(groups);
        snapshot::publish("card-k", out);
        let values = Values::default();
        let card = card(&values.reading("card-k"), &NoPast);
        snapshot::clear("card-k");
        assert_eq!(
            card.numbers,
            serde_json::json!({"groups": [
                {"group": "g", "lag_messages": 11.0, "lag_seconds": 9.0, "status": "stall"},
                {"group": "idle", "lag_messages": 0.0, "lag_seconds": 0.0, "status": null},
            ]})
        );
        assert_eq!(
            card.trends,
            vec![("kafka_lag_messages", Trend::Level(11.0))]
        );
        // Another agent exports it: no group.
        let hidden = super::card(&Reading::nothing("card-k"), &NoPast);
        assert_eq!(hidden.tables[0].rows.len(), 0);
    }
}
