//! What the agent exports: the metric catalogue, bounded labels, the
//! quantile sketch, the per-cycle snapshots, and the values the recorder
//! keeps readable for the status page.

pub mod agent_spans;
pub mod catalogue;
pub mod collector;
pub mod labels;
pub mod otlp;
pub mod sketch;
pub mod snapshot;
pub mod values;
