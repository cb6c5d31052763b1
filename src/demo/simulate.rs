//! Placeholder until the simulation lands.
use std::time::Duration;
use tokio_util::sync::CancellationToken;
#[derive(Debug, Clone)]
pub struct Simulation {
    pub table: String,
    pub rate_per_sec: f64,
    pub stuck_after: Duration,
}
impl Default for Simulation {
    fn default() -> Self {
        Simulation {
            table: "inbox".into(),
            rate_per_sec: 20.0,
            stuck_after: Duration::from_secs(10),
        }
    }
}
pub async fn create_table(_pool: &sqlx::SqlitePool, _table: &str) -> Result<(), sqlx::Error> {
    Ok(())
}
pub async fn run(
    _pool: sqlx::SqlitePool,
    _sim: Simulation,
    cancel: CancellationToken,
) -> Result<(), sqlx::Error> {
    cancel.cancelled().await;
    Ok(())
}
