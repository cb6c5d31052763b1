//! Ground truth on MariaDB: the real agent tails a table that a concurrent
//! workload writes, and every exported number is compared with what the workload
//! knows it wrote (`INBOXWATCH_TEST_MYSQL`, default mysql://root@127.0.0.1:3306/test).

use crate::common;

use common::Db;
use common::scenarios::{
    dead_without_new_attempt_ground_truth, error_classes_ground_truth, inbox_ground_truth,
    outbox_ground_truth,
};

/// Guards the inbox counting rules on MariaDB: every counter per event type is
/// exact (no event missed, none counted twice — including rows from transactions that
/// commit 2 s after newer rows were read, and duplicate deliveries after completion),
/// histogram counts exact and sums within 1e-6, history rows from before the agent's
/// start never counted, quantiles within 1 % of the exact durations, and backlog,
/// oldest age and stuck rows equal to direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_inbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::mysql().await;
    inbox_ground_truth(&db, "my").await;
}

/// Guards the outbox rules on MariaDB: published count and publish-delay histogram
/// count/sum per event type equal the ground truth (late commits included, rows
/// published before the agent started excluded), backlog and oldest unpublished age
/// equal direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_outbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::mysql().await;
    outbox_ground_truth(&db, "my").await;
}

/// Guards the error classes on MariaDB, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_counters_by_error_class_match_the_workload() {
    let db = Db::mysql().await;
    error_classes_ground_truth(&db, "mycls").await;
}

/// Guards issue 35's false retries on MariaDB: a row going `failed` → `dead` with its
/// attempts unchanged completes the attempt it showed failed — no retry, no
/// failure, no attempt more (`/api/v1/events/{id}` shows exactly `attempts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_a_move_to_dead_without_a_new_attempt_is_no_retry() {
    let db = Db::mysql().await;
    dead_without_new_attempt_ground_truth(&db, "myend").await;
}
