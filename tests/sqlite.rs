//! Ground truth on SQLite: the real agent tails a table in a file that a concurrent
//! workload writes (WAL mode), and every exported number is compared with what the
//! workload knows it wrote.

use crate::common;

use common::Db;
use common::scenarios::{
    dead_without_new_attempt_ground_truth, inbox_ground_truth, outbox_ground_truth,
};

/// Guards the inbox counting rules on SQLite (text timestamps in the canonical
/// `YYYY-MM-DD HH:MM:SS.SSS` format): every counter per event type is exact, including
/// rows written with an `updated_at` 2 s older than rows already read (SQLite's
/// stand-in for a late commit), histogram counts exact and sums within 1e-6, history
/// rows never counted, quantiles within 1 % of the exact durations, and backlog,
/// oldest age and stuck rows equal to direct queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_inbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::sqlite().await;
    inbox_ground_truth(&db, "lite").await;
}

/// Guards the outbox counting rules on SQLite: published counts and publish-delay
/// histograms (count, sum, every bucket) per event type exact against the workload,
/// late transactions included, and backlog and oldest unpublished age equal to direct
/// queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_outbox_metrics_match_ground_truth_of_concurrent_workload() {
    let db = Db::sqlite().await;
    outbox_ground_truth(&db, "lite").await;
}

/// Guards issue 35's false retries on SQLite: a row going `failed` → `dead` with its
/// attempts unchanged completes the attempt it showed failed — no retry, no
/// failure, no attempt more (`/api/v1/events/{id}` shows exactly `attempts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_move_to_dead_without_a_new_attempt_is_no_retry() {
    let db = Db::sqlite().await;
    dead_without_new_attempt_ground_truth(&db, "liteend").await;
}
