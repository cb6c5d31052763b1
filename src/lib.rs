//! inboxwatch: an agent that watches message consumers from the outside —
//! their inbox / processing-record tables and outbox tables — and exports
//! what on-call needs as Prometheus metrics.

pub mod app;
pub mod cli;
pub mod config;
pub mod coordination;
pub mod demo;
pub mod doctor;
pub mod dsn;
pub mod http;
pub mod lookup;
pub mod schema;
pub mod sources;
pub mod telemetry;
pub mod tracing_link;
