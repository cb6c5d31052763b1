//! What the agent exports: the metric catalogue, bounded labels and the
//! quantile sketch.

pub mod agent_spans;
pub mod catalogue;
pub mod collector;
pub mod labels;
pub mod otlp;
pub mod sketch;
pub mod snapshot;
