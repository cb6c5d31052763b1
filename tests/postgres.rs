//! Ground truth on PostgreSQL: the real agent tails a table that a concurrent
//! workload writes, and every exported number is compared with what the workload
//! knows it wrote (`INBOXWATCH_TEST_PG`, default postgres://postgres@127.0.0.1:5432/test).

mod common;

use common::Db;
use common::scenarios::{error_classes_ground_truth, inbox_ground_truth, outbox_ground_truth};

/// Guards the inbox counting rules on PostgreSQL: every counter per event type is
/// exact (no event missed, none counted twice — including rows from transactions that
/// commit 2 s after newer rows were read, and duplicate deliveries after completion),
/// histogram counts exact and sums within 1e-6, history rows from before the agent's
/// start never counted, quantiles within 1 % of the exact durations, and backlog,
/// oldest age and stuck rows equal to direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_inbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::postgres().await;
    inbox_ground_truth(&db, "pg").await;
}

/// Guards the outbox rules on PostgreSQL: published count and publish-delay histogram
/// count/sum per event type equal the ground truth (late commits included, rows
/// published before the agent started excluded), backlog and oldest unpublished age
/// equal direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_outbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::postgres().await;
    outbox_ground_truth(&db, "pg").await;
}

/// Guards the error classes on PostgreSQL: failed attempts, dead letters and retries
/// on permanent errors by `error_class` (built-in classes, a source's own, `other` and
/// `unknown`) equal the workload's truth exactly; the source's info series carries its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_counters_by_error_class_match_the_workload() {
    let db = Db::postgres().await;
    error_classes_ground_truth(&db, "pgcls").await;
}
